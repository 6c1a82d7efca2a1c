"""Matmul + epilogue (issue 18 item 2): a linear layer followed by elementwise ops on its
result, "tpu" against CPU eager, side by side in one process, interleaved.

On "tpu" each is one region: the product (CPU's GEMM on the whole operands, so values
equal CPU's), then the epilogue as one fused loop reading it; before (commit 42f39e4) the
epilogue ran op by op, one pass over the product per op. Per case: the median ms of
"tpu" (record and flush) and of CPU eager, and the median of per-repeat ratios
(cpu/tpu > 1: tpu faster). Run it with PYTHONPATH pointing at each build to compare.

    PYTHONPATH=. python benchmarks/matmul_epilogue.py [--repeats 15] [--threads 1]
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _timing import bench_args, paired_ratio, summary, tpu_against_cpu  # noqa: E402

import torch_tpu_eager  # noqa: E402

QUICK = os.environ.get("TORCH_TPU_QUICK") == "1"
M, K, N = (64, 64, 64) if QUICK else (2048, 256, 1024)


def linear_relu(x, w, b, r):
    return F.relu(F.linear(x, w, b))


def linear_gelu_tanh_residual(x, w, b, r):
    return F.gelu(F.linear(x, w, b), approximate="tanh") * 0.5 + r


def mm_bias_silu_mul(x, w, b, r):
    return F.silu(x @ w.t() + b) * r


CASES = [
    ("relu(linear(x))", linear_relu),
    ("gelu(linear(x), tanh) * 0.5 + r", linear_gelu_tanh_residual),
    ("silu(x @ w.T + b) * r", mm_bias_silu_mul),
]


def main():
    args = bench_args(__doc__, QUICK)
    print(f"threads {args.threads}, repeats {args.repeats}, x {M}x{K}, w {N}x{K}, load {os.getloadavg()[0]:.1f}")
    print(f"{'case':34} | {'tpu ms':>8} | {'cpu ms':>8} | cpu/tpu")
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(*s, generator=g) for s in ((M, K), (N, K), (N,), (M, N))]
    dev = [t.to("tpu") for t in cpu]
    for label, fn in CASES:
        torch.testing.assert_close(fn(*dev).cpu(), fn(*cpu))

        before = torch_tpu_eager.metrics()["regions_run"]
        out = fn(*dev)
        torch.tpu.synchronize()  # `out` alive: the flush computes it
        regions = torch_tpu_eager.metrics()["regions_run"] - before
        del out
        s = tpu_against_cpu(fn, dev, cpu, args.repeats)
        tpu_ms, cpu_ms = summary(s["tpu"])["median"] * 1e3, summary(s["cpu"])["median"] * 1e3
        ratio = paired_ratio(s["cpu"], s["tpu"])
        print(f"{label:34} | {tpu_ms:8.2f} | {cpu_ms:8.2f} | {ratio:.2f}   ({regions} region(s))")


if __name__ == "__main__":
    main()
