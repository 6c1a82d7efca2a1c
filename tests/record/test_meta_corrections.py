"""Results where torch's meta kernels disagree with CPU's kernel, corrected at record time
(record.cpp correct_meta_outcome): out= strides, masked gradients, out= of composite reductions."""

import pytest
import torch
import torch.nn.functional as F
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


# Fixed in record.cpp correct_meta_outcome: sort's meta kernel restrided a same-shaped out=.
@pytest.mark.parametrize("stable", [False, True])
def test_sort_into_transposed_out_matches_cpu(stable):
    x = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    got = {}
    for dev in ("cpu", "tpu"):
        v = torch.zeros(3, 2, device=dev)
        i = torch.zeros(3, 2, dtype=torch.long, device=dev)
        r = torch.sort(x.to(dev), stable=stable, dim=1, out=(v.t(), i.t()))
        got[dev] = (r[0].stride(), v.cpu(), i.cpu())
    assert got["tpu"][0] == got["cpu"][0]
    torch.testing.assert_close(got["tpu"][1], got["cpu"][1])
    torch.testing.assert_close(got["tpu"][2], got["cpu"][2])


def test_msort_into_strided_out_matches_cpu():
    x = torch.tensor([3.0, 1.0, 2.0, 0.0])
    got = {}
    for dev in ("cpu", "tpu"):
        buf = torch.full((8,), -1.0, device=dev)
        r = torch.msort(x.to(dev), out=buf[::2])
        got[dev] = (r.stride(), buf.cpu())
    assert got["tpu"][0] == got["cpu"][0]
    torch.testing.assert_close(got["tpu"][1], got["cpu"][1])


# Fixed in record.cpp correct_meta_outcome (masked gradients are undefined, as on CPU).
def test_batch_norm_weight_grad_when_input_needs_no_grad():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 4, 4)
    w0 = torch.randn(3)
    grads = {}
    for dev in ("cpu", "tpu"):
        w = w0.clone().to(dev).requires_grad_()
        out = F.batch_norm(img.to(dev), None, None, w, None, training=True)
        (out.sin()).sum().backward()
        grads[dev] = w.grad.cpu()
    torch.testing.assert_close(grads["tpu"], grads["cpu"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.BatchNorm2d(3),
        lambda: torch.nn.BatchNorm2d(3).eval(),
        lambda: torch.nn.InstanceNorm2d(3, affine=True),
    ],
    ids=["batch_norm_train", "batch_norm_eval", "instance_norm_affine"],
)
def test_norm_module_parameter_grads_when_input_needs_no_grad(make):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    grads = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(1)
        m = make().to(dev)
        m(x.to(dev)).sin().sum().backward()
        grads[dev] = [p.grad.cpu() for p in m.parameters()]
    for g_tpu, g_cpu in zip(grads["tpu"], grads["cpu"]):
        torch.testing.assert_close(g_tpu, g_cpu)


def test_native_batch_norm_backward_masked_grad_input_is_none():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 4, 4)
    w = torch.randn(3)
    res = {}
    for dev in ("cpu", "tpu"):
        x, wd = img.to(dev), w.to(dev)
        _, mean, invstd = torch.native_batch_norm(x, wd, None, None, None, True, 0.1, 1e-5)
        r = torch.ops.aten.native_batch_norm_backward(
            torch.ones_like(x), x, wd, None, None, mean, invstd, True, 1e-5, [False, True, False]
        )
        res[dev] = r
    assert (res["tpu"][0] is None) == (res["cpu"][0] is None)
    torch.testing.assert_close(res["tpu"][1].cpu(), res["cpu"][1])


# Fixed by an op-table row (tools/gen_op_table.py composite_reduction_out); sweep: tests/api/test_out_overloads.py.
def test_mode_with_out_matches_cpu():
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 0.0]])
    res = {}
    for dev in ("cpu", "tpu"):
        v = torch.empty(2, device=dev)
        i = torch.empty(2, dtype=torch.long, device=dev)
        torch.mode(x.to(dev), 1, out=(v, i))
        res[dev] = (v.cpu(), i.cpu())
    torch.testing.assert_close(res["tpu"][0], res["cpu"][0])
    torch.testing.assert_close(res["tpu"][1], res["cpu"][1])


# Fixed in record.cpp correct_meta_outcome (kNormStatsInInputDtype): group norm of a
# 16-bit input with float32 parameters ("mixed type", PyTorch's test_nn test_groupnorm_nhwc):
# CPU keeps mean/rstd in float32 and gives grad_input the input's dtype and
# grad_weight/bias the weight's; the meta kernels say otherwise.
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("wdtype", [torch.float32, "same", None])
def test_group_norm_mixed_dtypes_match_cpu(xdtype, wdtype):
    N, C, G = 2, 8, 4
    wd = xdtype if wdtype == "same" else wdtype
    res = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        x = torch.randn(N, C, 5, 5).to(xdtype).to(dev).requires_grad_()
        w = None if wd is None else torch.randn(C).to(wd).to(dev).requires_grad_()
        b = None if wd is None else torch.randn(C).to(wd).to(dev).requires_grad_()
        out, mean, rstd = torch.ops.aten.native_group_norm(x.detach(), w, b, N, C, 25, G, 1e-5)
        y = F.group_norm(x, G, w, b)
        y.backward(torch.ones_like(y))
        grads = [t.grad for t in (x, w, b) if t is not None]
        res[dev] = [out, mean, rstd, y, *grads]
    for got, want in zip(res["tpu"], res["cpu"], strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


# tools/gen_op_table.py META_NOT_FINAL: isin(Scalar, Tensor)'s structured meta function gives
# shape [0], which CPU's kernel replaces by the Scalar's shape [] (PyTorch's test_isin).
@pytest.mark.parametrize("element", [5, 1, 3.0])
@pytest.mark.parametrize("invert", [False, True])
def test_isin_scalar_tensor_is_zero_dim_as_on_cpu(element, invert):
    b = torch.tensor([[10, 20, 30], [0, 1, 3]])
    got = {}
    for dev in ("cpu", "tpu"):
        r = torch.isin(element, b.to(dev), invert=invert)
        out = torch.empty(0, dtype=torch.bool, device=dev)
        r_out = torch.isin(element, b.to(dev), invert=invert, out=out)
        got[dev] = (r.shape, r.stride(), r.dtype, r.cpu(), r_out.shape, out.cpu())
    assert got["tpu"][:3] == got["cpu"][:3]
    assert got["tpu"][4] == got["cpu"][4]
    assert torch.equal(got["tpu"][3], got["cpu"][3])
    assert torch.equal(got["tpu"][5], got["cpu"][5])


# Its out= kernel resizes a 0-dim out to [0] first and warns (CPU's quirk): the warning comes
# at the call as on CPU, never at a later flush (OUT_KERNEL_RESIZES: the out= call runs eagerly).
@pytest.mark.parametrize("out_shape", [(), (3,)])
def test_isin_scalar_tensor_out_warns_at_the_call_as_on_cpu(out_shape):
    import warnings

    b = torch.tensor([[10, 20, 30], [0, 1, 3]])
    got = {}
    for dev in ("cpu", "tpu"):
        out = torch.empty(out_shape, dtype=torch.bool, device=dev)
        with warnings.catch_warnings(record=True) as at_call:
            warnings.simplefilter("always")
            torch.isin(1, b.to(dev), out=out)
        with warnings.catch_warnings(record=True) as at_read:
            warnings.simplefilter("always")
            value = out.cpu()
        got[dev] = ([str(w.message)[:60] for w in at_call], len(at_read), out.shape, value)
    assert got["tpu"][:3] == got["cpu"][:3]
    assert got["cpu"][0], "CPU warns at the call"
    assert torch.equal(got["tpu"][3], got["cpu"][3])


_BN_OUT = {
    "native_batch_norm.out": lambda x, w, b, rm, rv, out, sm, si: torch.native_batch_norm(
        x, w, b, rm, rv, False, 0.1, 1e-5, out=(out, sm, si)
    ),
    "_native_batch_norm_legit.out": lambda x, w, b, rm, rv, out, sm, si: torch.ops.aten._native_batch_norm_legit.out(
        x, w, b, rm, rv, False, 0.1, 1e-5, out=out, save_mean=sm, save_invstd=si
    ),
}


def _bn_eval_out(dev, op, stats_shape):
    g = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(4, 3, 5, generator=g), torch.randn(3, generator=g), torch.randn(3, generator=g)
    rm, rv = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5
    x, w, b, rm, rv = (t.to(dev) for t in (x, w, b, rm, rv))
    out = torch.empty(0, device=dev)
    sm, si = torch.full(stats_shape, 7.0, device=dev), torch.full(stats_shape, -7.0, device=dev)
    ret = _BN_OUT[op](x, w, b, rm, rv, out, sm, si)
    return [t.cpu() for t in (out, sm, si, rm, rv, *ret)]


@pytest.mark.parametrize("op", sorted(_BN_OUT))
@pytest.mark.parametrize("stats_shape", [(3,), (0,), (7,)], ids=["C", "empty", "other"])
def test_batch_norm_eval_out_leaves_save_stats_as_given(op, stats_shape):
    # CPU's eval path neither resizes nor writes save_mean / save_invstd nor the running
    # statistics; the meta kernel resized the save statistics to [C].
    got, want = _bn_eval_out("tpu", op, stats_shape), _bn_eval_out("cpu", op, stats_shape)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("op", sorted(_BN_OUT))
def test_batch_norm_eval_out_save_stats_of_another_rank_raise_at_the_call(op):
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="TensorAccessor expected 1 dims but tensor has 2"):
            _bn_eval_out(dev, op, (1, 3))
    y = torch.ones(3, device="tpu") * 2  # the queue is still usable
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]
