"""Ops with both a CPU kernel and a CompositeImplicitAutograd decomposition (silu_backward,
mish_backward, native_channel_shuffle): CPU runs its own kernel, and so must "tpu"
(tools/gen_op_table.py records them). Their decompositions round every 16-bit
intermediate; CPU's kernels compute in float32 and round once. Found by PyTorch's
test_nn test_activations_bfloat16_half_cpu called on "tpu"."""

import pytest
import torch

from difftest import assert_bit_equal, requires_tpu

pytestmark = requires_tpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["silu", "mish"])
def test_activation_backward_is_cpus_kernel(name, dtype):
    g = torch.Generator().manual_seed(37)
    x = torch.randn(4096, generator=g).to(dtype)
    grad = torch.randn(4096, generator=g).to(dtype)
    op = getattr(torch.ops.aten, name + "_backward")
    assert_bit_equal((op(grad.to("tpu"), x.to("tpu")).cpu(),), (op(grad, x),))
    module = torch.nn.SiLU() if name == "silu" else torch.nn.Mish()
    grads = []
    for dev in ("cpu", "tpu"):
        xx = x.clone().to(dev).requires_grad_()
        module(xx).backward(grad.to(dev))
        grads.append(xx.grad)
    assert_bit_equal((grads[1].cpu(),), (grads[0],))


@pytest.mark.parametrize("channels_last", [False, True])
def test_native_channel_shuffle_matches_cpu(channels_last):
    x = torch.arange(2 * 6 * 3 * 3, dtype=torch.float32).reshape(2, 6, 3, 3)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = torch.native_channel_shuffle(x, 3)
    got = torch.native_channel_shuffle(x.to("tpu"), 3)
    assert got.stride() == want.stride()
    assert_bit_equal((got.cpu(),), (want,))
