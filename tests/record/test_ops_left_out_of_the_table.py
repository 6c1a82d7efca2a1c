"""Ops the op table once left out, which CPU runs and "tpu" did not.

- In-place ops whose only kernel is CompositeExplicitAutograd and whose composite calls
  CPU's DispatchStub itself (conj_physical_): on "tpu" the stub had no kernel and raised
  "DispatchStub: missing kernel for tpu" (an INTERNAL ASSERT) where CPU conjugates in
  place. tools/gen_op_table.py records them whole. Found by PyTorch's test_ops.py
  TestMathBits (test_conj_view_conj_physical, test_neg_conj_view_conj_physical).
- histogramdd's three ops (_histogramdd_bin_edges, _histogramdd_from_bin_cts,
  _histogramdd_from_bin_tensors) were excluded and raised NotImplementedError; they run at
  the call like histc and histogram (kSync). Found by test_ops.py's test_errors_histogramdd
  and TestMathBits test_neg_view_histogramdd.
- _scaled_mm / _scaled_mm_v2 (float8 matmul with scales) were excluded and raised
  NotImplementedError where CPU computes; they run CPU's kernel at the call (kSync).
  Found by test_ops.py's test_out_warning_torch__scaled_mm and tools/sweep_dtype_errors.py."""

import pytest
import torch

from difftest import assert_bit_equal, requires_tpu

pytestmark = requires_tpu


def _pair(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(shape, generator=g, dtype=torch.complex128) * 4
    x = x.to(dtype) if dtype.is_complex else x.real.to(dtype)
    return x, x.to("tpu")


@pytest.mark.parametrize(
    "dtype", [torch.complex64, torch.complex128, torch.float32, torch.float64, torch.int64, torch.bool]
)
def test_conj_physical_inplace_matches_cpu(dtype):
    x, t = _pair(dtype)
    assert t.conj_physical_() is t
    x.conj_physical_()
    assert_bit_equal((t.cpu(),), (x,))


@pytest.mark.parametrize("view", ["conj", "neg_conj", "strided"])
def test_conj_physical_inplace_of_a_view(view):
    """TestMathBits' cases: the in-place op on a conjugate (and negative) view, and on a
    strided slice, writes the base as CPU does."""
    x, t = _pair(torch.complex64, (4, 6))
    if view == "strided":
        x[:, ::2].conj_physical_()
        t[:, ::2].conj_physical_()
        assert_bit_equal((t.cpu(),), (x,))
        return
    xv, tv = x.conj(), t.conj()
    if view == "neg_conj":
        xv, tv = torch._neg_view(xv), torch._neg_view(tv)
    xv.conj_physical_()
    tv.conj_physical_()
    assert (tv.is_conj(), tv.is_neg()) == (xv.is_conj(), xv.is_neg())
    assert_bit_equal((tv.resolve_conj().resolve_neg().cpu(), t.cpu()), (xv.resolve_conj().resolve_neg(), x))


def test_conj_physical_inplace_then_other_ops():
    """The recorded node joins a region with the ops around it; the values stay CPU's."""
    x, t = _pair(torch.complex64)
    want = (x * 2).conj_physical_().abs() + 1
    got = (t * 2).conj_physical_().abs() + 1
    assert_bit_equal((got.cpu(),), (want,))


def test_conj_physical_inplace_autograd():
    x, t = _pair(torch.complex128)
    grads = []
    for base in (x, t):
        leaf = base.clone().requires_grad_()
        y = leaf * 3
        y.conj_physical_()
        y.abs().sum().backward()
        grads.append(leaf.grad)
    assert_bit_equal((grads[1].cpu(),), (grads[0],))


def _to(v, dev):
    if isinstance(v, torch.Tensor):
        return v.to(dev)
    if isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
        return [b.to(dev) for b in v]
    return v


HISTOGRAMDD_CASES = {
    "bin_counts": dict(bins=[3, 4, 2]),
    "one_count": dict(bins=5),
    "range": dict(bins=[3, 4, 2], range=[-1.0, 1.0, -2.0, 2.0, 0.0, 1.0]),
    "weight_density": dict(bins=[3, 4, 2], weight="w", density=True),
    "bin_tensors": dict(bins=[torch.tensor([-1.0, 0, 1]), torch.tensor([-3.0, 0, 0.5, 3]), torch.linspace(-2, 2, 5)]),
    "bin_tensors_weight": dict(
        bins=[torch.tensor([-1.0, 1]), torch.tensor([-3.0, 3]), torch.tensor([0.0, 2])], weight="w"
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(HISTOGRAMDD_CASES))
def test_histogramdd_matches_cpu(case, dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=g).to(dtype)
    w = torch.rand(40, generator=g).to(dtype)
    kw = {k: (w if v == "w" else v) for k, v in HISTOGRAMDD_CASES[case].items()}
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if isinstance(kw["bins"], list) and isinstance(kw["bins"][0], torch.Tensor):
        kw["bins"] = [b.to(dtype) for b in kw["bins"]]
    want = torch.histogramdd(x, **kw)
    got = torch.histogramdd(x.to("tpu"), **{k: _to(v, "tpu") for k, v in kw.items()})
    assert got.hist.device.type == "tpu" and all(e.device.type == "tpu" for e in got.bin_edges)
    assert_bit_equal((got.hist.cpu(), *(e.cpu() for e in got.bin_edges)), (want.hist, *want.bin_edges))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.histogramdd(torch.ones(4, 3, dtype=torch.long, device=d), bins=[2, 2, 2]),
        lambda d: torch.histogramdd(torch.ones(4, 3, device=d), bins=[2, 2]),
        lambda d: torch.histogramdd(torch.ones(4, 2, device=d), bins=[2, 2], weight=torch.ones(3, device=d)),
    ],
    ids=["long_input", "bins_rank", "weight_shape"],
)
def test_histogramdd_errors_at_the_call(call):
    with pytest.raises(Exception) as cpu:
        call("cpu")
    with pytest.raises(type(cpu.value)) as tpu:
        call("tpu")
    assert str(tpu.value) == str(cpu.value)


def _scaled_mm_args(dev, rows=16):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(rows, 32, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, generator=g).to(torch.float8_e4m3fn).t()
    return a.to(dev), b.to(dev), torch.tensor(0.5, device=dev), torch.tensor(2.0, device=dev)


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
def test_scaled_mm_matches_cpu(out_dtype):
    want = torch._scaled_mm(*_scaled_mm_args("cpu"), out_dtype=out_dtype)
    got = torch._scaled_mm(*_scaled_mm_args("tpu"), out_dtype=out_dtype)
    assert got.device.type == "tpu" and got.stride() == want.stride()
    assert_bit_equal((got.cpu(),), (want,))


def test_scaled_mm_out_warns_and_resizes_as_cpu():
    """test_out_warning: a wrongly sized out= is resized with CPU's UserWarning."""
    outs = []
    for dev in ("cpu", "tpu"):
        out = torch.empty(3, device=dev)
        with pytest.warns(UserWarning, match="was resized") as w:
            torch._scaled_mm(*_scaled_mm_args(dev), out_dtype=torch.float32, out=out)
        outs.append((out.cpu(), [str(x.message) for x in w]))
    assert outs[1][1] == outs[0][1]
    assert_bit_equal((outs[1][0],), (outs[0][0],))


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b, sa, sb: torch._scaled_mm(a.float(), b, sa, sb),
        lambda a, b, sa, sb: torch._scaled_mm(a, b[:8], sa, sb),
    ],
    ids=["float32_operand", "shapes"],
)
def test_scaled_mm_errors_at_the_call(call):
    with pytest.raises(Exception) as cpu:
        call(*_scaled_mm_args("cpu"))
    with pytest.raises(type(cpu.value)) as tpu:
        call(*_scaled_mm_args("tpu"))
    assert str(tpu.value) == str(cpu.value)
