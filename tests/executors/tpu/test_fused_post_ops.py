"""Cheap elementwise ops (neg, abs, relu, add, mul, div) that read the value of the op
before them, with a constant, a buffer or that value as the other operand, run in that
op's pass over the tile (PostOp in csrc/executors/tpu/fused_kernels.inc); the
intermediate value is then never stored.
Grouping must not change a value or lose one that is read again: every case is
compared with CPU PyTorch bit for bit (IEEE-exact ops, or set_fused_math("cpu"))."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")

SIZES = [1, 17, 1024, 4099]


def _both(fn, *inputs):
    """fn on CPU and on tpu; the tpu results read back to the host."""
    want = fn(*inputs)
    got = fn(*(t.to("tpu") for t in inputs))
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    return [g.cpu() for g in got], list(want)


def _assert_equal(fn, *inputs):
    got, want = _both(fn, *inputs)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("n", SIZES)
def test_run_of_cheap_ops_after_a_binary_op(n):
    _assert_equal(
        lambda x, y: (((x * y - 0.5) / 3.0).neg().abs() + 1.0).relu() * 0.25, cpu_randn(n, seed=1), cpu_randn(n, seed=2)
    )


def test_more_cheap_ops_than_one_pass_takes():
    # Twelve in a row: more than a group holds (8), so the run splits into two passes.
    def prog(x, y):
        h = x / y
        for c in (0.5, 2.0, -1.0, 3.0, 0.125, 1.5):
            h = (h * c).neg()
        return h

    _assert_equal(prog, cpu_randn(1025, seed=3), cpu_randn(1025, seed=4))


def test_value_read_again_after_a_cheap_op_is_kept():
    # h feeds the cheap op and a later op: it cannot be skipped.
    _assert_equal(lambda x, y: ((x * y) * 2.0) + (x * y).abs(), cpu_randn(3000, seed=5), cpu_randn(3000, seed=6))

    def prog(x, y):
        h = x * y
        g = h.neg()
        return g / h

    _assert_equal(prog, cpu_randn(3000, seed=7), cpu_randn(3000, seed=8))


def test_materialized_values_inside_a_run():
    def prog(x, y):
        h = x * y  # returned: written to its buffer
        g = (h - 1.0).abs()  # returned
        return h, g, (g * 3.0).neg()

    _assert_equal(prog, cpu_randn(2049, seed=9), cpu_randn(2049, seed=10))


def test_value_read_by_the_row_reduction_after_the_program():
    def prog(x, y):
        h = x * y - 0.25
        return h.neg() * 2.0, F.softmax(h, dim=-1)

    _assert_equal(prog, cpu_randn(33, 70, seed=11), cpu_randn(33, 70, seed=12))
    _assert_equal(
        lambda x, y: F.log_softmax((x / y).abs() * 0.5, dim=-1),
        cpu_randn(9, 1000, seed=13),
        cpu_randn(9, 1000, seed=14),
    )


def test_add_with_alpha_as_a_cheap_op():
    # 1024 elements: CPU's vector loop covers them all. Its scalar tail (the last n mod 32)
    # rounds alpha * b before adding, which the fused multiply-add does not
    # (docs/tpu_target.md), so another size could differ there by half an ulp of alpha * b.
    _assert_equal(
        lambda x, y: torch.add(torch.sub(x * y, 0.3, alpha=7.0), 0.1, alpha=-3.0),
        cpu_randn(1024, seed=15),
        cpu_randn(1024, seed=16),
    )


def test_cheap_ops_after_cpu_math_routines(cpu_math):
    # Under "cpu" math an exp, tanh, ... pass calls MKL's VML on the tile; the cheap
    # ops after it run in their own passes, and every value equals CPU's.
    _assert_equal(lambda x: ((x * 2.0).exp() * 0.5).neg().tanh().abs() - 1.0, cpu_randn(4099, seed=17))


@pytest.mark.parametrize("n", SIZES)
def test_tensor_operands_of_cheap_ops(n):
    # The value's partner is an input buffer, a materialized output, another live
    # register, or the value itself; the value may be either operand of mul and add.
    def prog(x, y):
        h = x * 3.0  # a register that stays live below
        v = (y / 7.0) * x  # external buffer
        v = x + v  # value as the second operand of an add
        v = v * h  # another live register
        v = v * v  # the value itself
        v = y * v  # value second in a mul
        v = v - x  # add with alpha -1, value first
        v = x - v  # value second of a sub: x + (-1) * value, in the same pass (value_scaled)
        v = x / v  # value second of a div: its own pass
        return v + h

    _assert_equal(prog, cpu_randn(n, seed=18), cpu_randn(n, seed=19))


def test_materialized_output_as_a_tensor_operand():
    def prog(x, y):
        m = x * y  # returned: read back from its buffer below
        v = (y + 2.0).neg() * m
        return m, (v + m).abs()

    _assert_equal(prog, cpu_randn(3001, seed=20), cpu_randn(3001, seed=21))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("weight", [0.1, 0.7])
def test_lerp_second_step_in_the_first_steps_pass(n, weight):
    # lerp is end - self, then self + weight * that: the second step takes the value as
    # its scaled operand (PostOp::value_scaled), in the first step's pass; then Adam's
    # next ops on the result. Weights on both sides of 0.5 (CPU's two formulas).
    def prog(m, g):
        m = m.clone()
        m.lerp_(g, weight)
        return m, torch.lerp(g, m, weight) * 2.0 + 1.0

    _assert_equal(prog, cpu_randn(n, seed=22), cpu_randn(n, seed=23))


@pytest.mark.parametrize("n", [1, 33, 4099])
def test_scaled_value_operands(n):
    # a + alpha * value with a constant, a buffer, and a live register as a.
    def prog(x, y):
        h = x * 0.5
        v = torch.add(y, x * y, alpha=-0.3)
        v = torch.add(h, v * 2.0, alpha=1.7)
        return torch.add(torch.full_like(x, 0.25), v.abs(), alpha=3.0) + h

    _assert_equal(prog, cpu_randn(n, seed=24), cpu_randn(n, seed=25))


@pytest.mark.parametrize("n", SIZES)
def test_fused_multiply_add_after_its_first_factor(n):
    # addcmul(self, t1, t2, value) is (value * t1) * t2 + self with one rounding: the
    # multiply-add runs in the pass of value * t1 (a PostOp), its addend a register,
    # an input buffer, or a constant; the value may be either factor, or both.
    def prog(v, g):
        r = v * 0.999
        out = torch.addcmul(r, g, g, value=0.001)  # Adam's exp_avg_sq update
        w = torch.addcmul(g, g * 0.5, v)  # addend an input buffer
        s = g * 0.25
        z = torch.addcmul(torch.full_like(g, 2.0), s, s, value=3.0)  # both factors the value
        return out, w, z

    _assert_equal(prog, cpu_randn(n, seed=26).abs(), cpu_randn(n, seed=27))
