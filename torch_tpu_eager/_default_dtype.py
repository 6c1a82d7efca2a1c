"""Queued ops run under the default dtype of their call.

CPU kernels read ``torch.get_default_dtype()`` when they run: an integer true
division, or a floating-point function of integers (``sqrt``, ``sin``, ``atan2``,
...), computes in the default dtype. A "tpu" op queued under
``torch.set_default_dtype(torch.float64)`` (PyTorch's tests' ``set_default_dtype``
context) and read after the context restored float32 ran in float32 and was widened
into its float64 result: not CPU's values. Changing the default dtype therefore first
runs every chip's queued ops (a flush's errors stay with the tensors they reach, as at
any flush); torch has no hook on the change.
"""

import functools

import torch

from . import _C, _torch_patches


def _flush_then(target):
    original = _torch_patches.original(target)

    @functools.wraps(original)
    def replacement(arg, /):
        _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
        original(arg)

    return replacement


def install():
    """Replaces torch.set_default_dtype / set_default_tensor_type by versions that flush first."""
    for name in ("set_default_dtype", "set_default_tensor_type"):
        _torch_patches.patch(torch, name, _flush_then(f"torch.{name}"), why="flush first")
