"""The exp estimate of softmax's bfloat16 normalizing pass (csrc/executors/spyre/df16.cpp,
kExpEstimateSteps) against CPU's exp, torch.exp (MKL's VML on x86-64 wheels).

The pass takes exp(x - max) by a polynomial estimate and keeps a quotient only where
it is more than kEstimateSlack f32 bit steps from a df16 carry; that is right only if
the estimate is within one bit step of torch.exp on every difference it can see. The
differences of softmax are f32 values in [-inf, 0] (NaN and d > 0 are redone with
torch.exp); below -86 the pass takes -86. The slow test checks every f32 in [-86, 0]
(1.1e9 values) on the build the pass runs on this CPU (16 AVX-512 lanes, else 8 AVX2
+ FMA lanes); the fast ones a sample of them, the edges, the clamp, and that both
builds give the same bits.
"""

import pytest
import torch

from difftest import cpu_features_off, requires_tpu

pytestmark = requires_tpu

STEPS = 1  # kExpEstimateSteps in df16.cpp


def _estimate(d, wide=True):
    """The estimate at d, on its AVX-512 build where the CPU has one (``wide``), else
    (and with AVX-512F switched off) on its AVX2 + FMA build."""
    from torch_tpu_eager import _C

    with cpu_features_off(*([] if wide else ["avx512f"])):
        e = _C._softmax_exp_estimate(d)
    if e is None:
        pytest.skip("the estimate needs AVX2 and FMA; without them the pass takes torch.exp")
    return e


def _steps_from_exp(d):
    """|bits(estimate(d)) - bits(torch.exp(d))| for float32 d (both finite and >= 0 there)."""
    return (_estimate(d).view(torch.int32) - torch.exp(d).view(torch.int32)).abs()


def _bits_range(lo, hi, step=1):
    """The float32 values whose int32 bits run from lo to hi - 1 (every step-th)."""
    return torch.arange(lo, hi, step, dtype=torch.int32).view(torch.float32)


NEG_ZERO = -(2**31)  # int32 bits of -0.0; bits grow with |d| for negative d
CLAMP = int(torch.tensor([-86.0]).view(torch.int32))


def test_exp_estimate_within_one_step_sampled():
    # Every 4099th float in [-86, 0], plus the ends, +0, values near multiples of
    # ln 2 / 2 (where the reduction switches k) and tiny differences.
    d = torch.cat(
        [
            _bits_range(NEG_ZERO, CLAMP + 1, 4099),
            torch.tensor([0.0, -0.0, -86.0, -1e-30, -1.4901163e-07, -0.5, -1.0, -21.5, -44.0]),
            torch.cat([torch.arange(-124, 1) * 0.34657359 + o for o in (-1e-6, 0.0, 1e-6)]).float().clamp(-86, 0),
        ]
    )
    steps = _steps_from_exp(d)
    assert int(steps.max()) <= STEPS
    assert _estimate(torch.tensor([0.0, -0.0])).tolist() == [1.0, 1.0]


def test_exp_estimate_builds_agree():
    # The pass runs the 16-lane AVX-512 build where the CPU has AVX-512F, else the
    # 8-lane AVX2 + FMA one: the same operations, so the same bits (also on a
    # length that leaves partial vectors, and on NaN, +-inf and d > 0).
    d = torch.cat([_bits_range(NEG_ZERO, CLAMP + 1, 4099), torch.tensor([float("nan"), float("inf"), -1e30, 3.0, 0.5])])
    for n in (d.numel(), 13, 7):
        assert torch.equal(_estimate(d[:n], True).view(torch.int32), _estimate(d[:n], False).view(torch.int32))


def test_exp_estimate_clamped_below_minus_86():
    # Below -86 (and at -inf) the estimate is exp(-86)'s, under 2^-124: after a
    # quotient by a softmax sum (>= 1) far under df16's zero limit, as torch.exp's.
    d = torch.tensor([-86.0, -86.5, -87.0, -100.0, -1e30, float("-inf")])
    e = _estimate(d)
    assert bool((e > 0).all()) and bool((e < 2.0**-124).all())
    assert bool((torch.exp(d) < 2.0**-124).all())


def test_exp_estimate_within_one_step_everywhere():
    # Exhaustive: all 1,118,568,449 float32 values in [-86, 0] (slow tier: minutes).
    worst, step = 0, 1 << 24
    for lo in range(NEG_ZERO, CLAMP + 1, step):
        worst = max(worst, int(_steps_from_exp(_bits_range(lo, min(lo + step, CLAMP + 1))).max()))
    assert worst <= STEPS
