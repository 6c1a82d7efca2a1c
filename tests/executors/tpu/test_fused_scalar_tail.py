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

from difftest import DEVICE, assert_bit_equal, cpu_randn, flush_on_tpu, restoring

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
# 20001: above the 16,384 elements past which CPU's gelu splits its loop between threads.
SIZES = [1, 7, 20, 31, 33, 80, 100, 1000, 4099, 20001, 32768, 32769, 70001]


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


# ---- gelu (approximate='none'), gelu_backward and the cases judge22 fixed (docs/random_programs.md) ----


@pytest.fixture
def cpu_math(threads):
    """set_fused_math("cpu"), where a fused gelu (approximate='none') of a contiguous float32 input
    is CPU's oneDNN kernel; restored after the test. Yields the threads setter."""
    import torch_tpu_eager

    for _ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        torch_tpu_eager.set_fused_math("cpu")
        yield threads


# CPU's gelu runs oneDNN only for a contiguous float32 / bfloat16 input of more than one element,
# else ATen's formula (SLEEF's erf in vectors, libm's erff on each range's last elements).
# (base shape, view, threads, dtype). Found by tests/executors/tpu/test_random_fused.py: gelu of
# x[1::2] of an (81, 1000) float32 matrix differed in 20,254 of 40,000 elements; of float16 on
# two threads in 1 of 40,000.
GELU_LAYOUTS = [
    ((81, 1000), lambda b: b[1::2], 1, torch.float32),
    ((81, 1000), lambda b: b[1::2], 2, torch.float32),
    ((81, 1000), lambda b: b.t(), 1, torch.float32),
    ((40, 200), lambda b: b[:, ::2], 2, torch.float32),
    ((40, 1), lambda b: b.expand(40, 1000), 2, torch.float32),
    ((1, 1000), lambda b: b.expand(40, 1000), 1, torch.float32),
    ((2, 3, 5, 7), lambda b: b.contiguous(memory_format=torch.channels_last), 1, torch.float32),
    ((40, 1000), lambda b: b, 2, torch.float16),
    ((20001,), lambda b: b, 2, torch.float16),
    ((40, 1000), lambda b: b.t(), 2, torch.bfloat16),
    ((20001,), lambda b: b, 2, torch.bfloat16),
    ((4097,), lambda b: b, 1, torch.float32),  # a last tile of one element (oneDNN on CPU)
    ((65537,), lambda b: b, 2, torch.float32),
    ((1,), lambda b: b, 1, torch.float32),
]


@pytest.mark.parametrize("case", range(len(GELU_LAYOUTS)))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("where", ["input", "value"])
def test_gelu_layouts_bit_equal(cpu_math, case, approximate, where):
    shape, view, nthreads, dtype = GELU_LAYOUTS[case]
    cpu_math(nthreads)
    base = (cpu_randn(*shape, seed=case) * 3).to(dtype)

    def prog(b):
        # input: gelu reads the view; value: a product of the view (its fresh result has the
        # view's dim order: a permuted loop for x.t()) feeds gelu
        x = view(b) if where == "input" else view(b) * 1.0
        return [F.gelu(x, approximate=approximate) * 2.0 + 1.0]

    got, _ = flush_on_tpu(prog, base)
    assert_bit_equal(got, prog(base))


# A per-row value expanded along the row ([..., 1] expanded) and a broadcast operand of a binary
# op: CPU's inner loop runs rows of the row's length (the expanded input a stride-0 operand).
@pytest.mark.parametrize("name", ["sigmoid", "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("shape", [(40, 1000), (3, 5, 37), (70, 1000)])
def test_expanded_row_input_bit_equal(cpu_math, name, shape):
    cpu_math(2)
    f = {"sigmoid": torch.sigmoid, "silu": F.silu, "gelu_tanh": _gelu_tanh, "gelu": F.gelu}[name]
    col = cpu_randn(*shape[:-1], 1, seed=5) * 3

    def prog(c):
        return [f(c.expand(*shape)) * 2.0 + 1.0]

    got, _ = flush_on_tpu(prog, col)
    assert_bit_equal(got, prog(col))


BACKWARD = {
    "silu": lambda g, x: torch.ops.aten.silu_backward(g, x),
    "gelu_tanh": lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
    "gelu": lambda g, x: torch.ops.aten.gelu_backward(g, x),
}


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("n", [8, 31, 1000, 20001, 70001])
@pytest.mark.parametrize("name", BACKWARD)
def test_activation_backward_tail_bit_equal(cpu_math, name, n, nthreads):
    # gelu_backward's scalar tail (libm's tanhf / erff and expf); found by test_random_fused.py: a
    # leaf's gradient through gelu (tanh) of 8 elements differed by 1 ulp in one element.
    cpu_math(nthreads)
    x = cpu_randn(n, seed=n) * 3
    g = cpu_randn(n, seed=n + 1)

    def prog(a, b):
        return [BACKWARD[name](a * 1.0, (b - 0.5) * 2.0) + 0.5]

    got, _ = flush_on_tpu(prog, g, x)
    assert_bit_equal(got, prog(g, x))


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("bcast", ["grad_row", "self_col"])
def test_activation_backward_broadcast_bit_equal(cpu_math, name, bcast):
    if name == "gelu" and bcast == "grad_row":
        pytest.skip("CPU's oneDNN gelu_backward raises for a broadcast grad of a contiguous self")
    cpu_math(2)
    x = cpu_randn(40, 1000, seed=1) * 3
    g = cpu_randn(1000, seed=2) if bcast == "grad_row" else cpu_randn(40, 1000, seed=2)
    if bcast == "self_col":
        x = cpu_randn(40, 1, seed=3) * 3

    def prog(a, b):
        if bcast == "self_col":
            return [BACKWARD[name](a * 1.0, b.expand(40, 1000)) + 0.5]
        return [BACKWARD[name](a, b * 1.0) + 0.5]

    got, _ = flush_on_tpu(prog, g, x)
    assert_bit_equal(got, prog(g, x))


@pytest.mark.parametrize("name", ["sigmoid", "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("view", ["t", "slice"])
def test_strided_input_into_given_out_bit_equal(cpu_math, name, view):
    # A permuted input into a given contiguous out=: CPU's loop follows the out's order, reading the
    # input with an inner stride other than 1, so every element takes the scalar function. Found by
    # test_random_fused.py: sigmoid(x.t(), out=) of 40,000 elements differed in 1,452.
    cpu_math(1)
    op = {
        "sigmoid": torch.ops.aten.sigmoid.out,
        "silu": torch.ops.aten.silu.out,
        "gelu_tanh": lambda x, out: torch.ops.aten.gelu.out(x, approximate="tanh", out=out),
        "gelu": torch.ops.aten.gelu.out,
    }[name]
    base = cpu_randn(1000, 40, seed=4) * 3 if view == "t" else cpu_randn(40, 2000, seed=4) * 3

    def prog(b):
        x = b.t() if view == "t" else b[:, 1::2]
        out = torch.empty(40, 1000, device=b.device)
        op(x, out=out)
        return [out * 2.0]

    got, _ = flush_on_tpu(prog, base)
    assert_bit_equal(got, prog(base))


def test_gelu_leaf_gradients_bit_equal(cpu_math):
    # Through autograd: gelu of a transposed leaf (CPU: the formula forward and backward) and of a
    # contiguous one (oneDNN's), both forms.
    cpu_math(1)
    for approximate in ("none", "tanh"):
        for shape, view in (((33, 40), lambda t: t.t()), ((8,), lambda t: t), ((40, 33), lambda t: t)):
            leaf = (cpu_randn(*shape, seed=7) * 3).requires_grad_()
            dev = leaf.detach().to("tpu").requires_grad_()
            for t in (leaf, dev):
                (
                    F.gelu(view(t), approximate=approximate) * cpu_randn(*view(leaf).shape, seed=8).to(t.device)
                ).sum().backward()
            assert_bit_equal([dev.grad.cpu()], [leaf.grad])


@pytest.mark.parametrize("name", ["silu", "gelu_tanh", "gelu"])
def test_tail_under_an_accumulation_bit_equal(cpu_math, name):
    # The tail recomputed after a pass whose PostOp adds into the output it writes (autograd's
    # accumulation of a sliced leaf's two gradients, the activation's and a linear's): found by
    # test_random_fused.py (seed 34), 320 of 645 gradients off by up to 4.6 while judge22 was
    # under way (the tail read the accumulated output again).
    cpu_math(1)
    f = {"silu": F.silu, "gelu_tanh": _gelu_tanh, "gelu": F.gelu}[name]
    grads = []
    for dev in ("cpu", "tpu"):
        leaf = (cpu_randn(5, 129, seed=1) * 3).to(dev).requires_grad_()
        x = leaf[:, 1::2]
        outs = [f(x).neg(), F.linear(x, cpu_randn(64, 64, seed=2).to(dev))]
        torch.autograd.backward(outs, [cpu_randn(5, 64, seed=3 + k).to(dev) for k in range(2)])
        grads.append(leaf.grad.cpu())
    assert_bit_equal([grads[1]], [grads[0]])
