"""Spyre interpreter speed: the same region run on the Spyre target and on the
TPU target, side by side in one process (issue 21 target: Spyre within 3x).

Each contender builds the same program on "tpu" tensors with its target active
and flushes it (``.cpu()`` of the result); wall time of the whole step is
counted, medians of warm repeats (a target switch drops compiled kernels, so
each target runs its repeats in turn). The regions are a float16 MLP-like
step (matmul, bias, gelu, layer_norm, softmax, sum) and a float32 one, then
``softmax(x, 0)`` of a 1000x300 bfloat16 tensor (dim 0 is the split rows: a
ring reduction with a normalizing second pass on Spyre), and the ring
programs added on 2026-12-05 on the same tensor: ``cummax(x, 0)`` (a scan of
(value, index) pairs) and ``linalg.vector_norm(x, 2, 0)`` (f32 sums of df16
powers), and the order statistics on the ring (2026-12-05, branch spyre21e:
per-core sorted runs merged in core order): ``sort(x, 0)``, ``topk(x, 8, 0)``
and ``median(x, 0)``, with ``kthvalue``, ``nanmedian`` and ``mode`` (topk,
kthvalue, median and nanmedian by radix selection since branch spyre21f),
and ``mse_loss(x * 0.5, x)`` (a two-operand loss summed over the ring, branch
spyre21f).

    PYTHONPATH=. python benchmarks/spyre_interpreter.py [--repeats 15] [--cpu-time] [--only softmax]

``--only TEXT`` keeps the rows whose name contains TEXT (alternated runs of
one row take seconds instead of minutes). ``--cpu-time`` counts the process's
CPU seconds (time.process_time) on one ATen thread instead of wall time: on a
shared, loaded machine wall times swing by several x between runs, CPU time
much less.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import clock, interleave  # noqa: E402

import torch_tpu_eager as tte  # noqa: E402
from torch_tpu_eager import env as tpu_env  # noqa: E402


def make_step(dtype, n=256, d=512, h=256, timer=clock):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(d, h, generator=g) / d**0.5).to(dtype)
    b = torch.randn(h, generator=g).to(dtype)

    def step():
        def run():
            dx, dw, db = x.to("tpu"), w.to("tpu"), b.to("tpu")
            t0 = timer()
            y = F.gelu(dx @ dw + db)
            z = F.layer_norm(y, (h,))
            out = torch.softmax(z * 2 + y, dim=-1).sum(dim=0)
            out.cpu()
            return timer() - t0

        return run

    return step


def make_ring_step(dtype=torch.bfloat16, shape=(1000, 300), timer=clock, op=lambda t: torch.softmax(t, dim=0)):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)

    def step():
        def run():
            dx = x.to("tpu")
            t0 = timer()
            out = op(dx)
            (out[0] if isinstance(out, tuple) else out).cpu()
            return timer() - t0

        return run

    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="warm repeats per figure (at most 3 with TORCH_TPU_QUICK=1)")
    p.add_argument("--cpu-time", action="store_true", help="CPU seconds on one ATen thread instead of wall time")
    p.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="run only the rows whose name contains TEXT (repeatable; e.g. --only softmax: a run in seconds)",
    )
    args = p.parse_args(argv)
    if tpu_env.get("TORCH_TPU_QUICK"):  # smoke run (docs' commands under test): few repeats
        args.repeats = min(args.repeats, 3)
    timer = clock
    if args.cpu_time:
        torch.set_num_threads(1)
        timer = time.process_time
    before = tte.get_target()
    try:
        cases = [(str(dtype), make_step(dtype, timer=timer)) for dtype in (torch.float16, torch.float32)]
        cases.append(("softmax(x, 0) bf16", make_ring_step(timer=timer)))
        cases.append(("cummax(x, 0) bf16", make_ring_step(timer=timer, op=lambda t: torch.cummax(t, 0))))
        cases.append(
            ("norm(x, dim=0) bf16", make_ring_step(timer=timer, op=lambda t: torch.linalg.vector_norm(t, 2, 0)))
        )
        cases.append(("sort(x, 0) bf16", make_ring_step(timer=timer, op=lambda t: torch.sort(t, 0))))
        cases.append(("topk(x, 8, 0) bf16", make_ring_step(timer=timer, op=lambda t: torch.topk(t, 8, 0))))
        cases.append(("median(x, 0) bf16", make_ring_step(timer=timer, op=lambda t: torch.median(t, 0))))
        cases.append(("kthvalue(x,300,0)", make_ring_step(timer=timer, op=lambda t: torch.kthvalue(t, 300, 0))))
        cases.append(("nanmedian(x, 0)", make_ring_step(timer=timer, op=lambda t: torch.nanmedian(t, 0))))
        cases.append(("mode(x, 0) bf16", make_ring_step(timer=timer, op=lambda t: torch.mode(t, 0))))
        cases.append(("mse_loss(x/2, x)", make_ring_step(timer=timer, op=lambda t: F.mse_loss(t * 0.5, t))))
        if args.only:
            cases = [(name, make) for name, make in cases if any(text in name for text in args.only)]
        for name, make in cases:
            med = {}
            for target in ("spyre", "tpu-v5e"):
                # Switching targets drops compiled kernels: each target runs its
                # repeats warm, one after the other (interleaving would recompile).
                tte.set_target(target)
                med[target] = statistics.median(interleave({target: make()}, args.repeats, warmup=2)[target])
            s, t = med["spyre"], med["tpu-v5e"]
            print(
                f"{name:19s} spyre {s * 1e3:8.2f} ms  tpu-v5e {t * 1e3:8.2f} ms  "
                f"ratio {s / t:5.2f}x (target <= 3x){' [CPU time, 1 thread]' if args.cpu_time else ''}"
            )
    finally:
        tte.set_target(before)


if __name__ == "__main__":
    main()
