"""float32 sigmoid, silu, silu_backward and gelu (approximate='tanh') in fused loops equal CPU's bit for bit,
also on the elements CPU's kernel computes with its scalar function (over dense inputs, and
over inputs read through strides whose CPU iteration runs rows). CPU's elementwise loop (cpu_kernel_vec) runs each
thread's range in vectors of two SIMD registers and the rest of the range, at its end, with
the scalar function, which for sigmoid, silu and silu_backward calls libm's expf instead of SLEEF's exp; the
fused loop recomputes those elements the same way (for_each_cpu_tail in
csrc/executors/tpu/fused_kernels.inc). Before, they differed by an ulp, which BatchNorm over
small maps amplified past tolerance in real models (torchvision efficientnet_b3's
squeeze-excitation: a 1x1 convolution with sigmoid in its epilogue over 80 elements)."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, assert_bit_equal, cpu_randn, flush_on_tpu

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")

FNS = {
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    # silu's gradient at x for an upstream gradient of 0.75 - x (binary: both operands read densely)
    "silu_backward": lambda x: torch.ops.aten.silu_backward(0.75 - x, x),
}


@pytest.fixture
def threads():
    """Sets torch's intra-op thread count for the test (CPU's ranges depend on it), restores it after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# Sizes: all scalar (< one step of 32 floats at AVX512, 16 at AVX2), partial steps, whole steps,
# and above 32,768 elements (at::internal::GRAIN_SIZE), where two threads split CPU's loop in two
# ranges, each with its own scalar tail.
SIZES = [1, 7, 20, 31, 33, 80, 100, 1000, 4099, 32768, 32769, 70001]


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", FNS)
def test_fused_chain_bit_equal(threads, name, n, nthreads):
    threads(nthreads)
    f = FNS[name]
    x = cpu_randn(n, seed=n) * 4
    w = cpu_randn(n, seed=n + 1)

    def prog(a, b):  # the op between a producer and a consumer of its loop (a PostOp after it)
        return [f(-a) * b + 0.5]

    got, ops = flush_on_tpu(prog, x, w)
    assert ops == [], f"{name} should run in the fused loop, ran {ops}"
    assert_bit_equal(got, prog(x, w))


@pytest.mark.parametrize("name", FNS)
def test_in_place_and_special_values(name):
    f = FNS[name]
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7, 104.0, -104.0, float("inf"), float("-inf"), float("nan")])
    x = torch.cat([x, cpu_randn(40, seed=3) * 30])

    def prog(a):
        b = a * 1.0
        return [f(b) + 0.0]

    got, ops = flush_on_tpu(prog, x)
    assert ops == []
    (g,), (w,) = got, prog(x)
    # NaN is NaN (the sign of a NaN from the vector loop is not compared), every other value bit for bit.
    assert torch.equal(g.isnan(), w.isnan())
    assert torch.equal(g[~w.isnan()].view(torch.int32), w[~w.isnan()].view(torch.int32))


@pytest.mark.parametrize("name", FNS)
def test_convolution_epilogue_channels_last_and_strided(name):
    # A squeeze-excitation gate (1x1 convolution + gate over [2, C, 1, 1]), a channels-last map
    # and a column half of a matrix (read through strides: CPU iterates it by rows, left as is).
    f = FNS[name]
    g = cpu_randn(2, 40, 1, 1, seed=1)
    wt = cpu_randn(40, 40, 1, 1, seed=2) * 0.2
    bias = cpu_randn(40, seed=3)
    m = cpu_randn(2, 24, 5, 7, seed=4).contiguous(memory_format=torch.channels_last)

    def prog(a, w, b, c):
        return [f(F.conv2d(a, w, b)) * 2.0, f(c * 3.0) - 1.0]

    got, _ = flush_on_tpu(prog, g, wt, bias, m)
    want = prog(g, wt, bias, m)
    assert_bit_equal(got, want)
    assert got[1].stride() == want[1].stride()


def _gelu_tanh(t):
    return F.gelu(t, approximate="tanh")


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("n", SIZES)
def test_gelu_tanh_tail_bit_equal(threads, n, nthreads):
    # CPU's gelu (approximate='tanh') takes ATen's formula on x86-64 for either layout, its
    # scalar tail libm's tanhf; found by tests/executors/tpu/test_random_fused.py (6 of 30
    # elements of a 6x5 gelu after a producer differed by an ulp).
    threads(nthreads)
    x = cpu_randn(n, seed=n) * 4
    w = cpu_randn(n, seed=n + 1)

    def prog(a, b):
        return [_gelu_tanh((a - 3) / 7) * b + 0.5]

    got, ops = flush_on_tpu(prog, x, w)
    assert "aten::gelu" not in ops, f"gelu should run in the fused loop, ran {ops}"
    assert_bit_equal(got, prog(x, w))


# Inputs read through strides whose CPU iteration runs rows (each row's piece of a thread range is
# one call of CPU's inner loop, with its own scalar tail) or only scalars (an inner stride of 2):
# (base shape, view, threads). Found by tests/executors/tpu/test_random_fused.py: sigmoid of a
# row slice x[1::2] of an (81, 1000) matrix differed in 11 of 40,000 elements.
STRIDED = [
    ((81, 1000), lambda b: b[1::2], 1),
    ((81, 1000), lambda b: b[1::2], 2),
    ((40, 2000), lambda b: b[:, :1000], 2),
    ((40, 2000), lambda b: b[:, 3:1003], 1),
    ((40, 200), lambda b: b[:, ::2], 1),
    ((7, 3, 50), lambda b: b[:, 1:, 3:], 1),
    ((300, 257), lambda b: b[:, :200], 2),
    ((2, 70000), lambda b: b[:, 1:], 2),
    ((1, 1000), lambda b: b.expand(40, 1000), 2),
]


@pytest.mark.parametrize("case", range(len(STRIDED)))
@pytest.mark.parametrize("name", ["sigmoid", "silu", "gelu_tanh"])
def test_strided_input_rows_bit_equal(threads, name, case):
    shape, view, nthreads = STRIDED[case]
    threads(nthreads)
    f = {"sigmoid": torch.sigmoid, "silu": F.silu, "gelu_tanh": _gelu_tanh}[name]
    base = cpu_randn(*shape, seed=case) * 3

    def prog(b):
        return [f(view(b)) * 2.0 + 1.0]

    got, _ = flush_on_tpu(prog, base)
    assert_bit_equal(got, prog(base))
