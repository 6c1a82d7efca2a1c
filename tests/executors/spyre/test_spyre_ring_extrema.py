"""Ring programs for the last reductions of the split rows that ran whole
(issue 21): cummax/cummin (a scan of (value, index) pairs: each core's rows
tile by tile with a carried pair, the cores' last pairs merged along the
ring), norm / linalg_vector_norm (f32 partials of df16 powers, one root),
aminmax ((min, max) pairs), nansum, count_nonzero, any and all over dim 0;
and the reductions that still run their regions whole (nll_loss2d_forward,
...) counted as library calls.

The references are independent of the executor: cummax/cummin by CPU's scan
rule written out here row by row (a NaN is taken, else an element >= the
running value for cummax, <= for cummin: ties keep the later index), the
sums in the order docs/ktir.md defines ("Ring reductions": each corelet's
rows of each core's tile, corelet 0 then 1, tiles in order, the cores in
order) with float32 tensor ops and the df16 codec of test_spyre_numerics.
Inputs are large and random, with many ties, NaN, -0.0, 0.0 and +-inf (on
the device a 16-bit inf is df16's NaN code; float32 keeps it).
"""

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import df16_ref, same, store
from test_spyre_ring import SHAPE_IDS, SHAPES, _close, _ordered_total, _schedule

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["f16", "bf16", "f32"]
# Every shape runs 2+ tile steps per core, so the carried pairs cross tiles;
# 2000x300: 63 rows per core (steps of 32 and 31 rows, a last core of 47);
# 1200x2000: 3-4 tile steps per core.
SCAN_SHAPES = SHAPES + [(2000, 300), (1200, 2000)]
SCAN_IDS = SHAPE_IDS + ["2000x300", "1200x2000"]


def _special(dtype, shape, seed):
    """Coarse random values (many ties) with NaN, -0.0, 0.0, +inf and -inf
    sprinkled in, as the device holds them (16-bit: dtype, then df16)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        return torch.randint(-20, 20, shape, generator=g)
    t = (torch.randn(shape, generator=g) * 8).round() / 4
    pick = torch.rand(shape, generator=g)
    for k, v in enumerate([float("nan"), -0.0, 0.0, float("inf"), float("-inf")]):
        t = torch.where((pick >= 0.002 * k) & (pick < 0.002 * (k + 1)), torch.tensor(v), t)
    if dtype == torch.float32:
        return t
    return df16_ref(t.to(dtype).float()).to(dtype)


def _scan_ref(x, is_max):
    """CPU's cummax/cummin rule, row by row over dim 0 (vectorized over columns)."""
    vals, idx = torch.empty_like(x), torch.empty(x.shape, dtype=torch.int64)
    out, at = x[0].clone(), torch.zeros(x.shape[1:], dtype=torch.int64)
    for i in range(x.shape[0]):
        cur = x[i]
        better = cur >= out if is_max else cur <= out
        take = torch.isnan(cur) | (~torch.isnan(out) & better) if x.is_floating_point() else better
        out = torch.where(take, cur, out)
        at = torch.where(take, torch.tensor(i), at)
        vals[i], idx[i] = out, at
    return vals, idx


def _same_bits(got, want):
    """0 when equal element for element, NaN equal to NaN and the sign of zero kept."""
    g, w = got.double(), want.double()
    return same(g, w) + int(((g == 0) & (w == 0) & (torch.signbit(g) != torch.signbit(w))).sum())


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=SCAN_IDS)
def test_cummax_cummin_scan_over_the_ring(spyre_target, dtype, shape):
    a = _special(dtype, shape, 51)
    d = a.to("tpu")
    for fn, is_max in [(torch.cummax, True), (torch.cummin, False)]:
        values, indices = fn(d, 0)
        values, indices = values.cpu(), indices.cpu()
        _schedule()
        ref_v, ref_i = _scan_ref(a.double() if dtype != torch.int64 else a, is_max)
        assert values.dtype == dtype and indices.dtype == torch.int64
        assert _same_bits(values, ref_v) == 0
        assert torch.equal(indices, ref_i)
        want_v, want_i = fn(a, 0)  # CPU's kernel on the same values
        assert _same_bits(values, want_v) == 0 and torch.equal(indices, want_i)


def test_cummax_feeds_later_ops_and_writes_out(spyre_target):
    a = _special(torch.float16, (1000, 300), 52)
    d = a.to("tpu")
    got = (torch.cummax(d * 2.0, 0).values + 1.0).cpu()
    x = store(a.float() * 2.0, torch.float16)
    assert same(got, store(torch.cummax(x, 0).values.float() + 1.0, torch.float16)) == 0
    v, i = torch.empty(0, dtype=torch.float16, device="tpu"), torch.empty(0, dtype=torch.int64, device="tpu")
    torch.cummin(d, 0, out=(v, i))
    want = torch.cummin(a, 0)
    assert _same_bits(v.cpu(), want.values) == 0 and torch.equal(i.cpu(), want.indices)


def _norm_partial(seg, ord_, dims):
    if ord_ == float("inf"):
        return seg.abs().amax(dim=dims, keepdim=True)
    if ord_ == float("-inf"):
        return seg.abs().amin(dim=dims, keepdim=True)
    if ord_ == 0:
        return (seg != 0).sum(dim=dims, keepdim=True, dtype=torch.float32)
    if ord_ == 1:
        return seg.abs().sum(dim=dims, keepdim=True)
    if ord_ == 2:
        return (seg * seg).sum(dim=dims, keepdim=True)
    return seg.abs().pow(ord_).sum(dim=dims, keepdim=True)


def _norm_merge(ord_):
    if ord_ == float("inf"):
        return torch.maximum
    if ord_ == float("-inf"):
        return torch.minimum
    return torch.add


def _norm_root(t, ord_):
    if ord_ in (float("inf"), float("-inf"), 0, 1):
        return t
    if ord_ == 2:
        return t.sqrt()
    return t.pow(1.0 / ord_)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("special", [False, True], ids=["randn", "nan_inf_zeros"])
def test_norm_sums_df16_powers_over_the_ring(spyre_target, dtype, shape, special):
    if special:
        a = _special(dtype, shape, 53)
    else:
        g = torch.Generator().manual_seed(53)
        a = torch.randn(shape, generator=g).to(dtype)
        a = a if dtype == torch.float32 else df16_ref(a.float()).to(dtype)
    d = a.to("tpu")
    x = a.float()
    cases = [
        (2, (0,), lambda t: torch.linalg.vector_norm(t, 2, 0)),
        (2, (0, 1), lambda t: torch.norm(t)),
        (1, (0,), lambda t: torch.linalg.vector_norm(t, 1, 0, keepdim=True)),
        (3.0, (0,), lambda t: torch.linalg.vector_norm(t, 3.0, 0)),
        (0, (0,), lambda t: torch.linalg.vector_norm(t, 0, 0)),
        (float("inf"), (0,), lambda t: torch.linalg.vector_norm(t, float("inf"), 0)),
        (float("-inf"), (0, 1), lambda t: torch.linalg.vector_norm(t, float("-inf"))),
        (2, (0,), lambda t: torch.norm(t, dim=0)),
    ]
    for ord_, dims, f in cases:
        got = f(d).cpu()
        s = _schedule()
        total = _ordered_total(x, s, lambda lo, hi: _norm_partial(x[lo:hi], ord_, dims), _norm_merge(ord_))
        ref = _norm_root(total, ord_).reshape(got.shape)
        assert got.dtype == dtype
        want = ref if dtype == torch.float32 else store(ref, dtype)
        assert same(got, want) == 0, (ord_, dims)
        if not special:
            _close(got, f(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_aminmax_count_any_all_nansum(spyre_target, dtype, shape):
    a = _special(dtype, shape, 54)
    d = a.to("tpu")
    lo, hi = torch.aminmax(d, dim=0)
    _schedule()
    want_lo, want_hi = torch.aminmax(a, dim=0)
    assert _same_bits(lo.cpu(), want_lo) == 0 and _same_bits(hi.cpu(), want_hi) == 0
    lo, hi = torch.aminmax(d)
    _schedule()
    want_lo, want_hi = torch.aminmax(a)
    assert same(lo.cpu(), want_lo) == 0 and same(hi.cpu(), want_hi) == 0
    for f in [
        lambda t: torch.count_nonzero(t, 0),
        lambda t: torch.count_nonzero(t),
        lambda t: (t > 0).any(0),
        lambda t: (t > 0).all(0),
        lambda t: t.any(),
        lambda t: (t != 3).all(),
    ]:
        got = f(d).cpu()
        _schedule()
        assert torch.equal(got, f(a))
    if dtype == torch.int64:
        assert torch.equal(torch.nansum(d, 0).cpu(), torch.nansum(a, 0))
        return
    x = a.float()
    for dims in [(0,), (0, 1)]:
        got = torch.nansum(d, dims).cpu()
        s = _schedule()
        total = _ordered_total(x, s, lambda lo, hi: torch.nansum(x[lo:hi], dim=dims, keepdim=True), torch.add).reshape(
            got.shape
        )
        assert got.dtype == dtype
        assert same(got, total if dtype == torch.float32 else store(total, dtype)) == 0


def test_reductions_without_a_ring_program_are_library_calls(spyre_target):
    # Reductions of the split rows without a ring combine (nll_loss2d_forward,
    # ...) keep their regions whole: each runs its whole input as a
    # library call (metrics). The order statistics (median, kthvalue, sort,
    # topk, ...) have ring programs since 2026-12-05 (test_spyre_ring_order.py),
    # mse_loss, huber_loss, smooth_l1_loss, binary_cross_entropy and trace
    # since branch spyre21f (test_spyre_ring_losses.py), renorm since branch
    # spyre21s (test_spyre_ring_renorm.py), as multilabel_margin_loss
    # (test_spyre_ring_multilabel.py).
    from torch_tpu_eager import metrics, metrics_report, reset_metrics, spyre

    a = _special(torch.float32, (200, 64), 55)
    b = _special(torch.float32, (200, 64), 57)
    d, e = a.to("tpu"), b.to("tpu")
    a, b = a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0)
    d, e = d.nan_to_num(0.0, 1.0, -1.0), e.nan_to_num(0.0, 1.0, -1.0)
    tgt = torch.randint(0, 4, (200, 4, 4), generator=torch.Generator().manual_seed(58))
    td = tgt.to("tpu")
    # [N, C, H, W] log-probabilities (made on the host: the loss is the region's only op).
    a = a.reshape(200, 4, 4, 4).log_softmax(1)
    d = a.to("tpu")
    cases = {
        "nll_loss2d_forward": lambda t, u: torch.nn.functional.nll_loss(t, td if t.device.type == "tpu" else tgt),
    }
    for name, f in cases.items():
        d.cpu(), e.cpu()
        reset_metrics()
        got = f(d, e).cpu()
        _close(got, f(a, b), torch.float32)
        (s,) = spyre.last_schedule()
        assert s["executed"] == "whole" and "no ring combine" in s["whole_reason"]
        assert metrics()["library_calls"] == 1, name
        lines = [line.strip() for line in metrics_report().splitlines()]
        assert f"spyre_library_call.{name}: 1" in lines, (name, lines)
        assert f"spyre_whole_region.{name}: 1" in lines, (name, lines)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_softmax_ring_chain_on_special_values(spyre_target, dtype, shape):
    # The cores' (max, sum) partials merged in core order (the running max
    # as one batched scan since 2026-12-05): equal to the defined chain's
    # values with NaN, +-0, +-inf and ties in the columns (whole columns of
    # -inf too), the sign of zero included.
    from test_spyre_ring import _ring_total

    a = _special(dtype, shape, 56)
    a[:, 1] = float("-inf")
    a[:, 2] = 0.0
    a[::3, 2] = -0.0
    d = a.to("tpu")
    x = a.float()
    for name, f in [("softmax", lambda t: torch.softmax(t, 0)), ("log_softmax", lambda t: torch.log_softmax(t, 0))]:
        got = f(d).cpu()
        s = _schedule()
        (m, tot), _ = _ring_total("softmax", x, (0,), s)
        ref = (x - m).exp() / tot if name == "softmax" else (x - m) - tot.log()
        want = ref if dtype == torch.float32 else store(ref, dtype)
        assert _same_bits(got, want) == 0, name
