"""The host runs the functional kernel where CPU's out= kernel would warn.

CPU's out= kernels of mse_loss, huber_loss, smooth_l1_loss and binary_cross_entropy
(torch 2.13) compute the unreduced loss into `out` before reducing, resizing a
correctly sized 0-dim `out` with PyTorch's deprecation warning "An output with one
or more elements was resized". CPU's functional call warns nothing, so neither may
"tpu" (tools/gen_op_table.py OUT_KERNEL_RESIZES keeps them out of out_overloads.inc).
Values, dtypes and shapes are CPU's.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)

LOSSES = {
    "mse_loss": lambda x, y, r: F.mse_loss(x, y, reduction=r),
    "huber_loss": lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.7),
    "smooth_l1_loss": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
    "binary_cross_entropy": lambda x, y, r: F.binary_cross_entropy(x.sigmoid(), y.sigmoid(), reduction=r),
}


def _resize_warnings(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in got if "was resized" in str(w.message)]


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_warns_like_cpu_and_matches(name, reduction, dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(37, 19, generator=g).to(dtype)
    y = torch.randn(37, 19, generator=g).to(dtype)
    loss = LOSSES[name]
    expected, cpu_warned = _resize_warnings(lambda: loss(x, y, reduction))
    got, tpu_warned = _resize_warnings(lambda: loss(x.to("tpu"), y.to("tpu"), reduction).cpu())
    assert tpu_warned == cpu_warned == []
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got.dtype == expected.dtype and got.shape == expected.shape


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_backward_warns_like_cpu_and_matches(name):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 5, generator=g)
    y = torch.randn(8, 5, generator=g)

    def grad(dev):
        xd = x.to(dev).detach().requires_grad_()
        LOSSES[name](xd, y.to(dev), "mean").backward()
        return xd.grad.cpu()

    expected, cpu_warned = _resize_warnings(lambda: grad("cpu"))
    got, tpu_warned = _resize_warnings(lambda: grad("tpu"))
    assert tpu_warned == cpu_warned == []
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# The explicit out= overloads of the same ops: CPU's kernel resizes `out` to the
# unreduced shape before reducing into it, which a queued node's fixed-size device
# buffer cannot take (it failed at the flush: "Trying to resize storage that is not
# resizable"). They run at the call (tools/gen_op_table.py kind_of): CPU's kernel, a
# resizable out, CPU's values, shape and warnings.
OUT_ARGS = {
    "mse_loss": lambda x, y, r: (x, y, r),
    "huber_loss": lambda x, y, r: (x, y, r, 0.7),
    "smooth_l1_loss": lambda x, y, r: (x, y, r, 0.5),
    "binary_cross_entropy": lambda x, y, r: (x.sigmoid(), y.sigmoid(), None, r),
}


@pytest.mark.parametrize("name", sorted(OUT_ARGS))
@pytest.mark.parametrize("reduction", [0, 1, 2])  # none, mean, sum
@pytest.mark.parametrize("out_shape", [(0,), (), (3,)])
def test_explicit_out_overload_resizes_out_like_cpu(name, reduction, out_shape):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 5, generator=g)
    y = torch.randn(6, 5, generator=g)
    op = getattr(torch.ops.aten, name).out

    def call(dev):
        out = torch.full(out_shape, 9.0, device=dev)
        res = op(*OUT_ARGS[name](x.to(dev), y.to(dev), reduction), out=out)
        assert res is out
        return out.cpu()

    expected, cpu_warned = _resize_warnings(lambda: call("cpu"))
    got, tpu_warned = _resize_warnings(lambda: call("tpu"))
    assert tpu_warned == cpu_warned
    # CPU's binary_cross_entropy.out reduces over the out it wrote the unreduced loss
    # to, unlike its functional op (NaN for the mean into an out of zero elements):
    # deterministic, and CPU's values are the contract.
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    assert got.shape == expected.shape


def test_explicit_out_overload_reads_queued_inputs():
    """Inputs still queued on the device (computed, not copied in) are run first."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    out = torch.empty(0, device="tpu")
    # Exact on both devices (no transcendental: the fused math may differ by an ulp).
    torch.ops.aten.mse_loss.out(x.to("tpu") * 2, (x.to("tpu") - 1).abs(), 1, out=out)
    expected = torch.ops.aten.mse_loss.out(x * 2, (x - 1).abs(), 1, out=torch.empty(0))
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
