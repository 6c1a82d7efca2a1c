"""set_fused_math: which float32 routines fused loops use for exp, log, sin, cos, tanh
and sqrt. "cpu" must equal CPU's ops bit for bit; "sleef" (the default) must stay
within the few ulp SLEEF documents. Both are checked against CPU PyTorch on inputs
that end in partial vectors and tiles."""
import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

SIZES = [1, 17, 1024, 1025, 4099]
# Each function behind a cheap producer, so the op runs inside a fused region rather
# than as CPU's own kernel on the device buffer.
FUNCS = {
    "exp": lambda t: (t * 8.0).exp(),
    "log": lambda t: (t.abs() * 50.0 + 1e-3).log(),
    "sin": lambda t: (t * 10.0).sin(),
    "cos": lambda t: (t * 10.0).cos(),
    "tanh": lambda t: (t * 4.0).tanh(),
    "sqrt": lambda t: (t.abs() * 100.0).sqrt(),
}


@pytest.fixture
def mode():
    before = torch_tpu_eager.fused_math()
    yield torch_tpu_eager.set_fused_math
    torch_tpu_eager.set_fused_math(before)


def _ulp_distance(a, b):
    # Distance in representable float32 values (both finite here).
    def ordered(t):
        i = t.view(torch.int32).long()
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    return (ordered(a) - ordered(b)).abs()


def _fused(fn, x):
    xd = x.to("tpu")
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    out = fn(xd).cpu()
    assert torch_tpu_eager.metrics()["regions_run"] == 1, "the producer and the function should be one region"
    return out


def test_default_is_sleef():
    assert torch_tpu_eager.fused_math() == "sleef"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", FUNCS)
def test_cpu_routines_equal_cpu_bit_for_bit(mode, name, n):
    mode("cpu")
    x = cpu_randn(n, seed=n)
    assert torch.equal(_fused(FUNCS[name], x), FUNCS[name](x))


@pytest.mark.parametrize("name", FUNCS)
def test_sleef_routines_are_within_a_few_ulp(mode, name):
    mode("sleef")
    x = cpu_randn(1 << 16, seed=7)
    got, want = _fused(FUNCS[name], x), FUNCS[name](x)
    # SLEEF's bounds are 1.0 ulp (exp, log, tanh) and 3.5 ulp (sin, cos) from the true
    # value; CPU's routines have their own error, so the two may differ by their sum.
    assert _ulp_distance(got, want).max().item() <= 4


def test_cpu_routines_make_the_chain16_program_equal_cpu(mode):
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from run_all import chain16
    mode("cpu")
    x = torch.rand(300, 301, generator=torch.Generator().manual_seed(3))
    assert torch.equal(chain16(x.to("tpu")).cpu(), chain16(x))


def test_the_mode_applies_to_a_cached_region(mode):
    # The compile cache does not key on the mode: the same region, run again after a
    # switch, must use the new routines.
    x = cpu_randn(5000, seed=11)
    fn = FUNCS["sin"]
    mode("sleef")
    first = _fused(fn, x)
    mode("cpu")
    assert torch.equal(_fused(fn, x), fn(x))
    assert not torch.equal(first, fn(x)), "sleef and CPU's routines should differ somewhere on 5000 values"


def test_bad_mode_raises_and_keeps_the_mode(mode):
    mode("cpu")
    with pytest.raises(ValueError, match="fused math mode"):
        torch_tpu_eager.set_fused_math("fast")
    assert torch_tpu_eager.fused_math() == "cpu"
