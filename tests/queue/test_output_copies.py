"""Copies of op results into device memory at the flush (metrics()["output_copies"]).

An op whose CPU kernel cannot write its result where the device keeps it (no out=
kernel: convolution, batch_norm_backward, ...) returns a fresh CPU tensor. The device
is simulated in host memory, so that fresh result is not copied when it has the
recorded layout: for a value that lives only between the flush's regions (transient)
it becomes its flush-local memory (host_runtime.h, adopt_transient), for a value
observed after the flush its device memory (device.h, adopt_host_buffer; the tpu
storage's data pointer follows). Values are compared with CPU.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager
from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="flush copies are the tpu device's")

X = cpu_randn(2, 3, 8, 8, seed=31)
W = cpu_randn(4, 3, 3, 3, seed=32)
M = cpu_randn(4 * 6 * 6, 5, seed=33)


def _copies_of_flush(fn):
    before = torch_tpu_eager.metrics()["output_copies"]
    out = fn()
    torch.tpu.synchronize()
    return out, torch_tpu_eager.metrics()["output_copies"] - before


def _on_tpu():
    x, w, m = X.to("tpu"), W.to("tpu"), M.to("tpu")
    torch.tpu.synchronize()
    return x, w, m


def test_transient_convolution_result_is_not_copied():
    x, w, m = _on_tpu()
    # conv2d's result is read by the matmul's region and by nothing after the flush
    got, copies = _copies_of_flush(lambda: F.conv2d(x, w).flatten(1) @ m)
    assert copies == 0
    torch.testing.assert_close(got.cpu(), F.conv2d(X, W).flatten(1) @ M, rtol=0, atol=0)


def test_observed_convolution_result_becomes_device_memory():
    x, w, _ = _on_tpu()
    got, copies = _copies_of_flush(lambda: F.conv2d(x, w))
    assert copies == 0  # the CPU kernel's result is the device storage that `got` keeps
    assert got.stride() == F.conv2d(X, W).stride()
    assert got.untyped_storage().data_ptr() == got.data_ptr()
    torch.testing.assert_close(got.cpu(), F.conv2d(X, W), rtol=0, atol=0)


def test_adopted_result_written_in_place_and_viewed():
    x, w, _ = _on_tpu()
    got = F.conv2d(x, w)
    view = got[:, 1]
    torch.tpu.synchronize()
    got.mul_(3.0)  # a later flush writes the adopted memory
    view.add_(1.0)
    want = F.conv2d(X, W)
    want.mul_(3.0)
    want[:, 1].add_(1.0)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(view.cpu(), want[:, 1], rtol=0, atol=0)


def test_adopted_result_keeps_memory_accounting():
    x, w, _ = _on_tpu()
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    got = F.conv2d(x, w)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() - before == got.untyped_storage().nbytes()
    del got
    assert torch.tpu.memory_allocated() == before


def test_adopted_result_shared_with_host_then_written():
    # 1 MiB and more: .cpu() shares the device buffer copy-on-write (device/host_share.h);
    # the share then owns the adopted buffer along with the device.
    x = cpu_randn(1, 3, 130, 130, seed=34)
    w = cpu_randn(16, 3, 3, 3, seed=35)
    got = F.conv2d(x.to("tpu"), w.to("tpu"))
    host = got.cpu()
    got.add_(1.0)  # the device moves to a private copy; `host` keeps the old value
    want = F.conv2d(x, w)
    torch.testing.assert_close(host, want, rtol=0, atol=0)
    torch.testing.assert_close(got.cpu(), want + 1.0, rtol=0, atol=0)
    del got
    torch.testing.assert_close(host, want, rtol=0, atol=0)


def test_adopted_result_exported_through_dlpack():
    x, w, _ = _on_tpu()
    got = F.conv2d(x, w)
    alias = torch.from_dlpack(got)  # flushes; the address is pinned from here on
    assert alias.data_ptr() == got.data_ptr()
    got.mul_(2.0)
    torch.testing.assert_close(alias.cpu(), 2.0 * F.conv2d(X, W), rtol=0, atol=0)


def test_transient_result_read_by_two_later_regions_and_written_in_place():
    x, w, m = _on_tpu()

    def prog(x, w, m):
        y = F.conv2d(x, w)  # transient
        a = y.flatten(1) @ m  # one region reads it
        y.mul_(2.0)  # an in-place write to the adopted memory
        b = y.flatten(1) @ m  # another region reads the new value
        return a + b

    got, _ = _copies_of_flush(lambda: prog(x, w, m))
    torch.testing.assert_close(got.cpu(), prog(X, W, M), rtol=0, atol=0)


def test_training_step_with_batch_norm_matches_cpu():
    def step(dev):
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(144, 5),
        ).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(3):
            loss = net(X.to(dev)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses).cpu(), [p.detach().cpu() for p in net.parameters()]

    (want_l, want_p) = step("cpu")
    before = torch_tpu_eager.metrics()["output_copies"]
    got_l, got_p = step("tpu")
    # Convolution and batch-norm results that autograd keeps became device memory.
    assert torch_tpu_eager.metrics()["output_copies"] - before <= 3
    torch.testing.assert_close(got_l, want_l)
    for g, w in zip(got_p, want_p):
        torch.testing.assert_close(g, w)


def test_zero_tensor_result_is_copied_not_adopted():
    # sgn's backward of a real input is an efficient zero tensor on CPU: a storage
    # without a buffer, which must not become the gradient's device memory.
    def grad(dev):
        a = X.detach().to(dev).requires_grad_()
        torch.sgn(a).sum().backward()
        return a.grad.cpu()

    torch.testing.assert_close(grad("tpu"), grad("cpu"), rtol=0, atol=0)
