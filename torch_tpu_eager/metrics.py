"""Counters of the DeferAndFuse queue, the JIT and the executor."""
from . import _C
from ._args import int64_arg


def metrics() -> dict:
    """A snapshot of the device counters since start or :func:`reset_metrics`.

    Keys: ``ops_recorded`` (ops appended to the queue), ``ops_executed``,
    ``ops_eliminated`` (dead code), ``eager_ops`` (run at record time: data-
    dependent shapes), ``fallback_ops``, ``flushes``, ``flush_reasons`` (reason ->
    count), ``regions_run`` (fused regions executed), ``ops_per_region``,
    ``library_calls`` (ops not lowered), ``cache_hits``, ``compiles``,
    ``bytes_materialized`` (bytes written to device storages), ``bytes_read``,
    ``padding_bytes`` (extra HBM bytes the tiled layouts of those reads and writes
    move), ``flops`` (useful operations: matmul 2*M*N*K, others one per element),
    ``sim_time_s`` (simulated device seconds on the active target, see
    :func:`torch_tpu_eager.set_target`), ``compile_time_s`` (host seconds),
    ``disk_cache_hits`` / ``disk_cache_misses`` (compiled regions and meta-
    inference results found / not found in the on-disk cache after an
    in-memory miss; a region loaded from disk is not counted in ``compiles``),
    ``disk_cache_writes`` (entries appended to it); the three stay 0 when the
    disk cache is off (:func:`torch_tpu_eager.set_cache_dir`).
    ``host_reads_shared`` / ``bytes_shared``: reads to the host (``t.cpu()``,
    ``t.to("cpu")``) that handed the CPU tensor the device buffer itself, copy-on-
    write, instead of copying it (whole dense storages of at least 1 MiB);
    ``cow_copies`` / ``cow_bytes``: copies made later because one side wrote a
    buffer the other still shared.
    Does not flush.
    """
    return _C._metrics()


def reset_metrics() -> None:
    """Zeroes every counter of :func:`metrics`."""
    _C._reset_metrics()


def set_queue_limits(max_ops: int = 4096, max_bytes: int = 1 << 30) -> None:
    """Sets the auto-flush limits: pending ops, and bytes of pending fresh outputs.

    Defaults: 4096 ops and 1 GiB (env vars TORCH_TPU_MAX_PENDING_OPS and
    TORCH_TPU_MAX_PENDING_BYTES set them at start). Raises ValueError for
    values below 1, TypeError for a non-integer and OverflowError for a value
    past 2**63 - 1 (each naming the argument).
    """
    _C._set_queue_limits(int64_arg("set_queue_limits", "max_ops", max_ops),
                         int64_arg("set_queue_limits", "max_bytes", max_bytes))


def queue_limits() -> tuple:
    """(max pending ops, max pending bytes)."""
    return tuple(_C._queue_limits())


def op_table() -> list:
    """Rows (overload name, primitive kind) of the ops the device records."""
    return list(_C._op_table())
