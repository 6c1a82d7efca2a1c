"""Spyre's 16-bit sums read in place (executors/spyre/reduce16.cpp, branch
spyre22b): sum over the last dim of float16 / bfloat16 rows, and the corelet
partials of a sum or mean over the split rows (dim 0), with no f32 copy of the
input. The values must be those of CPU's float32 sum kernel on the df16
values (test_spyre_numerics' reference and ring order), every tail size,
and the same bits from the AVX2 and baseline builds.
"""

import pytest
import torch

from difftest import cpu_features_off, requires_tpu
from test_spyre_numerics import _inputs, _ring_reference, same, store

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16]
IDS = ["f16", "bf16"]
# Under 8 (ATen's scalar loop), whole and partial 8- and 32-vectors, and long
# enough rows for the cascade's carries (past 16 and 256 groups of 4 vectors).
WIDTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 31, 33, 64, 100, 300, 513, 1000, 4100, 9000]


def _specials(a):
    """a with NaN, signed zeros and float16 subnormals (df16 values) in its first rows."""
    a = a.clone()
    flat = a.view(-1)
    vals = [float("nan"), 0.0, -0.0, 2.0**-20, -3 * 2.0**-22, 2.0**-14 * 1.5]
    for i, v in enumerate(vals):
        if i * 7 < flat.numel():
            flat[i * 7] = v
    return a


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_every_width(spyre_target, dtype):
    for n in WIDTHS:
        a = _inputs(dtype, seed=50 + n, shape=(40, n))
        for keepdim in (False, True):
            got = a.to("tpu").sum(-1, keepdim=keepdim).cpu()
            assert same(got, store(a.float().sum(-1, keepdim=keepdim), dtype)) == 0, n


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_special_values_and_ranks(spyre_target, dtype):
    a = _specials(_inputs(dtype, seed=60, shape=(6, 5, 300)))
    got = a.to("tpu").sum(2).cpu()
    assert same(got, store(a.float().sum(2), dtype)) == 0
    assert torch.isnan(got[0, 0])
    b = _specials(_inputs(dtype, seed=61, shape=(33, 7)))
    assert same(b.to("tpu").sum(1).cpu(), store(b.float().sum(1), dtype)) == 0


def _ring_sum_and_mean(a, dtype):
    """(kind, tpu result, reference, schedule) of ``a.sum(0)`` and ``a.mean(0)`` on "tpu": the
    reference is ``_ring_reference`` in the launch's own schedule, stored in ``dtype``."""
    from torch_tpu_eager import spyre

    for kind, f in (("sum", lambda t: t.sum(0)), ("mean", lambda t: t.mean(0))):
        got = f(a.to("tpu")).cpu()
        (sched,) = spyre.last_schedule()
        yield kind, got, store(_ring_reference(a.float(), kind, (0,), sched).reshape(got.shape), dtype), sched


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(1000, 300), (64, 2), (3000, 5), (77, 33), (500, 7), (2000, 9)])
def test_ring_sum_and_mean_over_rows(spyre_target, dtype, shape):
    a = _specials(_inputs(dtype, seed=62, shape=shape))
    for kind, got, want, sched in _ring_sum_and_mean(a, dtype):
        assert same(got, want) == 0, (kind, sched["executed"], sched["whole_reason"])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_baseline_build_same_bits(spyre_target, dtype):
    for shape in [(40, 300), (40, 9), (1000, 300), (3000, 5)]:
        a = _specials(_inputs(dtype, seed=63, shape=shape))
        for f in (lambda t: t.sum(-1), lambda t: t.sum(0)):
            wide = f(a.to("tpu")).cpu()
            with cpu_features_off("avx2"):
                narrow = f(a.to("tpu")).cpu()
            assert torch.equal(wide.view(torch.int16), narrow.view(torch.int16)), shape


# Column counts around the 32-column blocks read as paired loads (and their
# 8-column and scalar tails), and row counts whose corelet shares pass 16 and
# 256 rows (the cascade's level carries); the ring input is read in place
# (no tile copy) when the sum is the steps' only op.
RING_SHAPES = [(700, 32), (900, 48), (1100, 47), (640, 96), (5000, 33), (40000, 16), (9000, 64), (3, 40)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", RING_SHAPES, ids=[f"{r}x{c}" for r, c in RING_SHAPES])
def test_ring_sum_column_blocks_and_carries(spyre_target, dtype, shape):
    a = _specials(_inputs(dtype, seed=64, shape=shape))
    for kind, got, want, sched in _ring_sum_and_mean(a, dtype):
        assert same(got, want) == 0, (kind, sched["tile_rows"], sched["corelet_share"])
        assert sched["ring_steps_run"] == sched["cores_used"] - 1


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_ring_sum_after_an_op_on_the_tiles(spyre_target, dtype):
    # The steps also run an op: the ring reads the step's tile, not the input.
    from torch_tpu_eager import spyre

    a = _inputs(dtype, seed=65, shape=(2000, 40))
    got = (a.to("tpu") * 2).sum(0).cpu()
    (sched,) = spyre.last_schedule()
    want = store(_ring_reference(store(a.float() * 2, dtype).float(), "sum", (0,), sched), dtype)
    assert same(got, want) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_paired_groups(spyre_target, dtype):
    # Rows of 32k + r values: the paired groups of 4 vectors, then leftover vectors and values.
    for n in (32, 40, 63, 64, 65, 96, 127, 128, 544, 2080):
        a = _specials(_inputs(dtype, seed=66 + n, shape=(70, n)))
        assert same(a.to("tpu").sum(1).cpu(), store(a.float().sum(1), dtype)) == 0, n


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_baseline_build_same_bits_column_blocks(spyre_target, dtype):
    for shape in [(5000, 33), (640, 96), (40000, 16)]:
        a = _specials(_inputs(dtype, seed=67, shape=shape))
        wide = a.to("tpu").sum(0).cpu()
        with cpu_features_off("avx2"):
            narrow = a.to("tpu").sum(0).cpu()
        assert torch.equal(wide.view(torch.int16), narrow.view(torch.int16)), shape


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_read_in_place_over_tile_steps(spyre_target, dtype):
    # A sum over the last dim walked in several tile steps: each step's rows are read where
    # they are; the values are CPU's f32 row sums, the steps those of the schedule.
    from torch_tpu_eager import spyre

    for shape, dim in [((1000, 300), 1), ((3000, 33), -1), ((200, 5, 300), 2), ((5000, 7), 1)]:
        a = _specials(_inputs(dtype, seed=68, shape=shape))
        for keepdim in (False, True):
            got = a.to("tpu").sum(dim, keepdim=keepdim).cpu()
            (sched,) = spyre.last_schedule()
            assert sched["executed"] == "tiles" and sched["tile_steps"] == sched["n_tiles"] > 1, sched["text"]
            assert same(got, store(a.float().sum(dim, keepdim=keepdim), dtype)) == 0, (shape, keepdim)


# float32 ring sums (branch spyre24a): each corelet's share summed in place in CPU's order
# (host::cpu_column_sums: the column groups of 4 vectors of CPU's sum kernel, 64 columns at
# AVX512 and 32 at AVX2, and the tails after them), shares past 16 and 256 rows (the cascade's
# carries), shares of one row (CPU's other path, kept; 64x30000's tiles are one row each).
F32_RING_SHAPES = [
    (700, 64),
    (900, 65),
    (1100, 80),
    (640, 127),
    (1000, 300),
    (5000, 33),
    (40000, 16),
    (9000, 64),
    (3, 40),
    (1000, 2),
    (77, 33),
    (64, 30000),
]


def _f32_specials(shape, seed):
    """randn * 2 float32 values with NaN, +-inf and signed zeros in their first rows."""
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2
    flat = a.view(-1)
    for i, v in enumerate([float("nan"), -0.0, float("inf"), -float("inf"), 0.0, 3e38, 3e38]):
        if i * 5 < flat.numel():
            flat[i * 5] = v
    return a


def _f32_ring_mismatches(a, f=lambda t: t):
    """[(kind, mismatches)] of f(a).sum(0) and .mean(0) on "tpu" against _ring_reference of f(a)."""
    from torch_tpu_eager import spyre

    out = []
    for kind, op in (("sum", lambda t: t.sum(0)), ("mean", lambda t: t.mean(0))):
        got = op(f(a.to("tpu"))).cpu()
        (sched,) = spyre.last_schedule()
        # The reference on f(a)'s rows as a tile holds them (contiguous: CPU's kernel sums a
        # strided view's columns in another order).
        want = _ring_reference(f(a).contiguous(), kind, (0,), sched).reshape(got.shape)
        num = ~want.isnan()  # zeros' signs compared too (a NaN's sign bit is not a value)
        out.append((kind, same(got, want), torch.equal(got.signbit()[num], want.signbit()[num])))
    return out


@pytest.mark.parametrize("shape", F32_RING_SHAPES, ids=[f"{r}x{c}" for r, c in F32_RING_SHAPES])
def test_f32_ring_sum_in_cpu_order(spyre_target, shape):
    a = _f32_specials(shape, seed=70)
    for kind, bad, signs in _f32_ring_mismatches(a):
        assert bad == 0 and signs, (kind, shape)


def test_f32_ring_sum_tile_path_and_strided_input(spyre_target):
    # An op on the tiles first (the partials read the step's tile), and a transposed input
    # (no in-place read: the tile copy's rows).
    a = _f32_specials((2000, 96), seed=71)
    for kind, bad, signs in _f32_ring_mismatches(a, lambda t: t * 2):
        assert bad == 0 and signs, ("after an op", kind)
    b = _f32_specials((300, 1000), seed=72)
    for kind, bad, signs in _f32_ring_mismatches(b, lambda t: t.t()):
        assert bad == 0 and signs, ("transposed", kind)


_F32_RING_AVX2_CHILD = r"""
import json, sys, torch, torch_tpu_eager as tte
sys.path[:0] = [{tests!r}, {spyre_tests!r}]
from test_spyre_reduce16 import _f32_specials, _f32_ring_mismatches
tte.set_target("spyre")
res = {{"capability": torch.backends.cpu.get_cpu_capability(), "bad": []}}
for threads in (1, 2):
    torch.set_num_threads(threads)
    for shape in [(700, 32), (900, 33), (1100, 48), (1000, 300), (40000, 16), (64, 30000)]:
        for kind, bad, signs in _f32_ring_mismatches(_f32_specials(shape, seed=73)):
            if bad or not signs:
                res["bad"].append([threads, list(shape), kind, bad])
print(json.dumps(res))
"""


def test_f32_ring_sum_at_avx2(tmp_path):
    # CPU's sum kernel at AVX2 (8-float vectors: groups of 32 columns) in a child process.
    import os

    from difftest import REPO_ROOT, run_avx2_child

    here = os.path.dirname(os.path.abspath(__file__))
    code = _F32_RING_AVX2_CHILD.format(tests=os.path.join(REPO_ROOT, "tests"), spyre_tests=here)
    assert run_avx2_child(code, tmp_path)["bad"] == []


def test_f16c_build_same_bits_as_avx2_and_baseline(spyre_target):
    # float16 widened by F16C (branch spyre24a: vcvtph2ps, the values in column order, no
    # paired loads) against the AVX2 bit-operation build and the baseline build, and against
    # CPU's f32 sums (rows) / the ring reference (columns); widths around 8 and 32 values.
    for shape in [(40, 7), (40, 33), (70, 96), (70, 127), (1000, 300), (5000, 33), (640, 96), (3, 40)]:
        a = _specials(_inputs(torch.float16, seed=74, shape=shape))
        for f in (lambda t: t.sum(-1), lambda t: t.sum(0)):
            f16c = f(a.to("tpu")).cpu()
            with cpu_features_off("f16c"):
                bits = f(a.to("tpu")).cpu()
            with cpu_features_off("avx2"):
                base = f(a.to("tpu")).cpu()
            assert torch.equal(f16c.view(torch.int16), bits.view(torch.int16)), shape
            assert torch.equal(f16c.view(torch.int16), base.view(torch.int16)), shape
        assert same(a.to("tpu").sum(-1).cpu(), store(a.float().sum(-1), torch.float16)) == 0, shape
        for kind, got, want, _ in _ring_sum_and_mean(a, torch.float16):
            assert same(got, want) == 0, (kind, shape)


# float32 row sums read in place (branch spyre25a): each tile step's rows summed where they are,
# in the order of CPU's sum kernel (8-float vectors: torch 2.13 has no AVX512 sum kernel, so an
# AVX512 CPU runs its AVX2 one): widths under, at and around one vector and one group of 4
# vectors, and rows long enough for the cascade's carries (16 and 256 groups of 4 vectors),
# under ATen's grain of 32768 values.
F32_ROW_WIDTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 300, 1025, 4100, 17000]


def _f32_rows(shape, seed):
    """float32 rows of mixed magnitudes (sums whose order shows in their bits), with NaN,
    +-inf and signed zeros in their first rows."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-12, 13, shape, generator=g).float())
    flat = a.view(-1)
    for i, v in enumerate([float("nan"), -0.0, float("inf"), -float("inf"), 0.0, 3e38, 3e38, -0.0]):
        if i * 5 + 1 < flat.numel():
            flat[i * 5 + 1] = v
    return a


def _row_sum_mismatches(a, dim=-1, keepdim=False):
    """(mismatched elements, zero signs equal, tiled in several steps) of a.sum(dim) on "tpu"
    against CPU's float32 a.sum(dim) of the contiguous rows (the tile's layout)."""
    from torch_tpu_eager import spyre

    got = a.to("tpu").sum(dim, keepdim=keepdim).cpu()
    (sched,) = spyre.last_schedule()
    want = a.contiguous().sum(dim, keepdim=keepdim)
    num = ~want.isnan()
    tiled = sched["executed"] == "tiles" and sched["tile_steps"] > 1
    return same(got, want), torch.equal(got.signbit()[num], want.signbit()[num]), tiled


def _row_sums_in_place():
    from difftest import report_count

    return report_count("spyre_row_sums.")


def test_f32_row_sums_in_cpu_order(spyre_target):
    for n in F32_ROW_WIDTHS:
        rows = max(40, min(2000, 600000 // n))
        a = _f32_rows((rows, n), seed=80 + n)
        before = _row_sums_in_place()
        for keepdim in (False, True):
            bad, signs, tiled = _row_sum_mismatches(a, keepdim=keepdim)
            assert bad == 0 and signs, (n, keepdim)
        # Programs walked in several tile steps read the rows in place (one-step ones run CPU's sum).
        if tiled:
            assert _row_sums_in_place() == before + 2, n


def test_f32_row_sums_ranks_and_strided_input(spyre_target):
    for shape, dim in [((200, 5, 300), 2), ((3000, 33), -1), ((64, 17000), 1)]:
        bad, signs, _ = _row_sum_mismatches(_f32_rows(shape, seed=81), dim)
        assert bad == 0 and signs, shape
    # A transposed input is not read in place: the tiles' copies hold its rows contiguous.
    before = _row_sums_in_place()
    bad, signs, _ = _row_sum_mismatches(_f32_rows((300, 1000), seed=82).t())
    assert bad == 0 and signs
    assert _row_sums_in_place() == before


def test_f32_row_sums_baseline_build_same_bits(spyre_target):
    # The AVX2 and baseline builds of the loop: the same adds in CPU's order.
    for shape in [(1000, 300), (2000, 9), (2000, 16), (500, 1025), (64, 17000)]:
        a = _f32_rows(shape, seed=83)
        before = _row_sums_in_place()
        wide = a.to("tpu").sum(-1).cpu()
        with cpu_features_off("avx2"):
            narrow = a.to("tpu").sum(-1).cpu()
        assert torch.equal(wide.view(torch.int32), narrow.view(torch.int32)), shape
        assert same(wide, a.sum(-1)) == 0, shape
        assert _row_sums_in_place() == before + 2, shape


_F32_ROWS_AVX2_CHILD = r"""
import json, sys, torch, torch_tpu_eager as tte
sys.path[:0] = [{tests!r}, {spyre_tests!r}]
from test_spyre_reduce16 import _f32_rows, _row_sum_mismatches, _row_sums_in_place
tte.set_target("spyre")
res = {{"capability": torch.backends.cpu.get_cpu_capability(), "bad": [], "in_place": -_row_sums_in_place()}}
for n in (7, 8, 9, 15, 16, 17, 31, 33, 300, 1025, 17000):
    bad, signs, _ = _row_sum_mismatches(_f32_rows((max(40, min(2000, 600000 // n)), n), seed=84 + n))
    if bad or not signs:
        res["bad"].append([n, bad])
res["in_place"] += _row_sums_in_place()
print(json.dumps(res))
"""


def test_f32_row_sums_at_avx2(tmp_path):
    # CPU's sum kernel at AVX2 capability in a child process (its AVX2 kernel, as at AVX512).
    import os

    from difftest import REPO_ROOT, run_avx2_child

    here = os.path.dirname(os.path.abspath(__file__))
    code = _F32_ROWS_AVX2_CHILD.format(tests=os.path.join(REPO_ROOT, "tests"), spyre_tests=here)
    res = run_avx2_child(code, tmp_path)
    assert res["bad"] == [] and res["in_place"] > 0
