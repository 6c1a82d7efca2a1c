"""set_fused_math: which float32 routines fused loops use for exp, log, sin, cos, tanh
and sqrt. "cpu" must equal CPU's ops bit for bit; "sleef" (the default) must stay
within a few ulp (SLEEF's documented bounds; 1 ulp for our own exp and tanh). Both are
checked against CPU PyTorch on inputs that end in partial vectors and tiles."""

import pytest
import torch

from difftest import REPO_ROOT, DEVICE, cpu_randn, restoring

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
    yield from restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math)


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

    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
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


def _tanh_sweep_inputs():
    # Every 4099th normal float32 below 1e38, both signs, and the special values:
    # zeros, subnormals, the ends of the polynomial's range (0.625), where exp(2|x|)
    # overflows (~44.4), infinities and NaN.
    import numpy as np

    bits = np.arange(0x00800000, 0x7E967699, 4099, dtype=np.int64).astype(np.int32)
    sweep = torch.from_numpy(bits.view(np.float32).copy())
    special = torch.tensor(
        [0.0, 1e-45, 1e-40, 1.17e-38, 0.6249999, 0.625, 0.6250001, 9.0, 44.3, 44.4, 44.5, 89.0, float("inf")]
    )
    x = torch.cat([sweep, special])
    return torch.cat([x, -x, torch.tensor([float("nan")])])


def test_sleef_mode_tanh_within_one_ulp_of_cpu(mode):
    mode("sleef")
    x = _tanh_sweep_inputs()
    # (x * 2) / 2 would round subnormals; tanh(x * 2.0) with x halved exactly does not.
    half = x / 2
    got, want = _fused(lambda t: (t * 2.0).tanh(), half), torch.tanh(half * 2.0)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    got, want = got[~nan], want[~nan]
    assert torch.equal(got.signbit(), want.signbit()), "tanh keeps the sign of zero and of every input"
    # Measured over every third normal float (1.4e9 values): at most 1 ulp from CPU's
    # MKL tanh, 0.18% of values differing; 1 ulp from the correctly rounded value.
    assert _ulp_distance(got, want).max().item() <= 1
    exact = torch.tanh((half * 2.0)[~nan].double()).float()
    assert _ulp_distance(got, exact).max().item() <= 1


def _exp_sweep_inputs():
    # Every 1031st float32 of magnitude below 100, both signs, and the special values:
    # zeros, subnormals, the ends of the inline range (87), where exp overflows (88.72)
    # and where its result becomes subnormal (-87.34) and zero (-103.97), inf and NaN.
    import numpy as np

    bits = np.arange(0, 0x42C80000, 1031, dtype=np.int64).astype(np.int32)
    sweep = torch.from_numpy(bits.view(np.float32).copy())
    special = torch.tensor(
        [0.0, 1e-45, 1e-40, 86.99999, 87.0, 87.00001, 88.72, 88.73, 89.0, 100.0, 103.9, 104.0, float("inf")]
    )
    x = torch.cat([sweep, special])
    return torch.cat([x, -x, torch.tensor([float("nan")])])


def test_sleef_mode_exp_within_one_ulp_of_cpu(mode):
    mode("sleef")
    half = _exp_sweep_inputs() / 2
    got, want = _fused(lambda t: (t * 2.0).exp(), half), torch.exp(half * 2.0)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    got, want = got[~nan], want[~nan]
    # Measured over every float32 of magnitude below 100 (2.2e9 values): at most 1 ulp
    # from CPU's MKL exp (0.81% differ) and from the correctly rounded value.
    assert _ulp_distance(got, want).max().item() <= 1
    exact = torch.exp((half * 2.0)[~nan].double()).float()
    assert _ulp_distance(got, exact).max().item() <= 1


def test_polynomials_are_the_ones_the_fit_tool_prints():
    import os
    import re
    import subprocess
    import sys

    root = REPO_ROOT
    out = subprocess.run(
        [sys.executable, os.path.join(root, "tools", "fit_fused_math_polys.py")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with open(os.path.join(root, "csrc", "executors", "tpu", "fused_kernels.inc")) as f:
        source = f.read()
    for name, function in (("exp Q", "inline Vec exp_inline"), ("tanh P", "inline Vec tanh_via_exp")):
        line = next(line for line in out.splitlines() if line.startswith(f"{name} coefficients"))
        printed = [float(c) for c in re.findall(r"(-?\d\.\d+e[-+]\d+)f", line)]
        body = source.split(function, 1)[1].split("\n}\n", 1)[0]
        in_code = [float(c) for c in re.findall(r"Vec\((-?\d\.\d+e[-+]\d+)f\)", body)]
        assert len(printed) == 5 and all(c in in_code for c in printed), (name, printed, in_code)


def _sweep_rows(cols):
    """Rows of softmax inputs whose max is 0, so exp's argument is each value itself: a
    dense sweep of [-110, 0] (past exp's underflow at -104), subnormals, +-0 and -inf."""
    sweep = torch.linspace(-110.0, 0.0, 1 << 18)
    specials = torch.tensor([-0.0, 0.0, -1e-45, -1e-40, -1e-38, float("-inf"), -87.33655, -103.97, -104.0])
    values = torch.cat([sweep, specials])
    values = torch.cat([values, torch.zeros((-values.numel()) % (cols - 1))]).view(-1, cols - 1)
    return torch.cat([values, torch.zeros(values.shape[0], 1)], dim=1)  # each row's max: 0


@pytest.mark.parametrize("cols", [1024, 37])
def test_softmax_exp_inlined_equals_cpu_bit_for_bit(cols):
    # softmax, log_softmax and sigmoid keep CPU's exp (at::vec's SLEEF expf u10), inlined
    # as exp_as_sleef; tools/check_sleef_exp.py checks it on every float32 value.
    x = _sweep_rows(cols)
    for fn in (lambda t: torch.softmax(t, -1), lambda t: torch.log_softmax(t, -1)):
        assert torch.equal(fn(x.to("tpu") * 1.0).cpu(), fn(x))


def test_sigmoid_exp_inlined_equals_cpu_bit_for_bit():
    # 2^18 + 64 values: each thread's share (one or two threads) is a multiple of 32, so
    # CPU's vector loop (SLEEF) computes them all, none its scalar tail (libm).
    x = torch.cat([torch.linspace(-120.0, 120.0, 1 << 18), torch.tensor([0.0, -0.0, 1e-40, -1e-40] * 16)])
    assert torch.equal((x.to("tpu") * 1.0).sigmoid().cpu(), (x * 1.0).sigmoid())
