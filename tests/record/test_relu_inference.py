"""relu's shape inference by clamp_min's C++ meta function (OpTrait kInferAsClampMinZero).

CPU's relu refuses bool and returns ``clamp_min(self, 0)``; the record kernel infers a relu
call with clamp_min's structured meta function on meta twins instead of running CPU's kernel
on zero-filled CPU twins. The result's values, dtype and strides and the errors raised at the
call must be CPU's. Every test uses shapes of its own, so the inference runs (the meta cache
is per process).
"""

import pytest
import torch

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)
from difftest import DEVICE, cpu_randn, run_both, run_both_at_call

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the record kernel is the tpu device's")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64]
)
def test_relu_dtypes(dtype):
    n = 3 + [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64].index(
        dtype
    )
    x = (cpu_randn(n, 5, seed=n) * 10).to(dtype)
    run_both(lambda dev: torch.relu(x.to(dev)), DEVICE, check_stride=True)


def test_relu_layouts():
    """Channels-last, transposed, expanded (stride 0), sliced, size-1 dims, 0-dim and empty inputs."""
    cl = cpu_randn(2, 3, 5, 7, seed=1).contiguous(memory_format=torch.channels_last)
    t = cpu_randn(9, 13, seed=2).t()
    e = cpu_randn(6, 1, seed=3)
    s = cpu_randn(8, 10, seed=4)
    one = cpu_randn(1, 4, 1, seed=5)
    z = cpu_randn((), seed=6)
    empty = cpu_randn(0, 3, seed=7)

    def fn(dev):
        return (
            torch.relu(cl.to(dev)),
            torch.relu(t.to(dev)),
            torch.relu(e.to(dev).expand(6, 11)),
            torch.relu(s.to(dev)[1::2, ::3]),
            torch.relu(one.to(dev).permute(2, 1, 0)),
            torch.relu(z.to(dev)),
            torch.relu(empty.to(dev)),
        )

    run_both(fn, DEVICE, check_stride=True)


def test_relu_module_in_a_training_step():
    """Conv -> relu -> backward: relu's result feeds threshold_backward as on CPU."""
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = cpu_randn(2, 3, 7, 9, seed=8)

    def fn(dev):
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).to(dev)
        m[0].load_state_dict(conv.state_dict())
        y = m(x.to(dev))
        y.sum().backward()
        return y.detach(), m[0].weight.grad

    run_both(fn, DEVICE, check_stride=True)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_relu_rejects_at_the_call(dtype):
    """bool: "Boolean inputs not supported for relu"; complex: clamp_min's complex error."""

    def build(dev):
        return (torch.ones(3, 7, dtype=dtype).to(dev),)

    assert run_both_at_call(build, lambda x: torch.relu(x), DEVICE) is not None
