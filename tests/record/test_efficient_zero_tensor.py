"""torch._efficientzerotensor on "tpu": a ZeroTensor as on CPU (forward-mode AD's tangent of an
argument that has none; csrc/ops/device_kernels.cpp efficient_zero_tensor). Recorded as an op
with CPU's kernel, it was a plain tensor whose fused-region value had no buffer: forward-mode
gradcheck of complex inputs (PyTorch's test_foreach test_autodiff) ended the process with a
segmentation fault."""

import pytest
import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)
from torch.autograd import gradcheck


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_efficientzerotensor_is_a_zero_tensor_as_on_cpu(dtype, shape):
    got = {}
    for dev in ("cpu", "tpu"):
        z = torch._efficientzerotensor(shape, dtype=dtype, device=dev)
        x = -torch.arange(1, 7, dtype=torch.float64)[: max(1, z.numel())].reshape(shape).to(dtype).to(dev)
        prod = z * x
        got[dev] = (
            z._is_zerotensor(),
            z.shape,
            z.stride(),
            z.dtype,
            z.device.type,
            prod._is_zerotensor(),
            prod.cpu(),
            (z + x).cpu(),
            z.cpu(),
        )
    assert got["tpu"][:4] == got["cpu"][:4] and got["tpu"][4] == "tpu"
    assert got["tpu"][5] == got["cpu"][5]
    for a, b in zip(got["tpu"][6:], got["cpu"][6:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(
            torch.signbit(torch.view_as_real(a) if a.is_complex() else a),
            torch.signbit(torch.view_as_real(b) if b.is_complex() else b),
        )


def test_efficientzerotensor_is_immutable_as_on_cpu():
    errors = {}
    for dev in ("cpu", "tpu"):
        z = torch._efficientzerotensor((3,), device=dev)
        with pytest.raises(RuntimeError) as e:
            z.add_(1)
        errors[dev] = str(e.value)
    assert errors["tpu"] == errors["cpu"]


@pytest.mark.parametrize(
    "fn", [torch.abs, torch.sgn, lambda t: t * 1j, torch.real], ids=["abs", "sgn", "mul_1j", "real"]
)
def test_forward_mode_gradcheck_of_complex_inputs(fn):
    torch.manual_seed(0)
    x = torch.randn(3, 3, dtype=torch.complex128).to("tpu").requires_grad_()
    assert gradcheck(fn, (x,), check_forward_ad=True, check_batched_grad=False, check_batched_forward_grad=False)


def test_foreach_forward_mode_gradcheck_of_complex_inputs():
    torch.manual_seed(0)
    xs = [torch.randn(n, n, dtype=torch.complex128).to("tpu").requires_grad_() for n in (3, 2, 1)]
    assert gradcheck(
        lambda *t: torch._foreach_abs(t),
        xs,
        check_forward_ad=True,
        check_batched_grad=False,
        check_batched_forward_grad=False,
    )
