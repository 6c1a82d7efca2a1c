"""Elementwise chains from training code that use the fused loops' wider vocabulary
(issue 18 item 5): "tpu" against CPU eager, side by side in one process, interleaved.

Each chain is one region; before the lowering table (commit 3f23aeb) every one of them ran
op by op through CPU kernels, since one op of each was outside the float32 vocabulary.
Per chain: the median ms of "tpu" (record and flush) and of CPU eager, and the median of
per-repeat ratios (cpu/tpu > 1: tpu faster). The int64 index-math chains (1M elements) run
in the integer loop (executors/tpu/fused_int.cpp); before it they ran op by op.

    PYTHONPATH=. python benchmarks/fused_vocab.py [--repeats 15] [--threads 1]
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _timing import bench_args, paired_ratio, summary, tpu_against_cpu  # noqa: E402

import torch_tpu_eager  # noqa: E402, F401

aten = torch.ops.aten
N = (4096, 1024)  # 4M elements
QUICK = os.environ.get("TORCH_TPU_QUICK") == "1"  # the docs test's short form: small tensors, 2 repeats
if QUICK:
    N = (64, 1024)


def swiglu(a, b):
    return F.silu(a) * b


def gelu_tanh_bias(x, b):
    return F.gelu(x + b[0], approximate="tanh")


def gelu_backward_chain(g, x):
    return aten.gelu_backward(g * 0.5, x) + g


def leaky_where_clamp(x, y):
    return torch.where(x > 0, x, x * 0.01).clamp(-3.0, 3.0) + y


def relu_backward_scaled(g, x):
    return aten.threshold_backward(g, x, 0.0) * 0.5 + x


def sq_diff(x, y):
    return (x - y).pow(2) * 0.5


CHAINS = [
    ("silu(a) * b", swiglu),
    ("gelu(x + b, tanh)", gelu_tanh_bias),
    ("gelu_backward(g * 0.5, x) + g", gelu_backward_chain),
    ("where(x > 0, x, 0.01x).clamp + y", leaky_where_clamp),
    ("threshold_backward(g, x) * 0.5 + x", relu_backward_scaled),
    ("(x - y) ** 2 * 0.5", sq_diff),
]


def index_math(i, j):
    return (i * 31 + 7) % 1000 // 3


def hash_mask(i, j):
    h = (i ^ (i >> 7)) * 0x9E3779B1 + j
    return torch.where((h & 15) < 3, h % 977, -j)


INT_CHAINS = [
    ("(i * 31 + 7) % 1000 // 3", index_math),
    ("where((h & 15) < 3, h % 977, -j), h hash", hash_mask),
]
INT_N = 1 << 20 if not QUICK else 1 << 14


def main():
    args = bench_args(__doc__, QUICK)
    print(f"threads {args.threads}, repeats {args.repeats}, tensors {N[0]}x{N[1]}, load {os.getloadavg()[0]:.1f}")
    print(f"{'chain':38} | {'dtype':8} | {'tpu ms':>8} | {'cpu ms':>8} | cpu/tpu")
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(*N, generator=g).to(dtype)
        b = torch.randn(*N, generator=g).to(dtype)
        da, db = a.to("tpu"), b.to("tpu")
        for label, fn in CHAINS:
            torch.testing.assert_close(fn(da, db).cpu(), fn(a, b), rtol=2e-2, atol=1e-2)

            s = tpu_against_cpu(fn, (da, db), (a, b), args.repeats)
            tpu_ms, cpu_ms = summary(s["tpu"])["median"] * 1e3, summary(s["cpu"])["median"] * 1e3
            ratio = paired_ratio(s["cpu"], s["tpu"])
            print(f"{label:38} | {str(dtype)[6:]:8} | {tpu_ms:8.2f} | {cpu_ms:8.2f} | {ratio:.2f}")
    g = torch.Generator().manual_seed(1)
    i = torch.randint(-(2**40), 2**40, (INT_N,), generator=g)
    j = torch.randint(-(2**62), 2**62, (INT_N,), generator=g)
    di, dj = i.to("tpu"), j.to("tpu")
    for label, fn in INT_CHAINS:
        assert torch.equal(fn(di, dj).cpu(), fn(i, j))
        s = tpu_against_cpu(fn, (di, dj), (i, j), args.repeats)
        tpu_ms, cpu_ms = summary(s["tpu"])["median"] * 1e3, summary(s["cpu"])["median"] * 1e3
        ratio = paired_ratio(s["cpu"], s["tpu"])
        print(f"{label:38} | {'int64':8} | {tpu_ms:8.2f} | {cpu_ms:8.2f} | {ratio:.2f}")


if __name__ == "__main__":
    main()
