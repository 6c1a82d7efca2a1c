"""torch.tpu.Precision / torch.tpu.precision: scoped float32 matmul precision."""
import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _bf16_matmul(a, b):
    return a.bfloat16().float() @ b.bfloat16().float()


def test_scope_sets_agrees_and_restores():
    before = torch.get_float32_matmul_precision()
    with torch.tpu.precision(torch.tpu.Precision.MEDIUM) as p:
        assert p is torch.tpu.Precision.MEDIUM
        assert torch.get_float32_matmul_precision() == "medium" == torch.tpu.get_precision().value
        with torch.tpu.precision("highest"):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "medium"
    assert torch.get_float32_matmul_precision() == before


def test_restores_on_exception():
    before = torch.get_float32_matmul_precision()
    with pytest.raises(KeyError):
        with torch.tpu.precision("high"):
            raise KeyError("x")
    assert torch.get_float32_matmul_precision() == before


def test_ops_recorded_inside_run_at_the_scope_precision():
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ta, tb = a.to("tpu"), b.to("tpu")
    with torch.tpu.precision("medium"):
        y_medium = ta @ tb
    y_highest = ta @ tb  # recorded outside: "highest" (the default)
    torch.testing.assert_close(y_medium.cpu(), _bf16_matmul(a, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y_highest.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_decorator_and_bad_values():
    @torch.tpu.precision("high")
    def f():
        return torch.get_float32_matmul_precision()

    assert f() == "high"
    with pytest.raises(ValueError, match="unknown precision"):
        torch.tpu.precision("fp8")
    with pytest.raises(ValueError):
        torch.tpu.precision(3)
