"""The host runtime's own kernels for training-step ops (executors/direct_kernels.cpp):
max_pool2d_with_indices on dense float32 with square windows, its backward (the input
gradient), and native_batch_norm in training mode (its statistics loop). Values and indices equal
CPU's bit for bit, including NaN, -inf and ties (the first maximum in row-major order
wins, a later NaN replaces an earlier one), for the cases the kernel takes and the
cases it leaves to CPU's kernel (padding, dilation, ceil_mode's partial windows)."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, aten_ops_during, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu executor's host kernels")


def _special(shape, seed):
    """randn rounded to quarters (many ties) with NaN, +-inf and -0.0 sprinkled in."""
    x = (cpu_randn(*shape, seed=seed) * 4).round() / 4
    flat = x.view(-1)
    g = torch.Generator().manual_seed(seed + 100)
    for value in (float("nan"), float("-inf"), float("inf"), -0.0):
        flat[torch.randint(0, flat.numel(), (max(1, flat.numel() // 20),), generator=g)] = value
    return x


POOL_CASES = {
    "k2s2": dict(shape=(4, 3, 8, 10), kernel_size=2),
    "k2s2_odd": dict(shape=(2, 3, 9, 7), kernel_size=2),
    "k2s2_wide": dict(shape=(2, 3, 6, 39), kernel_size=2),  # 8-wide vector steps and a remainder
    "k2s2_cnn": dict(shape=(32, 8, 16, 16), kernel_size=2),  # run_all.py's CNN step
    "k3s2_overlap": dict(shape=(2, 2, 11, 9), kernel_size=3, stride=2),
    "k3s3": dict(shape=(3, 12, 12), kernel_size=3),
    "k4s1": dict(shape=(1, 2, 7, 8), kernel_size=4, stride=1),
    "k2s3_gaps": dict(shape=(2, 2, 10, 10), kernel_size=2, stride=3),
    "rect_falls_back": dict(shape=(2, 2, 8, 9), kernel_size=(2, 3)),
    "padding_falls_back": dict(shape=(2, 2, 8, 8), kernel_size=3, stride=2, padding=1),
    "dilation_falls_back": dict(shape=(2, 2, 9, 9), kernel_size=2, dilation=2),
    "ceil_partial_falls_back": dict(shape=(2, 2, 9, 9), kernel_size=2, ceil_mode=True),
    "ceil_full": dict(shape=(2, 2, 8, 8), kernel_size=2, ceil_mode=True),
}


@pytest.mark.parametrize("special", [False, True], ids=["randn", "nan_inf_ties"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_max_pool2d_with_indices_equals_cpu(case, special):
    kw = dict(POOL_CASES[case])
    shape = kw.pop("shape")
    x = _special(shape, 3) if special else cpu_randn(*shape, seed=3)
    out, idx = F.max_pool2d(x, return_indices=True, **kw)
    got_out, got_idx = F.max_pool2d(x.to(DEVICE), return_indices=True, **kw)
    got_out, got_idx = got_out.cpu(), got_idx.cpu()
    assert got_out.shape == out.shape and got_out.stride() == out.stride()
    assert torch.equal(got_idx, idx)
    assert torch.equal(got_out.view(torch.int32), out.view(torch.int32))  # bit for bit, NaN and -0.0 too


@pytest.mark.parametrize("case,own", [("k2s2", True), ("k3s2_overlap", True), ("padding_falls_back", False)])
def test_max_pool2d_runs_own_kernel(case, own):
    """The cases the kernel takes run no CPU pooling kernel in the flush; the others run CPU's."""
    kw = dict(POOL_CASES[case])
    x = cpu_randn(*kw.pop("shape"), seed=4).to(DEVICE)
    torch.tpu.synchronize()
    out = F.max_pool2d(x, return_indices=True, **kw)
    ran = [op for op in aten_ops_during(torch.tpu.synchronize) if "max_pool" in op]
    assert (ran == []) == own, ran
    del out


def test_max_pool2d_relu_backward_equals_cpu():
    """relu -> max_pool2d -> sum, as in a CNN block: gradients through the indices."""
    x = _special((2, 4, 8, 8), 5).nan_to_num(0.0)
    grads = []
    for dev in ("cpu", DEVICE):
        xd = x.to(dev).detach().requires_grad_()
        y = F.max_pool2d(F.relu(xd), 2)
        (y * torch.arange(y.numel(), dtype=torch.float32, device=dev).view_as(y)).sum().backward()
        grads.append((y.detach().cpu(), xd.grad.cpu()))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


BN_CASES = {
    "cnn_block": dict(shape=(32, 8, 16, 16)),
    "cnn_block2": dict(shape=(32, 16, 8, 8)),  # run_all.py's second batch norm: sixteen AVX2 lanes
    "channels_not_multiple_of_4": dict(shape=(3, 7, 5, 6)),
    # channel blocks of 16, 8 and 4 and a remainder; planes not a multiple of 4
    "channels_30_plane_9": dict(shape=(2, 30, 3, 3)),
    "channels_20_plane_25": dict(shape=(3, 20, 5, 5)),
    "channels_12_plane_2": dict(shape=(8, 12, 2)),
    "channels_24_large_offset": dict(shape=(4, 24, 7, 7), scale=1e-2, shift=3e3),
    "one_channel": dict(shape=(4, 1, 3, 3)),
    "conv1d": dict(shape=(5, 6, 11)),
    "volumetric": dict(shape=(2, 5, 3, 4, 3)),
    "large_offset": dict(shape=(4, 6, 8, 8), scale=1e3, shift=1e4),
    "no_affine_falls_back": dict(shape=(4, 6, 5, 5), affine=False),
    "no_running_stats_falls_back": dict(shape=(4, 6, 5, 5), track=False),
    "channels_last_falls_back": dict(shape=(4, 6, 5, 5), channels_last=True),
    "batchnorm1d_2d_falls_back": dict(shape=(16, 6)),
}


@pytest.mark.parametrize("case", list(BN_CASES))
def test_batch_norm_train_equals_cpu(case):
    """BatchNorm in training mode, two steps: output, running statistics and gradients bit for bit."""
    kw = dict(BN_CASES[case])
    shape = kw["shape"]
    bn_cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
    torch.manual_seed(0)
    ref = bn_cls[len(shape)](
        shape[1], momentum=0.3, eps=1e-3, affine=kw.get("affine", True), track_running_stats=kw.get("track", True)
    )
    if kw.get("affine", True):
        with torch.no_grad():
            ref.weight.copy_(cpu_randn(shape[1], seed=7))
            ref.bias.copy_(cpu_randn(shape[1], seed=8))
    dev = bn_cls[len(shape)](
        shape[1], momentum=0.3, eps=1e-3, affine=kw.get("affine", True), track_running_stats=kw.get("track", True)
    )
    dev.load_state_dict(ref.state_dict())
    dev = dev.to(DEVICE)
    for step in range(2):
        x = cpu_randn(*shape, seed=20 + step) * kw.get("scale", 1.0) + kw.get("shift", 0.0)
        if kw.get("channels_last"):
            x = x.contiguous(memory_format=torch.channels_last)
        xd = x.to(DEVICE).detach().requires_grad_()
        x = x.detach().requires_grad_()
        y, yd = ref(x), dev(xd)
        g = cpu_randn(*shape, seed=30 + step)
        y.backward(g)
        yd.backward(g.to(DEVICE))
        assert torch.equal(yd.detach().cpu(), y.detach())
        assert torch.equal(xd.grad.cpu(), x.grad)
    for name, value in ref.state_dict().items():
        assert torch.equal(dev.state_dict()[name].cpu(), value), name
    for (name, p), q in zip(ref.named_parameters(), dev.parameters()):
        assert torch.equal(q.grad.cpu(), p.grad), name


@pytest.mark.parametrize("case,own", [("cnn_block", True), ("no_affine_falls_back", False)])
def test_batch_norm_train_runs_own_kernel(case, own):
    """Training-mode batch norm with affine parameters and running statistics runs no CPU batch_norm op."""
    shape = BN_CASES[case]["shape"]
    bn = torch.nn.BatchNorm2d(shape[1], affine=BN_CASES[case].get("affine", True)).to(DEVICE)
    x = cpu_randn(*shape, seed=5).to(DEVICE)
    torch.tpu.synchronize()
    y = bn(x)
    ran = [op for op in aten_ops_during(torch.tpu.synchronize) if "batch_norm" in op]
    assert (ran == []) == own, ran
    del y


def _pool_backward(dev, x, grad_seed, special, kw):
    """max_pool2d(x) forward on `dev` and its input gradient for a random output gradient."""
    xd = x.to(dev).detach().requires_grad_()
    y = F.max_pool2d(xd, **kw)
    g = _special(y.shape, grad_seed) if special else cpu_randn(*y.shape, seed=grad_seed)
    y.backward(g.to(dev))
    return xd.grad.cpu()


@pytest.mark.parametrize("special", [False, True], ids=["randn", "nan_inf_signed_zero"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_max_pool2d_backward_equals_cpu(case, special):
    """The input gradient bit for bit: overlapping windows sum repeated indices in output order;
    NaN, inf and -0.0 gradients land as CPU's +0.0 + g does."""
    kw = dict(POOL_CASES[case])
    shape = kw.pop("shape")
    x = _special(shape, 6) if special else cpu_randn(*shape, seed=6)
    want, got = _pool_backward("cpu", x, 9, special, kw), _pool_backward(DEVICE, x, 9, special, kw)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_max_pool2d_backward_given_indices_equals_cpu(dtype):
    """The backward op called with indices of its own: repeated indices (summed in output order),
    -1 (skipped), indices anywhere in the plane; 16-bit types run CPU's kernel."""
    g = torch.Generator().manual_seed(11)
    x = cpu_randn(3, 4, 6, 6, seed=12).to(dtype)
    grad = cpu_randn(3, 4, 3, 3, seed=13).to(dtype)
    idx = torch.randint(-1, 36, (3, 4, 3, 3), generator=g)
    idx[0, 0] = 7  # one input element takes every output's gradient of a plane
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False)
    want = torch.ops.aten.max_pool2d_with_indices_backward(grad, x, *args, idx)
    got = torch.ops.aten.max_pool2d_with_indices_backward(grad.to(DEVICE), x.to(DEVICE), *args, idx.to(DEVICE)).cpu()
    assert got.dtype == want.dtype and got.stride() == want.stride()
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["k2s2_cnn", "k3s2_overlap", "padding_falls_back"])
def test_max_pool2d_backward_runs_own_kernel(case):
    """A dense float32 pooling gradient runs no CPU max-pooling backward kernel in the flush
    (with padding too: the forward runs CPU's kernel, its indices are in range)."""
    kw = dict(POOL_CASES[case])
    x = cpu_randn(*kw.pop("shape"), seed=4).to(DEVICE).requires_grad_()
    y = F.max_pool2d(x, **kw)
    y.backward(torch.ones_like(y))
    ran = [op for op in aten_ops_during(torch.tpu.synchronize) if "max_pool2d_with_indices_backward" in op]
    assert ran == [], ran
