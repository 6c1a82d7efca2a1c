"""In-place ops whose only kernel is CompositeExplicitAutograd and whose composite calls
CPU's DispatchStub itself (conj_physical_): on "tpu" the stub had no kernel and raised
"DispatchStub: missing kernel for tpu" (an INTERNAL ASSERT) where CPU conjugates in place.
tools/gen_op_table.py records them whole. Found by PyTorch's test_ops.py TestMathBits
(test_conj_view_conj_physical, test_neg_conj_view_conj_physical)."""

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
