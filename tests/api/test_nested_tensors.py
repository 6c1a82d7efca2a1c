"""Nested tensors (``torch.nested``, strided layout) on "tpu", each against CPU.

A nested "tpu" tensor is PyTorch's NestedTensorImpl over device memory; its nested
sizes/strides/offsets are CPU tensors. Nested ops run CPU's nested kernels on the host
(csrc/ops/layout_kernels.cpp); views share the "tpu" storage; the dense-to-nested
constructors of the transformer fast path (``_nested_tensor_from_mask``,
``_nested_from_padded``) have "tpu" kernels. Found by PyTorch's test_nn
(``test_TransformerEncoderLayer_empty``: NotImplementedError for NestedTensorPrivateUse1).
"""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from difftest import requires_tpu

pytestmark = [requires_tpu, pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")]

DEV = "tpu"


def _parts(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, generator=g).to(dtype), torch.randn(4, 3, generator=g).to(dtype)]


def _nested(device, dtype=torch.float32, **kw):
    return torch.nested.nested_tensor([p.to(device) for p in _parts(dtype)], device=device, **kw)


def _same_nested(t, c, **tol):
    """t (nested, on "tpu") holds CPU nested tensor c's components, dtype and nested sizes."""
    assert t.is_nested and t.device.type == DEV and t.dtype == c.dtype
    assert torch.equal(torch.ops.aten._nested_tensor_size(t), torch.ops.aten._nested_tensor_size(c))
    assert t.is_contiguous() == c.is_contiguous()
    for a, b in zip(t.unbind(), c.unbind(), strict=True):
        assert a.device.type == DEV
        torch.testing.assert_close(a.cpu(), b, **tol)


def test_construction_metadata_and_round_trips():
    c, t = _nested("cpu"), _nested(DEV)
    _same_nested(t, c)
    assert (t.dim(), t.size(0), t.size(2)) == (c.dim(), c.size(0), c.size(2))
    # nested metadata stays on the host, as for CPU and CUDA nested tensors
    for getter in (torch.ops.aten._nested_tensor_size, torch.ops.aten._nested_tensor_strides):
        assert getter(t).device.type == "cpu" and torch.equal(getter(t), getter(c))
    _same_nested(c.to(DEV), c)
    back = t.cpu()
    assert back.is_nested and back.device.type == "cpu"
    assert torch.equal(back.to_padded_tensor(0.0), c.to_padded_tensor(0.0))
    _same_nested(torch.nested.as_nested_tensor([p.to(DEV) for p in _parts()]), c)
    assert torch.equal(t.to_padded_tensor(-1.0).cpu(), c.to_padded_tensor(-1.0))
    # an empty component (TransformerEncoderLayer_empty's input)
    e = torch.nested.nested_tensor([torch.rand(0, 8, device=DEV)], device=DEV)
    assert e.unbind()[0].shape == (0, 8) and e.unbind()[0].device.type == DEV


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ops_match_cpu(dtype):
    c, t = _nested("cpu", dtype), _nested(DEV, dtype)
    w = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).to(dtype)
    for f in (
        lambda n: n * 2 + 1,
        lambda n: n * n,
        lambda n: F.relu(n),
        lambda n: F.gelu(n),
        lambda n: F.softmax(n, -1),
        lambda n: F.dropout(n, 0.0),
        lambda n: n.transpose(1, 2).contiguous(),
        lambda n: torch.matmul(n, n.transpose(1, 2)),
        lambda n: F.layer_norm(
            n, (3,), torch.ones(3, dtype=dtype, device=n.device), torch.zeros(3, dtype=dtype, device=n.device)
        ),
        lambda n: n.clone(),
    ):
        _same_nested(f(t), f(c))
    # linear has a composite kernel beside its nested one (the nested one must win)
    _same_nested(F.linear(t, w.to(DEV)), F.linear(c, w))


def test_views_share_the_storage():
    c, t = _nested("cpu"), _nested(DEV)
    for n in (c, t):
        n.unbind()[1].add_(100)
        n.select(0, 0).mul_(-1)
    _same_nested(t, c)
    tt, ct = t.transpose(1, 2), c.transpose(1, 2)
    assert not tt.is_contiguous() and not ct.is_contiguous()
    _same_nested(tt, ct)


def test_in_place_ops_and_copy():
    c, t = _nested("cpu"), _nested(DEV)
    c.mul_(3).add_(c)
    t.mul_(3).add_(t)
    _same_nested(t, c)
    src_c, src_t = c * 0 + 7, t * 0 + 7
    c.copy_(src_c)
    t.copy_(src_t)
    _same_nested(t, c)


def test_autograd_through_nested():
    grads = []
    for dev in ("cpu", DEV):
        n = _nested(dev, requires_grad=True)
        y = (n * n + 1).to_padded_tensor(0.0)
        y.sum().backward()
        grads.append(n.grad)
    assert grads[1].device.type == DEV
    _same_nested(grads[1], grads[0])


def test_dense_to_nested_constructors():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 6, generator=g)
    mask = torch.tensor([[True, True, False, False], [True, True, True, False]])
    c = torch._nested_tensor_from_mask(x, mask)
    t = torch._nested_tensor_from_mask(x.to(DEV), mask.to(DEV))
    _same_nested(t, c)
    for m in (mask, torch.tensor([[True, False, True, False], [True] * 4])):
        want = torch._nested_tensor_from_mask_left_aligned(x, m)
        assert torch._nested_tensor_from_mask_left_aligned(x.to(DEV), m.to(DEV)) is want
    sizes = torch.tensor([[2, 6], [3, 6]])
    _same_nested(torch._nested_from_padded(x.to(DEV), sizes), torch._nested_from_padded(x, sizes))


@pytest.mark.parametrize("lengths", [(3, 5), (0,)])
def test_transformer_encoder_fast_path_with_nested_input(lengths):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, batch_first=True, dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in lengths]
    with torch.no_grad():
        want = layer(torch.nested.nested_tensor(parts))
        got = layer.to(DEV)(torch.nested.nested_tensor([p.to(DEV) for p in parts], device=DEV))
    _same_nested(got, want)


def test_transformer_encoder_padding_mask_fast_path():
    # a dense input with src_key_padding_mask: the fast path converts it to a nested
    # tensor (_nested_tensor_from_mask) and back (to_padded_tensor)
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, batch_first=True), 2, enable_nested_tensor=True)
    enc = enc.eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4))
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = enc(x, src_key_padding_mask=pad)
        got = enc.to(DEV)(x.to(DEV), src_key_padding_mask=pad.to(DEV))
    assert got.device.type == DEV and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_errors_are_cpus_and_the_queue_stays_valid():
    c, t = _nested("cpu"), _nested(DEV)
    dense = torch.ones(3, 2)
    with pytest.raises(RuntimeError) as want:
        torch.matmul(c, dense)
    with pytest.raises(type(want.value), match="Expected both to be nested"):
        torch.matmul(t, dense.to(DEV))
    _same_nested(t + 1, c + 1)


def test_jagged_layout_matches_cpu():
    # torch.nested's jagged layout: a Python subclass over dense values and offsets
    results = []
    for dev in ("cpu", DEV):
        nt = torch.nested.nested_tensor([p.to(dev) for p in _parts()], layout=torch.jagged, requires_grad=True)
        padded = (F.gelu(nt) * 2).to_padded_tensor(0.0)  # _jagged_to_padded_dense_forward
        padded.sum().backward()  # _padded_dense_to_jagged_forward
        lin = F.linear(nt, torch.ones(2, 3, device=dev))
        results.append((padded, nt.grad.values(), lin.values(), nt.offsets()))
    for got, want in zip(results[1], results[0], strict=True):
        assert got.device.type == DEV
        torch.testing.assert_close(got.cpu(), want)
