"""The fused elementwise loop (csrc/executors/tpu/fused_kernels.inc): register reuse,
materialized values written by their instruction and read back by later ones, operand
kinds (register, device buffer, constant) and sizes that end in a partial vector or tile.
IEEE-exact ops are compared with CPU bit for bit; transcendental ones within an ulp or so
under the default fused math (CPU's exp, sin, ... call MKL's VML, the fused loop ATen's
SLEEF routines; tests/executors/tpu/test_fused_math.py covers the bit-equal "cpu" mode)."""

import pytest
import torch

from difftest import REPO_ROOT, DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the fused loop exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

# 1,024 floats is the largest tile; 16 an AVX512 vector, 8 an AVX2 one.
SIZES = [1, 7, 16, 17, 1023, 1024, 1025, 3000, 4099]


def _run_one_region(fn, *args):
    dev = [a.to("tpu") for a in args]
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    out = fn(*dev)
    out = [o.cpu() for o in out] if isinstance(out, tuple) else out.cpu()
    assert torch_tpu_eager.metrics()["regions_run"] == 1, "the chain should run as one fused region"
    return out


@pytest.mark.parametrize("n", SIZES)
def test_exact_chain_matches_cpu_bit_for_bit(n):
    def prog(x, y):
        h = (x + 1.0) * y - 0.5  # add, mul with a buffer, sub of a constant (alpha -1)
        h = h / 3.0 + x.mul(0.25)  # div by a constant, a second read of x
        h = h.sub(y, alpha=2.0).abs()  # a + alpha * b as one rounding, like CPU
        return (h * h).neg().relu() + h  # the same register as both operands

    x, y = cpu_randn(n, seed=1), cpu_randn(n, seed=2)
    assert torch.equal(_run_one_region(prog, x, y), prog(x, y))


@pytest.mark.parametrize("n", [5, 1024, 2049])
def test_materialized_value_read_by_later_ops(n):
    # h is a result (written straight into its device buffer) and an operand of the rest.
    def prog(x):
        h = x * 3.0 - 1.0
        g = h * h + h
        return h, g / 7.0, (g + h).abs()

    x = cpu_randn(n, seed=3)
    for got, exp in zip(_run_one_region(prog, x), prog(x)):
        assert torch.equal(got, exp)


def test_many_live_values_share_few_registers_and_match():
    # 16 values alive at once: more registers than a 1,024-float tile can hold in L1,
    # so the tile shrinks; the result must not change.
    def prog(x):
        vals = [x * float(k + 1) + float(k) for k in range(16)]
        acc = vals[0]
        for v in vals[1:]:
            acc = acc + v
        return acc

    x = cpu_randn(5000, seed=4)
    assert torch.equal(_run_one_region(prog, x), prog(x))


@pytest.mark.parametrize("n", [17, 1000 * 1000])
def test_chain16_benchmark_program_matches_cpu(n):
    import os
    import sys

    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
    from run_all import chain16

    x = cpu_randn(n, seed=5)
    torch.testing.assert_close(_run_one_region(chain16, x), chain16(x), rtol=2e-6, atol=1e-6)
