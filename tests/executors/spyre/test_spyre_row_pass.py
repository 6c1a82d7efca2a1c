"""The Spyre interpreter's row pass (executors/spyre/row_pass.h, issue 21): a
region that is one float32, bfloat16 or float16 softmax, log_softmax or
layer_norm over the last dim(s) runs each core's rows of each tile step with
CPU's float32 row kernel, in place (16-bit rows widened, each result rounded
once to df16, since 2026-12-07, branch spyre24b).

The float32 reference is CPU's op on the whole tensor: float32 on Spyre is IEEE
f32 (docs/spyre.md), so every value equals CPU's bit for bit (NaN where CPU has
NaN). The 16-bit reference is CPU's float32 op on the inputs' df16 values, each
result rounded once by the tests' own df16 codec (test_spyre_numerics.store).
Each case also asserts that the pass ran (the metrics' spyre_row_pass count),
so these tests fail where the region runs op by op.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import cpu_features_off, report_count, requires_tpu
from test_spyre_numerics import df16_ref, store

pytestmark = requires_tpu

# Row widths: every tail of an AVX-512 vector (16) and of two, a row under
# one vector, rows around softmax_row's 1,536 / 2,048-float limits.
WIDTHS = [1, 5, 15, 16, 17, 31, 33, 64, 129, 300, 1537, 2049]
# Shapes whose dim 0 is split over the cores: one step or several, uneven
# last tiles, 3-D views whose split rows hold several rows of the op.
SHAPES = [(1000, 300), (77, 37), (3, 5), (1, 7), (130, 129), (5, 2049), (2, 3, 70), (40, 8, 16), (1100, 33)]

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, 88.0, -88.0, 100.5, -104.5, 1e30, -1e30]


def _values(shape, seed, special=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    if special:
        flat = x.view(-1)
        k = min(flat.numel() // 4, len(SPECIAL))
        pos = torch.randperm(flat.numel(), generator=g)[:k]
        flat[pos] = torch.tensor(SPECIAL[:k])
    return x


def _mismatches(got, want):
    """Elements whose bits differ (NaN equal to NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    bad = int((torch.isnan(got) != nan).sum())
    keep = ~nan & ~torch.isnan(got)
    return bad + int((got[keep].view(torch.int32) != want[keep].view(torch.int32)).sum())


def _row_pass_count():
    return report_count("spyre_row_pass.")


def _vectorized():
    """Whether CPU's row kernels run vectors here (the pass's condition, tpu::run_cpu_rows)."""
    from torch_tpu_eager import _C

    f = _C._cpu_features()
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and f["avx2"] and f["fma"] and f["f16c"]


def _layer_norm_affine(last):
    g = torch.Generator().manual_seed(last)
    w = torch.randn(last, generator=g)
    b = torch.randn(last, generator=g)
    return lambda t: F.layer_norm(t, (last,), w.to(t.device), b.to(t.device), 1e-3)


def _ops(last):
    """name -> op over the last dim of width `last` (the same function on CPU and "tpu")."""
    return {
        "softmax": lambda t: torch.softmax(t, -1),
        "log_softmax": lambda t: torch.log_softmax(t, t.dim() - 1),
        "layer_norm": lambda t: F.layer_norm(t, (last,)),
        "layer_norm_affine": _layer_norm_affine(last),
    }


def _check(fn, x, passes=1):
    before = _row_pass_count()
    got = fn(x.to("tpu"))
    got = [t.cpu() for t in got] if isinstance(got, tuple) else [got.cpu()]
    assert _row_pass_count() == before + (passes if _vectorized() else 0), "the row pass did not run as expected"
    want = fn(x)
    want = list(want) if isinstance(want, tuple) else [want]
    return [_mismatches(g, w) for g, w in zip(got, want)]


def test_row_ops_some_shapes(spyre_target):
    """The fast tier's sample of the tests below (the slow tier runs them whole)."""
    x = _values((2, 3, 70), 75)
    for name in ("softmax", "layer_norm_affine"):
        assert _check(_ops(70)[name], x) == [0], name


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "layer_norm_affine"])
def test_row_op_equals_cpu_every_shape(spyre_target, name):
    for shape in SHAPES:
        x = _values(shape, sum(shape))
        assert _check(_ops(shape[-1])[name], x) == [0], (name, shape)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm"])
def test_row_op_equals_cpu_every_width(spyre_target, name):
    for n in WIDTHS:
        x = _values((67, n), n)
        assert _check(_ops(n)[name], x) == [0], (name, n)


def test_layer_norm_statistics_stored(spyre_target):
    """native_layer_norm's mean and rstd read back: the pass stores them (one float per row)."""
    for shape, normalized in [((1000, 300), (300,)), ((40, 8, 16), (8, 16)), ((77, 37), (37,))]:
        x = _values(shape, 3)
        w = torch.randn(normalized)

        def fn(t):
            return torch.native_layer_norm(t, normalized, w.to(t.device), None, 1e-5)

        assert _check(fn, x) == [0, 0, 0], shape


def test_benchmark_rows_take_the_pass(spyre_target):
    """The benchmark's float32 layer_norm and softmax(x, 1) rows (1000x300 randn)."""
    x = torch.randn(1000, 300, generator=torch.Generator().manual_seed(1))
    assert _check(lambda t: F.layer_norm(t, (300,)), x) == [0]
    assert _check(lambda t: torch.softmax(t, 1), x) == [0]


def test_other_dims_and_dtypes_run_op_by_op(spyre_target):
    """softmax over a dim that is not the last, float64, and a 16-bit layer_norm with
    float32 weight (CPU's mixed type: float32 statistics): no row pass (other paths)."""
    x = _values((64, 48), 7, special=False)
    w = torch.randn(48).to("tpu")
    for fn, t in [
        (lambda t: torch.softmax(t, 0), x),
        (lambda t: torch.softmax(t, 1), x.double()),
        (lambda t: F.layer_norm(t, (48,), w), x.bfloat16()),
    ]:
        before = _row_pass_count()
        fn(t.to("tpu")).cpu()
        assert _row_pass_count() == before


def test_each_cpu_build_same_bits(spyre_target):
    """The executors' AVX-512 switched off (the pass still runs CPU's capability, so the
    same bits) and AVX2 / FMA / F16C off (op by op: ATen's kernel): CPU's values each time."""
    x = _values((130, 129), 11)
    for off in [(), ("avx512f",), ("avx512f", "avx2", "fma", "f16c")]:
        with cpu_features_off(*off):
            for name, fn in _ops(129).items():
                before = _row_pass_count()
                got = fn(x.to("tpu")).cpu()
                ran = _row_pass_count() - before
                assert ran == (1 if _vectorized() else 0), (off, name)
                assert _mismatches(got, fn(x)) == 0, (off, name)


# ------------------------------------------------------------------ 16-bit rows

DTYPES16 = [torch.bfloat16, torch.float16]
IDS16 = ["bf16", "f16"]


def _mismatches16(got, want):
    """Elements whose 16-bit patterns differ (NaN equal to NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    bad = int((torch.isnan(got) != nan).sum())
    keep = ~nan & ~torch.isnan(got)
    return bad + int((got[keep].view(torch.int16) != want[keep].view(torch.int16)).sum())


def _ops16(last, dtype):
    """name -> (op on "tpu" tensors of dtype, the same op's float32 reference on df16 values)."""
    g = torch.Generator().manual_seed(last)
    w = (torch.randn(last, generator=g) * 2).to(dtype)
    b = torch.randn(last, generator=g).to(dtype)
    wr, br = df16_ref(w.float()), df16_ref(b.float())
    return {
        "softmax": (lambda t: torch.softmax(t, -1), lambda r: torch.softmax(r, -1)),
        "log_softmax": (lambda t: torch.log_softmax(t, -1), lambda r: torch.log_softmax(r, -1)),
        "layer_norm": (lambda t: F.layer_norm(t, (last,)), lambda r: F.layer_norm(r, (last,))),
        "layer_norm_affine": (
            lambda t: F.layer_norm(t, (last,), w.to(t.device), b.to(t.device), 1e-3),
            lambda r: F.layer_norm(r, (last,), wr, br, 1e-3),
        ),
    }


def _check16(op, ref, x, passes=1):
    """Mismatches of op(x) on Spyre against ref on x's df16 values, rounded once."""
    before = _row_pass_count()
    got = op(x.to("tpu"))
    got = [t.cpu() for t in got] if isinstance(got, tuple) else [got.cpu()]
    assert _row_pass_count() == before + (passes if _vectorized() else 0), "the row pass did not run as expected"
    want = ref(df16_ref(x.float()))
    want = list(want) if isinstance(want, tuple) else [want]
    return [_mismatches16(g, store(w, x.dtype)) for g, w in zip(got, want)]


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
def test_row_ops16_some_shapes(spyre_target, dtype):
    """The fast tier's sample of the 16-bit tests below."""
    x = _values((40, 8, 70), 76).to(dtype)
    for name in ("softmax", "layer_norm_affine"):
        assert _check16(*_ops16(70, dtype)[name], x) == [0], name


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "layer_norm_affine"])
def test_row_op16_every_shape(spyre_target, dtype, name):
    for shape in SHAPES:
        x = _values(shape, sum(shape)).to(dtype)
        assert _check16(*_ops16(shape[-1], dtype)[name], x) == [0], (name, shape)


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm"])
def test_row_op16_every_width(spyre_target, dtype, name):
    # 4,097 and 5,000: rows wider than the pass's 4,096-float buffer (one row a chunk).
    for n in WIDTHS + [4097, 5000]:
        x = _values((23, n), n).to(dtype)
        assert _check16(*_ops16(n, dtype)[name], x) == [0], (name, n)


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
def test_layer_norm16_statistics_stored(spyre_target, dtype):
    """native_layer_norm's 16-bit mean and rstd read back: each rounded once to df16."""
    for shape, normalized in [((1000, 300), (300,)), ((40, 8, 16), (8, 16)), ((77, 37), (37,))]:
        x = _values(shape, 3, special=False).to(dtype)
        w = torch.randn(normalized).to(dtype)
        wr = df16_ref(w.float())

        def op(t):
            return torch.native_layer_norm(t, normalized, w.to(t.device), None, 1e-5)

        def ref(r):
            return torch.native_layer_norm(r, normalized, wr, None, 1e-5)

        assert _check16(op, ref, x) == [0, 0, 0], shape


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
def test_row_op16_non_contiguous_input(spyre_target, dtype):
    """A transposed or strided input: the df16 reference's values whichever path runs."""
    x = _values((96, 130), 12).to(dtype)
    for name, (op, ref) in _ops16(96, dtype).items():
        for view in (lambda t: t.t(), lambda t: t[:, ::2].t()[:, :96].t().t()):
            got = op(view(x.to("tpu"))).cpu()
            want = store(ref(view(df16_ref(x.float()))), dtype)
            assert _mismatches16(got, want) == 0, name


@pytest.mark.parametrize("dtype", DTYPES16, ids=IDS16)
def test_each_cpu_build_same_bits16(spyre_target, dtype):
    """The executors' AVX-512 off (AVX2 conversions), AVX2 / FMA / F16C off (op by op):
    the df16 reference's bits each time."""
    x = _values((130, 129), 11).to(dtype)
    for off in [(), ("avx512f",), ("avx512f", "avx2", "fma", "f16c")]:
        with cpu_features_off(*off):
            for name, (op, ref) in _ops16(129, dtype).items():
                assert _check16(op, ref, x) == [0], (off, name)
