"""Profiler of simulated kernels: ``with torch_tpu_eager.profile() as prof:``.

Every fused region the device runs while a profiler is active is one kernel
record, costed on the active target (see :mod:`torch_tpu_eager.target`). Times
are simulated device seconds, laid back to back on a simulated timeline; they
say what the program would take on the chip, not how long the host took.
"""

import json
import sys

from . import _C


def _tiling_cells(t) -> str:
    """The tiling columns of :meth:`profile.table`."""
    if not t:
        return f"{'-':>12}  {'-':>8}  {'-':>9}  {'-':>5}"
    grid = "x".join(str(g) for g in t["grid"])
    mxu = "-" if t["mxu_utilization"] is None else f"{100 * t['mxu_utilization']:.0f}"
    return f"{grid:>12}  {t['vmem_bytes'] / 2**20:>8.2f}  {t['hbm_reread_bytes'] / 1e6:>9.3f}  {mxu:>5}"


class profile:
    """Context manager recording every kernel (fused region) run inside it.

    Entering and leaving flush pending ops (flush reason ``"synchronize"``), so
    the kernels recorded are exactly the work recorded inside the block. An
    error of a failed op is not raised by the flush; it stays with the tensors
    it poisoned (its kernel is recorded with ``failed=True``). Profilers nest.
    When no profiler is active, nothing is recorded.

    After the block, ``kernels`` is a list of dicts, one per kernel in run order:

    - ``name``: region name, e.g. ``"fused_mul_add_sum"``; ``target``: chip it was costed on
    - ``ops``: the fused ATen ops (``"add.Tensor"``, ...); ``shapes``: per op, the shapes of
      its tensor arguments; ``output_shapes``: per op, its fresh results' shapes
    - ``bytes_read``, ``bytes_written``: HBM bytes of the values the kernel reads from and
      writes to device memory (logical, unpadded); ``padding_bytes``: the extra bytes their
      tiled layouts move
    - ``flops``: useful operations (matmul 2*M*N*K, others one per element);
      ``mxu_flops``: what the MXUs spend on padded shapes times precision passes
    - ``compute_s``, ``memory_s``: simulated compute and HBM seconds; ``sim_time_s`` =
      max(compute_s, memory_s) + launch cost; ``start_s``: start on the simulated timeline,
      seconds from the profiler's start
    - ``cache_hit``: the compiled region came from the cache; ``failed``: an op raised
    - ``tiling``: the kernel's VMEM tiling on a TPU target (None on other targets), a dict:
      ``kind`` (``"vector"`` or ``"matmul"``), ``grid`` (vector: row and column blocks;
      matmul: batch, M/bm, N/bn, K/bk), ``block`` (vector: ``(br, bc)``; matmul:
      ``(bm, bk, bn)``), ``order`` (matmul grid order, ``"mnk"`` or ``"nmk"``, k innermost),
      ``blocks`` (per operand: ``role``, ``dtype``, 2-D ``shape``, ``block``, ``buffers``,
      ``vmem_bytes``), ``vmem_bytes`` (footprint) and ``vmem_budget_bytes`` (the chip's VMEM
      per TensorCore), ``hbm_reread_bytes`` (HBM bytes read again because of the blocking;
      included in ``memory_s``), ``mxu_utilization`` (useful / padded MACs; None without
      MXU work). See docs/tpu_target.md for the policy.

    - ``kind``: ``"kernel"`` (a fused region), or ``"collective"`` for a collective charged by
      :func:`torch_tpu_eager.ici.record_collective`: then ``name`` is the op
      (``"all_reduce"``, ...), ``sim_time_s`` its simulated interconnect time, the byte and
      FLOP counters 0, and ``collective`` a dict (``algorithm``, ``group_size``, ``nbytes``,
      ``shape``, ``bytes_per_link``, ``hops``, ``latency_s``, ``bandwidth_s``; None for kernels)

    Inside a ``torch.profiler.profile()`` each kernel run on a TPU target also appears
    as a range ``"tpu::<name>"`` (host time of the simulation; its fused ops in the
    range's ``ops`` argument when ``record_shapes=True``). With
    ``activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]`` every kernel
    (any target) is also a device event of torch.profiler: same ``name``, lasting its
    ``sim_time_s``, on the track of its chip (Chrome trace pid) and stream (tid),
    starting where its stream's simulated clock was (each chip's earliest device event at
    the host time the session started; docs/interconnect.md), and
    linked to the op that ran it (so ``key_averages()`` fills the device-time columns);
    a collective charged by :func:`torch_tpu_eager.ici.record_collective` likewise is a
    device event ``"ici::<op>"`` lasting its simulated ICI time.
    ``torch.autograd.profiler.profile(use_device="tpu")`` gives each op the simulated
    time of the kernels run during it. Both come from csrc/device/kineto_profiler.cpp
    and csrc/lazy/profiler_stubs.cpp.
    """

    def __init__(self):
        self.kernels = []
        self._first = None
        self._clock0 = 0.0

    def __enter__(self):
        _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
        self._first, self._clock0 = _C._trace_begin()
        return self

    def __exit__(self, *exc):
        try:
            _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
        finally:
            records = _C._trace_end(self._first)
        for r in records:
            r["start_s"] -= self._clock0
        self.kernels = records
        return False

    @property
    def total_sim_time_s(self) -> float:
        """Simulated seconds of all recorded kernels."""
        return sum(k["sim_time_s"] for k in self.kernels)

    def summary(self, sort_by: str = "sim_time_s") -> list:
        """Kernels grouped by name, sorted by ``sort_by`` (a numeric key), largest first.

        Each row: ``name``, ``calls``, ``ops``, ``kind``, ``tiling`` (of its slowest call), and the
        sums of ``sim_time_s``, ``compute_s``, ``memory_s``, ``flops``, ``bytes_read``,
        ``bytes_written``, ``padding_bytes``.
        """
        keys = ("sim_time_s", "compute_s", "memory_s", "flops", "bytes_read", "bytes_written", "padding_bytes")
        rows: dict[str, dict] = {}
        for k in self.kernels:
            row = rows.setdefault(
                k["name"],
                {
                    "name": k["name"],
                    "calls": 0,
                    "ops": k["ops"],
                    "tiling": None,
                    "kind": k.get("kind", "kernel"),
                    "_slowest": -1.0,
                    **{x: 0 for x in keys},
                },
            )
            if k.get("tiling") and k["sim_time_s"] > row["_slowest"]:
                row["tiling"], row["_slowest"] = k["tiling"], k["sim_time_s"]
            row["calls"] += 1
            for x in keys:
                row[x] += k[x]
        for row in rows.values():
            row.pop("_slowest", None)
        return sorted(rows.values(), key=lambda r: r[sort_by], reverse=True)

    def table(self, sort_by: str = "sim_time_s", row_limit: int | None = None, file=sys.stdout) -> str:
        """A text summary of :meth:`summary`, sorted by simulated time; printed to ``file``
        (pass ``file=None`` to only return it). Returns the text.

        Columns: calls, total and mean simulated time (microseconds), share of the
        total, GFLOP, HBM MB moved (read + written + padding), padding MB, the
        achieved FLOP/s (TFLOP/s), whether compute or memory bound, and the tiling of
        the slowest call: grid, VMEM footprint (MiB), HBM re-read MB and MXU
        utilization (%, ``-`` without MXU work).
        """
        rows = self.summary(sort_by)
        if row_limit is not None:
            rows = rows[:row_limit]
        total = self.total_sim_time_s or 1.0
        width = max([len("kernel")] + [min(len(r["name"]), 48) for r in rows])
        head = (
            f"{'kernel':<{width}}  {'calls':>5}  {'sim us':>10}  {'mean us':>9}  {'%':>5}  {'GFLOP':>9}  "
            f"{'HBM MB':>9}  {'pad MB':>8}  {'TFLOP/s':>8}  {'bound':<7}  {'grid':>12}  {'VMEM MiB':>8}  "
            f"{'reread MB':>9}  {'MXU %':>5}"
        )
        lines = [head, "-" * len(head)]
        for r in rows:
            hbm = r["bytes_read"] + r["bytes_written"] + r["padding_bytes"]
            tflops = r["flops"] / r["sim_time_s"] / 1e12 if r["sim_time_s"] > 0 else 0.0
            if r.get("kind") == "collective":
                bound = "ici"
            else:
                bound = "compute" if r["compute_s"] >= r["memory_s"] else "memory"
            lines.append(
                f"{r['name'][:48]:<{width}}  {r['calls']:>5}  {r['sim_time_s'] * 1e6:>10.2f}  "
                f"{r['sim_time_s'] * 1e6 / r['calls']:>9.2f}  {100 * r['sim_time_s'] / total:>5.1f}  "
                f"{r['flops'] / 1e9:>9.3f}  {hbm / 1e6:>9.3f}  {r['padding_bytes'] / 1e6:>8.3f}  {tflops:>8.2f}  "
                f"{bound:<7}  {_tiling_cells(r['tiling'])}"
            )
        targets = sorted({k["target"] for k in self.kernels})
        lines.append(
            f"{len(self.kernels)} kernels, {self.total_sim_time_s * 1e6:.2f} us simulated on "
            f"{', '.join(targets) or '-'}"
        )
        text = "\n".join(lines)
        if file is not None:
            print(text, file=file)
        return text

    def export_chrome_trace(self, path: str) -> None:
        """Writes the kernels as a Chrome trace (JSON ``traceEvents``) that
        chrome://tracing and Perfetto open: one complete event (``"ph": "X"``) per
        kernel, ``ts`` and ``dur`` in microseconds of simulated time, the kernel's
        counters in ``args``.
        """
        events = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": 0,
                "tid": 0,
                "args": {"name": "tpu (simulated: " + ", ".join(sorted({k["target"] for k in self.kernels})) + ")"},
            },
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "kernels"}},
        ]
        if any(k.get("kind") == "collective" for k in self.kernels):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "collectives (ICI)"}})
        for k in self.kernels:
            if k.get("kind") == "collective":
                events.append(
                    {
                        "name": k["name"],
                        "cat": "collective",
                        "ph": "X",
                        "pid": 0,
                        "tid": 1,
                        "ts": k["start_s"] * 1e6,
                        "dur": k["sim_time_s"] * 1e6,
                        "args": {"target": k["target"], **k["collective"]},
                    }
                )
                continue
            args = {
                x: k[x]
                for x in (
                    "ops",
                    "shapes",
                    "bytes_read",
                    "bytes_written",
                    "padding_bytes",
                    "flops",
                    "mxu_flops",
                    "compute_s",
                    "memory_s",
                    "target",
                    "cache_hit",
                    "failed",
                    "tiling",
                )
            }
            events.append(
                {
                    "name": k["name"],
                    "cat": "kernel",
                    "ph": "X",
                    "pid": 0,
                    "tid": 0,
                    "ts": k["start_s"] * 1e6,
                    "dur": k["sim_time_s"] * 1e6,
                    "args": args,
                }
            )
        with open(path, "w") as f:
            json.dump(
                {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"clock": "simulated device time"}}, f
            )
