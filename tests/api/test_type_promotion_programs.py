"""Dtype promotion and integer semantics (BR-24).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both


# ---------------------------------------------------------------------------
# dtype promotion and integer semantics (BR-24)
# ---------------------------------------------------------------------------

PROMOTION = {
    "int32_plus_float_scalar": lambda d: torch.arange(3, dtype=torch.int32).to(d) + 1.5,
    "int64_times_float_scalar": lambda d: torch.arange(3).to(d) * 2.5,
    "int_true_div_int": lambda d: torch.arange(5).to(d) / 2,
    "int_floordiv_float_scalar": lambda d: torch.arange(-3, 4).to(d) // 2.0,
    "int_pow_int": lambda d: torch.arange(-3, 4).to(d) ** 2,
    "int_pow_float": lambda d: torch.arange(4).to(d) ** 0.5,
    "int_pow_negative_tensor": lambda d: torch.tensor([1, -1, 2, 0]).to(d) ** torch.tensor([-1, -1, -1, 2]).to(d),
    "bool_plus_bool_scalar": lambda d: torch.tensor([True, False]).to(d) + True,
    "bool_plus_int_scalar": lambda d: torch.tensor([True, False]).to(d) + 1,
    "bool_times_float_scalar": lambda d: torch.tensor([True, False]).to(d) * 2.5,
    "bool_and_scalar": lambda d: torch.tensor([True, False]).to(d) & True,
    "int8_plus_big_scalar_wraps": lambda d: torch.tensor([1, -100], dtype=torch.int8).to(d) + 1000,
    "int8_mul_wraps": lambda d: torch.tensor([100, -100], dtype=torch.int8).to(d) * 3,
    "uint8_minus_one_wraps": lambda d: torch.tensor([0, 5], dtype=torch.uint8).to(d) - 1,
    "uint8_minus_int8_promotes_int16": lambda d: (
        torch.tensor([1], dtype=torch.uint8).to(d) - torch.tensor([2], dtype=torch.int8).to(d)
    ),
    "int16_times_0dim_int64": lambda d: torch.tensor([300, -300], dtype=torch.int16).to(d) * torch.tensor(200).to(d),
    "int32_plus_0dim_f64": lambda d: (
        torch.arange(3, dtype=torch.int32).to(d) + torch.tensor(1.5, dtype=torch.float64).to(d)
    ),
    "f16_plus_0dim_f64": lambda d: (
        torch.ones(3, dtype=torch.float16).to(d) + torch.tensor(1e-3, dtype=torch.float64).to(d)
    ),
    "f16_plus_python_float": lambda d: torch.ones(3, dtype=torch.float16).to(d) + 1e-3,
    "bf16_times_f32_tensor": lambda d: torch.ones(3, dtype=torch.bfloat16).to(d) * torch.full((3,), 1.001).to(d),
    "int_compare_float_scalar": lambda d: torch.arange(4).to(d) > 1.5,
    "float_eq_int_tensor": lambda d: torch.tensor([1.0, 2.5]).to(d) == torch.tensor([1, 2]).to(d),
    "int32_wrap_mul": lambda d: torch.tensor([2**30, -(2**30)], dtype=torch.int32).to(d) * 4,
    "int32_add_wrap_tensor": lambda d: (
        torch.tensor([2**31 - 1], dtype=torch.int32).to(d) + torch.tensor([2], dtype=torch.int32).to(d)
    ),
    "int64_big_add_wraps": lambda d: torch.tensor([2**62, 2**63 - 1]).to(d) * 2,
    "int64_exact_above_2p53": lambda d: torch.tensor([2**53 + 1, -(2**60) - 7]).to(d) + 0,
    "int64_big_floordiv": lambda d: torch.tensor([2**62 + 1, -(2**62) - 1]).to(d) // 3,
    "int64_big_compare": lambda d: torch.tensor([2**53 + 1]).to(d) == torch.tensor([2**53]).to(d),
    "int_sum_dtype": lambda d: torch.arange(5, dtype=torch.int32).to(d).sum(),
    "bool_sum_dtype": lambda d: torch.tensor([True, True, False]).to(d).sum(),
    "int8_cumsum_dtype": lambda d: torch.tensor([100, 100, 100], dtype=torch.int8).to(d).cumsum(0),
    "int16_prod_dtype": lambda d: torch.tensor([300, 300, 300], dtype=torch.int16).to(d).prod(),
    "int32_big_sum_no_wrap": lambda d: torch.full((8,), 2**30, dtype=torch.int32).to(d).sum(),
    "bitwise_ops": lambda d: (
        torch.tensor([6, -7]).to(d) & 3,
        torch.tensor([6, -7]).to(d) ^ -1,
        torch.tensor([1, -8]).to(d) >> 1,
    ),
    "abs_int_min": lambda d: torch.tensor([-(2**31)], dtype=torch.int32).to(d).abs(),
}


@pytest.mark.parametrize("case", sorted(PROMOTION))
def test_promotion_and_integer_semantics(dev, case):
    run_both(PROMOTION[case], dev, rtol=0, atol=0)


def test_zero_dim_cpu_tensor_mixes_with_device_tensor(dev):
    def prog(d):
        x = torch.arange(4.0).to(d)
        i = torch.arange(4, dtype=torch.int32).to(d)
        s = torch.tensor(2.5)  # CPU 0-dim: allowed with any device
        k = torch.tensor(3)  # CPU 0-dim int64
        out = [
            x + s,
            s * x,
            x / s,
            x > s,
            i + k,
            i * s,
            torch.add(i, k),
            torch.mul(x, s),
            k - i,
            torch.maximum(x, torch.tensor(1.5)),
            x == torch.tensor(1.0),
        ]
        y = x.clone()
        y.mul_(s)
        y[1] = torch.tensor(-1)
        y[2:].add_(k)
        torch.add(x, s, out=x)
        return out, y, x

    out_cpu = run_both(prog, dev)
    assert out_cpu[0][0].device_type == torch.device(dev).type


def test_python_scalar_types_do_not_change_tensor_dtype(dev):
    def prog(d):
        f16 = torch.tensor([1.0, 2.0], dtype=torch.float16).to(d)
        i32 = torch.tensor([1, 2], dtype=torch.int32).to(d)
        return f16 * 3, f16 + True, i32 * True, i32 - 7, f16 / 3, i32.float() / 3

    run_both(prog, dev)
