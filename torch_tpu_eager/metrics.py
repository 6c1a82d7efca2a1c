"""Counters of the DeferAndFuse queue, the JIT and the executor."""

from . import _C
from ._args import int64_arg


def metrics() -> dict:
    """A snapshot of the device counters since start or :func:`reset_metrics`.

    Keys: ``ops_recorded`` (ops appended to the queue), ``ops_executed``,
    ``ops_eliminated`` (dead code), ``eager_ops`` (run at record time: data-
    dependent shapes), ``fallback_ops``, ``flushes``, ``flush_reasons`` (reason ->
    count), ``regions_run`` (fused regions executed), ``ops_per_region``,
    ``library_calls`` (ops not lowered), ``output_copies`` (op results the CPU
    kernel did not write into their device storage, copied there after it: CPU
    eager makes no such copy), ``cache_hits``, ``compiles``,
    ``flush_cache_hits`` (flushes whose structure an earlier flush had: its
    partition, keys and kernels reused, so the flush only binds and runs;
    ``flush_cache_size`` / ``flush_cache_limit``: plans held and their bound,
    ``TORCH_TPU_FLUSH_CACHE_SIZE``),
    ``bytes_materialized`` (bytes written to device storages), ``bytes_read``,
    ``padding_bytes`` (extra HBM bytes the tiled layouts of those reads and writes
    move), ``flops`` (useful operations: matmul 2*M*N*K, others one per element),
    ``sim_time_s`` (simulated device seconds on the active target, see
    :func:`torch_tpu_eager.set_target`), ``schedule_time_s`` (on Spyre, the same
    kernels timed by their double-buffered load/compute/store schedules; 0 on the
    TPU targets; docs/spyre.md relates it to ``sim_time_s``), ``compile_time_s`` (host seconds),
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
    ``twin_inferences``: calls whose result shapes were inferred by running CPU's
    kernel on zero-filled CPU copies of the arguments (a first-step cost), counted
    since the process started (not reset).
    Does not flush.
    """
    return _C._metrics()


def reset_metrics() -> None:
    """Zeroes every counter of :func:`metrics` and the timers of :func:`metrics_report`."""
    _C._reset_metrics()
    _C._reset_debug_report()


def _percentile(sorted_values, q):
    """The q-quantile (0..1) of a non-empty sorted list, by linear interpolation."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _format_value(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def metrics_report() -> str:
    """A text report of the device's counters and timers, like torch_xla's ``metrics_report()``.

    Counters are those of :func:`metrics` (flush causes included), then one per ATen
    op that ran through the CPU fallback (``cpu_fallback.<overload>``). Timers: ``flush``
    (host time of each flush, all of its regions), ``compile`` (host time compiling regions, per flush that compiled),
    ``region_run`` (host time running one compiled region), ``record`` (host time of one
    op call on "tpu": recording it, or running it at the call when it must, e.g. a
    data-dependent shape or a flush the queue limits trigger; every op when
    ``TORCH_TPU_DEBUG`` >= 1, else 1 op in 64, so its count is the ops timed),
    each with its count, total and the 50th/90th/99th percentiles of a uniform sample
    of at most 4096 durations, in milliseconds. Does not flush.
    """
    lines = ["Counters:"]
    for name, value in metrics().items():
        if isinstance(value, dict):
            for key, n in value.items():
                if n:
                    lines.append(f"  {name}.{key}: {_format_value(n)}")
        else:
            lines.append(f"  {name}: {_format_value(value)}")
    for name, n in _C._op_counts():
        lines.append(f"  {name}: {n}")
    lines.append("Timers (ms):")
    for name, (count, total_s, samples) in sorted(_C._timers().items()):
        s = sorted(samples)
        pct = ", ".join(f"p{int(q * 100)} {1e3 * _percentile(s, q):.3f}" for q in (0.5, 0.9, 0.99)) if s else ""
        lines.append(f"  {name}: count {count}, total {1e3 * total_s:.3f}, {pct}")
    return "\n".join(lines)


def debug_summary(top: int = 5) -> str:
    """What ``TORCH_TPU_DEBUG=1`` prints at exit: flushes per cause, compiles, and the
    ``top`` Python lines that triggered the most flushes."""
    m = metrics()
    causes = ", ".join(f"{k} {v}" for k, v in m["flush_reasons"].items() if v) or "none"
    lines = [
        f"[tpu debug] summary: {m['flushes']} flushes ({causes}); {m['compiles']} regions compiled, "
        f"{m['cache_hits']} cache hits, {m['regions_run']} regions run, {m['ops_recorded']} ops recorded"
    ]
    by_line = sorted(_C._flushes_by_line(), key=lambda kv: -kv[1])[:top]
    for line, n in by_line:
        lines.append(f"[tpu debug]   {n:6d} flushes triggered at {line}")
    return "\n".join(lines)


def set_queue_limits(max_ops: int = 4096, max_bytes: int = 1 << 30) -> None:
    """Sets the auto-flush limits: pending ops, and bytes of pending fresh outputs.

    Defaults: 4096 ops and 1 GiB (env vars TORCH_TPU_MAX_PENDING_OPS and
    TORCH_TPU_MAX_PENDING_BYTES set them at start). Raises ValueError for
    values below 1, TypeError for a non-integer and OverflowError for a value
    past 2**63 - 1 (each naming the argument).
    """
    _C._set_queue_limits(
        int64_arg("set_queue_limits", "max_ops", max_ops), int64_arg("set_queue_limits", "max_bytes", max_bytes)
    )


def queue_limits() -> tuple:
    """(max pending ops, max pending bytes)."""
    return tuple(_C._queue_limits())


def op_table() -> list:
    """Rows (overload name, primitive kind) of the ops the device records."""
    return list(_C._op_table())
