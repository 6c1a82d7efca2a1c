"""Spyre: mark_dynamic shapes over a sweep of sizes (issue 21 item 3).

Cases (``--case``, default all), each a fresh float16 tensor per size marked
dynamic (range 1..512) on the Spyre target:

- ``slice``: ``(16, n)`` marked at dim 1, ``d[:, 1:] * d[:, 1:] + 1.0``;
- ``cat``: ``(16, n)`` marked at dim 1, ``torch.cat([d, d], 1) + 1.0`` (a
  created size ``2n``);
- ``pad``: ``(16, n)`` marked at dim 1, ``F.pad(d, (1, 1)) * 2.0`` (``n+2``);
- ``2d``: ``(n, n // 2 + 3)`` marked at both dims, ``d * d + 1.0`` (element
  count ``s0*s1``);
- ``t``: the same tensor, ``d.t() * 2.0 + 1.0`` (a transposed view: each
  mark follows its dim through the strides, ``sizes=[s1, s0]``);
- ``fixed``: ``(16, n)`` marked at dim 1, ``d[:, :2] * 2.0`` (a fixed slice
  far from the base: the 2 stays a number, the pitch is ``s0``).
- ``readpad``: ``(16, n)`` marked at dim 1, ``p = F.pad(d, (1, 1))`` made by
  one flush (``p.cpu()``), then ``p[:, 1:] * 2.0`` in the next (the buffer
  carries the mark of the ``n`` it follows: ``s0`` its own ``n + 2``);
- ``unsqueeze``: ``(16, n)`` marked at dim 1, ``d.unsqueeze(0) * 2.0`` (a view
  of another rank keeps the mark on the dim of its stride);
- ``flatten``: ``(n, 16)`` marked at dim 0, ``d.flatten() * 2.0`` (the merged
  dim is ``16*s0``);
- ``repeat``: ``(16, n)`` marked at dim 1, ``d.repeat(1, 2) * 2.0`` (the
  buffer's ``[16, 2*s0]`` view);
- ``stack``: ``(16, n)`` marked at dim 1, ``torch.stack([d, d], 2) * 2.0``.
- ``split``: ``(16, 4q)`` marked at dim 1 (``4q`` the multiple of 4 at or
  below n), ``d.view(16, 4, -1) * 2.0`` (the marked dim split into a fixed
  factor and a quotient: ``sizes=[16, 4, s0]``, s0 the quotient);
- ``splitin``: the same tensor, ``d.view(16, -1, 4) * 2.0`` (the quotient
  outside the factor: ``sizes=[16, s0, 4] strides=[4*s0, 4, 1]``).
- ``cat2``: two tensors ``(16, n)`` and ``(16, n // 2 + 3)``, each marked at
  dim 1, ``torch.cat([d, e], 1) * 2.0`` (``s0+s1``);
- ``cat2out``: the same into an ``out=`` buffer of ``n + n // 2 + 3`` made
  outside the region, then ``* 2.0`` (the buffer's size follows the sum of
  two marked sizes);
- ``readcat2``: the same cat made by one flush, then ``p[:, 1:] * 2.0`` in
  the next (the result carries the mark of the sum).
- ``heads``: ``(16, 64r)`` marked at dim 1 (``r = n // 8`` rows: 5 to 55,
  range 1..4096), ``d.view(16, -1, 64) * 2.0`` (attention's heads split:
  the fixed 64 is the smaller part; both parts are symbols);
- ``after``: ``(16, n)`` and ``(16, n // 2 - 3)``, each marked at dim 1,
  ``d[:, m:] * 2.0`` and ``e * 3.0`` in one region (``n - m`` at offset
  ``m``: ``n`` is ``m + t``).
- ``qkv``: ``(16, 3n)`` marked at dim 1 (range 1..1536), ``q, k, v =
  d.chunk(3, 1)``, ``q * k + v`` (equal parts: the part is the symbol,
  the marked size ``3*s0``);
- ``qkvheads``: ``(16, 3 * 64r)`` marked at dim 1 (``r = n // 8``, range
  1..12288), each of q, k, v split into heads, ``q.view(16, -1, 64) *
  k.view(...) + v.view(...)`` (a split of an equal part: ``3*s0*s1``);
- ``heads64``: as ``heads`` with ``(n + 1) // 7`` rows of 64 (5 to 64: the
  sweep's last shape, n = 4096, is 64 rows of 64, equal factors).
- ``qfirst``: ``(16, 3n)`` marked at dim 1 (range 1..1536), ``d.chunk(3,
  1)[0] * 2.0`` (only the first equal part, unsplit: ``s0`` the part, the
  pitch ``3*s0``);
- ``tstep``: ``(n, 16)`` marked at dim 0, ``d.t()[:, ::2] * 2.0`` (a step
  slice of a transposed view: ``s0`` its size ``ceil(n / 2)``, ``n`` is
  ``2*s0+s1-1``, ``s1`` in 0..1);
- ``step3``: ``(16, n)`` marked at dim 1, ``d[:, 1::3] * 2.0`` (the pitch
  ``3*s0+s1-1``);
- ``dropcls``: ``(16, 64r + 1)`` marked at dim 1 (``r = n // 8``, range
  1..4096), ``d[:, 1:].view(16, -1, 64) * 2.0`` (a split of a slice: the
  pitch ``s0*s1+1``).
- ``mlp``: ``(n, 64)`` marked at dim 0, a pre-norm MLP block (layer_norm,
  ``@ w1`` (64, 256), gelu, ``@ w2`` (256, 64), residual): with ``--sizes
  16,64,77,256`` n meets the weights' sizes (``4n``, ``16n``, ``n = 64``);
- ``attn``: ``(n, 64)`` marked at dim 0, a pre-norm attention block (4
  heads of 16: qkv ``chunk(3, -1)``, ``view(n, 4, 16).transpose(0, 1)``,
  softmax in float32, ``@ wo``, residual).
- ``llama``: ``(n, 64)`` marked at dim 0, a llama-like block (RMSNorm, the
  attention above with rotary embedding and a causal mask sliced from
  ``(1024, ...)`` buffers, ``cos[:n]``, ``mask[:n, :n]``, a SwiGLU MLP of
  ``chunk(2, -1)`` of ``@ w13`` (64, 512), ``@ w2``).

For each n, the first launch of the shape (a bind of the compiled program, or
a new program when none fits) and then ``--repeats`` warm launches. Prints,
per case, ``compiles``, ``plans_built`` and the thread CPU time of the first
launches (summed) and the median warm launch. Run it against another build by
pointing PYTHONPATH at that checkout (the script only uses public API).
``--target tpu-v5e`` runs the same regions on the TPU target (the JIT key is
shared: its compile counts follow the same marks).

    PYTHONPATH=. python benchmarks/spyre_dynamic_slice.py [--shapes 12] [--repeats 5] [--case slice]
        [--target spyre] [--sizes 16,64,77]
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import torch_tpu_eager as tte


def read_later(p):
    """``p`` made by one flush, then read by the next."""
    p.cpu()
    return p[:, 1:] * 2.0


def cat_out(d, e):
    """``cat([d, e], 1)`` into a buffer made outside the region."""
    buf = torch.empty(16, d.shape[1] + e.shape[1], dtype=d.dtype, device=d.device)
    torch.cat([d, e], 1, out=buf)
    return buf * 2.0


def two(n):
    """The shapes of the two-tensor cases."""
    return [(16, n), (16, n // 2 + 3)]


def qkv(d):
    """Attention's q, k, v: three equal parts of the marked dim."""
    q, k, v = d.chunk(3, 1)
    return q * k + v


def qkv_heads(d):
    """q, k, v each split into heads of 64."""
    q, k, v = (p.view(16, -1, 64) for p in d.chunk(3, 1))
    return q * k + v


def after(d, e):
    """``d[:, m:]`` (m the size of e) and e, two results of one region."""
    return d[:, e.shape[1] :] * 2.0, e * 3.0


_W = {}


def _weights(device):
    """The blocks' weights (float16, made once per device)."""
    if device not in _W:
        g = torch.Generator().manual_seed(0)
        shapes = dict(g=(64,), b=(64,), w1=(64, 256), w2=(256, 64), wqkv=(64, 192), wo=(64, 64), w13=(64, 512))
        shapes.update(cos=(1024, 16), sin=(1024, 16), mask=(1024, 1024))
        _W[device] = {k: (torch.randn(*s, generator=g) * 0.1).half().to(device) for k, s in shapes.items()}
    return _W[device]


def mlp(x):
    """A pre-norm MLP block."""
    w = _weights(x.device.type)
    h = F.layer_norm(x, (64,), w["g"], w["b"])
    return x + F.gelu(h @ w["w1"]) @ w["w2"]


def attn(x):
    """A pre-norm attention block, 4 heads of 16."""
    w, n = _weights(x.device.type), x.shape[0]
    q, k, v = (
        t.view(n, 4, 16).transpose(0, 1) for t in (F.layer_norm(x, (64,), w["g"], w["b"]) @ w["wqkv"]).chunk(3, -1)
    )
    p = torch.softmax(((q @ k.transpose(-2, -1)) * 0.25).float(), -1).half()
    return x + (p @ v).transpose(0, 1).reshape(n, 64) @ w["wo"]


def _rms(x, g):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).half() * g


def _rope(t, cos, sin):
    """Rotary embedding of (4, n, 16) heads by (n, 16) tables (half rotation)."""
    return t * cos + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin


def llama(x):
    """A llama-like block: RMSNorm, 4 heads of 16 with rotary embedding and
    a causal mask sliced from (512, ...) buffers, SwiGLU MLP (chunk(2))."""
    w, n = _weights(x.device.type), x.shape[0]
    q, k, v = (t.view(n, 4, 16).transpose(0, 1) for t in (_rms(x, w["g"]) @ w["wqkv"]).chunk(3, -1))
    cos, sin = w["cos"][:n], w["sin"][:n]
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    s = (q @ k.transpose(-2, -1)) * 0.25 + w["mask"][:n, :n]
    p = torch.softmax(s.float(), -1).half()
    x = x + (p @ v).transpose(0, 1).reshape(n, 64) @ w["wo"]
    a, b = (_rms(x, w["b"]) @ w["w13"]).chunk(2, -1)
    return x + (F.silu(a) * b) @ w["w2"]


CASES = {
    "slice": (lambda n: (16, n), (1,), lambda d: d[:, 1:] * d[:, 1:] + 1.0),
    "cat": (lambda n: (16, n), (1,), lambda d: torch.cat([d, d], 1) + 1.0),
    "pad": (lambda n: (16, n), (1,), lambda d: F.pad(d, (1, 1)) * 2.0),
    "2d": (lambda n: (n, n // 2 + 3), (0, 1), lambda d: d * d + 1.0),
    "t": (lambda n: (n, n // 2 + 3), (0, 1), lambda d: d.t() * 2.0 + 1.0),
    "fixed": (lambda n: (16, n), (1,), lambda d: d[:, :2] * 2.0),
    "readpad": (lambda n: (16, n), (1,), lambda d: read_later(F.pad(d, (1, 1)))),
    "unsqueeze": (lambda n: (16, n), (1,), lambda d: d.unsqueeze(0) * 2.0),
    "flatten": (lambda n: (n, 16), (0,), lambda d: d.flatten() * 2.0),
    "repeat": (lambda n: (16, n), (1,), lambda d: d.repeat(1, 2) * 2.0),
    "stack": (lambda n: (16, n), (1,), lambda d: torch.stack([d, d], 2) * 2.0),
    "split": (lambda n: (16, n // 4 * 4), (1,), lambda d: d.view(16, 4, -1) * 2.0),
    "splitin": (lambda n: (16, n // 4 * 4), (1,), lambda d: d.view(16, -1, 4) * 2.0),
    "cat2": (two, (1,), lambda d, e: torch.cat([d, e], 1) * 2.0),
    "cat2out": (two, (1,), cat_out),
    "readcat2": (two, (1,), lambda d, e: read_later(torch.cat([d, e], 1))),
    "heads": (lambda n: (16, n // 8 * 64), (1,), lambda d: d.view(16, -1, 64) * 2.0),
    "after": (lambda n: [(16, n), (16, n // 2 - 3)], (1,), after),
    "qkv": (lambda n: (16, 3 * n), (1,), qkv),
    "qkvheads": (lambda n: (16, 3 * 64 * (n // 8)), (1,), qkv_heads),
    "heads64": (lambda n: (16, (n + 1) // 7 * 64), (1,), lambda d: d.view(16, -1, 64) * 2.0),
    "qfirst": (lambda n: (16, 3 * n), (1,), lambda d: d.chunk(3, 1)[0] * 2.0),
    "tstep": (lambda n: (n, 16), (0,), lambda d: d.t()[:, ::2] * 2.0),
    "step3": (lambda n: (16, n), (1,), lambda d: d[:, 1::3] * 2.0),
    "dropcls": (lambda n: (16, n // 8 * 64 + 1), (1,), lambda d: d[:, 1:].view(16, -1, 64) * 2.0),
    "mlp": (lambda n: (n, 64), (0,), mlp),
    "attn": (lambda n: (n, 64), (0,), attn),
    "llama": (lambda n: (n, 64), (0,), llama),
}
# The marks' upper bound (the heads split's sizes go to 3520, 4096 for heads64).
UPPER = {"heads": 4096, "qkv": 1536, "qkvheads": 12288, "heads64": 8192, "qfirst": 1536, "dropcls": 4096}


def to_host(out):
    """The case's result(s) on the host (one flush)."""
    return [o.cpu() for o in out] if isinstance(out, tuple) else out.cpu()


def inputs(shape, n):
    """The case's float16 tensors of size n on the device (one or two)."""
    shapes = shape(n)
    shapes = shapes if isinstance(shapes, list) else [shapes]
    return [torch.randn(*s).half().to("tpu") for s in shapes]


def sweep(case, sizes, repeats):
    shape, dims, fn = CASES[case]
    # Warm the op path once outside the sweep (a size outside the range).
    to_host(fn(*inputs(shape, 1000)))
    tte.reset_metrics()
    firsts, warms = [], []
    for n in sizes:
        ds = inputs(shape, n)
        for d in ds:
            for dim in dims:
                tte.mark_dynamic(d, dim, 1, UPPER.get(case, 512))
        t0 = time.thread_time()
        to_host(fn(*ds))
        firsts.append(time.thread_time() - t0)
        w = []
        for _ in range(repeats):
            t0 = time.thread_time()
            to_host(fn(*ds))
            w.append(time.thread_time() - t0)
        warms.append(statistics.median(w))
    m = tte.metrics()
    return m["compiles"], m["plans_built"], sum(firsts), statistics.median(warms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=3 if os.environ.get("TORCH_TPU_QUICK") else 12)
    ap.add_argument("--repeats", type=int, default=2 if os.environ.get("TORCH_TPU_QUICK") else 5)
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--target", default="spyre", help="spyre (default), tpu-v5e or tpu-v6e")
    ap.add_argument("--sizes", help="comma-separated n (instead of --shapes' sweep)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tte.set_target(args.target)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [40 + 37 * i for i in range(args.shapes)]
    print(f"target {args.target}, shapes n = {sizes}")
    print(f"{'case':>9} {'compiles':>8} {'plans_built':>11} {'first launches ms':>17} {'warm ms':>8}")
    for case in args.case or list(CASES):
        c, p, first, warm = sweep(case, sizes, args.repeats)
        print(f"{case:>9} {c:>8} {p:>11} {first * 1e3:>17.2f} {warm * 1e3:>8.3f}")


if __name__ == "__main__":
    main()
