"""Spyre interpreter speed: the same region run on the Spyre target and on the
TPU target, side by side in one process (issue 21 target: Spyre within 3x).

Each contender builds the same program on "tpu" tensors with its target active
and flushes it (``.cpu()`` of the result); the upload of the inputs is outside
the clock. The regions are a float16 MLP-like step (matmul, bias, gelu,
layer_norm, softmax, sum) and a float32 one, then ``softmax(x, 0)`` of a
1000x300 bfloat16 tensor (dim 0 is the split rows: a ring reduction with a
normalizing second pass on Spyre), and the ring programs added on 2026-12-05
on the same tensor: ``cummax(x, 0)`` (a scan of (value, index) pairs) and
``linalg.vector_norm(x, 2, 0)`` (f32 sums of df16 powers), and the order
statistics on the ring (2026-12-05, branch spyre21e: per-core sorted runs
merged in core order): ``sort(x, 0)``, ``topk(x, 8, 0)`` and ``median(x, 0)``,
with ``kthvalue``, ``nanmedian`` and ``mode`` (topk, kthvalue, median and
nanmedian by radix selection since branch spyre21f), and ``mse_loss(x * 0.5,
x)`` (a two-operand loss summed over the ring, branch spyre21f); since branch spyre21c the
bfloat16 step and one row per region kind in bfloat16, float16 and float32: an elementwise
chain of six ops, ``sum(x, 1)``, ``sum(x, 0)``, ``layer_norm``, ``softmax(x, 1)``,
``matmul`` and attention (``--only chain6`` etc.).

    PYTHONPATH=. python benchmarks/spyre_interpreter.py [--repeats 15] [--cpu-time] [--only softmax] [--instructions]

The targets alternate within the run (a switch drops compiled kernels, so each
turn of a target starts with one untimed launch that recompiles, then
``--block`` timed launches, median kept): ``--repeats`` rounds, each one turn
per target in rotating order, and the ratio printed is the median of the
per-round ratios spyre / tpu-v5e (with the rounds' least and largest ratio,
and how many rounds were over 3x): both turns of a round saw the same machine
load, so the ratio does not move with the load the way two medians taken
minutes apart do. ``--only TEXT`` keeps the rows whose name contains TEXT.
``--cpu-time`` counts the process's CPU seconds (time.process_time) on one
ATen thread instead of wall time. ``--instructions`` adds the instructions of
one launch (the same timed part, one ATen thread) on each target, counted by
valgrind's callgrind in a child process per row and target (collection
switched on around the launches only), a column that does not depend on the
load; it takes a minute or more per row (hardware counters, ``perf stat -e
instructions``, are not available on every VM).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import clock, interleave  # noqa: E402

import torch_tpu_eager as tte  # noqa: E402
from torch_tpu_eager import env as tpu_env  # noqa: E402

TARGETS = ("spyre", "tpu-v5e")
LIMIT = 3.0  # the target: spyre / tpu-v5e <= 3x


def mlp_case(dtype, n=256, d=512, h=256):
    """(upload, launch) of the MLP-like step: upload() puts the inputs on the device,
    launch(inputs) runs and flushes the step (the timed part)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(d, h, generator=g) / d**0.5).to(dtype)
    b = torch.randn(h, generator=g).to(dtype)

    def upload():
        return x.to("tpu"), w.to("tpu"), b.to("tpu")

    def launch(inputs):
        dx, dw, db = inputs
        y = F.gelu(dx @ dw + db)
        z = F.layer_norm(y, (h,))
        torch.softmax(z * 2 + y, dim=-1).sum(dim=0).cpu()

    return upload, launch


def ring_case(op, dtype=torch.bfloat16, shape=(1000, 300)):
    """(upload, launch) of ``op`` on a randn bfloat16 tensor split over its dim 0."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)

    def upload():
        return x.to("tpu")

    def launch(dx):
        out = op(dx)
        (out[0] if isinstance(out, tuple) else out).cpu()

    return upload, launch


def tensors_case(op, shapes, dtype, seed=2):
    """(upload, launch) of ``op(*tensors)`` on randn tensors of ``shapes`` and ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*shape, generator=g).to(dtype) for shape in shapes]

    def upload():
        return [x.to("tpu") for x in xs]

    def launch(inputs):
        op(*inputs).cpu()

    return upload, launch


def chain(x):
    """An elementwise chain of six ops (one fused loop on the TPU target)."""
    return (torch.sigmoid(x * 1.5 + 0.25) * x - 0.5).abs()


def attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v over [batch * heads, seq, d] (bmm, scale, softmax, bmm)."""
    return torch.softmax(q @ k.transpose(1, 2) * q.shape[-1] ** -0.5, dim=-1) @ v


# The region kinds of the MLP step one by one, each in the 16-bit dtypes and
# float32 (2026-12-07, branch spyre21c): shapes of the step's tensors (and
# the ring rows' 1000x300).
KIND_DTYPES = (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32))


def kind_cases():
    """[(row name, (upload, launch))] of the single-kind rows."""
    rows = []
    for tag, dt in KIND_DTYPES:
        rows += [
            (f"chain6 {tag}", tensors_case(chain, [(1000, 300)], dt)),
            (f"sum(x, 1) {tag}", tensors_case(lambda x: x.sum(1), [(1000, 300)], dt)),
            (f"sum(x, 0) {tag}", tensors_case(lambda x: x.sum(0), [(1000, 300)], dt)),
            (f"layer_norm {tag}", tensors_case(lambda x: F.layer_norm(x, (300,)), [(1000, 300)], dt)),
            (f"softmax(x, 1) {tag}", tensors_case(lambda x: torch.softmax(x, 1), [(1000, 300)], dt)),
            (f"matmul {tag}", tensors_case(torch.matmul, [(256, 512), (512, 256)], dt)),
            (f"attention {tag}", tensors_case(attention, [(16, 128, 64)] * 3, dt)),
        ]
    return rows


def cases():
    """[(row name, (upload, launch))] in the table's order."""
    rows = [(str(dtype), mlp_case(dtype)) for dtype in (torch.float16, torch.float32, torch.bfloat16)]
    rows += [
        ("softmax(x, 0) bf16", ring_case(lambda t: torch.softmax(t, dim=0))),
        ("cummax(x, 0) bf16", ring_case(lambda t: torch.cummax(t, 0))),
        ("norm(x, dim=0) bf16", ring_case(lambda t: torch.linalg.vector_norm(t, 2, 0))),
        ("sort(x, 0) bf16", ring_case(lambda t: torch.sort(t, 0))),
        ("topk(x, 8, 0) bf16", ring_case(lambda t: torch.topk(t, 8, 0))),
        ("median(x, 0) bf16", ring_case(lambda t: torch.median(t, 0))),
        ("kthvalue(x,300,0)", ring_case(lambda t: torch.kthvalue(t, 300, 0))),
        ("nanmedian(x, 0)", ring_case(lambda t: torch.nanmedian(t, 0))),
        ("mode(x, 0) bf16", ring_case(lambda t: torch.mode(t, 0))),
        ("mse_loss(x/2, x)", ring_case(lambda t: F.mse_loss(t * 0.5, t))),
    ]
    return rows + kind_cases()


def turn(target, upload, launch, block, timer):
    """Seconds of one launch on ``target``: its median over ``block`` timed launches,
    after the switch and one untimed launch (which recompiles)."""
    tte.set_target(target)
    launch(upload())

    def once():
        inputs = upload()
        t0 = timer()
        launch(inputs)
        return timer() - t0

    return statistics.median(interleave({target: once}, block, warmup=0)[target])


def alternated(upload, launch, rounds, block, timer):
    """{target: [seconds per round]}: the targets' turns alternate, in rotating order."""
    seconds = {t: [] for t in TARGETS}
    for r in range(rounds):
        for target in TARGETS[r % 2 :] + TARGETS[: r % 2]:
            seconds[target].append(turn(target, upload, launch, block, timer))
    return seconds


def count_instructions(name, target, launches):
    """Instructions per launch of row ``name`` on ``target`` (one ATen thread), counted
    by callgrind in a child process around ``launches`` launches; None without valgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        cmd += [sys.executable, __file__, "--count-child", name, target, str(launches)]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(out) as f:
            # One "totals:" line per dumped part ("summary:" stays 0 with --instr-atstart=no).
            total = sum(int(n) for n in re.findall(r"^totals: (\d+)", f.read(), re.M))
    return total / launches


def count_child(name, target, launches):
    """The child of count_instructions: warm launches, then ``launches`` launches with
    callgrind's instrumentation on (their inputs uploaded before)."""
    torch.set_num_threads(1)
    upload, launch = dict(cases())[name]
    tte.set_target(target)
    for _ in range(3):
        launch(upload())
    inputs = [upload() for _ in range(launches)]
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    for i in range(launches):
        launch(inputs[i])
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="alternated rounds (at most 2 with TORCH_TPU_QUICK=1)")
    p.add_argument(
        "--block",
        type=int,
        default=3,
        help="timed launches per target turn, their median kept (1 with TORCH_TPU_QUICK=1)",
    )
    p.add_argument("--cpu-time", action="store_true", help="CPU seconds on one ATen thread instead of wall time")
    p.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="run only the rows whose name contains TEXT (repeatable; e.g. --only softmax: a run in seconds)",
    )
    p.add_argument("--instructions", action="store_true", help="add callgrind's instructions per launch on each target")
    p.add_argument("--count-child", nargs=3, metavar=("ROW", "TARGET", "LAUNCHES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.count_child:
        return count_child(args.count_child[0], args.count_child[1], int(args.count_child[2]))
    quick = tpu_env.get("TORCH_TPU_QUICK")
    if quick:  # smoke run (docs' commands under test): two rounds of one launch, one counted launch
        args.repeats, args.block = min(args.repeats, 2), 1
    timer = clock
    if args.cpu_time:
        torch.set_num_threads(1)
        timer = time.process_time
    rows = cases()
    if args.only:
        rows = [(name, case) for name, case in rows if any(text in name for text in args.only)]
    before = tte.get_target()
    try:
        for name, (upload, launch) in rows:
            sec = alternated(upload, launch, args.repeats, args.block, timer)
            ratios = [s / t for s, t in zip(sec["spyre"], sec["tpu-v5e"])]
            s, t = statistics.median(sec["spyre"]), statistics.median(sec["tpu-v5e"])
            over = sum(r > LIMIT for r in ratios)
            line = (
                f"{name:20s} spyre {s * 1e3:7.2f} ms  tpu-v5e {t * 1e3:7.2f} ms  "
                f"ratio {statistics.median(ratios):5.2f}x [{min(ratios):.2f}-{max(ratios):.2f}, "
                f"{over}/{len(ratios)} rounds > {LIMIT:g}x]"
            )
            if args.instructions:
                tte.set_target(before)
                counts = {t: count_instructions(name, t, 1 if quick else 10) for t in TARGETS}
                if None in counts.values():
                    line += "  instructions: no valgrind"
                else:
                    c, d = counts["spyre"], counts["tpu-v5e"]
                    line += f"  instructions {c / 1e6:.2f} M / {d / 1e6:.2f} M = {c / d:.2f}x"
            print(line + (" [CPU time, 1 thread]" if args.cpu_time else ""), flush=True)
    finally:
        tte.set_target(before)


if __name__ == "__main__":
    main()
