"""The ``torch.tpu`` device module (names follow ``torch.cuda`` and TorchTPU).

One simulated device, ``tpu:0``. Memory numbers are bytes of simulated device
memory held by live storages and pending values.
"""
import contextlib
import enum

import torch

from . import _C

_current_device = 0


def is_available() -> bool:
    """True: the simulated device needs no hardware."""
    return True


def is_initialized() -> bool:
    return True


def _lazy_init():
    """Raises RuntimeError in a process forked after its parent used the device (as CUDA's)."""
    if _C._is_in_bad_fork():
        raise RuntimeError(
            "Cannot re-initialize tpu in forked subprocess. To use tpu with multiprocessing, "
            "you must use the 'spawn' start method")


def _is_in_bad_fork() -> bool:
    """True in a process forked after its parent used the device: tpu ops raise there."""
    return _C._is_in_bad_fork()


def device_count() -> int:
    """Number of "tpu" devices (always 1)."""
    return 1


def current_device() -> int:
    """Index of the current "tpu" device (always 0)."""
    return _current_device


def _index(device) -> int:
    if device is None:
        return _current_device
    if isinstance(device, int):
        idx = device
    else:
        dev = torch.device(device)
        if dev.type != "tpu":
            raise ValueError(f"expected a tpu device, got {dev}")
        idx = 0 if dev.index is None else dev.index
    if not 0 <= idx < device_count():
        raise ValueError(f"tpu device index {idx} out of range; device_count() is {device_count()}")
    return idx


def set_device(device) -> None:
    """Selects the current device. Raises ValueError for an index other than 0."""
    global _current_device
    _current_device = _index(device)


class device:
    """Context manager that makes ``device`` current (used by ``torch.load``)."""

    def __init__(self, device):
        self.idx = _index(device) if device is not None else _current_device

    def __enter__(self):
        global _current_device
        self.prev = _current_device
        _current_device = self.idx

    def __exit__(self, *exc):
        global _current_device
        _current_device = self.prev
        return False


def synchronize(device=None) -> None:
    """Flushes every pending op of the device and waits for it (reason "synchronize").

    Raises the first error of a failed op, naming the op and the Python line
    that recorded it.
    """
    _index(device)
    _C._flush(_C.FLUSH_SYNCHRONIZE)


# ---- RNG (device generator: seed + offset, consumed at record time) ----

def _generator(device=None):
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator (called by ``torch.manual_seed``)."""
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic random number."""
    _generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        _generator(i).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    """The generator state: a CPU uint8 tensor of 16 bytes (seed, offset)."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    """Restores a state returned by :func:`get_rng_state`."""
    _generator(device).set_state(new_state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


default_generators = tuple(_C._default_generator(i) for i in range(1))


# ---- memory (simulated device memory, bytes) ----

def memory_allocated(device=None) -> int:
    """Bytes of device memory held by storages (live tensors and pending values)."""
    return _C._memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset, bytes."""
    return _C._max_memory_allocated(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Returns the host blocks of freed device tensors, which the device keeps for reuse
    (as CUDA's caching allocator does), to the C library. Allocated tensors are untouched."""
    _C._empty_cache()


def memory_reserved(device=None) -> int:
    """Bytes held by the device: :func:`memory_allocated`, the rounding of the blocks
    behind it (to 64 B; 4 KiB from 1 MiB; 2 MiB from 4 MiB), and the freed blocks kept
    for reuse (blocks of 1 MiB or more, at most 512 MiB in all; freed with
    :func:`empty_cache`)."""
    return _C._memory_allocated(_index(device)) + _C._live_padding_bytes() + _C._cached_bytes()


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---- eager modes (names as in TorchTPU) ----

class EagerMode(enum.IntEnum):
    """How ops run: deferred and fused (default), or flushed one by one."""

    DEFER_AND_FUSE = 0
    DEFER_NEVER = 1
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 2


class _ModeGuard(contextlib.AbstractContextManager):
    def __init__(self, previous):
        self.previous = previous

    def __exit__(self, *exc):
        _C._set_eager_mode(int(self.previous))
        return False


def set_eager_mode(mode) -> _ModeGuard:
    """Sets the eager mode; also usable as ``with set_eager_mode(...):`` to restore it after.

    Accepts an :class:`EagerMode` or its name. Raises ValueError for an unknown
    mode. Leaving DEFER_AND_FUSE flushes pending ops first.
    """
    if isinstance(mode, str):
        try:
            mode = EagerMode[mode]
        except KeyError:
            raise ValueError(f"unknown eager mode {mode!r}; valid: {[m.name for m in EagerMode]}") from None
    mode = EagerMode(mode)
    previous = get_eager_mode()
    _C._set_eager_mode(int(mode))
    return _ModeGuard(previous)


def get_eager_mode() -> EagerMode:
    """The current :class:`EagerMode` (env var TORCH_TPU_DEFER_AND_FUSE=0 starts in DEFER_NEVER)."""
    return EagerMode(_C._eager_mode())
