"""channels_last inputs: every result and gradient has CPU's sizes, strides and values.

CPU's NCHW kernels (convolution, pads, pixel/channel shuffle, max_unpool, norms,
pools, upsampling) keep a channels_last input's memory format; the device records
results in the geometry its meta inference gives, so a meta kernel that says
contiguous would hand back NCHW strides. Gradients are checked with a contiguous
and with a channels_last incoming gradient.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)

CL, CL3 = torch.channels_last, torch.channels_last_3d


def _x4(dtype=torch.float32):
    return torch.randn(2, 4, 8, 8, dtype=dtype).contiguous(memory_format=CL)


def _x5():
    return torch.randn(2, 4, 6, 6, 6).contiguous(memory_format=CL3)


def _weight(*shape, fmt=None):
    w = torch.randn(*shape)
    return w.contiguous(memory_format=fmt) if fmt is not None else w


# name -> (input maker, extra leaf tensors (CPU), fn(x, leaves on the device) -> result(s))
CASES = {
    "conv2d": (_x4, lambda: [_weight(6, 4, 3, 3)], lambda x, p: F.conv2d(x, p[0])),
    "conv2d_bias_stride_pad": (
        _x4,
        lambda: [_weight(6, 4, 3, 3), torch.randn(6)],
        lambda x, p: F.conv2d(x, p[0], p[1], stride=2, padding=1),
    ),
    "conv2d_groups_dilation": (
        _x4,
        lambda: [_weight(6, 2, 3, 3)],
        lambda x, p: F.conv2d(x, p[0], groups=2, dilation=2),
    ),
    "conv2d_depthwise": (_x4, lambda: [_weight(4, 1, 3, 3)], lambda x, p: F.conv2d(x, p[0], groups=4)),
    "conv2d_channels_last_weight_only": (
        lambda: torch.randn(2, 4, 8, 8),
        lambda: [_weight(6, 4, 3, 3, fmt=CL)],
        lambda x, p: F.conv2d(x, p[0]),
    ),
    "conv2d_float64": (
        lambda: _x4(torch.float64),
        lambda: [_weight(6, 4, 3, 3).double()],
        lambda x, p: F.conv2d(x, p[0]),
    ),
    "conv_transpose2d": (_x4, lambda: [_weight(4, 6, 3, 3)], lambda x, p: F.conv_transpose2d(x, p[0], stride=2)),
    "conv3d": (_x5, lambda: [_weight(6, 4, 3, 3, 3)], lambda x, p: F.conv3d(x, p[0])),
    "batch_norm_train": (
        _x4,
        lambda: [torch.randn(4), torch.randn(4)],
        lambda x, p: F.batch_norm(x, None, None, p[0], p[1], training=True),
    ),
    "batch_norm_eval": (
        _x4,
        lambda: [torch.randn(4), torch.randn(4)],
        lambda x, p: F.batch_norm(
            x, torch.zeros(4, device=x.device), torch.ones(4, device=x.device), p[0], p[1], training=False
        ),
    ),
    "group_norm": (_x4, lambda: [torch.randn(4), torch.randn(4)], lambda x, p: F.group_norm(x, 2, p[0], p[1])),
    "max_pool2d_indices": (_x4, list, lambda x, p: F.max_pool2d(x, 3, 2, 1, return_indices=True)),
    "avg_pool2d": (_x4, list, lambda x, p: F.avg_pool2d(x, 3, 2, 1)),
    "adaptive_avg_pool2d": (_x4, list, lambda x, p: F.adaptive_avg_pool2d(x, 3)),
    "adaptive_max_pool2d": (_x4, list, lambda x, p: F.adaptive_max_pool2d(x, 3, return_indices=True)),
    "max_pool3d": (_x5, list, lambda x, p: F.max_pool3d(x, 2, return_indices=True)),
    "avg_pool3d": (_x5, list, lambda x, p: F.avg_pool3d(x, 2)),
    "adaptive_avg_pool3d": (_x5, list, lambda x, p: F.adaptive_avg_pool3d(x, 2)),
    "adaptive_max_pool3d": (_x5, list, lambda x, p: F.adaptive_max_pool3d(x, 2, return_indices=True)),
    "upsample_nearest": (_x4, list, lambda x, p: F.interpolate(x, scale_factor=2, mode="nearest")),
    "upsample_bilinear": (_x4, list, lambda x, p: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True)),
    "upsample_bicubic": (_x4, list, lambda x, p: F.interpolate(x, scale_factor=2, mode="bicubic")),
    "upsample_bilinear_antialias": (
        _x4,
        list,
        lambda x, p: F.interpolate(x, size=(5, 5), mode="bilinear", antialias=True),
    ),
    "upsample_trilinear": (_x5, list, lambda x, p: F.interpolate(x, scale_factor=2, mode="trilinear")),
    "pixel_shuffle": (_x4, list, lambda x, p: F.pixel_shuffle(x, 2)),
    "pixel_unshuffle": (_x4, list, lambda x, p: F.pixel_unshuffle(x, 2)),
    "reflection_pad2d": (_x4, list, lambda x, p: F.pad(x, (1, 2, 1, 2), mode="reflect")),
    "replication_pad2d": (_x4, list, lambda x, p: F.pad(x, (1, 2, 1, 2), mode="replicate")),
    "reflection_pad3d": (_x5, list, lambda x, p: F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect")),
    "replication_pad3d": (_x5, list, lambda x, p: F.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate")),
    "constant_pad": (_x4, list, lambda x, p: F.pad(x, (1, 1, 1, 1))),
    "channel_shuffle": (_x4, list, lambda x, p: F.channel_shuffle(x, 2)),
    "max_unpool2d": (_x4, list, lambda x, p: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)),
    "max_unpool3d": (_x5, list, lambda x, p: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2)),
    "prelu": (_x4, lambda: [torch.randn(4)], lambda x, p: F.prelu(x, p[0])),
    "softmax_channels": (_x4, list, lambda x, p: F.softmax(x, 1)),
    "cross_entropy_2d": (
        _x4,
        list,
        lambda x, p: F.cross_entropy(x, torch.zeros(2, 8, 8, dtype=torch.long, device=x.device), reduction="none"),
    ),
}


def _flat(r):
    if isinstance(r, torch.Tensor):
        return [r]
    return [t for e in r for t in _flat(e)]


def _run(dev, name, x0, leaves0, channels_last_grad):
    _, _, fn = CASES[name]
    x = x0.clone().to(dev).requires_grad_()
    leaves = [p.clone().to(dev).requires_grad_() for p in leaves0]
    outs = _flat(fn(x, leaves))
    diff = [o for o in outs if o.requires_grad]
    torch.manual_seed(2)
    grads = [torch.randn(o.shape, dtype=o.dtype) for o in diff]
    grads = [
        g.contiguous(memory_format=CL if g.dim() == 4 else CL3) if channels_last_grad and g.dim() in (4, 5) else g
        for g in grads
    ]
    torch.autograd.backward(diff, [g.to(dev) for g in grads])
    return outs + [x.grad] + [p.grad for p in leaves]


@pytest.mark.parametrize("channels_last_grad", [False, True], ids=["contiguous_grad", "channels_last_grad"])
@pytest.mark.parametrize("name", list(CASES))
def test_channels_last_input_matches_cpu(name, channels_last_grad):
    make_x, make_leaves, _ = CASES[name]
    torch.manual_seed(0)
    x0, leaves0 = make_x(), make_leaves()
    cpu = _run("cpu", name, x0, leaves0, channels_last_grad)
    tpu = _run("tpu", name, x0, leaves0, channels_last_grad)
    assert len(tpu) == len(cpu)
    for k, (c, t) in enumerate(zip(cpu, tpu)):
        assert t.device.type == "tpu"
        assert (t.shape, t.stride(), t.dtype) == (c.shape, c.stride(), c.dtype), f"result {k}"
        torch.testing.assert_close(t.cpu(), c, msg=f"result {k}")


def test_conv2d_channels_last_stays_channels_last_through_a_cached_call():
    # The second call hits the meta cache: the cached geometry is CPU's too.
    torch.manual_seed(0)
    w = torch.randn(4, 3, 3, 3)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CL)
        c = F.conv2d(x, w)
        t = F.conv2d(x.to("tpu"), w.to("tpu"))
        assert t.stride() == c.stride()
        torch.testing.assert_close(t.cpu(), c)


def test_bad_convolution_raises_like_cpu_and_the_queue_survives():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CL)
    pending = torch.ones(4, device="tpu") * 3  # queued, not flushed
    with pytest.raises(RuntimeError):
        F.conv2d(x, torch.randn(4, 5, 3, 3))  # CPU: channel mismatch
    with pytest.raises(RuntimeError):
        F.conv2d(x.to("tpu"), torch.randn(4, 5, 3, 3, device="tpu"))
    torch.testing.assert_close(pending.cpu(), torch.full((4,), 3.0))
    good = F.conv2d(x.to("tpu"), torch.ones(4, 3, 3, 3, device="tpu"))
    torch.testing.assert_close(good.cpu(), F.conv2d(x, torch.ones(4, 3, 3, 3)))


def test_plain_meta_tensors_keep_pytorchs_device_hint():
    # The CPU answer is for the device's own meta inference only.
    from torch._meta_registrations import device_hint

    assert device_hint(torch.empty(2, device="meta")) == "cuda"
