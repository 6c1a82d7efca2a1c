"""Benchmarks of the "tpu" device against CPU eager and torch.compile, side by side.

All contenders run in this one process and alternate within every repeat; every figure
is the median of the repeats, and every ratio the median of the per-repeat ratios. Each
benchmark first checks its result against CPU PyTorch and is not timed if that fails.

1. record overhead: N ops ``a + b`` / ``a.mul(b)`` on 1-element float32 tensors. For
   "tpu" only the recording is timed (the flush happens outside the clock, and the
   queue limit is raised so that no auto-flush lands inside it). Then the cost of a
   flush that hits the JIT cache: a 16-op chain on tiny tensors is recorded, and only
   ``torch.tpu.synchronize()`` is timed.
2. chain16: 16 elementwise ops on a 1000x1000 float32 tensor, result read to the host,
   on "tpu", CPU eager and torch.compile (CPU, inductor, compiled once before timing).
3. bytes moved by chain16 on "tpu" (the ``bytes_read`` + ``bytes_materialized`` counters
   per run) against the floor of reading its input once and writing its output once.
4. softmax over the last dim, layer_norm (with weight and bias) and layer_norm of a sum
   ``F.layer_norm(x + r)`` on 4096x1024 float32, "tpu" vs CPU eager, twice: result read to
   the host (the tpu figure then includes a 16 MB device-to-host copy that CPU eager does
   not make), and result left on the device (``torch.tpu.synchronize()``, as device benchmarks time kernels); then
   ``torch.logsumexp(x * 2 + b, -1)`` on 4096x1024 float32, result read to the host
   (checked bit for bit against CPU). Each "-> host" row is followed by the minor page faults
   per call of each contender (getrusage, a count the machine's load does not change): CPU
   eager's 16 MiB results come from reused heap or from fresh pages depending on its
   allocator's state, which moves its time by 3-6x between processes (docs/performance.md,
   rows25); the row says which state each run measured.
5. digits MLP training step (64-128-64-10, batch 64, Adam), loss read every 10 steps.
6. char-LM training step (examples/train_char_lm.py's model, config and AdamW; forward,
   backward, clip_grad_norm_, step), loss read every step, "tpu" vs CPU eager; then the
   compiles counted over all timed steps, which follow 3 warm-up steps (target: 0).

7. training steps, each on one thread and then on two, "tpu" vs CPU eager vs
   torch.compile (the model wrapped in torch.compile, inductor, compiled before timing;
   the optimizer eager): an MLP with Adam; a 2-layer nanoGPT (SDPA, GELU, LayerNorm,
   tied head) with AdamW and clip_grad_norm_; a CNN (two conv + BatchNorm) with SGD
   momentum. Loss read to the host every step. ``--only training`` runs just these.

Every contender runs with torch's own intra-op thread count (one per core) unless
``--threads`` says otherwise. The "tpu" executor's fused loops split across the same
threads (at::parallel_for) and it runs CPU kernels too, so both sides get the same
threads. ``--threads 1`` gives steadier figures on a machine that other jobs share.

    python benchmarks/run_all.py                 # full run (about 1 minute on 2 cores)
    python benchmarks/run_all.py --quick         # smoke test: 3 repeats, small sizes
    python benchmarks/run_all.py --json out.json # also write every sample as JSON
    python benchmarks/run_all.py --only training # the three training steps, 1 and 2 threads
    python benchmarks/run_all.py --only overhead # record overhead and the cache-hit flush (1.)
    python benchmarks/run_all.py --only ici      # only the simulated ICI collectives table

8. simulated ICI collectives (benchmarks/ici_collectives.py): all_reduce / all_gather / reduce_scatter of
   1-256 MiB over 2, 4 and 8 chips of every TPU target, simulated time and bus bandwidth from
   torch_tpu_eager.ici's cost model (not timed). Printed after the table.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find _timing however we are loaded
from _timing import clock, faults_counted, interleave, paired_ratio, summary  # noqa: E402

import torch_tpu_eager  # noqa: E402  (registers the "tpu" device and torch.tpu)
from torch_tpu_eager import env as tpu_env  # noqa: E402

TPU = "tpu"
SEED = 0

FULL = dict(
    repeats=15,
    record_n=2000,
    flushes=100,
    chain_size=1000,
    chain_iters=3,
    mlp_steps=30,
    check_steps=10,
    rows_shape=(4096, 1024),
    rows_iters=3,
    lm_steps=10,
    lm_check_steps=5,
    train_steps=5,
    train_check_steps=3,
)
QUICK = dict(
    repeats=3,
    record_n=200,
    flushes=10,
    chain_size=128,
    chain_iters=1,
    mlp_steps=10,
    check_steps=3,
    rows_shape=(256, 128),
    rows_iters=1,
    lm_steps=2,
    lm_check_steps=2,
    train_steps=2,
    train_check_steps=2,
)
LM_WARMUP_STEPS = 3  # the target: no compiles after step 3


# ---------------------------------------------------------------- helpers


class Report:
    """Rows of the table, correctness checks and device metrics, for printing and JSON."""

    def __init__(self):
        self.rows = []
        self.checks = {}
        self.metrics = {}

    def check(self, name, fn):
        """Runs ``fn`` (which asserts against CPU); records and returns whether it passed."""
        try:
            fn()
        except AssertionError as exc:
            self.checks[name] = {"passed": False, "error": str(exc).strip().splitlines()[0]}
            return False
        self.checks[name] = {"passed": True}
        return True

    def row(self, bench, unit, samples, scale, ratios=(), notes=None):
        """Adds a row: ``samples`` {contender: seconds per repeat} shown times ``scale``.

        ``ratios`` are (numerator, denominator) contender pairs, reported as the median
        of per-repeat ratios. ``notes`` {contender: text} replaces a missing figure.
        """
        values = {
            name: {k: (v * scale if k in ("median", "min", "max") else v) for k, v in summary(s).items()}
            for name, s in samples.items()
        }
        self.rows.append(
            {
                "benchmark": bench,
                "unit": unit,
                "values": values,
                "samples_s": samples,
                "ratios": {
                    f"{n}/{d}": paired_ratio(samples[n], samples[d]) for n, d in ratios if n in samples and d in samples
                },
                "notes": dict(notes or {}),
            }
        )

    def faults_row(self, bench, faults, repeats):
        """Adds a row of minor page faults per call, {contender: [per repeat]}, warm-up
        rounds dropped: median [min-max]. CPU eager's result buffers come either from
        reused heap or from fresh pages (4,096 faults per 16 MiB), which process the
        allocator's state leaves it in varies, and its time by 3-6x (docs/performance.md, rows25)."""
        notes = {}
        for name, counts in faults.items():
            kept = counts[-repeats:]
            notes[name] = f"{statistics.median(kept):.0f} [{min(kept):.0f}-{max(kept):.0f}]"
        self.rows.append(
            {"benchmark": bench, "unit": "faults", "values": {}, "samples_s": {}, "ratios": {}, "notes": notes}
        )

    def failed_row(self, bench, reason):
        """Adds a row for a benchmark that was not timed, showing ``reason``."""
        self.rows.append(
            {"benchmark": bench, "unit": "", "values": {}, "samples_s": {}, "ratios": {}, "notes": {"tpu": reason}}
        )


def metrics_delta(before, after):
    """Counter differences between two ``torch_tpu_eager.metrics()`` snapshots."""
    out = {}
    for key, value in after.items():
        if key == "flush_reasons":
            reasons = {r: c - before[key].get(r, 0) for r, c in value.items()}
            out[key] = {r: c for r, c in reasons.items() if c}
        elif isinstance(value, (int, float)) and key != "ops_per_region":
            out[key] = value - before.get(key, 0)
    return out


def per_run(delta, runs):
    """Per-run view of a metrics delta: the figures the chain16 / MLP notes print."""
    regions = delta.get("regions_run", 0)
    return {
        "runs": runs,
        "flushes_per_run": delta.get("flushes", 0) / runs,
        "regions_per_run": regions / runs,
        "ops_recorded_per_run": delta.get("ops_recorded", 0) / runs,
        "ops_executed_per_run": delta.get("ops_executed", 0) / runs,
        "ops_per_region": delta.get("ops_executed", 0) / regions if regions else 0.0,
        "cache_hits": delta.get("cache_hits", 0),
        "compiles": delta.get("compiles", 0),
        "plans_built": delta.get("plans_built", "-"),
        "library_calls_per_run": delta.get("library_calls", 0) / runs,
        "mb_materialized_per_run": delta.get("bytes_materialized", 0) / runs / 1e6,
        "flush_reasons": delta.get("flush_reasons", {}),
    }


def machine_info():
    """What the figures depend on: cores, threads, versions, CPU model, date, commit."""
    cpu_model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=5,
            ).stdout.strip()
            or "?"
        )
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model,
        "commit": commit,
        # Other processes compete for the same cores; the figures are only as quiet as this.
        "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


# ---------------------------------------------------------------- 1. record overhead


def _record_add(a, b, n):
    for _ in range(n):
        a + b


def _record_mul(a, b, n):
    for _ in range(n):
        a.mul(b)


def bench_record(cfg, report):
    """Per-op cost of recording an op on "tpu" against running it on CPU eager."""
    a_cpu, b_cpu = torch.tensor([1.5]), torch.tensor([-0.25])
    a, b = a_cpu.to(TPU), b_cpu.to(TPU)
    torch.tpu.synchronize()
    n = cfg["record_n"]
    previous = torch_tpu_eager.queue_limits()
    # N ops must stay in the queue, or an auto-flush would be timed as recording.
    torch_tpu_eager.set_queue_limits(max_ops=10**6, max_bytes=previous[1])
    try:
        for label, loop, op in (("a + b", _record_add, torch.add), ("a.mul(b)", _record_mul, torch.mul)):
            bench = f"record {label} (1 elem, N={n})"
            if not report.check(
                bench, lambda: torch.testing.assert_close(op(a, b).cpu(), op(a_cpu, b_cpu), rtol=0, atol=0)
            ):
                report.failed_row(bench, "CHECK FAILED")
                continue
            auto_flushes = [0]

            def run_tpu(loop=loop):
                torch.tpu.synchronize()
                flushes0 = torch_tpu_eager.metrics()["flushes"]
                t0 = clock()
                loop(a, b, n)
                seconds = clock() - t0
                auto_flushes[0] += torch_tpu_eager.metrics()["flushes"] - flushes0
                torch.tpu.synchronize()
                return seconds / n

            def run_cpu(loop=loop):
                t0 = clock()
                loop(a_cpu, b_cpu, n)
                return (clock() - t0) / n

            samples = interleave({"tpu": run_tpu, "cpu": run_cpu}, cfg["repeats"])
            # A flush inside the timed region would make the figure meaningless.
            report.check(
                f"{bench}: no flush while recording",
                lambda: _assert_equal(auto_flushes[0], 0, "flushes inside the timed region"),
            )
            report.row(bench, "us/op", samples, 1e6, ratios=[("tpu", "cpu")])
    finally:
        torch_tpu_eager.set_queue_limits(*previous)


def _assert_equal(actual, expected, what):
    assert actual == expected, f"{what}: {actual} (expected {expected})"


# ---------------------------------------------------------------- 2.-3. chain16 and its bytes


def chain16(x):
    """16 elementwise ops; every intermediate stays in a range where exp/sin are tame."""
    y = x + 1.0
    y = y * x
    y = y - 0.5
    y = y / 3.0
    y = y.sin()
    y = y.exp()
    y = y.relu()
    y = y.tanh()
    y = y.sigmoid()
    y = y - x
    y = y.abs()
    y = y * 0.25
    y = y + x
    y = y.cos()
    y = y.neg()
    y = y * y
    return y


CHAIN_OPS = 16


def bench_flush(cfg, report):
    """Cost of a flush whose regions are all JIT cache hits (16-op chain, 4x4 tensors)."""
    bench = f"flush, cache hit ({CHAIN_OPS}-op chain, 4x4)"
    x_cpu = torch.randn(4, 4, generator=torch.Generator().manual_seed(SEED))
    x = x_cpu.to(TPU)
    torch.tpu.synchronize()
    if not report.check(bench, lambda: torch.testing.assert_close(chain16(x).cpu(), chain16(x_cpu))):
        report.failed_row(bench, "CHECK FAILED")
        return
    flushes = cfg["flushes"]

    def run_flush():
        total = 0.0
        for _ in range(flushes):
            y = chain16(x)  # recorded, outside the clock
            t0 = clock()
            torch.tpu.synchronize()
            total += clock() - t0
            del y
        return total / flushes

    before = torch_tpu_eager.metrics()
    samples = interleave({"tpu": run_flush}, cfg["repeats"])
    delta = metrics_delta(before, torch_tpu_eager.metrics())
    runs = (cfg["repeats"] + 1) * flushes  # the interleave also runs one warmup round
    stats = per_run(delta, runs)
    report.metrics["flush_cache_hit"] = stats
    report.check(
        f"{bench}: every flush hits the cache",
        lambda: _assert_equal(stats["compiles"], 0, "compiles during timed flushes"),
    )
    report.row(bench, "us/flush", samples, 1e6)
    per_op = {"tpu": [s / CHAIN_OPS for s in samples["tpu"]]}
    report.row("  same, per op of the chain", "us/op", per_op, 1e6)


def bench_chain16(cfg, report):
    """chain16 on a large tensor read to the host: "tpu" vs CPU eager vs torch.compile."""
    size = cfg["chain_size"]
    bench = f"chain16 {size}x{size} f32 -> host"
    x_cpu = torch.randn(size, size, generator=torch.Generator().manual_seed(SEED))
    x = x_cpu.to(TPU)
    torch.tpu.synchronize()
    expected = chain16(x_cpu)
    if not report.check(bench, lambda: torch.testing.assert_close(chain16(x).cpu(), expected)):
        report.failed_row(bench, "CHECK FAILED")
        return

    notes = {}
    compiled = None
    try:
        t0 = clock()
        compiled = torch.compile(chain16, backend="inductor")
        got = compiled(x_cpu)  # compiles here, before any timing
        report.metrics["torch_compile_seconds"] = clock() - t0
        torch.testing.assert_close(got, expected)
    except AssertionError as exc:  # inductor's own numerics, not the device's: a note, not a check
        notes["compile"] = "mismatch vs eager: " + str(exc).strip().splitlines()[0][:60]
        compiled = None
    except Exception as exc:  # noqa: BLE001  (any compiler failure is reported, not raised)
        notes["compile"] = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:60]}"
        report.metrics["torch_compile_error"] = traceback.format_exc()  # in --json, for diagnosis
        compiled = None

    iters = cfg["chain_iters"]
    tpu_runs = [0]

    def run_tpu():
        t0 = clock()
        for _ in range(iters):
            chain16(x).cpu()
        tpu_runs[0] += iters
        return (clock() - t0) / iters

    def run_cpu():
        t0 = clock()
        for _ in range(iters):
            chain16(x_cpu).cpu()
        return (clock() - t0) / iters

    contenders = {"tpu": run_tpu, "cpu": run_cpu}
    if compiled is not None:

        def run_compile():
            t0 = clock()
            for _ in range(iters):
                compiled(x_cpu).cpu()
            return (clock() - t0) / iters

        contenders["compile"] = run_compile

    before = torch_tpu_eager.metrics()
    samples = interleave(contenders, cfg["repeats"])
    delta = metrics_delta(before, torch_tpu_eager.metrics())
    report.metrics["chain16"] = per_run(delta, tpu_runs[0])
    report.row(bench, "ms", samples, 1e3, ratios=[("cpu", "tpu"), ("compile", "tpu")], notes=notes)


def bench_chain16_bytes(cfg, report):
    """Bytes chain16 moves on "tpu" per run, against reading its input and writing its output once."""
    size = cfg["chain_size"]
    bench = f"chain16 {size}x{size} bytes moved"
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(SEED)).to(TPU)
    torch.tpu.synchronize()
    floor = 2 * x.numel() * x.element_size()  # one input read + one output of the same size written
    moved = []
    for _ in range(cfg["repeats"]):
        before = torch_tpu_eager.metrics()
        chain16(x).cpu()
        after = torch_tpu_eager.metrics()
        moved.append(
            (after["bytes_read"] - before["bytes_read"]) + (after["bytes_materialized"] - before["bytes_materialized"])
        )
    # Counters, not clocks: the row reuses the table's median machinery with bytes for seconds.
    report.row(
        bench,
        "MB/run",
        {"tpu": moved, "floor": [floor] * len(moved)},
        1e-6,
        ratios=[("tpu", "floor")],
        notes={"cpu": f"floor {floor / 1e6:.3g} (in+out)"},
    )


# ---------------------------------------------------------------- 4. row-wise reductions


def _layer_norm_params(cols):
    g = torch.Generator().manual_seed(SEED + 2)
    return torch.randn(cols, generator=g), torch.randn(cols, generator=g)


def bench_rows(cfg, report):
    """softmax(dim=-1) and layer_norm over the rows of a large matrix, read to the host;
    then layer_norm of a sum (x + r), whose producer "tpu" fuses into the row loop."""
    rows, cols = cfg["rows_shape"]
    x_cpu = torch.randn(rows, cols, generator=torch.Generator().manual_seed(SEED))
    r_cpu = torch.randn(rows, cols, generator=torch.Generator().manual_seed(SEED + 3))
    w_cpu, b_cpu = _layer_norm_params(cols)
    x, w, b = x_cpu.to(TPU), w_cpu.to(TPU), b_cpu.to(TPU)
    residual = {id(x): r_cpu.to(TPU), id(x_cpu): r_cpu}  # the r of each contender's x
    torch.tpu.synchronize()
    cases = (
        ("softmax(dim=-1)", lambda t, w, b: F.softmax(t, dim=-1)),
        ("layer_norm", lambda t, w, b: F.layer_norm(t, (cols,), w, b)),
        ("layer_norm(x + r)", lambda t, w, b: F.layer_norm(t + residual[id(t)], (cols,), w, b)),
    )
    iters = cfg["rows_iters"]
    for label, fn in cases:
        bench = f"{label} {rows}x{cols} f32 -> host"
        expected = fn(x_cpu, w_cpu, b_cpu)
        if not report.check(bench, lambda fn=fn: torch.testing.assert_close(fn(x, w, b).cpu(), expected)):
            report.failed_row(bench, "CHECK FAILED")
            continue

        def run_tpu(fn=fn):
            t0 = clock()
            for _ in range(iters):
                fn(x, w, b).cpu()
            return (clock() - t0) / iters

        def run_tpu_sync(fn=fn):
            t0 = clock()
            for _ in range(iters):
                y = fn(x, w, b)  # alive at the flush: a dropped result would be dead code
                torch.tpu.synchronize()
                del y
            return (clock() - t0) / iters

        def run_cpu(fn=fn):
            t0 = clock()
            for _ in range(iters):
                fn(x_cpu, w_cpu, b_cpu).cpu()
            return (clock() - t0) / iters

        contenders, faults = faults_counted({"tpu": run_tpu, "cpu": run_cpu}, iters)
        samples = interleave(contenders, cfg["repeats"])
        report.row(bench, "ms", samples, 1e3, ratios=[("cpu", "tpu")])
        report.faults_row(f"  {label}, minor page faults per call", faults, cfg["repeats"])
        samples = interleave({"tpu": run_tpu_sync, "cpu": run_cpu}, cfg["repeats"])
        report.row(f"  {label}, result kept on device", "ms", samples, 1e3, ratios=[("cpu", "tpu")])


def _assert_bit_equal(actual, expected):
    assert torch.equal(actual, expected), f"max difference {(actual - expected).abs().max().item()}"


def bench_logsumexp(cfg, report):
    """torch.logsumexp(x * 2 + b, -1) over the rows of a large matrix, read to the host.
    b has x's shape (a broadcast operand would end the fused loop's region on "tpu")."""
    rows, cols = cfg["rows_shape"]
    g = torch.Generator().manual_seed(SEED + 3)
    x_cpu, b_cpu = torch.randn(rows, cols, generator=g), torch.randn(rows, cols, generator=g)
    x, b = x_cpu.to(TPU), b_cpu.to(TPU)
    torch.tpu.synchronize()
    bench = f"logsumexp(x * 2 + b, -1) {rows}x{cols} f32 -> host"
    expected = torch.logsumexp(x_cpu * 2 + b_cpu, -1)
    # The device computes logsumexp as CPU does, so the check is bit for bit.
    if not report.check(bench, lambda: _assert_bit_equal(torch.logsumexp(x * 2 + b, -1).cpu(), expected)):
        report.failed_row(bench, "CHECK FAILED")
        return
    iters = cfg["rows_iters"]

    def run(t, u):
        def one_repeat():
            t0 = clock()
            for _ in range(iters):
                torch.logsumexp(t * 2 + u, -1).cpu()
            return (clock() - t0) / iters

        return one_repeat

    contenders, faults = faults_counted({"tpu": run(x, b), "cpu": run(x_cpu, b_cpu)}, iters)
    samples = interleave(contenders, cfg["repeats"])
    report.row(bench, "ms", samples, 1e3, ratios=[("cpu", "tpu")])
    report.faults_row("  logsumexp, minor page faults per call", faults, cfg["repeats"])


# ---------------------------------------------------------------- 5. digits MLP


def digits_data(n_batches, batch=64):
    """(x, y) batches of the digits shape: load_digits if scikit-learn is there, else synthetic."""
    try:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.int64)
        source = "sklearn load_digits"
    except ImportError:
        g = torch.Generator().manual_seed(SEED)
        x = torch.randint(0, 17, (1797, 64), generator=g).float() / 16.0
        y = torch.randint(0, 10, (1797,), generator=g)
        source = "synthetic (scikit-learn not installed)"
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SEED + 1))
    batches = [(x[perm[i * batch : (i + 1) * batch]], y[perm[i * batch : (i + 1) * batch]]) for i in range(n_batches)]
    return batches, source


class Trainer:
    """One model + Adam on one device, its batches staged there; steps through them in turn."""

    def __init__(self, device, batches):
        torch.manual_seed(SEED)
        # Built on CPU from one seed and moved: identical initial weights on every device.
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        ).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.batches = [(xb.to(device), yb.to(device)) for xb, yb in batches]
        self.i = 0

    def step(self):
        """One training step; returns the loss tensor (on the device, not read)."""
        xb, yb = self.batches[self.i % len(self.batches)]
        self.i += 1
        loss = F.cross_entropy(self.model(xb), yb)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def steps(self, n, read_every=10):
        """``n`` steps reading the loss to the host every ``read_every`` steps and after the last."""
        for k in range(1, n + 1):
            loss = self.step()
            if k % read_every == 0 or k == n:
                loss.item()


def time_trainer_steps(tpu, cpu, steps, repeats):
    """Times ``steps`` training steps of the tpu and CPU trainers, interleaved.

    Returns (samples in seconds per step, tpu metrics delta, tpu steps run).
    """
    tpu_runs = [0]

    def run_tpu():
        t0 = clock()
        tpu.steps(steps)
        tpu_runs[0] += steps
        return (clock() - t0) / steps

    def run_cpu():
        t0 = clock()
        cpu.steps(steps)
        return (clock() - t0) / steps

    before = torch_tpu_eager.metrics()
    samples = interleave({"tpu": run_tpu, "cpu": run_cpu}, repeats)
    return samples, metrics_delta(before, torch_tpu_eager.metrics()), tpu_runs[0]


def bench_mlp(cfg, report):
    """Training steps of the digits MLP on "tpu" vs CPU eager."""
    bench = "digits MLP step (Adam, batch 64)"
    batches, source = digits_data(n_batches=10)
    report.metrics["mlp_data"] = source

    def check():
        tpu, cpu = Trainer(TPU, batches), Trainer("cpu", batches)
        losses_tpu = torch.stack([tpu.step().detach() for _ in range(cfg["check_steps"])]).cpu()
        losses_cpu = torch.stack([cpu.step().detach() for _ in range(cfg["check_steps"])])
        torch.testing.assert_close(losses_tpu, losses_cpu)
        for (name, p_tpu), p_cpu in zip(tpu.model.named_parameters(), cpu.model.parameters()):
            torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), msg=lambda m, n=name: f"{n}: {m}")

    if not report.check(bench, check):
        report.failed_row(bench, "CHECK FAILED")
        return

    tpu, cpu = Trainer(TPU, batches), Trainer("cpu", batches)
    samples, delta, tpu_steps = time_trainer_steps(tpu, cpu, cfg["mlp_steps"], cfg["repeats"])
    report.metrics["mlp_step"] = per_run(delta, tpu_steps)
    report.row(bench, "ms/step", samples, 1e3, ratios=[("cpu", "tpu")])


# ---------------------------------------------------------------- 6. char-LM


def _char_lm():
    """examples/train_char_lm.py as a module: the benchmark trains exactly its model."""
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import train_char_lm

    return train_char_lm


class LMTrainer:
    """The example's char-LM + AdamW on one device, a fixed pool of batches staged there."""

    def __init__(self, lm, device, batches, vocab_size):
        self.model = lm.build_model(device, vocab_size, SEED)  # same CPU-seeded weights everywhere
        self.model.train()
        self.opt = lm.make_optimizer(self.model)
        self.batches = [(xb.to(device), yb.to(device)) for xb, yb in batches]
        self.i = 0

    def step(self):
        """Forward, backward, clip_grad_norm_(1.0), AdamW step; returns the loss, unread."""
        xb, yb = self.batches[self.i % len(self.batches)]
        self.i += 1
        _, loss = self.model(xb, yb)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss

    def steps(self, n):
        """``n`` steps, the loss read to the host after every one (as a logging loop does)."""
        for _ in range(n):
            self.step().item()


def bench_char_lm(cfg, report):
    """Training steps of the example char-LM on "tpu" vs CPU eager, and compiles after warm-up."""
    lm = _char_lm()
    data, itos = lm.load_text()
    gen = torch.Generator().manual_seed(SEED + 1)
    batches = [lm.get_batch(data, lm.Config(vocab_size=len(itos)).block_size, gen) for _ in range(10)]
    bench = f"char-LM step (AdamW+clip, batch {lm.BATCH_SIZE})"

    def check():
        # Default fused math (GELU's tanh a few ulp from CPU's): the losses and the
        # first step's gradients within float32 tolerance. Parameters after AdamW steps
        # are not compared there: Adam's first update is lr * sign(grad) wherever a
        # gradient is tiny, so an ulp of difference moves such a weight by up to 2 * lr.
        tpu, cpu = LMTrainer(lm, TPU, batches, len(itos)), LMTrainer(lm, "cpu", batches, len(itos))
        losses = [(tpu.step().detach(), cpu.step().detach())]
        for (name, p_tpu), p_cpu in zip(tpu.model.named_parameters(), cpu.model.parameters()):
            torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, msg=lambda m, n=name: f"{n} grad: {m}")
        losses += [(tpu.step().detach(), cpu.step().detach()) for _ in range(cfg["lm_check_steps"] - 1)]
        torch.testing.assert_close(torch.stack([t for t, _ in losses]).cpu(), torch.stack([c for _, c in losses]))
        # CPU's math routines in the fused loops: every parameter bit-equal after the steps.
        previous = torch_tpu_eager.fused_math()
        torch_tpu_eager.set_fused_math("cpu")
        try:
            tpu, cpu = LMTrainer(lm, TPU, batches, len(itos)), LMTrainer(lm, "cpu", batches, len(itos))
            for _ in range(cfg["lm_check_steps"]):
                tpu.step(), cpu.step()
            for (name, p_tpu), p_cpu in zip(tpu.model.named_parameters(), cpu.model.parameters()):
                torch.testing.assert_close(
                    p_tpu.detach().cpu(), p_cpu.detach(), rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}"
                )
        finally:
            torch_tpu_eager.set_fused_math(previous)

    if not report.check(bench, check):
        report.failed_row(bench, "CHECK FAILED")
        return

    tpu, cpu = LMTrainer(lm, TPU, batches, len(itos)), LMTrainer(lm, "cpu", batches, len(itos))
    tpu.steps(LM_WARMUP_STEPS)
    cpu.steps(LM_WARMUP_STEPS)
    samples, delta, tpu_steps = time_trainer_steps(tpu, cpu, cfg["lm_steps"], cfg["repeats"])
    stats = per_run(delta, tpu_steps)
    report.metrics["char_lm_step"] = stats
    report.row(bench, "ms/step", samples, 1e3, ratios=[("cpu", "tpu")])
    # A target, not a correctness check: a miss shows in the table, it does not fail the run.
    report.rows.append(
        {
            "benchmark": f"  compiles after {LM_WARMUP_STEPS} warm-up steps",
            "unit": "compiles",
            "values": {},
            "samples_s": {},
            "ratios": {},
            "notes": {"tpu": f"{stats['compiles']} in {tpu_steps} steps"},
        }
    )


# ---------------------------------------------------------------- 7. training steps

TRAINING_THREADS = (1, 2)


class _MLP(torch.nn.Module):
    def __init__(self, d_in, hidden, classes):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(d_in, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        )

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class _GPTBlock(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class _NanoGPT(torch.nn.Module):
    """nanoGPT's shape at toy size: token + position embeddings, pre-LN blocks with SDPA, tied head."""

    def __init__(self, vocab, block, d, heads, layers):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.blocks = torch.nn.ModuleList(_GPTBlock(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class _CNN(torch.nn.Module):
    def __init__(self, c, classes):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, c, 3, padding=1),
            torch.nn.BatchNorm2d(c),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(c, 2 * c, 3, padding=1),
            torch.nn.BatchNorm2d(2 * c),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(2 * c, classes),
        )

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def _training_cases(quick):
    """(name, model factory, optimizer factory, clip, batches factory) of the three training steps."""
    g = lambda: torch.Generator().manual_seed(SEED + 2)  # noqa: E731
    if quick:
        mlp, gpt, cnn = (64, 64, 10, 32), dict(vocab=32, block=16, d=32, heads=2, batch=4), (4, 8, 16)
    else:
        mlp, gpt, cnn = (256, 256, 10, 64), dict(vocab=65, block=64, d=64, heads=4, batch=8), (8, 16, 32)

    def mlp_batches():
        gen = g()
        return [
            (torch.randn(mlp[3], mlp[0], generator=gen), torch.randint(0, mlp[2], (mlp[3],), generator=gen))
            for _ in range(4)
        ]

    def gpt_batches():
        gen = g()
        return [
            (
                torch.randint(0, gpt["vocab"], (gpt["batch"], gpt["block"]), generator=gen),
                torch.randint(0, gpt["vocab"], (gpt["batch"], gpt["block"]), generator=gen),
            )
            for _ in range(4)
        ]

    def cnn_batches():
        gen = g()
        return [
            (torch.randn(cnn[2], 3, cnn[1], cnn[1], generator=gen), torch.randint(0, 10, (cnn[2],), generator=gen))
            for _ in range(4)
        ]

    return [
        (
            f"MLP {mlp[0]}-{mlp[1]}-{mlp[1]}-{mlp[2]} + Adam, batch {mlp[3]}",
            lambda: _MLP(mlp[0], mlp[1], mlp[2]),
            lambda ps: torch.optim.Adam(ps, lr=1e-3),
            False,
            mlp_batches,
        ),
        (
            f"nanoGPT 2L d{gpt['d']} T{gpt['block']} SDPA + AdamW + clip, batch {gpt['batch']}",
            lambda: _NanoGPT(gpt["vocab"], gpt["block"], gpt["d"], gpt["heads"], 2),
            lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
            True,
            gpt_batches,
        ),
        (
            f"CNN 2conv+BN {cnn[1]}x{cnn[1]} + SGD momentum, batch {cnn[2]}",
            lambda: _CNN(cnn[0], 10),
            lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
            False,
            cnn_batches,
        ),
    ]


class StepTrainer:
    """One training step (forward, backward, optional clip_grad_norm_(1.0), optimizer step), loss read each step.

    The model is built on CPU from one seed and moved, so every contender starts from the
    same weights; ``compiled`` wraps the model in torch.compile (inductor; optimizer eager).
    """

    def __init__(self, device, make_model, make_opt, clip, batches, compiled=False):
        torch.manual_seed(SEED)
        self.model = make_model().to(device)
        self.model.train()
        self.opt = make_opt(self.model.parameters())
        self.fn = torch.compile(self.model) if compiled else self.model
        self.clip = clip
        self.batches = [(a.to(device), b.to(device)) for a, b in batches]
        self.i = 0

    def step(self):
        xb, yb = self.batches[self.i % len(self.batches)]
        self.i += 1
        loss = self.fn(xb, yb)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.detach()

    def steps(self, n):
        for _ in range(n):
            self.step().item()


def warm_trainers(model, threads, quick, compiled=False):
    """(name, {"tpu": StepTrainer, "cpu": ..., "compile": ... with ``compiled``}) of the training step
    ``model`` ("mlp", "gpt" or "cnn"; the small models when ``quick``) at ``threads`` intra-op threads,
    float32 matmuls at "highest", each trainer warmed up three steps (compiles happen there)."""
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("highest")
    name, make_model, make_opt, clip, make_batches = _training_cases(quick)[("mlp", "gpt", "cnn").index(model)]
    contenders = {"tpu": ("tpu", False), "cpu": ("cpu", False)}
    if compiled:
        contenders["compile"] = ("cpu", True)
    trainers = {
        key: StepTrainer(device, make_model, make_opt, clip, make_batches(), compiled=compile_it)
        for key, (device, compile_it) in contenders.items()
    }
    for trainer in trainers.values():
        trainer.steps(3)
    return name, trainers


def bench_training(cfg, report, use_compile=True):
    """The three training steps on "tpu", CPU eager and torch.compile, on one and on two threads."""
    previous = torch.get_num_threads()
    for name, make_model, make_opt, clip, make_batches in _training_cases(cfg["repeats"] <= 3):
        batches = make_batches()

        def check():
            tpu = StepTrainer(TPU, make_model, make_opt, clip, batches)
            cpu = StepTrainer("cpu", make_model, make_opt, clip, batches)
            # The first step's gradients, then the losses of the next steps. Parameters are
            # not compared: a gradient that is zero in exact arithmetic (attention's key bias)
            # holds rounding noise, which Adam scales to a full lr-sized update.
            torch.testing.assert_close(tpu.step().cpu(), cpu.step())
            for p_tpu, p_cpu in zip(tpu.model.parameters(), cpu.model.parameters()):
                torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad)
            n = cfg["train_check_steps"]
            torch.testing.assert_close(
                torch.stack([tpu.step() for _ in range(n)]).cpu(), torch.stack([cpu.step() for _ in range(n)])
            )

        if not report.check(name, check):
            report.failed_row(name, "CHECK FAILED")
            continue
        tpu = StepTrainer(TPU, make_model, make_opt, clip, batches)
        cpu = StepTrainer("cpu", make_model, make_opt, clip, batches)
        notes, comp = {}, None
        if use_compile:
            try:
                t0 = clock()
                comp = StepTrainer("cpu", make_model, make_opt, clip, batches, compiled=True)
                comp.steps(2)  # compiles forward and backward here, before timing
                report.metrics[f"torch_compile_seconds {name}"] = clock() - t0
            except Exception as exc:  # noqa: BLE001  (a compiler failure is a note, not an error)
                notes["compile"] = f"failed: {type(exc).__name__}"
                comp = None
        steps = cfg["train_steps"]
        for threads in TRAINING_THREADS:
            torch.set_num_threads(threads)
            contenders = {}
            for key, trainer in (("tpu", tpu), ("cpu", cpu), ("compile", comp)):
                if trainer is None:
                    continue

                def run(trainer=trainer):
                    t0 = clock()
                    trainer.steps(steps)
                    return (clock() - t0) / steps

                contenders[key] = run
            tpu.steps(2)  # warm: compiles of this thread count happen here
            before = torch_tpu_eager.metrics()
            samples = interleave(contenders, cfg["repeats"])
            delta = metrics_delta(before, torch_tpu_eager.metrics())
            report.metrics[f"train {name} {threads}t"] = per_run(delta, steps * (cfg["repeats"] + 1))
            report.row(
                f"{name}, {threads} thread{'s' if threads > 1 else ''}",
                "ms/step",
                samples,
                1e3,
                ratios=[("cpu", "tpu"), ("compile", "tpu")],
                notes=notes,
            )
    torch.set_num_threads(previous)


# ---------------------------------------------------------------- output

CONTENDERS = (("tpu", "tpu"), ("cpu", "cpu eager"), ("compile", "cpu compile"))


def _fmt_value(v):
    if v is None:
        return "-"
    med = v["median"]
    text = f"{med:.3g}" if med < 100 else f"{med:.0f}"
    return f"{text} ±{v['spread'] * 100:.0f}%"


def format_table(report, info, cfg, quick):
    """The table as text: one row per figure, medians ± half the interquartile range."""
    lines = [
        f"torch_tpu_eager benchmarks{' (--quick)' if quick else ''} | {info['date']} | commit {info['commit']}",
        f"nproc {info['nproc']}, torch threads {info['torch_threads']}, torch {info['torch']}, "
        f"python {info['python']}, cpu: {info['cpu']}, load average at start {info['loadavg_1min']}",
        f"each figure: median of {cfg['repeats']} interleaved repeats (± half the IQR); "
        "ratios: median of per-repeat ratios, X/tpu > 1 means tpu is faster than X",
    ]
    load = info["loadavg_1min"]
    if load is not None and load >= info["nproc"]:
        lines.append(
            f"WARNING: load average {load} >= {info['nproc']} cores: other jobs share this machine, "
            "figures are noisy (paired ratios suffer least)"
        )
    lines.append("")
    header = ["benchmark", "unit"] + [label for _, label in CONTENDERS] + ["ratios"]
    body = []
    for row in report.rows:
        cells = [row["benchmark"], row["unit"]]
        for key, _ in CONTENDERS:
            if key in row["notes"]:
                cells.append(row["notes"][key])
            else:
                cells.append(_fmt_value(row["values"].get(key)))
        cells.append(", ".join(f"{k} = {v:.3g}" for k, v in row["ratios"].items()) or "-")
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    fmt = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines.append(fmt(header))
    lines.append("-+-".join("-" * w for w in widths))
    lines.extend(fmt(r) for r in body)
    return "\n".join(lines)


def format_metrics(report):
    """Device counters per run for the flush, chain16 and MLP benchmarks."""
    lines = []
    titles = (
        ("flush_cache_hit", "flush (cache hit), per flush"),
        ("chain16", "chain16, per run"),
        ("mlp_step", "digits MLP, per step"),
        ("char_lm_step", "char-LM, per step"),
    )
    for key, title in titles:
        m = report.metrics.get(key)
        if not m:
            continue
        reasons = ", ".join(f"{r} {c / m['runs']:.2g}" for r, c in sorted(m["flush_reasons"].items()))
        lines.append(
            f"tpu metrics, {title} ({m['runs']} runs): regions {m['regions_per_run']:.3g}, "
            f"ops/region {m['ops_per_region']:.3g}, ops recorded {m['ops_recorded_per_run']:.3g}, "
            f"executed {m['ops_executed_per_run']:.3g}, flushes {m['flushes_per_run']:.3g} "
            f"[{reasons or 'none'}], library calls {m['library_calls_per_run']:.3g}, "
            f"MB materialized {m['mb_materialized_per_run']:.3g}; in total cache hits "
            f"{m['cache_hits']}, compiles {m['compiles']}"
        )
    for key, m in report.metrics.items():
        if key.startswith("train ") and m:
            lines.append(
                f"tpu metrics, {key[6:]}, per step: regions {m['regions_per_run']:.3g}, "
                f"ops/region {m['ops_per_region']:.3g}, flushes {m['flushes_per_run']:.3g}, "
                f"library calls {m['library_calls_per_run']:.3g}; in total cache hits "
                f"{m['cache_hits']}, compiles {m['compiles']}, plans built {m.get('plans_built', '-')}"
            )
    if "torch_compile_seconds" in report.metrics:
        lines.append(
            f"torch.compile (inductor) of chain16: {report.metrics['torch_compile_seconds']:.1f} s, once, before timing"
        )
    if "mlp_data" in report.metrics:
        lines.append(f"digits data: {report.metrics['mlp_data']}")
    return "\n".join(lines)


def format_checks(report):
    """One line if every check against CPU passed, else one line per failed check."""
    failed = {k: v for k, v in report.checks.items() if not v["passed"]}
    if not failed:
        return f"correctness vs CPU: all {len(report.checks)} checks passed"
    return "\n".join(
        [f"correctness vs CPU: {len(failed)} of {len(report.checks)} checks FAILED"]
        + [f"  {k}: {v['error']}" for k, v in failed.items()]
    )


def run(argv=None):
    """Runs every benchmark; returns (report, machine info, config, parsed arguments)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        default=tpu_env.get("TORCH_TPU_QUICK"),
        help="few repeats and small sizes (smoke test)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results, with every sample, here")
    parser.add_argument(
        "--repeats", type=int, default=None, help="repeats per figure (default 15; with --quick 3, and at most 3)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads for every contender (default 0: torch's own choice, "
        "one per core; 1 is steadier on a machine other jobs share)",
    )
    parser.add_argument(
        "--only",
        choices=("all", "training", "overhead", "rows", "ici"),
        default="all",
        help="'training': only the three training steps (7.), on one and two threads; "
        "'overhead': only the record and cache-hit flush rows (1.); "
        "'rows': only the row reductions (4.: softmax, layer_norm, logsumexp); "
        "'ici': only the simulated ICI collectives (8.)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        default=tpu_env.get("TORCH_TPU_QUICK"),
        help="skip torch.compile in the training steps (its compile takes minutes here; "
        "on by default with TORCH_TPU_QUICK=1)",
    )
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        cfg["repeats"] = min(args.repeats, QUICK["repeats"]) if args.quick else args.repeats
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's choice) or more")

    # Process-wide settings, restored after so that a caller (the smoke test) keeps its own.
    previous = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        # With as many threads as cores (the default), the intra-op pool's barriers stall
        # whenever another process holds a core: on a 2-core machine shared with other jobs
        # this made figures 10-300x slower, unevenly; --threads 1 avoids it.
        # The MLP check compares with CPU at f32; the device's matmul precision follows this.
        torch.set_float32_matmul_precision("highest")
        info = machine_info()
        report = Report()
        t0 = clock()
        if args.only in ("all", "overhead"):
            bench_record(cfg, report)
            bench_flush(cfg, report)
        if args.only == "all":
            bench_chain16(cfg, report)
            bench_chain16_bytes(cfg, report)
        if args.only in ("all", "rows"):
            bench_rows(cfg, report)
            bench_logsumexp(cfg, report)
        if args.only == "all":
            bench_mlp(cfg, report)
            bench_char_lm(cfg, report)
        if args.only in ("all", "training"):
            bench_training(cfg, report, use_compile=not args.no_compile)
        if args.only in ("all", "ici"):
            import ici_collectives as ici_bench  # benchmarks/ici_collectives.py: the cost model's table, nothing timed

            report.metrics["ici"] = ici_bench.simulated_rows()
        report.metrics["wall_seconds"] = clock() - t0
    finally:
        torch.set_num_threads(previous[0])
        torch.set_float32_matmul_precision(previous[1])
    return report, info, cfg, args


def main(argv=None):
    """Runs the benchmarks and prints the table; returns 0 if every correctness check passed."""
    report, info, cfg, args = run(argv)
    if report.rows:
        print(format_table(report, info, cfg, args.quick))
        print()
    metrics_text = format_metrics(report)
    if metrics_text:
        print(metrics_text)
    if report.metrics.get("ici"):
        import ici_collectives as ici_bench

        print()
        print(ici_bench.format_table(report.metrics["ici"]))
        print()
    print(format_checks(report))
    print(f"wall time {report.metrics['wall_seconds']:.0f} s")
    ok = all(c["passed"] for c in report.checks.values())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "config": cfg,
                    "quick": args.quick,
                    "all_checks_passed": ok,
                    "checks": report.checks,
                    "rows": report.rows,
                    "metrics": report.metrics,
                },
                f,
                indent=1,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
