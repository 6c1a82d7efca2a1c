"""Division modes (BR-27).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both, run_both_outcome


# ---------------------------------------------------------------------------
# division modes (BR-27)
# ---------------------------------------------------------------------------


def test_division_modes_float_and_int(dev):
    def prog(d):
        a = torch.tensor([-7.0, 7.0, -1.0, 5.0, -0.5, 6.0]).to(d)
        b = torch.tensor([2.0, -2.0, 3.0, 3.0, 2.0, -4.0]).to(d)
        ai = torch.tensor([-7, 7, -1, 5, 0, -9, 9]).to(d)
        bi = torch.tensor([2, -2, 2, 3, 5, -3, -4]).to(d)
        trunc = torch.div(a, b, rounding_mode="trunc")
        floor = torch.div(a, b, rounding_mode="floor")
        return (
            trunc,
            floor,
            trunc.signbit(),
            floor.signbit(),
            a // b,
            a % b,
            torch.fmod(a, b),
            torch.remainder(a, b).signbit(),
            torch.div(ai, bi, rounding_mode="trunc"),
            torch.div(ai, bi, rounding_mode="floor"),
            ai // bi,
            ai % bi,
            torch.fmod(ai, bi),
            ai / bi,
            ai // -3,
            ai % -3,
            torch.fmod(ai, -3),
            torch.div(ai, 2.0, rounding_mode="trunc"),
            torch.div(ai, torch.tensor(2.0).to(d), rounding_mode="floor"),
            torch.tensor([-5.5, 5.5]).to(d) % -2,
            torch.remainder(ai.to(torch.int32), 4),
        )

    run_both(prog, dev)


def test_float_division_by_zero_and_non_finite(dev):
    def prog(d):
        a = torch.tensor([1.0, -1.0, 0.0, float("inf"), -float("inf"), float("nan"), 3.0]).to(d)
        z = torch.zeros(7, device=d)
        nz = torch.full((7,), -0.0, device=d)
        return (
            a / z,
            a / nz,
            a // z,
            torch.div(a, z, rounding_mode="trunc"),
            torch.remainder(a, z),
            torch.fmod(a, z),
            a // float("inf"),
            a % float("inf"),
            torch.div(a, -float("inf"), rounding_mode="floor"),
            torch.arange(3).to(d) / 0,
            (torch.arange(3).to(d) / 0).isnan(),
        )

    run_both(prog, dev)


INT_DIV_BY_ZERO = {
    "floor_divide_int64": lambda d: torch.tensor([1, 2]).to(d) // torch.tensor([1, 0]).to(d),
    "floor_divide_scalar_zero": lambda d: torch.tensor([1, 2]).to(d) // 0,
    "trunc_div_int32": lambda d: torch.div(
        torch.tensor([1], dtype=torch.int32).to(d), torch.tensor([0], dtype=torch.int32).to(d), rounding_mode="trunc"
    ),
    "remainder_int": lambda d: torch.remainder(torch.tensor([5]).to(d), torch.tensor([0]).to(d)),
    "fmod_int": lambda d: torch.fmod(torch.tensor([5]).to(d), torch.tensor([0]).to(d)),
    "floor_divide_uint8": lambda d: (
        torch.tensor([3], dtype=torch.uint8).to(d) // torch.tensor([0], dtype=torch.uint8).to(d)
    ),
    "inplace_floor_divide": lambda d: torch.tensor([4, 5]).to(d).floor_divide_(torch.tensor([2, 0]).to(d)),
    "true_div_int_by_zero_is_inf": lambda d: torch.tensor([1, 0, -1]).to(d) / torch.tensor([0, 0, 0]).to(d),
}


@pytest.mark.parametrize("case", sorted(INT_DIV_BY_ZERO))
def test_integer_division_by_zero_matches_cpu(dev, case):
    exc = run_both_outcome(INT_DIV_BY_ZERO[case], dev)
    if case == "true_div_int_by_zero_is_inf":
        assert exc is None
    else:
        assert isinstance(exc, RuntimeError), "CPU raises for integer division by zero"


def test_integer_division_by_zero_leaves_other_tensors_valid(dev):
    x = torch.arange(4).to(dev)
    y = x * 3  # pending when the failing op is recorded
    with pytest.raises(RuntimeError):
        (x // torch.zeros(4, dtype=torch.int64, device=dev)).cpu()
    assert y.cpu().tolist() == [0, 3, 6, 9]
    assert (x + 1).cpu().tolist() == [1, 2, 3, 4]
