"""Spyre's 16-bit numerics (issue 21): every op computes in float32 from the
df16 values of its inputs and rounds its result once to df16 (matmul and
reductions accumulate in f32 and round once on store).

The reference here is independent of the project's codec: df16 (DLFloat
1-6-9: sign, 6 exponent bits with bias 31, 9 fraction bits, no subnormals,
magnitudes <= 2**-31 are zero, one NaN/Inf code) is computed from its
definition with float64 arithmetic (frexp, round half away from zero), and
each reference op runs CPU's float32 kernel on float32 copies of the inputs.
"""

import math

import numpy as np
import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu

DF16_MAX = 2.0**32 * (1 + 510 / 512)
DF16_ZERO_LIMIT = 2.0**-31  # this magnitude and below hold code 0


def df16_ref(x):
    """float32 tensor -> float32 tensor of the nearest df16 values (ties away from zero)."""
    a = x.detach().to(torch.float64).numpy()
    m, e = np.frexp(np.abs(a))  # |a| = m * 2**e, 0.5 <= m < 1
    q = np.floor(m * 1024.0 + 0.5)  # 10 significant bits: 1 implicit + 9 fraction
    mag = np.ldexp(q, e - 10)
    out = np.where(mag <= DF16_ZERO_LIMIT, 0.0, mag)
    out = np.where((mag > DF16_MAX) | ~np.isfinite(a), np.nan, out)
    out = np.copysign(out, a)
    return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(a.shape))


def store(x32, dtype):
    """What a dtype tensor on Spyre holds for the f32 result x32: df16, then dtype."""
    return df16_ref(x32).to(dtype)


def matmul_ref(a, b):
    """The f32 values of a 16-bit matmul on Spyre (docs/ktir.md, "Numerics"): each
    dot product summed in k order from 0, one f32 add of the exact product per step
    (df16 operands: every product is exact in f32). a [..., M, K], b [..., K, N]."""
    a, b = a.float(), b.float()
    acc = torch.zeros(a.shape[:-1] + b.shape[-1:])
    for k in range(a.shape[-1]):
        acc = acc + a[..., :, k : k + 1] * b[..., k : k + 1, :]
    return acc


def same(got, want):
    """Count of elements that differ (NaNs equal each other)."""
    g, w = got.float(), want.float()
    diff = ~((g == w) | (torch.isnan(g) & torch.isnan(w)))
    return int(diff.sum())


def test_reference_codec_on_known_values():
    x = torch.tensor([1.0, 1 + 2**-10, 1 + 3 * 2**-11, 2.0**-31, 2.0**-31 * 1.5, 1e10, -0.0, float("inf")])
    want = [1.0, 1 + 2**-9, 1 + 2**-9, 0.0, 2.0**-31 * 1.5, float("nan"), -0.0, float("nan")]
    got = df16_ref(x).tolist()
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == w, (got, want)


def _inputs(dtype, n=4096, seed=0, positive=False, shape=None):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape or (n,), generator=g) * 2
    if positive:
        t = t.abs() + 0.25
    # Values as they sit on the device: dtype, then df16 (the host->device copy rounds once).
    return df16_ref(t.to(dtype).float()).to(dtype)


UNARY = {
    "exp": torch.exp,
    "tanh": torch.tanh,
    "gelu": torch.nn.functional.gelu,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "neg": torch.neg,
    "sqrt_abs": lambda t: torch.sqrt(t.abs()),
    "silu": torch.nn.functional.silu,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
}

DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rounds_once(spyre_target, dtype, name):
    f = UNARY[name]
    a = _inputs(dtype, seed=1)
    got = f(a.to("tpu")).cpu()
    want = store(f(a.float()), dtype)
    assert got.dtype == dtype
    assert same(got, want) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_rounds_once(spyre_target, dtype, name):
    f = BINARY[name]
    a, b = _inputs(dtype, seed=2), _inputs(dtype, seed=3, positive=(name == "div"))
    got = f(a.to("tpu"), b.to("tpu")).cpu()
    want = store(f(a.float(), b.float()), dtype)
    assert same(got, want) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_chain_rounds_once_per_op(spyre_target, dtype):
    a, b = _inputs(dtype, seed=4), _inputs(dtype, seed=5)
    da, db = a.to("tpu"), b.to("tpu")
    got = (da * db + da).cpu()
    prod = store(a.float() * b.float(), dtype)
    want = store(prod.float() + a.float(), dtype)
    assert same(got, want) == 0
    # Scalars and in-place ops too.
    d = da * 0.5
    d.add_(db, alpha=2.0)
    got = torch.exp(d).cpu()
    x = store(a.float() * 0.5, dtype)
    x = store(x.float() + 2.0 * b.float(), dtype)
    assert same(got, store(torch.exp(x.float()), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_reductions_accumulate_in_f32_and_round_once(spyre_target, dtype):
    a = _inputs(dtype, seed=6, shape=(64, 300))
    d = a.to("tpu")
    for f in (lambda t: t.sum(dim=1), lambda t: t.mean(dim=0), lambda t: t.amax(dim=1), lambda t: t.sum()):
        got = f(d).cpu()
        assert same(got, store(f(a.float()), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_softmax_layer_norm_matmul(spyre_target, dtype):
    a = _inputs(dtype, seed=7, shape=(64, 256))
    w = _inputs(dtype, seed=8, shape=(256, 96))
    g = _inputs(dtype, seed=9, shape=(256,))
    bias = _inputs(dtype, seed=10, shape=(256,))
    d = a.to("tpu")
    got = torch.softmax(d, dim=-1).cpu()
    assert same(got, store(torch.softmax(a.float(), dim=-1), dtype)) == 0
    got = torch.nn.functional.layer_norm(d, (256,), g.to("tpu"), bias.to("tpu")).cpu()
    want = store(torch.nn.functional.layer_norm(a.float(), (256,), g.float(), bias.float()), dtype)
    assert same(got, want) == 0
    got = (d @ w.to("tpu")).cpu()
    assert same(got, store(matmul_ref(a, w), dtype)) == 0


def test_issue_double_rounding_repro_is_gone(spyre_target):
    # The issue's measurement: float16 a * b differed from df16(f32 product) in 1,071 of 4,096.
    a, b = _inputs(torch.float16, seed=11), _inputs(torch.float16, seed=12)
    got = (a.to("tpu") * b.to("tpu")).cpu()
    assert same(got, store(a.float() * b.float(), torch.float16)) == 0
    # The old scheme (float16 kernel, then df16) differs often: the test can tell.
    old = df16_ref((a * b).float()).to(torch.float16)
    assert same(old, store(a.float() * b.float(), torch.float16)) > 100


def test_float32_is_untouched(spyre_target):
    g = torch.Generator().manual_seed(13)
    a, w = torch.randn(32, 64, generator=g), torch.randn(64, 16, generator=g)
    got = torch.softmax(a.to("tpu") @ w.to("tpu"), dim=-1).cpu()
    assert torch.equal(got, torch.softmax(a @ w, dim=-1))


def test_casts_round_once(spyre_target):
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4096, generator=g) * 100
    for dtype in DTYPES:
        got = x.to("tpu").to(dtype).cpu()
        assert same(got, store(x, dtype)) == 0
        back = got.to("tpu").float().cpu()
        assert torch.equal(back, got.float())


def test_casts_bit_exact_on_every_df16_value_and_tie(spyre_target):
    """A float32 -> float16/bfloat16 cast on Spyre stores dtype(df16(x)) bit for
    bit (bfloat16's rounding of df16's 2 extra fraction bits is ties to even)
    on every df16 value, every midpoint between neighbours (df16's own ties),
    their neighbours one f32 ulp away, and random float32 bit patterns."""
    c = np.arange(1 << 16, dtype=np.uint32)
    s, e, f = c >> 15, (c >> 9) & 63, c & 511
    vals = np.ldexp(1 + f / 512, e.astype(np.int64) - 31) * np.where(s == 1, -1.0, 1.0)
    vals = vals[((c & 0x7FFF) != 0) & ((c & 0x7FFF) != 0x7FFF)]  # finite, nonzero codes
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float64; float32 holds them (11 bits)
    x = torch.from_numpy(np.concatenate([vals, mids]).astype(np.float32))
    bits = x.view(torch.int32)
    rnd = torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=torch.Generator().manual_seed(21))
    x = torch.cat([x, (bits + 1).view(torch.float32), (bits - 1).view(torch.float32), rnd.int().view(torch.float32)])
    for dtype in DTYPES:
        got = x.to("tpu").to(dtype).cpu()
        want = store(x, dtype)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan]), dtype


def test_bf16_upload_rounds_every_bit_pattern(spyre_target):
    """A bfloat16 tensor copied to Spyre holds df16 of each value, then
    bfloat16 (since branch spyre18s the upload rounds in 16-bit lanes): every
    one of the 65536 bit patterns reads back as the reference's store, bit for
    bit (NaN where the reference has NaN: df16 has one NaN/Inf code)."""
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = x.to("tpu").cpu()
    want = store(x.float(), torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def _ring_reference(x32, kind, dims, sched):
    """An op reducing the split rows (dim 0), in the order the device defines
    (docs/ktir.md, "Ring reductions"): each core reduces its rows tile by tile,
    a tile's rows split between the 2 corelets (CPU's float32 kernel on each
    corelet's rows, corelet 0 + corelet 1), tiles combined in order, then the
    cores' partials are combined along the ring in core order. float32 result."""
    rows, rpc, used = x32.shape[0], sched["rows_per_core"], sched["cores_used"]
    tile = sched["tile_rows"] or 1
    reduce = {"sum": torch.sum, "mean": torch.sum, "amax": torch.amax, "amin": torch.amin}[kind]
    combine = {"sum": torch.add, "mean": torch.add, "amax": torch.maximum, "amin": torch.minimum}[kind]
    total = None
    for c in range(used):
        part = None
        for b in range(c * rpc, min((c + 1) * rpc, rows), tile):
            e = min(b + tile, (c + 1) * rpc, rows)
            halves = [(b, e)] if e - b < 2 else [(b, b + (e - b + 1) // 2), (b + (e - b + 1) // 2, e)]
            p = None
            for lo, hi in halves:
                q = reduce(x32[lo:hi], dim=dims, keepdim=True)
                p = q if p is None else combine(p, q)
            part = p if part is None else combine(part, p)
        total = part if total is None else combine(total, part)
    if kind == "mean":
        count = 1
        for d in dims:
            count *= x32.shape[d]
        total = total / count
    return total


RING_CASES = [
    ("sum", (0,), lambda t: t.sum(dim=0)),
    ("sum", (0, 1), lambda t: t.sum()),
    ("mean", (0,), lambda t: t.mean(dim=0)),
    ("amax", (0,), lambda t: t.amax(dim=0)),
    ("amin", (0, 1), lambda t: t.amin(dim=(0, 1))),
]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("shape", [(64, 300), (1000, 300), (37, 2000)], ids=["64x300", "1000x300", "37x2000"])
def test_ring_reductions_in_the_defined_order(spyre_target, dtype, shape):
    # 16-bit: 0 mismatches against the df16 rounding of the ring-order f32 result;
    # float32: that result bit for bit (and CPU's sum up to summation order).
    from torch_tpu_eager import spyre

    a = _inputs(dtype, seed=15, shape=shape) if dtype != torch.float32 else _inputs(torch.float32, seed=15, shape=shape)
    d = a.to("tpu")
    checked = 0
    for kind, dims, f in RING_CASES:
        got = f(d).cpu()
        (sched,) = spyre.last_schedule()
        assert sched["executed"] == "tiles", sched["whole_reason"]
        assert sched["ring_steps_run"] == sched["cores_used"] - 1
        ref = _ring_reference(a.float(), kind, dims, sched).reshape(got.shape)
        want = ref if dtype == torch.float32 else store(ref, dtype)
        assert got.dtype == dtype
        assert same(got, want) == 0, kind
        torch.testing.assert_close(
            got.float(), f(a.float()).float(), rtol=2e-2 if dtype != torch.float32 else 1e-5, atol=1e-3
        )
        checked += got.numel()
    assert checked > 0
