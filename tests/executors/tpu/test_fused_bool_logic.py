"""Bool math in the fused loop (executors/tpu, kLowerings' bool rows): logical_and / or /
xor / not and bitwise_and / or / xor / not on bool tensors (functional, in place, out=)
run in the loop on its 0.0f / 1.0f values with comparisons and where, exact as bool.
int32 / int64 math runs in the integer loop (test_fused_int.py). Values equal
CPU's bit for bit; the flush's ATen calls show what was fused."""

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, flush_on_tpu, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")


BINARY = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shape_b", [(33, 40), (40,), (1, 40)])
def test_binary_bool_ops_fuse_with_comparisons_and_where(name, shape_b):
    op = BINARY[name]
    x, y = cpu_randn(33, 40, seed=1), cpu_randn(*shape_b, seed=2)

    def fn(x, y):
        m = op(x > 0, y < 0.3)  # y's mask broadcast over x's rows
        return torch.where(m, x, x * 2.0), m

    got, ops = flush_on_tpu(fn, x, y)
    assert_bit_equal(got, fn(x, y))
    assert ops == [], ops


@pytest.mark.parametrize("not_op", [torch.logical_not, torch.bitwise_not, lambda m: ~m])
def test_not_and_in_place_forms(not_op):
    x = cpu_randn(17, 5, seed=3)

    def fn(x):
        m = x > 0.1
        n = not_op(m)
        k = x < 0.5
        k.logical_and_(n)
        k.bitwise_or_(x > 2.0)
        return n, k, torch.where(k, x, 0.0 * x)

    got, ops = flush_on_tpu(fn, x)
    assert_bit_equal(got, fn(x))
    assert ops == [], ops


def test_out_form_and_non_contiguous_input_runs_equal():
    x = cpu_randn(8, 12, seed=4)

    def fn(x):
        a = x.t() > 0  # a transposed comparison: a loop over another layout or op by op
        out = torch.empty(12, 8, dtype=torch.bool, device=x.device)
        torch.logical_or(a, x.t() < -1.0, out=out)
        return (out, ~out)

    got, _ = flush_on_tpu(fn, x)
    assert_bit_equal(got, fn(x))


def test_integer_math_fuses_and_equals_cpu():
    # int32 / int64 (floor division, remainder, overflow wrap-around): the integer loop.
    a = torch.tensor([7, -7, 2**31 - 1, -(2**31), 5], dtype=torch.int32)
    b = torch.tensor([2, 2, 1, -1, -3], dtype=torch.int32)

    def fn(a, b):
        return (a + b * 3, torch.div(a, b, rounding_mode="floor"), a % b, (a * b) > 0, a.to(torch.int64) * 2**40)

    got, ops = flush_on_tpu(fn, a, b)
    assert_bit_equal(got, fn(a, b))
    assert ops == [], ops
