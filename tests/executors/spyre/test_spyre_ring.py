"""Ring reductions beyond sum/mean/amax/amin (issue 21): var/std (a
count/mean/M2 merge), prod, argmax/argmin (value/index pairs, the first index
on ties), softmax/log_softmax (max, then the sum rescaled to the new max) and
layer_norm over every dim (count/mean/M2, then a normalizing pass), cumsum
(a carried prefix per core, then the cores' exclusive prefix), cumprod (the
same with products), nll_loss (loss and weight sums), max.dim/min.dim (value
and index), max()/min() and logsumexp (softmax's partials, CPU's shift for
infinite maxes) when the reduced dim is dim 0, split over the cores;
and the ring's time in the schedule and the profiler row.

The reference is independent of the executor: it follows the order the
device defines (docs/ktir.md, "Ring reductions": each corelet's rows of each
core's tile with CPU's float32 kernels, corelet 0 then 1, tiles in order, the
cores' partials along the ring in core order), written here from that text
with float32 tensor ops, and rounds once with the df16 codec of
test_spyre_numerics (its own definition of df16). 16-bit results must equal
it with 0 mismatches, float32 ones bit for bit; each is also close to CPU's
op (which sums in another order).
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import _inputs, df16_ref, same, store

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["f16", "bf16", "f32"]
SHAPES = [(64, 300), (1000, 300), (37, 2000)]
SHAPE_IDS = ["64x300", "1000x300", "37x2000"]


def _segments(rows, sched):
    """Per core, per tile step, the (lo, hi) rows of each corelet."""
    rpc, used = sched["rows_per_core"], sched["cores_used"]
    tile = sched["tile_rows"] or 1  # a row cut into sticks runs one row per step
    cores = []
    for c in range(used):
        steps = []
        for b in range(c * rpc, min((c + 1) * rpc, rows), tile):
            e = min(b + tile, (c + 1) * rpc, rows)
            if e - b < 2:
                steps.append([(b, e)])
            else:
                mid = b + (e - b + 1) // 2
                steps.append([(b, mid), (mid, e)])
        cores.append(steps)
    return cores


def _partial(kind, seg, first_row, dims):
    if kind in ("var", "ln"):
        s = seg.sum(dim=dims, keepdim=True)
        n = seg.numel() // s.numel()
        mean = s / n
        d = seg - mean
        return [mean, (d * d).sum(dim=dims, keepdim=True)], float(n)
    if kind == "prod":
        if len(dims) == 1:
            return [seg.prod(dim=dims[0], keepdim=True)], 0.0
        return [seg.reshape(-1).prod(0).reshape([1] * seg.dim())], 0.0
    if kind in ("argmax", "argmin", "argmax_flat", "argmin_flat"):
        f = torch.argmax if kind.startswith("argmax") else torch.argmin
        if kind.endswith("_flat"):
            flat = seg.reshape(-1)
            i = f(flat, 0, keepdim=True)
            return [flat.gather(0, i), i + first_row * (seg.numel() // seg.shape[0])], 0.0
        i = f(seg, 0, keepdim=True)
        return [seg.gather(0, i), i + first_row], 0.0
    if kind in ("softmax", "log_softmax"):
        m = seg.amax(dim=dims, keepdim=True)
        return [m, (seg - m).exp().sum(dim=dims, keepdim=True)], 0.0
    raise AssertionError(kind)


def _merge(kind, a, b):
    if a is None:
        return b
    (ta, na), (tb, nb) = a, b
    if kind in ("var", "ln"):
        n = na + nb
        d = tb[0] - ta[0]
        return [ta[0] + d * (nb / n), (ta[1] + tb[1]) + (d * d) * (na * nb / n)], n
    if kind == "prod":
        return [ta[0] * tb[0]], 0.0
    if kind.startswith("argmax") or kind.startswith("argmin"):
        better = tb[0] > ta[0] if kind.startswith("argmax") else tb[0] < ta[0]
        take = better | (torch.isnan(tb[0]) & ~torch.isnan(ta[0]))
        return [torch.where(take, tb[0], ta[0]), torch.where(take, tb[1], ta[1])], 0.0
    m = torch.maximum(ta[0], tb[0])
    return [m, ta[1] * (ta[0] - m).exp() + tb[1] * (tb[0] - m).exp()], 0.0


def _ordered_total(x32, sched, partial, merge):
    """partial(lo, hi) of each corelet's rows [lo, hi), merged in the ring's order: corelet 0
    then 1, a core's tiles in order, cores in order (merge(a, b): b holds the later rows)."""
    total = None
    for steps in _segments(x32.shape[0], sched):
        acc = None
        for halves in steps:
            part = None
            for lo, hi in halves:
                q = partial(lo, hi)
                part = q if part is None else merge(part, q)
            acc = part if acc is None else merge(acc, part)
        total = acc if total is None else merge(total, acc)
    return total


def _ring_total(kind, x32, dims, sched):
    return _ordered_total(
        x32, sched, lambda lo, hi: _partial(kind, x32[lo:hi], lo, dims), lambda a, b: _merge(kind, a, b)
    )


def _check(got, ref, dtype):
    want = ref if dtype == torch.float32 or not got.is_floating_point() else store(ref, dtype)
    assert same(got, want) == 0


def _schedule(chains=1):
    """The last region's schedule: it walked tiles and ran `chains` chains of
    cores_used - 1 hops along the ring."""
    from torch_tpu_eager import spyre

    (s,) = spyre.last_schedule()
    assert s["executed"] == "tiles", s["whole_reason"]
    assert s["ring_steps_run"] == chains * (s["cores_used"] - 1)
    return s


def _close(got, want, dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_var_std_merge_count_mean_m2(spyre_target, dtype, shape):
    a = _inputs(dtype, seed=31, shape=shape)
    d = a.to("tpu")
    for name, dims, f in [
        ("var", (0,), lambda t: t.var(0)),
        ("std", (0,), lambda t: t.std(0, correction=0)),
        ("var_all", (0, 1), lambda t: t.var()),
        ("var_mean", (0,), lambda t: torch.var_mean(t, 0, keepdim=True)),
        ("std_mean", (0, 1), lambda t: torch.std_mean(t, correction=2)),
    ]:
        got = f(d)
        got = tuple(g.cpu() for g in got) if isinstance(got, tuple) else (got.cpu(),)
        s = _schedule()
        (mean, m2), n = _ring_total("var", a.float(), dims, s)
        correction = 0 if name == "std" else (2 if name == "std_mean" else 1)
        var = m2 / max(0.0, n - correction)
        first = var.sqrt() if name.startswith("std") else var
        refs = [first, mean][: len(got)]
        for g, r in zip(got, refs):
            assert g.dtype == dtype
            _check(g, r.reshape(g.shape), dtype)
        want = f(a.float())
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            _close(g, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prod_multiplies_partials(spyre_target, dtype, shape):
    g = torch.Generator().manual_seed(32)
    # Mostly ones, 2% of the elements near 1: products over 600,000 stay finite.
    noise = torch.where(torch.rand(shape, generator=g) < 0.02, 0.05 * torch.randn(shape, generator=g), 0.0)
    a = (1.0 + noise).to(dtype)
    if dtype != torch.float32:
        a = df16_ref(a.float()).to(dtype)
    d = a.to("tpu")
    for dims, f in [((0,), lambda t: t.prod(0)), ((0, 1), lambda t: t.prod())]:
        got = f(d).cpu()
        s = _schedule()
        (p,), _ = _ring_total("prod", a.float(), dims, s)
        _check(got, p.reshape(got.shape), dtype)
        _close(got, f(a.float()), dtype)


def _tied_inputs(dtype, seed, shape):
    """Coarse values (integers in [-20, 20), or 4x random floats rounded to integers):
    many ties across rows, tiles and cores, for first-index tie rules."""
    if dtype == torch.int64:
        return torch.randint(-20, 20, shape, generator=torch.Generator().manual_seed(seed))
    return (_inputs(dtype, seed=seed, shape=shape).float() * 4).round().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_argmax_argmin_first_index_on_ties(spyre_target, dtype, shape):
    a = _tied_inputs(dtype, 33, shape)
    d = a.to("tpu")
    for kind, f in [
        ("argmax", lambda t: t.argmax(0)),
        ("argmin", lambda t: t.argmin(0, keepdim=True)),
        ("argmax_flat", lambda t: t.argmax()),
        ("argmin_flat", lambda t: t.argmin()),
    ]:
        got = f(d).cpu()
        s = _schedule()
        x = a.float() if dtype != torch.int64 else a
        (_, idx), _ = _ring_total(kind, x, (0,), s)
        assert got.dtype == torch.int64
        assert torch.equal(got, idx.reshape(got.shape)), kind
        assert torch.equal(got, f(a)), kind  # CPU: the first index on ties


def test_argmax_nan_wins_first(spyre_target):
    a = torch.randn(200, 64)
    a[150, 3] = float("nan")
    a[170, 3] = float("nan")
    a[5, 7] = float("nan")
    got = a.to("tpu").argmax(0).cpu()
    assert torch.equal(got, a.argmax(0))
    assert got[3] == 150 and got[7] == 5


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_softmax_over_split_rows(spyre_target, dtype, shape):
    a = _inputs(dtype, seed=34, shape=shape)
    d = a.to("tpu")
    x = a.float()
    for kind, f in [("softmax", lambda t: torch.softmax(t, 0)), ("log_softmax", lambda t: torch.log_softmax(t, 0))]:
        got = f(d).cpu()
        s = _schedule()
        (m, tot), _ = _ring_total(kind, x, (0,), s)
        ref = (x - m).exp() / tot if kind == "softmax" else (x - m) - tot.log()
        assert got.dtype == dtype
        _check(got, ref, dtype)
        _close(got, f(x), dtype)


@pytest.mark.parametrize(
    "shape", [(500, 7), (300, 4, 33), (200, 64), (90, 129)], ids=["500x7", "300x4x33", "200x64", "90x129"]
)
def test_softmax_bf16_rows_of_any_width(spyre_target, shape):
    # The bfloat16 normalizing pass runs in blocks of 64 values per row (a row
    # narrower than a block, a 3-d row, whole blocks, one value past them):
    # each value is still df16(exp(x - max) / sum) of the ring's statistics.
    a = _inputs(torch.bfloat16, seed=38, shape=shape)
    got = torch.softmax(a.to("tpu"), 0).cpu()
    s = _schedule()
    x = a.float()
    (m, tot), _ = _ring_total("softmax", x, (0,), s)
    assert got.dtype == torch.bfloat16
    _check(got, (x - m).exp() / tot, torch.bfloat16)
    _close(got, torch.softmax(x, 0), torch.bfloat16)


def _check_bf16_softmax_and_log_softmax(a):
    """softmax and log_softmax over dim 0 of bfloat16 `a`: df16 of the ring reference."""
    x = a.float()
    for kind, f in [("softmax", lambda t: torch.softmax(t, 0)), ("log_softmax", lambda t: torch.log_softmax(t, 0))]:
        got = f(a.to("tpu")).cpu()
        (m, tot), _ = _ring_total(kind, x, (0,), _schedule())
        assert got.dtype == torch.bfloat16
        _check(got, (x - m).exp() / tot if kind == "softmax" else (x - m) - tot.log(), torch.bfloat16)


# The builds softmax's native loops choose from (csrc/executors/cpu_features.h):
# {build: (features it needs, features switched off to reach it)}.
BUILDS = {
    "avx512": (("avx512f", "avx2", "fma"), ()),
    "avx2": (("avx2", "fma"), ("avx512f",)),
    "baseline": ((), ("avx512f", "avx2", "fma")),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("shape", [(1000, 300), (257, 33), (130, 2, 12)], ids=["1000x300", "257x33", "130x2x12"])
def test_softmax_each_cpu_build_same_bits(spyre_target, shape, dtype):
    # softmax and log_softmax over dim 0 (corelet partials, column sums, the
    # normalizing pass) on each build this CPU can run: 16 AVX-512 lanes, 8 AVX2
    # lanes, the baseline. Each equals df16 of the ring reference, so all give
    # the same bits, with NaN, +-inf and +-0 in some columns (df16 holds an
    # infinity as its NaN code: the bfloat16 reference starts from df16 inputs).
    from torch_tpu_eager import _C

    from difftest import cpu_features_off

    a = _inputs(dtype, seed=91, shape=shape)
    flat = a.view(shape[0], -1)
    flat[5, 0], flat[17, 2], flat[3, -1] = float("nan"), float("inf"), float("-inf")
    flat[:, 1] = 0.0
    flat[::2, 1] = -0.0
    x = df16_ref(a.float()) if dtype == torch.bfloat16 else a.float()
    present = _C._cpu_features()
    got = {}
    for build, (needs, off) in BUILDS.items():
        if not all(present[f] for f in needs):
            continue
        with cpu_features_off(*off):
            for kind, f in [
                ("softmax", lambda t: torch.softmax(t, 0)),
                ("log_softmax", lambda t: torch.log_softmax(t, 0)),
            ]:
                got[build, kind] = f(a.to("tpu")).cpu()
                (m, tot), _ = _ring_total(kind, x, (0,), _schedule())
                ref = (x - m).exp() / tot if kind == "softmax" else (x - m) - tot.log()
                _check(got[build, kind], ref, dtype)
    assert ("baseline", "softmax") in got
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for (build, kind), t in got.items():
        assert torch.equal(t.view(bits), got["baseline", kind].view(bits)), (build, kind)


@pytest.mark.parametrize(
    "shape", [(1000, 8), (700, 9), (333, 15), (130, 2, 12)], ids=["1000x8", "700x9", "333x15", "130x2x12"]
)
@pytest.mark.parametrize("specials", [False, True], ids=["randn", "nan_inf_zero"])
def test_softmax_bf16_input_read_in_place(spyre_target, shape, specials):
    # A bfloat16 input of softmax/log_softmax over dim 0 is read in place by
    # the corelet partials (8 columns per vector, the rest one by one) and by
    # softmax's normalizing pass, without an f32 copy: the values are still
    # df16 of the ring reference, with NaN, +-inf and +-0 in some columns
    # (a NaN column max, an infinite one, all-zero corelets).
    a = _inputs(torch.bfloat16, seed=71, shape=shape)
    if specials:
        flat = a.view(shape[0], -1)
        flat[5, 0] = float("nan")
        flat[:, 1] = 0.0
        flat[::2, 1] = -0.0
        flat[17, 2] = float("inf")
        flat[3, flat.shape[1] - 1] = float("-inf")
        flat[shape[0] - 1, flat.shape[1] - 1] = float("nan")
    _check_bf16_softmax_and_log_softmax(a)


@pytest.mark.parametrize(
    "shape",
    [(300, 16), (257, 33), (130, 48), (64, 2, 40), (1000, 300)],
    ids=["300x16", "257x33", "130x48", "64x2x40", "1000x300"],
)
@pytest.mark.parametrize("specials", [False, True], ids=["randn", "nan_inf_zero"])
def test_softmax_bf16_partials_in_paired_columns(spyre_target, shape, specials):
    # The bfloat16 corelet partials read whole blocks of 16 columns as their
    # even and odd columns (one block or two per row step) and keep them in
    # that order until the merged max and sum; the last n % 16 columns stay
    # in place. A column taken for another gives other statistics: the values
    # are still df16 of the ring reference, softmax and log_softmax, with NaN
    # (first row, a later row, an even and an odd column), +-inf, -inf
    # columns and +-0 in whole blocks and in the rest.
    a = _inputs(torch.bfloat16, seed=76, shape=shape)
    flat = a.view(shape[0], -1)
    rows, cols = flat.shape
    flat[:, 3::5] *= 24.0  # exps that underflow, quotients near 0
    if specials:
        flat[0, 0] = float("nan")
        flat[rows // 2, 5] = float("nan")
        flat[rows - 1, 12] = float("nan")
        flat[7, 1] = float("inf")
        flat[9, 14] = float("inf")
        flat[11, 14] = float("-inf")
        flat[:, 2] = float("-inf")
        flat[:, 15] = 0.0
        flat[::2, 15] = -0.0
        flat[rows // 3, cols - 1] = float("nan")
        flat[:, cols - 2] = float("-inf")
        flat[rows // 4, cols - 3] = float("inf")
    _check_bf16_softmax_and_log_softmax(a)


@pytest.mark.parametrize("shape", [(1000, 300), (70, 1000), (257, 129)], ids=["1000x300", "70x1000", "257x129"])
def test_softmax_bf16_normalizing_pass_by_reciprocal(spyre_target, shape):
    # softmax's normalizing pass multiplies by 1/s where that provably rounds
    # as the divide (else divides): columns of randn, of wide-ranging values
    # (quotients near 0, exps that underflow), of equal values, with a NaN, with
    # +inf, all -inf (NaN max and sums) and +-0; rows walked 16, 8 and 1 at a
    # time (300, 1000 and 129 columns). 0 mismatches against df16 of the ring
    # reference.
    rows, cols = shape
    a = _inputs(torch.bfloat16, seed=73, shape=shape)
    a[:, 1::7] *= 24.0
    a[:, 2] = 0.75
    a[11, 3] = float("nan")
    a[rows // 2, 4] = float("inf")
    a[:, 5] = float("-inf")
    a[:, 6] = 0.0
    a[::3, 6] = -0.0
    x = a.float()
    got = torch.softmax(a.to("tpu"), 0).cpu()
    (m, tot), _ = _ring_total("softmax", x, (0,), _schedule())
    _check(got, (x - m).exp() / tot, torch.bfloat16)


@pytest.mark.parametrize(
    "shape",
    [(300, 16), (70, 33), (5, 33), (40, 8200), (257, 129), (1000, 300)],
    ids=["300x16", "70x33", "5x33", "40x8200", "257x129", "1000x300"],
)
def test_softmax_bf16_normalizing_pass_in_paired_order(spyre_target, shape):
    # Since branch spyre18s the normalizing pass reads bfloat16 rows in paired
    # order (each 16 values as 8 even, then 8 odd ones) with m, s and 1/s of
    # its period paired to match, and stores the quotients back in column
    # order; values past the period's whole blocks (a 70x33 input's last 6
    # rows, all of 5x33, 8 per row of 8200) stay in place and read their
    # paired statistics. NaN, +-inf, all -inf, +-0, equal values and
    # quotients under df16's zero limit (x24 columns) in even and odd columns,
    # in whole blocks and in the values past them: 0 mismatches against df16
    # of the ring reference.
    rows, cols = shape
    a = _inputs(torch.bfloat16, seed=79, shape=shape)
    a[:, 1::7] *= 24.0
    a[:, 2] = 0.75
    a[11 % rows, 3] = float("nan")
    a[rows // 2, 4] = float("inf")
    a[:, 5] = float("-inf")
    a[:, 6] = 0.0
    a[::3, 6] = -0.0
    a[:, 8] = -30.0
    a[rows // 3, 8] = 30.0
    a[rows - 1, cols - 1] = float("nan")
    a[:, cols - 2] = float("-inf")
    a[0, cols - 3] = float("inf")
    a[:, cols - 4] = 0.5
    got, x, m, tot = _softmax_and_reference(a)
    _check(got, (x - m).exp() / tot, torch.bfloat16)


def _pool_and_stats(probe_seed, pool_seed, blocks):
    """A 1000 x (blocks * 300) bfloat16 pool and its ring reference statistics under the
    schedule of a 1000x300 softmax (each column's statistics depend on its own rows only)."""
    torch.softmax(_inputs(torch.bfloat16, seed=probe_seed, shape=(1000, 300)).to("tpu"), 0).cpu()
    pool = _inputs(torch.bfloat16, seed=pool_seed, shape=(1000, blocks * 300))
    (m, tot), _ = _ring_total("softmax", pool.float(), (0,), _schedule())
    return pool, m, tot


def _softmax_and_reference(a):
    """softmax(a, 0) on the device, a.float() and its ring reference max and sum."""
    x = a.float()
    got = torch.softmax(a.to("tpu"), 0).cpu()
    (m, tot), _ = _ring_total("softmax", x, (0,), _schedule())
    return got, x, m, tot


def _reciprocal_hazards(x, m, tot):
    """Where df16 of e * (1 / s) differs from df16 of e / s (e = exp(x - m), s = tot)."""
    e = (x - m).exp()
    return (
        store(e * (1 / tot), torch.bfloat16).view(torch.int16) != store(e / tot, torch.bfloat16).view(torch.int16)
    ) & ~(torch.isnan(e / tot))


def test_softmax_bf16_reciprocal_hazards_divided(spyre_target):
    # Where the product by 1/s rounds to another df16 value than the quotient
    # (a few in 10^6 randn values, near a df16 carry), the pass must divide:
    # columns holding such values, picked from a pool by the ring reference's
    # own sums, give df16 of the ring reference with 0 mismatches.
    cols = 300
    pool, m, tot = _pool_and_stats(74, 75, 32)
    picked = torch.nonzero(_reciprocal_hazards(pool.float(), m, tot).any(0)).flatten()[: cols - 12]
    a = torch.cat([pool[:, picked], pool[:, : cols - picked.numel()]], 1)  # hazards among the whole blocks
    got, x, m, tot = _softmax_and_reference(a)
    assert int(_reciprocal_hazards(x, m, tot).sum()) >= 10
    _check(got, (x - m).exp() / tot, torch.bfloat16)


def _estimate_hazards(x, m, tot):
    """Where df16 of estimate(x - m) * (1 / s) differs from df16 of exp(x - m) / s: the
    values softmax's normalizing pass must redo with torch.exp and the divide (the
    estimate of df16.cpp, within one f32 step of torch.exp)."""
    from torch_tpu_eager import _C

    d = x - m
    est = _C._softmax_exp_estimate(d.contiguous())
    if est is None:
        pytest.skip("no exp estimate on this CPU (AVX2 and FMA)")
    want = store(d.exp() / tot, torch.bfloat16).view(torch.int16)
    return (store(est * (1 / tot), torch.bfloat16).view(torch.int16) != want) & ~torch.isnan(d.exp() / tot)


def test_softmax_bf16_exp_estimate_hazards_redone(spyre_target):
    # Since branch spyre20s the normalizing pass of a bfloat16 input takes exp(x - max)
    # by an estimate and keeps its quotient only away from a df16 carry: columns where
    # the estimate's quotient would round to another df16 value than the reference's
    # (picked from a pool by the ring reference's own statistics) give df16 of the
    # reference with 0 mismatches.
    cols = 300
    pool, m, tot = _pool_and_stats(80, 81, 32)
    picked = torch.nonzero(_estimate_hazards(pool.float(), m, tot).any(0)).flatten()[: cols // 2]
    a = torch.cat([pool[:, picked], pool[:, : cols - picked.numel()]], 1)
    got, x, m, tot = _softmax_and_reference(a)
    assert int(_estimate_hazards(x, m, tot).sum()) >= 10
    _check(got, (x - m).exp() / tot, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    "shape", [(1000, 300), (77, 37), (33, 5), (40, 8200)], ids=["1000x300", "77x37", "33x5", "40x8200"]
)
def test_softmax_exp_estimate_special_columns(spyre_target, shape, dtype):
    # NaN, +-inf, all -inf, +-0, equal values, differences under -86 (the clamp) and under
    # df16's zero limit, in even and odd columns, whole 16-blocks and widths that are not
    # multiples of 16: softmax and log_softmax equal df16 of the ring reference. bfloat16
    # takes the estimate path of the normalizing pass; float16 the general one. Scaling by
    # 24 leaves a float16 value off df16's grid, so the reference starts, as the device does,
    # from the df16 of each input (the host->device copy's one rounding; infinities kept).
    rows, cols = shape
    a = _inputs(dtype, seed=82, shape=shape)
    a[:, 1::7] *= 24.0
    a[:, 2 % cols] = 0.75
    a[11 % rows, 3 % cols] = float("nan")
    a[rows // 2, 4 % cols] = float("inf")
    a[:, cols - 1] = float("-inf")
    a[:, 0] = 0.0
    a[::3, 0] = -0.0
    a[rows // 3, 1] = 100.0  # the column's other values 100 under its max: exps under 2^-124
    a[0, cols - 2] = float("nan")
    x = torch.where(a.isinf(), a.float(), df16_ref(a.float()))
    for kind, f in [("softmax", lambda t: torch.softmax(t, 0)), ("log_softmax", lambda t: torch.log_softmax(t, 0))]:
        got = f(a.to("tpu")).cpu()
        (m, tot), _ = _ring_total(kind, x, (0,), _schedule())
        assert got.dtype == dtype
        _check(got, (x - m).exp() / tot if kind == "softmax" else (x - m) - tot.log(), dtype)


def _sum_sensitive(x, m, tot):
    """Columns where one f32 step more or less in the sum changes a df16 softmax value."""
    e = (x - m).exp()
    want = store(e / tot, torch.bfloat16).view(torch.int16)
    flips = torch.zeros_like(want, dtype=torch.bool)
    for toward in (float("inf"), 0.0):
        near = torch.nextafter(tot, torch.full_like(tot, toward))
        flips |= store(e / near, torch.bfloat16).view(torch.int16) != want
    return flips.any(0)


def test_softmax_bf16_column_sums_in_aten_order(spyre_target):
    # Each corelet's column sums add the exps row by row in ATen's cascade
    # order (since branch spyre17s four rows per pass over the accumulator):
    # columns picked from a pool where one f32 step in the ring reference's
    # sum changes a df16 value give df16 of the reference with 0 mismatches,
    # so sums added in another order show as mismatches.
    cols = 300
    pool, m, tot = _pool_and_stats(77, 78, 8)
    picked = torch.nonzero(_sum_sensitive(pool.float(), m, tot)).flatten()
    assert picked.numel() >= 32  # about 2% of randn columns
    a = torch.cat([pool[:, picked[: cols // 2]], pool[:, : cols - min(cols // 2, picked.numel())]], 1)
    got, x, m, tot = _softmax_and_reference(a)
    _check(got, (x - m).exp() / tot, torch.bfloat16)


def test_softmax_bf16_strided_input_widened(spyre_target):
    # A transposed (non-contiguous) bfloat16 input is not read in place: it is
    # widened to f32 first, with the same reference values.
    a = _inputs(torch.bfloat16, seed=72, shape=(300, 1000)).t()
    x = a.float()
    got = torch.softmax(a.to("tpu"), 0).cpu()
    (m, tot), _ = _ring_total("softmax", x, (0,), _schedule())
    _check(got, (x - m).exp() / tot, torch.bfloat16)


def test_softmax_scratch_reused_across_sizes(spyre_target):
    # The widened input and the partials' exps live in scratch kept between
    # launches (branch spyre21i): a launch after a larger one (stale values
    # past its end) and after a smaller one (the buffer grown) still gives
    # df16 of the ring reference, softmax and log_softmax alike.
    for k, shape in enumerate([(1000, 300), (40, 70), (1200, 301), (64, 300)]):
        a = _inputs(torch.bfloat16, seed=60 + k, shape=shape)
        x = a.float()
        for kind, f in [("softmax", lambda t: torch.softmax(t, 0)), ("log_softmax", lambda t: torch.log_softmax(t, 0))]:
            got = f(a.to("tpu")).cpu()
            (m, tot), _ = _ring_total(kind, x, (0,), _schedule())
            _check(got, (x - m).exp() / tot if kind == "softmax" else (x - m) - tot.log(), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_layer_norm_over_every_dim(spyre_target, dtype, shape):
    a = _inputs(dtype, seed=35, shape=shape)
    w = _inputs(dtype, seed=36, shape=shape)
    b = _inputs(dtype, seed=37, shape=shape)
    x = a.float()
    sched = _probe_schedule(a)
    (mean, m2), n = _ring_total("ln", x, (0, 1), sched)
    rstd = (m2 / n + 1e-5).rsqrt()
    got = F.layer_norm(a.to("tpu"), shape).cpu()
    s = _schedule()
    assert (s["rows_per_core"], s["tile_rows"]) == (sched["rows_per_core"], sched["tile_rows"])
    _check(got, (x - mean) * rstd, dtype)
    _close(got, F.layer_norm(x, shape), dtype)
    got = F.layer_norm(a.to("tpu"), shape, w.to("tpu"), b.to("tpu"), eps=1e-3).cpu()
    _schedule()
    rstd = (m2 / n + 1e-3).rsqrt()
    _check(got, (x - mean) * rstd * w.float() + b.float(), dtype)
    _close(got, F.layer_norm(x, shape, w.float(), b.float(), eps=1e-3), dtype)
    # The statistics too (native_layer_norm's mean and rstd).
    out, mu, rs = torch.native_layer_norm(a.to("tpu"), shape, None, None, 1e-5)
    _schedule()
    rstd = (m2 / n + 1e-5).rsqrt()
    _check(mu.cpu(), mean.reshape(mu.shape), dtype)
    _check(rs.cpu(), rstd.reshape(rs.shape), dtype)


_SCHED = {}


def _probe_schedule(a):
    """The schedule of a layer_norm over every dim of `a`'s shape and dtype
    (the reference needs its tiles before computing)."""
    key = (tuple(a.shape), a.dtype)
    if key not in _SCHED:
        F.layer_norm(torch.zeros(a.shape, dtype=a.dtype, device="tpu"), a.shape).cpu()
        _SCHED[key] = _schedule()
    return _SCHED[key]


def test_normalized_result_feeds_later_ops(spyre_target):
    # The ring result on the split rows feeds an op after the ring: it runs
    # after the normalizing pass, on the whole views.
    a = _inputs(torch.float16, seed=38, shape=(256, 128))
    got = (torch.softmax(a.to("tpu") * 2.0, 0) * 3.0).cpu()
    x = store(a.float() * 2.0, torch.float16).float()
    from torch_tpu_eager import spyre

    (s,) = spyre.last_schedule()
    assert s["executed"] == "tiles", s["whole_reason"]
    (m, tot), _ = _ring_total("softmax", x, (0,), s)
    sm = store((x - m).exp() / tot, torch.float16).float()
    assert same(got, store(sm * 3.0, torch.float16)) == 0


def _stick_bytes(elems, elem_bytes=4, stick=128):
    return -(-elems * elem_bytes // stick) * stick


def test_ring_time_is_hop_latency_plus_bytes_over_the_link_bandwidth(spyre_target):
    from torch_tpu_eager import spyre
    from torch_tpu_eager.target import target_info

    info = target_info("spyre")
    # 128 B per cycle per direction (torch-spyre docs) at the assumed clock.
    assert info["ring_link_bandwidth"] == info["ring_bytes_per_cycle"] * info["core_clock_hz"]
    assert "ASSUMED" in info["sources"]["core_clock_hz"]
    # A fixed latency per hop (no public figure: an assumption), in cycles of that clock.
    assert "ASSUMED" in info["sources"]["ring_hop_latency_cycles"]
    lat = info["ring_hop_latency_s"]
    assert lat == info["ring_hop_latency_cycles"] / info["core_clock_hz"] and lat > 0
    x = torch.randn(64, 100).to("tpu")
    for f, stats, hops in [
        (lambda t: t.sum(0), 1, 31),  # one f32 partial of 100 per core, chained over 32 cores
        (lambda t: t.var(0), 2, 31),  # (mean, M2)
        (lambda t: torch.softmax(t, 0), 2, 62),  # (max, sum), then back to every core
    ]:
        f(x).cpu()
        (s,) = spyre.last_schedule()
        assert s["ring_steps"] == hops
        assert s["partial_bytes"] == stats * _stick_bytes(100)
        assert s["ring_bytes"] == hops * s["partial_bytes"]
        assert s["ring_latency_s"] == pytest.approx(hops * lat, rel=1e-12)
        assert s["ring_s"] == pytest.approx(hops * lat + s["ring_bytes"] / info["ring_link_bandwidth"], rel=1e-12)
        assert s["ring_s"] > 0
        assert s["executed_s"] == pytest.approx(max(c["end_s"] for c in s["per_core"]) + s["ring_s"], rel=1e-12)
        ring = s["stages"][-1]
        assert ring["kind"] == "ring_reduce"
        assert ring["end_s"] - ring["start_s"] == pytest.approx(s["ring_s"], rel=1e-9)
    # No ring, no ring time.
    (x * 2.0).cpu()
    (s,) = spyre.last_schedule()
    assert s["ring_steps"] == 0 and s["ring_s"] == 0 and s["ring_latency_s"] == 0


def test_profiler_row_carries_the_ring_time(spyre_target, tmp_path):
    import json

    from torch.profiler import ProfilerActivity, profile

    from torch_tpu_eager import spyre

    x = torch.randn(256, 128).to("tpu")
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        x.sum(0).cpu()
    (s,) = spyre.last_schedule()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    (k,) = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert k["args"]["ring_us"] == pytest.approx(s["ring_s"] * 1e6, rel=1e-6)
    assert k["args"]["ring_us"] > 0
    # The hops' latency, next to the ring's time and the calibrated law's sim_time_us.
    assert k["args"]["ring_latency_us"] == pytest.approx(s["ring_latency_s"] * 1e6, rel=1e-6)
    assert 0 < k["args"]["ring_latency_us"] < k["args"]["ring_us"]
    assert k["args"]["schedule_time_us"] == pytest.approx(s["executed_s"] * 1e6, rel=1e-6)


def _scan_reference(x, sched, scan_fn, combine):
    """A scan (cumsum / cumprod) over the split rows in the defined order: each
    core scans its rows tile by tile, carrying its running result; the ring
    passes each core the combined totals of the cores before it, which the
    second pass combines in. `scan_fn(x, 0)` is torch.cumsum or torch.cumprod,
    `combine` its binary op (torch.add / torch.mul)."""
    rows, rpc, used = x.shape[0], sched["rows_per_core"], sched["cores_used"]
    tile = sched["tile_rows"] or 1
    scan = torch.empty_like(x)
    carries = []
    for c in range(used):
        carry = None
        for b in range(c * rpc, min((c + 1) * rpc, rows), tile):
            e = min(b + tile, (c + 1) * rpc, rows)
            local = scan_fn(x[b:e], 0)
            if carry is not None:
                local = combine(local, carry)
            carry = local[-1:]
            scan[b:e] = local
        carries.append(carry)
    out = scan.clone()
    prefix = None
    for c in range(1, used):
        prefix = carries[c - 1] if prefix is None else combine(prefix, carries[c - 1])
        lo, hi = c * rpc, min((c + 1) * rpc, rows)
        out[lo:hi] = combine(scan[lo:hi], prefix)
    return out


def _cumsum_reference(x, sched):
    return _scan_reference(x, sched, torch.cumsum, torch.add)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_cumsum_over_split_rows_carries_the_prefix(spyre_target, dtype, shape):
    if dtype == torch.int64:
        a = torch.randint(-1000, 1000, shape, generator=torch.Generator().manual_seed(39))
    else:
        a = _inputs(dtype, seed=39, shape=shape)
    got = torch.cumsum(a.to("tpu"), 0).cpu()
    s = _schedule()
    x = a if dtype == torch.int64 else a.float()
    ref = _cumsum_reference(x, s)
    assert got.dtype == torch.cumsum(a, 0).dtype
    if dtype == torch.int64:
        assert torch.equal(got, torch.cumsum(a, 0))
    else:
        _check(got, ref, dtype)
        torch.testing.assert_close(
            got.float(), torch.cumsum(x, 0), rtol=2e-2 if dtype != torch.float32 else 1e-4, atol=0.1
        )


@pytest.mark.parametrize("bad", [12, 10, -1, -5], ids=["12", "classes", "-1", "-5"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_nll_loss_target_out_of_range_raises_cpu_index_error(spyre_target, bad, weighted):
    # CPU's check and exception type: a target outside [0, classes) that is not
    # ignore_index raises IndexError "Target <t> is out of bounds.": at the call
    # for labels the host holds (as CPU), at the read for labels computed on the
    # device (the ring's own check); other tensors stay valid.
    rows, classes = 300, 10
    x = torch.randn(rows, classes, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(6))
    target[::9] = -100
    target[rows // 2] = bad
    w = torch.rand(classes) + 0.5 if weighted else None
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        F.nll_loss(x, target, w)
    other = torch.arange(4.0, device="tpu") * 2
    wd = None if w is None else w.to("tpu")
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        F.nll_loss(x.to("tpu"), target.to("tpu"), wd)
    loss = F.nll_loss(x.to("tpu"), target.to("tpu") + 0, wd)
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        loss.item()
    assert other.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rows", [64, 1000, 37], ids=["64", "1000", "37"])
def test_nll_loss_over_split_rows(spyre_target, dtype, rows):
    # Per corelet (sum of -w[t] x[i, t], sum of w[t]), merged by adding; mean
    # divides the two once.
    x = _inputs(dtype, seed=40, shape=(rows, 10))
    g = torch.Generator().manual_seed(41)
    target = torch.randint(0, 10, (rows,), generator=g)
    target[::7] = -100  # ignored rows
    weight = _inputs(dtype, seed=42, shape=(10,), positive=True)
    for reduction, w in [("mean", None), ("sum", None), ("mean", weight), ("sum", weight)]:
        got = F.nll_loss(x.to("tpu"), target.to("tpu"), None if w is None else w.to("tpu"), reduction=reduction).cpu()
        s = _schedule()
        rpc, used = s["rows_per_core"], s["cores_used"]
        tile = s["tile_rows"] or 1
        wt = torch.ones(10) if w is None else w.float()
        total = None
        for c in range(used):
            acc = None
            for b in range(c * rpc, min((c + 1) * rpc, rows), tile):
                e = min(b + tile, (c + 1) * rpc, rows)
                halves = [(b, e)] if e - b < 2 else [(b, b + (e - b + 1) // 2), (b + (e - b + 1) // 2, e)]
                part = None
                for lo, hi in halves:
                    t = target[lo:hi]
                    keep = t != -100
                    safe = torch.where(keep, t, 0)
                    wi = torch.where(keep, wt[safe], 0.0)
                    picked = x.float()[lo:hi].gather(1, safe.unsqueeze(1)).squeeze(1)
                    q = [-(picked * wi).sum(), wi.sum()]
                    part = q if part is None else [part[0] + q[0], part[1] + q[1]]
                acc = part if acc is None else [acc[0] + part[0], acc[1] + part[1]]
            total = acc if total is None else [total[0] + acc[0], total[1] + acc[1]]
        ref = total[0] / total[1] if reduction == "mean" else total[0]
        _check(got, ref, dtype)
        _close(got, F.nll_loss(x.float(), target, None if w is None else w.float(), reduction=reduction), dtype)


def test_cross_entropy_of_a_gathered_batch_walks_tiles(spyre_target):
    # The digits step's loss region: the target is a batch gather the steps produce.
    g = torch.Generator().manual_seed(43)
    logits, y, idx = (
        torch.randn(200, 10, generator=g),
        torch.randint(0, 10, (500,), generator=g),
        torch.arange(0, 400, 2),
    )
    got = F.cross_entropy(logits.to("tpu"), y.to("tpu")[idx.to("tpu")]).cpu()
    from torch_tpu_eager import spyre

    for s in spyre.last_schedule():
        assert s["executed"] == "tiles", (s["kernel"], s["whole_reason"])
    torch.testing.assert_close(got, F.cross_entropy(logits, y[idx]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_max_min_dim_return_values_and_first_indices(spyre_target, dtype, shape):
    # max.dim/min.dim over the split rows combine (value, index) pairs as
    # argmax/argmin; max()/min() of every element as amax/amin.
    a = _tied_inputs(dtype, 43, shape)
    d = a.to("tpu")
    for f in [lambda t: torch.max(t, 0), lambda t: torch.min(t, 0, keepdim=True)]:
        values, indices = f(d)
        values, indices = values.cpu(), indices.cpu()
        _schedule()
        want_v, want_i = f(a)
        assert values.dtype == dtype and indices.dtype == torch.int64
        assert torch.equal(values, want_v)  # a stored input value: no rounding
        assert torch.equal(indices, want_i)  # CPU: the first index on ties
    for f in [lambda t: t.max(), lambda t: t.min()]:
        got = f(d).cpu()
        _schedule()
        assert torch.equal(got, f(a))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_logsumexp_over_split_rows(spyre_target, dtype, shape):
    # The softmax partials (max, sum of exp(x - max)) merged over the ring,
    # then log(sum) + max rounded once.
    a = _inputs(dtype, seed=44, shape=shape)
    d = a.to("tpu")
    x = a.float()
    for dims in [(0,), (0, 1)]:
        got = torch.logsumexp(d, dims).cpu()
        s = _schedule()
        (m, tot), _ = _ring_total("softmax", x, dims, s)
        assert got.dtype == dtype
        _check(got, (tot.log() + m).reshape(got.shape), dtype)
        _close(got, torch.logsumexp(x, dims), dtype)


def test_logsumexp_infinities_as_cpu(spyre_target):
    # CPU shifts by max where it is finite, else by 0: an all -inf column
    # gives -inf (not NaN), a +inf gives +inf, a NaN gives NaN.
    a = torch.randn(200, 8)
    a[:, 1] = float("-inf")
    a[150, 2] = float("inf")
    a[3, 3] = float("nan")
    a[170, 4] = float("-inf")
    got = torch.logsumexp(a.to("tpu"), 0).cpu()
    _schedule()
    torch.testing.assert_close(got, torch.logsumexp(a, 0), equal_nan=True)


def _cumprod_reference(x, sched):
    return _scan_reference(x, sched, torch.cumprod, torch.mul)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64], ids=IDS + ["i64"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_cumprod_over_split_rows_carries_the_prefix(spyre_target, dtype, shape):
    if dtype == torch.int64:
        g = torch.Generator().manual_seed(45)
        a = torch.where(torch.rand(shape, generator=g) < 0.01, torch.randint(-2, 3, shape, generator=g), 1)
    else:
        g = torch.Generator().manual_seed(45)
        noise = torch.where(torch.rand(shape, generator=g) < 0.02, 0.05 * torch.randn(shape, generator=g), 0.0)
        a = (1.0 + noise).to(dtype)
        if dtype != torch.float32:
            a = df16_ref(a.float()).to(dtype)
    got = torch.cumprod(a.to("tpu"), 0).cpu()
    s = _schedule()
    assert got.dtype == torch.cumprod(a, 0).dtype
    if dtype == torch.int64:
        assert torch.equal(got, torch.cumprod(a, 0))
    else:
        _check(got, _cumprod_reference(a.float(), s), dtype)
        _close(got, torch.cumprod(a.float(), 0), dtype)
