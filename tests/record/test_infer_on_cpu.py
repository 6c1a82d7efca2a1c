"""Shape inference by CPU's own kernel (OpTrait kInferOnCpu, record.cpp cpu_twins).

For batch norm, layer norm and adaptive average pooling (forward and backward), the
record kernel infers a call's result geometry by running CPU's kernel on zero-filled CPU twins of the arguments
instead of PyTorch's Python meta kernels (decompositions into dozens of reference ops,
most of a training program's first step). The results, their strides and dtypes, the
arguments written (running statistics) and the errors raised at the call must be CPU's.
(relu is inferred by clamp_min's C++ meta function now: test_relu_inference.py; its
cases here still compare it with CPU.)
Every test uses shapes of its own, so the inference runs (the meta cache is per process).
"""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)
from difftest import DEVICE, cpu_randn, run_both, run_both_at_call

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the record kernel is the tpu device's")


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_forward_and_running_stats(channels_last, training):
    x = cpu_randn(3, 5, 6, 7, seed=1)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = cpu_randn(5, seed=2), cpu_randn(5, seed=3)

    def fn(dev):
        rm, rv = torch.zeros(5, device=dev), torch.ones(5, device=dev)
        out = torch.native_batch_norm(x.to(dev), w.to(dev), b.to(dev), rm, rv, training, 0.1, 1e-5)
        return (*out, rm, rv)

    run_both(fn, DEVICE, check_stride=True)


def test_batch_norm_bfloat16_input_with_float32_parameters():
    x = cpu_randn(2, 4, 3, 5, seed=4, dtype=torch.bfloat16)
    w, b = cpu_randn(4, seed=5), cpu_randn(4, seed=6)

    def fn(dev):
        return torch.native_batch_norm(x.to(dev), w.to(dev), b.to(dev), None, None, True, 0.1, 1e-5)

    run_both(fn, DEVICE, check_stride=True)


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)])
def test_batch_norm_backward_output_mask(mask):
    x, g = cpu_randn(4, 6, 3, 2, seed=7), cpu_randn(4, 6, 3, 2, seed=8)
    w = cpu_randn(6, seed=9)
    mean, invstd = x.mean((0, 2, 3)), (x.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()

    def fn(dev):
        t = lambda a: a.to(dev)  # noqa: E731
        return torch.ops.aten.native_batch_norm_backward(
            t(g), t(x), t(w), None, None, t(mean), t(invstd), True, 1e-5, list(mask)
        )

    run_both(fn, DEVICE, check_stride=True)


def test_layer_norm_forward_and_backward_through_autograd():
    x0 = cpu_randn(3, 5, 9, seed=10)
    w0, b0 = cpu_randn(9, seed=11), cpu_randn(9, seed=12)

    def fn(dev):
        x, w, b = (a.detach().to(dev).requires_grad_() for a in (x0, w0, b0))
        y = F.layer_norm(x, (9,), w, b)
        y.square().sum().backward()
        return y.detach(), x.grad, w.grad, b.grad

    run_both(fn, DEVICE, check_stride=True)


def test_relu_keeps_channels_last_and_transposed_strides():
    x = cpu_randn(2, 3, 4, 5, seed=13).contiguous(memory_format=torch.channels_last)
    t = cpu_randn(7, 11, seed=14).t()
    run_both(lambda dev: (torch.relu(x.to(dev)), torch.relu(t.to(dev))), DEVICE, check_stride=True)


def test_mixed_dtypes_raise_cpu_error_at_the_call():
    # CPU's kernel: "mixed dtype (CPU): all inputs must share same datatype."
    def build(dev):
        return (cpu_randn(2, 3, 5, seed=15, dtype=torch.float64).to(dev), cpu_randn(3, seed=16).to(dev))

    def act(x, w):
        return torch.native_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)

    assert run_both_at_call(build, act, DEVICE) is not None


def test_layer_norm_bad_shape_raises_cpu_error_at_the_call():
    def build(dev):
        return (cpu_randn(2, 3, 6, seed=17).to(dev),)

    def act(x):
        return torch.native_layer_norm(x, [5], None, None, 1e-5)

    assert run_both_at_call(build, act, DEVICE) is not None


def test_input_above_the_twin_bound_infers_with_the_meta_kernel():
    # 17 MiB of float32: past record.cpp's kInferOnCpuMaxBytes (16 MiB), the meta kernel infers.
    x = cpu_randn(17 * 2**18, 4, seed=18)
    run_both(lambda dev: torch.native_layer_norm(x.to(dev), [4], None, None, 1e-5), DEVICE, check_stride=True)


@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_avg_pool_forward_and_backward(channels_last):
    x0 = cpu_randn(2, 3, 9, 7, seed=19)
    if channels_last:
        x0 = x0.contiguous(memory_format=torch.channels_last)

    def fn(dev):
        x = x0.detach().to(dev).requires_grad_()
        y = F.adaptive_avg_pool2d(x, (4, 3))
        y.square().sum().backward()
        return y.detach(), x.grad

    run_both(fn, DEVICE, check_stride=True)
