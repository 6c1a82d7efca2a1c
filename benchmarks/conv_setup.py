"""Per-call cost of CPU's convolutions at the shapes of run_all's CNN step, and what keeping oneDNN's set-up saves.

The CNN step of benchmarks/run_all.py (section 7: Conv2d(3, 8, 3, padding=1) on 32x3x16x16, then
Conv2d(8, 16, 3, padding=1) on 32x8x8x8) runs four convolution calls a step, on "tpu" as in CPU
eager: the forward of each and the backward of each (grad_weight and grad_bias for the first,
whose input needs no gradient; all three for the second). "tpu" runs them through the same
aten::convolution / aten::convolution_backward CPU kernels (oneDNN via ideep), so their per-call
cost is the same on both sides. This script times those calls in CPU eager, microseconds per call
(the best of --blocks blocks of --iters calls, at --threads intra-op threads), beside the forward
through PyTorch's prepacked path (``torch.ops.mkldnn_prepacked.conv2d_prepack`` once, then
``conv2d_run``: the weight reordered once and ideep's primitive descriptor and primitive kept
across calls), and checks that the prepacked result is bit-equal to ``torch.convolution``'s.
With ``--callgrind`` (under ``valgrind --tool=callgrind --instr-atstart=no``) it instead runs
--iters calls of the one case ``--case`` with instrumentation on around them only.

    python benchmarks/conv_setup.py [--threads 1] [--iters 500] [--blocks 5]
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all  # noqa: E402  (imports torch_tpu_eager; its env registry holds TORCH_TPU_QUICK)

# (name, input channels, output channels, height = width, output_mask of the backward)
LAYERS = (("conv1 3->8 16x16", 3, 8, 16, [False, True, True]), ("conv2 8->16 8x8", 8, 16, 8, [True, True, True]))
BATCH = 32
PAD = STRIDE = DIL = [1, 1]


def cases():
    """{case name: callable} for every timed call, and the (name, bit-equal) of each prepacked check."""
    gen = torch.Generator().manual_seed(0)
    calls, equal = {}, []
    for name, cin, cout, hw, mask in LAYERS:
        x = torch.randn(BATCH, cin, hw, hw, generator=gen)
        w = torch.randn(cout, cin, 3, 3, generator=gen)
        b = torch.randn(cout, generator=gen)
        y = torch.convolution(x, w, b, STRIDE, PAD, DIL, False, [0, 0], 1)
        gy = torch.randn(y.shape, generator=gen)
        ctx = torch.ops.mkldnn_prepacked.conv2d_prepack(w, b, STRIDE, PAD, DIL, 1, list(x.shape), "none")
        equal.append((name, torch.equal(torch.ops.mkldnn_prepacked.conv2d_run(x, ctx), y)))
        calls[f"{name} forward"] = lambda x=x, w=w, b=b: torch.convolution(x, w, b, STRIDE, PAD, DIL, False, [0, 0], 1)
        calls[f"{name} forward, prepacked"] = lambda x=x, ctx=ctx: torch.ops.mkldnn_prepacked.conv2d_run(x, ctx)
        calls[f"{name} backward {''.join('T' if m else 'F' for m in mask)}"] = (
            lambda gy=gy, x=x, w=w, cout=cout, mask=mask: torch.ops.aten.convolution_backward(
                gy, x, w, [cout], STRIDE, PAD, DIL, False, [0, 0], 1, mask
            )
        )
    return calls, equal


def best_us(fn, iters, blocks):
    """Microseconds per call: the best of ``blocks`` blocks of ``iters`` calls, after a warm-up."""
    for _ in range(min(iters, 50)):
        fn()
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return 1e6 * best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=500, help="calls per block (default 500; 20 with TORCH_TPU_QUICK=1)")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per case (default 5; 2 with TORCH_TPU_QUICK=1)")
    ap.add_argument("--callgrind", action="store_true", help="toggle callgrind around --iters calls of --case")
    ap.add_argument("--case", default="conv2 8->16 8x8 forward", help="with --callgrind: the case run")
    args = ap.parse_args()
    if run_all.tpu_env.get("TORCH_TPU_QUICK"):
        args.iters, args.blocks = min(args.iters, 20), min(args.blocks, 2)
    torch.set_num_threads(args.threads)
    calls, equal = cases()
    if args.callgrind:
        fn = calls[args.case]
        for _ in range(20):
            fn()
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
        for _ in range(args.iters):
            fn()
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)
        return
    print(f"CPU eager convolutions of run_all's CNN step, batch {BATCH}, {args.threads} thread(s), us per call")
    for name, fn in calls.items():
        print(f"  {name:40}{best_us(fn, args.iters, args.blocks):9.1f}")
    for name, same in equal:
        print(f"  {name}: prepacked forward bit-equal to torch.convolution: {same}")
    if not all(same for _, same in equal):
        sys.exit(1)


if __name__ == "__main__":
    main()
