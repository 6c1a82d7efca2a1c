"""Queued ops run under the deterministic-algorithms mode of their call.

CPU kernels of the index-writing ops (put_, index_put_, index_copy_, scatter, ...)
and of max_unpool read ``torch.use_deterministic_algorithms`` when they run: a
deterministic order for duplicate indices, or the nondeterministic alert (raise, or
warn with warn_only). While the mode is on, "tpu" runs them at the call (op-table
trait ``kReadsDeterministicMode``, csrc/ops/record.cpp); with the mode off they are queued. Changing the mode therefore
first runs every chip's queued ops, so none of them runs under a mode set after its
call (a flush's errors stay with the tensors they reach, as at any flush).
"""

import functools

import torch

from . import _C, _torch_patches


def _mode():
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def install():
    """Replaces torch.use_deterministic_algorithms by a version that flushes first."""
    original = _torch_patches.original("torch.use_deterministic_algorithms")

    @functools.wraps(original)
    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        if (bool(mode), bool(warn_only)) != _mode():
            _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
        original(mode, warn_only=warn_only)

    _torch_patches.patch(torch, "use_deterministic_algorithms", use_deterministic_algorithms, why="flush first")
