"""Simulated TPU numerics: MXU precision modes against an independent emulation."""

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _bf16(x):
    return x.to(torch.bfloat16).to(torch.float64)


def _reference(a, b, precision):
    """Matmul as the MXU defines it, computed in float64 so that only the input
    rounding matters: 'medium' one bf16 pass; 'high' bf16x3 (hi*hi + hi*lo + lo*hi)."""
    a64, b64 = a.double(), b.double()
    if precision == "highest":
        return a64 @ b64
    ah, bh = _bf16(a), _bf16(b)
    if precision == "medium":
        return ah @ bh
    al, bl = _bf16(a64 - ah), _bf16(b64 - bh)
    return ah @ bh + ah @ bl + al @ bh


@pytest.fixture
def precision_mode():
    old = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "linear"])
def test_matmul_precision_modes(precision, op, precision_mode):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 33, 70, generator=g)
    b = torch.randn(2, 70, 17, generator=g)
    bias = torch.randn(17, generator=g)
    torch.set_float32_matmul_precision(precision)
    if op == "mm":
        got, ref = torch.mm(a[0].to("tpu"), b[0].to("tpu")), _reference(a[0], b[0], precision)
    elif op == "addmm":
        got = torch.addmm(bias.to("tpu"), a[0].to("tpu"), b[0].to("tpu"))
        ref = bias.double() + _reference(a[0], b[0], precision)
    elif op == "bmm":
        got = torch.bmm(a.to("tpu"), b.to("tpu"))
        ref = torch.stack([_reference(a[i], b[i], precision) for i in range(2)])
    else:
        got = torch.nn.functional.linear(a[0].to("tpu"), b[0].t().contiguous().to("tpu"), bias.to("tpu"))
        ref = bias.double() + _reference(a[0], b[0], precision)
    got = got.cpu().double()
    # f32 accumulation of 70 products: ~70 * 2^-24 relative to the sum of |terms|.
    scale = (a[0].abs().double() @ b[0].abs().double()).max().item()
    assert (got - ref).abs().max().item() <= 1e-5 * scale
    if precision != "highest":
        # and it really is the reduced-precision result, not f32
        exact = a[0].double() @ b[0].double() if op != "bmm" else torch.bmm(a.double(), b.double())
        if op in ("addmm", "linear"):
            exact = exact + bias.double()
        assert (got - exact).abs().max().item() > 1e-6 * scale


def test_bf16_elementwise_rounds_once_per_op_like_cpu():
    x = torch.randn(1000, dtype=torch.bfloat16)
    y = ((x * 3 + 1).exp() / 7).sin()
    got = ((x.to("tpu") * 3 + 1).exp() / 7).sin().cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got, y)


@pytest.mark.parametrize(
    "fn",
    ["neg", "abs", "relu", "exp", "log", "sin", "cos", "tanh", "sigmoid", "sqrt", "rsqrt", "reciprocal"],
)
def test_fused_elementwise_loop_matches_cpu(fn):
    # Special values, a ramp and random data; sizes that end in a partial vector and tile.
    x = torch.cat(
        [
            torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-38, -1e-38, 88.0, -88.0]),
            torch.linspace(-10, 10, 2053),
            torch.randn(3001, generator=torch.Generator().manual_seed(1)),
        ]
    )

    def prog(t):
        y = getattr(torch, fn)(t * 1.5 - 0.25)
        return (y + t) * 0.5, y / 3.0

    import torch_tpu_eager

    torch_tpu_eager.reset_metrics()
    got = prog(x.to("tpu"))
    got = [g.cpu() for g in got]
    assert torch_tpu_eager.metrics()["regions_run"] == 1
    for g, e in zip(got, prog(x)):
        # transcendental results may differ from CPU's by an ulp (loop tails, vector width)
        torch.testing.assert_close(g, e, equal_nan=True, rtol=2e-6, atol=1e-6)
