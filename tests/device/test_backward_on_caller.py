"""Backward of tpu tensors runs on the calling thread (TORCH_TPU_BACKWARD_ON_CALLER, default 1).

The importing thread has autograd multithreading off, so a backward it calls runs
there (no hand-off to the device's ``pt_autograd_<i>`` thread); other threads keep
PyTorch's default. Gradients equal CPU's either way.
"""

import subprocess
import sys
import threading

import pytest
import torch

import torch_tpu_eager
from threaded import run_threads


@pytest.fixture(autouse=True)
def _cpu_fused_math():
    # Bit-equal gradients need CPU's own gelu in fused loops (the default "sleef"
    # routines are within the ulps docs/tpu_target.md gives, not bit-equal).
    before = torch_tpu_eager.fused_math()
    torch_tpu_eager.set_fused_math("cpu")
    yield
    torch_tpu_eager.set_fused_math(before)


def _grads(device):
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(4, 5)
    wd = w.detach().to(device).requires_grad_()
    loss = torch.nn.functional.gelu(x.to(device) @ wd).pow(2).mean()
    loss.backward()
    return wd.grad.cpu()


def test_backward_runs_on_the_calling_thread():
    assert not torch.autograd.is_multithreading_enabled()
    seen = []
    x = torch.randn(3, device="tpu", requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append(threading.current_thread()) or g)
    y.sum().backward()
    assert seen == [threading.current_thread()]
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))


def test_gradients_equal_cpu_from_the_main_and_another_thread():
    expected = _grads("cpu")
    torch.testing.assert_close(_grads("tpu"), expected, rtol=0, atol=0)
    out = {}

    def worker():
        out["threaded"] = torch.autograd.is_multithreading_enabled()  # PyTorch's default there
        out["grad"] = _grads("tpu")

    run_threads(worker)
    assert out["threaded"]
    torch.testing.assert_close(out["grad"], expected, rtol=0, atol=0)


def test_knob_off_keeps_the_device_thread():
    code = (
        "import threading, torch, torch_tpu_eager\n"
        "x = torch.randn(3, device='tpu', requires_grad=True); seen = []\n"
        "y = x * 2; y.register_hook(lambda g: seen.append(threading.current_thread().name) or g)\n"
        "y.sum().backward(); print(torch.autograd.is_multithreading_enabled(), seen[0] != 'MainThread')\n"
    )
    env = {**__import__("os").environ, "TORCH_TPU_BACKWARD_ON_CALLER": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
