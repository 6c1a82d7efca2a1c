"""The ``torch.tpu`` device module (names follow ``torch.cuda`` and TorchTPU).

Several simulated chips, ``tpu:0`` .. ``tpu:N-1`` (``device_count()``; env var
``TORCH_TPU_NUM_DEVICES``, default 2, or :func:`set_device_count` before the
device is first used). The current chip is per thread, as CUDA's current
device is. Memory numbers are bytes of the chip's simulated HBM held by live
storages (a pending result counts until its last tensor dies, as CUDA frees at ``del``).

Bad arguments raise what ``torch.cuda`` raises: ``ValueError`` for a device of
another type or an argument that is not a device, ``torch.AcceleratorError``
(a RuntimeError) "invalid device ordinal" for an index outside
``0 .. device_count() - 1``, but for the property queries (``get_device_properties``,
``get_device_name``, ``get_device_capability``), which raise ``torch.cuda``'s
``AssertionError("Invalid device id")`` there, for -1 too.
"""

import contextlib
import enum

import torch

from . import _C

# torch.cuda.OutOfMemoryError's name: what an allocation beyond a chip's simulated HBM raises.
OutOfMemoryError = torch.OutOfMemoryError


def is_available() -> bool:
    """True: the simulated device needs no hardware."""
    return True


def is_initialized() -> bool:
    """Whether this process initialized the device (:func:`init` or a first use), as
    ``torch.cuda.is_initialized()``: False in a process forked after its parent used it."""
    return _C._is_initialized()


def init() -> None:
    """Initializes the device, as ``torch.cuda.init()``: the simulated chips need no setup,
    but from now on a forked child cannot use the device. Raises CUDA's RuntimeError
    "Cannot re-initialize TPU in forked subprocess" in such a child."""
    _C._init()


def _lazy_init():
    """torch's lazy-init hook (``torch.accelerator.set_device_index``, tensor factories):
    initializes the device as ``torch.cuda._lazy_init`` does, so :func:`is_initialized`
    is True after it. Raises RuntimeError in a process forked after its parent used the
    device (as CUDA's)."""
    _C._init()


def _is_in_bad_fork() -> bool:
    """True in a process forked after its parent used the device: tpu ops raise there."""
    return _C._is_in_bad_fork()


def device_count() -> int:
    """Number of simulated "tpu" chips (``TORCH_TPU_NUM_DEVICES``, default 2)."""
    return _C._device_count()


def set_device_count(n: int) -> None:
    """Sets the number of simulated chips; call it before the device is first used.

    Raises ValueError for ``n`` outside 1..16, RuntimeError once the count is
    fixed (any "tpu" tensor, generator or device query fixes it) and differs.
    """
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"set_device_count() expects an int, got {type(n).__name__}")
    _C._set_device_count(n)


def current_device() -> int:
    """Index of this thread's current "tpu" chip."""
    return _C._current_device()


def _index(device, optional: bool = True) -> int:
    """The chip index of ``device`` (int, "tpu[:i]", torch.device; None: the current one).

    Raises ValueError for another device type or a non-device argument, and
    torch.AcceleratorError for an invalid ordinal (as torch.cuda does).
    """
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        idx = current_device() if device.index is None else device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        idx = device
    else:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    return _C._checked_device(idx)


def set_device(device) -> None:
    """Makes ``device`` this thread's current chip (as ``torch.cuda.set_device``).

    Initializes the device first (:func:`init`), as ``torch.cuda.set_device`` does:
    :func:`is_initialized` is then True, which torch reads as "the program chose its
    chip". DeviceMesh picks ``rank % device_count()`` only when it is False, and
    FakeTensor (DTensor's sharding propagation) resolves "tpu" to the current chip only
    when it is True (else to "tpu:0"). Raises RuntimeError in a process forked after its
    parent used the device, as CUDA's does."""
    index = _index(device)
    init()
    _C._set_device(index)


class device:
    """Context manager that makes ``device`` current and restores the previous chip.

    ``None`` or a negative index leaves the current chip unchanged (as torch.cuda.device).
    Used by ``torch.load`` with ``map_location``.
    """

    def __init__(self, device):
        if isinstance(device, int) and device < 0:
            device = None
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.idx >= 0:
            _C._set_device(self.idx)

    def __exit__(self, *exc):
        _C._set_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the chip of tensor ``obj`` current (a CPU tensor: no change)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


def synchronize(device=None) -> None:
    """Flushes every pending op of chip ``device`` (default: the current one) and waits
    for it (reason "synchronize"); other chips' queues are untouched, as CUDA's
    ``synchronize(device)`` waits for that device only.

    Raises the oldest error of a failed op on that chip that nothing has reported
    yet (no read of a tensor holding it, no earlier synchronizing call), with CPU's
    exception type and message, naming the op and the Python line that recorded it;
    once: the next call does not raise it again, and the queue and every tensor the
    failure did not reach stay valid. As CUDA reports a kernel's device-side assert
    at the next synchronizing call (README "Errors:").
    """
    _C._flush_device(_index(device), _C.FLUSH_SYNCHRONIZE)


# ---- streams and events (lanes of a chip's queue; events time simulated device time) ----


class Stream(torch.Stream):
    """A stream of a "tpu" chip: an ordered lane of the chip's queue (as ``torch.cuda.Stream``).

    Work on two streams is ordered only by the events between them. The chip's
    pending ops are all of one stream: recording an op on another stream runs
    the pending ones first (flush reason "stream_switch"), so each stream keeps
    its own simulated clock.
    ``Stream(device)`` takes an index, "tpu:i" or a torch.device (default: the current chip).

    ``priority`` (int, read-only, as ``torch.cuda.Stream.priority``) is always 0: the
    simulated chips schedule no stream ahead of another, so :meth:`priority_range` is
    ``(0, 0)``, what ``cudaDeviceGetStreamPriorityRange`` reports for a device without
    stream priorities, and ``Stream(priority=p)`` maps ``p`` to the nearest valid
    priority, 0 (``torch.cuda.Stream``'s documented rule). A ``priority`` that is not an
    int raises TypeError.
    """

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # wrapping an existing stream: stream_id, device_index, device_type
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)

    @property
    def priority(self) -> int:
        """The stream's priority: 0, the only one the simulated chips have (see the class)."""
        return 0

    @staticmethod
    def priority_range() -> tuple:
        """``(least, greatest)`` stream priority, as ``torch.cuda.Stream.priority_range()``:
        ``(0, 0)``, the simulated chips have no stream priorities."""
        return (0, 0)

    def wait_event(self, event) -> None:
        """Makes later work on this stream wait for ``event``."""
        event.wait(self)

    def wait_stream(self, stream) -> None:
        """Makes later work on this stream wait for the work queued so far on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        """Records ``event`` (a new :class:`Event` by default) on this stream and returns it."""
        if event is None:
            event = torch.Event(device=self.device)
        event.record(self)
        return event


class _EventMeta(type):
    # torch.Event's methods accept only torch.Event objects (elapsed_time checks
    # the exact type), so torch.tpu.Event makes torch.Event objects on "tpu" and
    # isinstance(e, torch.tpu.Event) is true for any of them.
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"

    def __call__(cls, enable_timing=False, blocking=False, interprocess=False):
        return torch.Event(
            device=torch.device("tpu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


class Event(metaclass=_EventMeta):
    """An event of the current "tpu" chip (as ``torch.cuda.Event``); a ``torch.Event``.

    ``record(stream)`` marks the point of the stream reached by the host program;
    it runs the chip's pending ops (flush reason "event") so that the work before it
    has a simulated end time. ``elapsed_time(end)`` is in **simulated device
    milliseconds**: the simulated time of the kernels run on the stream between the
    two events. Both events need ``enable_timing=True`` (else RuntimeError, as CUDA);
    an event recorded on one chip cannot be recorded on another (RuntimeError).
    ``query()`` is True once recorded; ``synchronize()`` does not wait (the work
    before the event ran at ``record``) but raises the chip's oldest error of a failed
    op that nothing has reported yet, as ``cudaEventSynchronize`` reports asynchronous
    errors (README "Errors:"); ``wait(stream)`` makes the stream's later work start
    after the event in simulated time.
    """


def _check_stream(stream):
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"expected a torch.Stream, got {type(stream).__name__}")
    if stream.device.type != "tpu":
        raise ValueError(f"Expected a tpu stream, but got a stream of {stream.device}")


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    """This thread's current stream of chip ``device`` (default: the current chip)."""
    return _wrap(torch.accelerator.current_stream(_index(device)))


def default_stream(device=None) -> Stream:
    """The default stream (id 0) of chip ``device``."""
    idx = _index(device)
    return Stream(stream_id=0, device_index=idx, device_type=torch.accelerator.current_stream(idx).device_type)


def set_stream(stream) -> None:
    """Makes ``stream`` the current stream of its chip (``None``: no-op, as torch.cuda)."""
    if stream is None:
        return
    _check_stream(stream)
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current on its chip (and that chip current),
    restoring both on exit, also on exceptions (as ``torch.cuda.StreamContext``)."""

    def __init__(self, stream):
        if stream is not None:
            _check_stream(stream)
        self.stream = stream

    def __enter__(self):
        if self.stream is None:
            return None
        self.prev_device = current_device()
        self.prev_stream = current_stream(self.stream.device_index)
        _C._set_device(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        torch.accelerator.set_stream(self.prev_stream)
        _C._set_device(self.prev_device)
        return False


def stream(stream) -> StreamContext:
    """``with torch.tpu.stream(s):`` makes ``s`` current (see :class:`StreamContext`)."""
    return StreamContext(stream)


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
    """Restores a state returned by :func:`get_rng_state`: a CPU uint8 tensor of 16 bytes
    (seed, offset) or 8 (the seed; offset 0), as CUDA's.

    Raises:
        TypeError: ``new_state`` is not a CPU ByteTensor.
        RuntimeError: it has another number of bytes.
    """
    if isinstance(new_state, torch.Tensor):
        new_state = new_state.clone(memory_format=torch.contiguous_format)  # as torch.cuda.set_rng_state
    _generator(device).set_state(new_state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


def __getattr__(name):
    # Built on first use, so that importing the module does not fix device_count().
    if name == "default_generators":
        return tuple(_C._default_generator(i) for i in range(device_count()))
    if name == "_initialized":
        # torch.cuda's module flag, read by torch.utils.checkpoint (and others) to decide
        # whether to save and restore the device generators around a recomputation.
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- memory (simulated HBM of each chip, bytes; names and contract of torch.cuda's) ----


def memory_allocated(device=None) -> int:
    """Bytes of the chip's memory held by live storages: what a tensor, a view of it, a storage
    object or autograd's saved tensors still reach. A pending result whose last holder dies
    stops counting then, before the flush that would compute it (as CUDA frees at ``del``);
    :func:`memory_reserved` keeps it until that flush frees its buffer."""
    return _C._memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`, bytes."""
    return _C._max_memory_allocated(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    """Resets the peaks of :func:`max_memory_allocated` / :func:`max_memory_reserved` to the current values."""
    _C._reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Resets the cumulative counters of :func:`memory_stats` (``*.allocated``, ``*.freed``, ``num_*``)."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Returns the host blocks of freed device tensors, which the device keeps for reuse
    (as CUDA's caching allocator does), to the C library. Allocated tensors are untouched."""
    _C._empty_cache()


def memory_reserved(device=None) -> int:
    """Bytes held for the chip: :func:`memory_allocated`, the rounding of the blocks
    behind it (to 64 B; 4 KiB from 1 MiB; 2 MiB from 4 MiB), the buffers of deleted
    pending results until the flush that frees them, and the freed blocks kept
    for reuse that this chip freed (blocks of 1 MiB or more, at most 512 MiB in all;
    freed with :func:`empty_cache`)."""
    return _C._memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` since start or the last :func:`reset_peak_memory_stats`, bytes."""
    return _C._max_memory_reserved(_index(device))


def memory_stats(device=None) -> dict:
    """CUDA's ``memory_stats`` dictionary for the chip (``allocated_bytes.all.current``,
    ``reserved_bytes.all.peak``, ``allocation.all.allocated``, ``num_ooms``, ...), from the
    device allocator through ``torch.accelerator.memory_stats``. Byte counts are of
    simulated HBM; only the ``all`` pools are filled."""
    return torch.accelerator.memory_stats(_index(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of :func:`memory_stats` for chip ``device``, as
    ``torch.cuda.memory_summary`` prints (FSDP and training scripts log it on an
    out-of-memory error): bytes (allocated, active, requested, reserved) and counts
    (allocations, active, segments), each current, peak, total allocated and total
    freed. Only the ``all`` pool is kept (``abbreviated`` is accepted for CUDA's
    signature; the device has no large/small pool split)."""
    index = _index(device)
    stats = memory_stats(index)
    rows = [
        ("allocated_bytes", "Allocated memory", True),
        ("active_bytes", "Active memory", True),
        ("requested_bytes", "Requested memory", True),
        ("reserved_bytes", "Device reserved memory", True),
        ("allocation", "Allocations", False),
        ("active", "Active allocs", False),
        ("segment", "Device reserved segments", False),
    ]

    def cell(value: int, is_bytes: bool) -> str:
        if not is_bytes:
            return f"{value:>10d}"
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024 * 768 or unit == "GiB":
                return f"{value:>6d} {unit:<3}"
            value //= 1024
        return f"{value:>10d}"

    rule = "=" * 79
    lines = [
        rule,
        f" torch_tpu_eager memory summary, device tpu:{index} ({get_device_name(index)})",
        f" OOMs: {stats.get('num_ooms', 0)}",
        rule,
        f" {'Metric':<25}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | {'Tot Freed':>10}",
    ]
    for key, name, is_bytes in rows:
        values = [stats.get(f"{key}.all.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
        lines.append("-" * 79)
        lines.append(f" {name:<25}| " + " | ".join(cell(v, is_bytes) for v in values))
    lines.append(rule)
    return "\n".join(lines) + "\n"


def is_current_stream_capturing() -> bool:
    """False: the device has no graph capture (``torch.cuda.is_current_stream_capturing``;
    code that skips work during a CUDA graph capture asks it)."""
    return False


def get_arch_list() -> list:
    """The chips this build simulates (``torch.cuda.get_arch_list`` lists the compute
    architectures a build supports): the target names :func:`torch_tpu_eager.set_target`
    accepts (:func:`torch_tpu_eager.list_targets`), e.g. ``["tpu-v4", "tpu-v5e", ...]``."""
    from .target import list_targets

    return list_targets()


def mem_get_info(device=None) -> tuple:
    """``(free, total)`` bytes of the chip's simulated HBM: total is the active target's
    HBM size (``target_info()["hbm_bytes"]``; Spyre: its DRAM), free what
    :func:`memory_reserved` does not hold."""
    return torch.accelerator.get_memory_info(_index(device))


# ---- device properties ----

_GENERATIONS = {"tpu-v4": (4, 0), "tpu-v5e": (5, 0), "tpu-v5p": (5, 1), "tpu-v6e": (6, 0), "spyre": (1, 0)}
_DISPLAY = {"tpu-v4": "TPU v4", "tpu-v5e": "TPU v5e", "tpu-v5p": "TPU v5p", "tpu-v6e": "TPU v6e", "spyre": "IBM Spyre"}


class _TpuDeviceProperties:
    """Properties of one simulated chip, as ``torch.cuda.get_device_properties`` gives them.

    Attributes: ``name`` (e.g. "TPU v5e (simulated)"), ``type`` ("tpu"), ``index``,
    ``target`` (the torch_tpu_eager target name), ``major``/``minor`` (chip generation:
    v4 (4, 0), v5e (5, 0), v5p (5, 1), v6e (6, 0); Spyre (1, 0)), ``total_memory`` (HBM
    bytes; Spyre: card DRAM), ``multi_processor_count`` (TensorCores; Spyre: cores),
    ``vmem_bytes`` (on-chip memory per core: TPU VMEM, Spyre LX scratchpad),
    ``mxu_shape`` ((rows, columns) of one MXU; Spyre: its PE array), ``mxu_count`` (per core),
    ``hbm_bandwidth`` (bytes/s), ``peak_bf16_flops`` (FLOP/s; None for Spyre),
    ``sources`` (parameter -> published source of the number).
    """

    def __init__(self, index: int, info: dict):
        name = info["name"]
        self.index = index
        self.type = "tpu"
        self.target = name
        self.name = f"{_DISPLAY.get(name, name)} (simulated)"
        self.major, self.minor = _GENERATIONS.get(name, (0, 0))
        if info["kind"] == "spyre":
            self.total_memory = int(info["dram_bytes"])
            self.multi_processor_count = int(info["cores"])
            self.vmem_bytes = int(info["lx_bytes_per_core"])
            self.mxu_shape = (int(info["pe_array_rows"]), int(info["pe_array_cols"]))
            self.mxu_count = int(info["corelets_per_core"])
            self.hbm_bandwidth = float(info["dram_bandwidth_spec"])
            self.peak_bf16_flops = None
        else:
            self.total_memory = int(info["hbm_bytes"])
            self.multi_processor_count = int(info["tensor_cores"])
            self.vmem_bytes = int(info["vmem_bytes"])
            self.mxu_shape = (int(info["mxu_size"]), int(info["mxu_size"]))
            self.mxu_count = int(info["mxus_per_core"])
            self.hbm_bandwidth = float(info["hbm_bandwidth"])
            self.peak_bf16_flops = float(info["peak_bf16_flops"])
        self.description = info.get("description", "")
        self.sources = dict(info["sources"])

    def __repr__(self):
        return (
            f"_TpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count}, "
            f"vmem_bytes={self.vmem_bytes}, mxu_shape={self.mxu_shape}, mxu_count={self.mxu_count})"
        )


def _properties_index(device) -> int:
    """The chip index of ``device`` for the property queries, with ``torch.cuda``'s checks
    there: an index outside ``0 .. device_count() - 1`` (a negative one too, which other
    functions read as the current chip) raises ``AssertionError("Invalid device id")``;
    another device type or a non-device argument raises ValueError (as :func:`_index`)."""
    if isinstance(device, int) and not isinstance(device, bool):
        idx = device
    elif device is None or isinstance(device, (str, torch.device)):
        dev = torch.device(device) if isinstance(device, str) else device
        if dev is not None and dev.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {dev}")
        idx = current_device() if dev is None or dev.index is None else dev.index
    else:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    if idx < 0 or idx >= device_count():
        raise AssertionError("Invalid device id")
    return idx


def get_device_properties(device=None) -> _TpuDeviceProperties:
    """Properties of chip ``device`` (default: the current one) from the active target's data file.

    Raises ``AssertionError("Invalid device id")`` for an index outside
    ``0 .. device_count() - 1``, negative ones included, as ``torch.cuda.get_device_properties``;
    ValueError for another device type or a non-device argument."""
    from .target import target_info

    return _TpuDeviceProperties(_properties_index(device), target_info())


def get_device_name(device=None) -> str:
    """Name of chip ``device``, e.g. ``"TPU v5e (simulated)"``; raises as :func:`get_device_properties`."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple:
    """``(major, minor)`` of chip ``device``: its TPU generation (see :class:`_TpuDeviceProperties`);
    raises as :func:`get_device_properties`."""
    prop = get_device_properties(device)
    return prop.major, prop.minor


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---- scoped matmul precision (names as TorchTPU's; values as torch.set_float32_matmul_precision) ----


class Precision(str, enum.Enum):
    """Precision of float32 matmuls and convolutions on the MXU.

    ``HIGHEST``: float32 ("highest"); ``HIGH``: three bfloat16 passes ("high");
    ``MEDIUM``/``DEFAULT``: one bfloat16 pass with float32 accumulation ("medium").
    The values are those of ``torch.set_float32_matmul_precision``.
    """

    HIGHEST = "highest"
    HIGH = "high"
    MEDIUM = "medium"


_PRECISION_CODES = {"highest": 0, "high": 1, "medium": 2}  # at::Float32MatmulPrecision
_PRECISION_NAMES = {v: k for k, v in _PRECISION_CODES.items()}


class precision(contextlib.ContextDecorator):
    """``with torch.tpu.precision(p):`` runs float32 matmuls that this thread records inside
    at precision ``p`` (a :class:`Precision` or one of "highest", "high", "medium"),
    restoring the previous one on exit, also on exceptions. Nests.

    The scope is per thread, as TorchTPU documents: other threads keep theirs, and ops
    each records run at its own precision (a thread's scope never changes another
    thread's results). Outside any scope an op runs at ``torch.get_float32_matmul_precision()``
    as of its call (PyTorch's process-wide setting, which the scope does not change:
    ``torch.get_float32_matmul_precision()`` keeps returning the process-wide value and
    :func:`get_precision` returns the precision in effect for this thread). The precision
    is fixed when an op is recorded: pending ops recorded at another precision run first
    (flush reason ``"precision_switch"``). Raises ValueError for an unknown precision.
    """

    def __init__(self, p):
        try:
            self.p = Precision(p.value if isinstance(p, Precision) else p)
        except ValueError:
            raise ValueError(f"unknown precision {p!r}; valid: {[m.value for m in Precision]}") from None
        self._prev = []

    def __enter__(self):
        self._prev.append(_C._thread_precision())
        _C._set_thread_precision(_PRECISION_CODES[self.p.value])
        return self.p

    def __exit__(self, *exc):
        _C._set_thread_precision(self._prev.pop())
        return False


def get_precision() -> Precision:
    """The :class:`Precision` float32 matmuls this thread records now run at: the innermost
    :class:`precision` scope of this thread, else ``torch.get_float32_matmul_precision()``."""
    code = _C._thread_precision()
    return Precision(_PRECISION_NAMES[code] if code >= 0 else torch.get_float32_matmul_precision())


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
