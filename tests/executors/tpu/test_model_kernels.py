"""Kernels real models reach (issue 17 §4), each compared with CPU.

- integer ``torch.histc`` (CUDA's semantics; CPU has no integer kernel), against a
  reference computed in float64 on CPU;
- ``_weight_norm_interface`` and its backward (``nn.utils.weight_norm`` and
  ``nn.utils.parametrizations.weight_norm``);
- the fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
  (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``);
- ``F.scaled_dot_product_attention`` through ``_fused_sdp_choice`` and
  ``_scaled_dot_product_fused_attention_overrideable`` (+ backward).

Every op here runs natively: recorded, not through the CPU fallback nor eagerly.
"""

import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from difftest import requires_tpu

pytestmark = requires_tpu

DEV = "tpu"


@contextlib.contextmanager
def recorded_only():
    """Asserts that the ops run inside were recorded: no fallback, no eager (run-at-call) op."""
    import torch_tpu_eager

    before = torch_tpu_eager.metrics()
    yield
    torch.tpu.synchronize()
    after = torch_tpu_eager.metrics()
    assert after["fallback_ops"] == before["fallback_ops"]
    assert after["eager_ops"] == before["eager_ops"]


# ---- integer histc ---------------------------------------------------------------


def histc_reference(x, bins, lo, hi):
    """CUDA's integer histc computed in float64 on CPU: bounds are the Scalars
    truncated to integers; equal bounds take the data's min/max, then widen by 1;
    element v in [lo, hi] goes to floor((v - lo) * bins / (hi - lo)), hi to the last bin."""
    lo, hi = int(lo), int(hi)
    v = x.to(torch.float64).flatten()
    if lo == hi and v.numel() > 0:
        lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    keep = (v >= lo) & (v <= hi)
    b = torch.floor((v[keep] - lo) * bins / (hi - lo)).to(torch.int64)
    b[b == bins] = bins - 1
    counts = torch.bincount(b, minlength=bins)
    return counts.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8])
@pytest.mark.parametrize(
    "bins,lo,hi", [(4, 0, 3), (8, 0, 7), (5, 0, 0), (3, -2, 9), (7, 2, 2), (10, 1.9, 6.7), (1, 0, 100)]
)
def test_histc_integer(dtype, bins, lo, hi):
    g = torch.Generator().manual_seed(bins * 100 + int(hi))
    low = 0 if dtype == torch.uint8 else -5
    x = torch.randint(low, 12, (37,), generator=g).to(dtype)
    with recorded_only():
        r = torch.histc(x.to(DEV), bins=bins, min=lo, max=hi)
    ref = histc_reference(x, bins, lo, hi)
    assert r.dtype == dtype and r.device.type == DEV
    assert torch.equal(r.cpu(), ref)


def test_histc_integer_moe_routing():
    # transformers' MoE load balancing: expert indices as int32, bins = experts, [0, experts - 1]
    experts = 8
    idx = torch.randint(0, experts, (64, 2), dtype=torch.int64)
    r = torch.histc(idx.to(DEV).int(), bins=experts, min=0, max=experts - 1)
    assert torch.equal(r.cpu(), torch.bincount(idx.flatten(), minlength=experts).int())


def test_histc_integer_edge_cases():
    # empty input with equal bounds: zeros; all-equal data: range widened to [v - 1, v + 1]
    e = torch.histc(torch.empty(0, dtype=torch.int32, device=DEV), bins=3)
    assert torch.equal(e.cpu(), torch.zeros(3, dtype=torch.int32))
    c = torch.histc(torch.full((5,), 4, dtype=torch.int64, device=DEV), bins=4)
    assert torch.equal(c.cpu(), histc_reference(torch.full((5,), 4), 4, 0, 0))
    # a strided input
    x = torch.arange(40, dtype=torch.int32).view(8, 5)
    r = torch.histc(x.to(DEV).t()[1:, ::2], bins=6, min=0, max=39)
    assert torch.equal(r.cpu(), histc_reference(x.t()[1:, ::2], 6, 0, 39))
    # counts kept in the input's dtype wrap as CUDA's (uint8: 300 elements in one bin)
    u = torch.histc(torch.zeros(300, dtype=torch.uint8, device=DEV), bins=2, min=0, max=1)
    assert torch.equal(u.cpu(), torch.tensor([300 % 256, 0], dtype=torch.uint8))
    # out=
    out = torch.empty(0, dtype=torch.int32, device=DEV)
    torch.histc(torch.tensor([0, 1, 1, 3], dtype=torch.int32, device=DEV), bins=4, min=0, max=3, out=out)
    assert torch.equal(out.cpu(), torch.tensor([1, 2, 0, 1], dtype=torch.int32))


def test_histc_integer_errors_at_call():
    x = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x, bins=4, min=3, max=1)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x, bins=0)
    assert torch.equal(x.cpu(), torch.tensor([1, 2], dtype=torch.int32))  # the queue and x stay valid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histc_float_matches_cpu(dtype):
    x = torch.randn(100, dtype=dtype)
    for bins, lo, hi in [(10, 0, 0), (7, -1, 1), (3, 0.5, 0.5)]:
        assert torch.equal(torch.histc(x.to(DEV), bins, lo, hi).cpu(), torch.histc(x, bins, lo, hi))


# ---- weight norm -------------------------------------------------------------------


def _grads(m):
    return [p.grad.cpu() if p.grad.device.type != "cpu" else p.grad for p in m.parameters()]


@pytest.mark.parametrize("kind", ["legacy", "parametrization"])
@pytest.mark.parametrize("dim", [0, 1, 2, -1, None])
def test_weight_norm_conv(kind, dim):
    torch.manual_seed(0)
    conv = nn.Conv1d(4, 6, 3)
    wn = nn.utils.weight_norm if kind == "legacy" else nn.utils.parametrizations.weight_norm
    cpu = wn(conv, dim=dim)
    tpu = wn(nn.Conv1d(4, 6, 3), dim=dim)
    tpu.load_state_dict(cpu.state_dict())
    tpu.to(DEV)
    x = torch.randn(2, 4, 9)
    y_cpu = cpu(x)
    with recorded_only():
        y_tpu = tpu(x.to(DEV))
    torch.testing.assert_close(y_tpu.cpu(), y_cpu)
    y_cpu.square().sum().backward()
    y_tpu.square().sum().backward()
    for a, b in zip(_grads(tpu), _grads(cpu)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_weight_norm_interface_ops(dim):
    v = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    g_shape = [1, 1, 1]
    g_shape[dim] = v.shape[dim]
    g = torch.rand(*g_shape, dtype=torch.float64, requires_grad=True)
    w = torch._weight_norm(v, g, dim if dim >= 0 else v.dim() + dim)
    vt = v.detach().to(DEV).requires_grad_()
    gt = g.detach().to(DEV).requires_grad_()
    with recorded_only():
        wt = torch._weight_norm(vt, gt, dim if dim >= 0 else v.dim() + dim)
    torch.testing.assert_close(wt.cpu(), w)
    go = torch.randn_like(w)
    w.backward(go)
    wt.backward(go.to(DEV))
    torch.testing.assert_close(vt.grad.cpu(), v.grad)
    torch.testing.assert_close(gt.grad.cpu(), g.grad)
    # the fused op itself (dim 0 or last), forward and backward
    d = 0 if dim == 0 else v.dim() - 1
    if dim in (0, -1):
        outs = torch._weight_norm_interface(v.detach(), g.detach(), d)
        outs_t = torch._weight_norm_interface(v.detach().to(DEV), g.detach().to(DEV), d)
        for a, b in zip(outs_t, outs):
            torch.testing.assert_close(a.cpu(), b)
        gb = torch.ops.aten._weight_norm_interface_backward(go, v.detach(), g.detach(), outs[1], d)
        gb_t = torch.ops.aten._weight_norm_interface_backward(
            go.to(DEV), v.detach().to(DEV), g.detach().to(DEV), outs_t[1], d
        )
        for a, b in zip(gb_t, gb):
            torch.testing.assert_close(a.cpu(), b)


# ---- MultiheadAttention / TransformerEncoderLayer fast paths ------------------------


def _pair(make):
    torch.manual_seed(0)
    cpu = make().eval()
    tpu = make().eval()
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to(DEV)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("mask", [None, "key_padding", "attn"])
def test_multihead_attention_fast_path(batch_first, need_weights, average, mask):
    cpu, tpu = _pair(lambda: nn.MultiheadAttention(16, 4, batch_first=batch_first))
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    kw = dict(need_weights=need_weights, average_attn_weights=average)
    if mask == "key_padding":
        kpm = torch.zeros(3, 5, dtype=torch.bool)
        kpm[1, 3:] = True
        kw_cpu, kw_tpu = dict(key_padding_mask=kpm), dict(key_padding_mask=kpm.to(DEV))
    elif mask == "attn":
        am = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
        kw_cpu, kw_tpu = dict(attn_mask=am), dict(attn_mask=am.to(DEV))
    else:
        kw_cpu, kw_tpu = {}, {}
    with torch.no_grad():
        out_cpu, w_cpu = cpu(x, x, x, **kw, **kw_cpu)
        xt = x.to(DEV)
        with recorded_only():
            out_tpu, w_tpu = tpu(xt, xt, xt, **kw, **kw_tpu)
    torch.testing.assert_close(out_tpu.cpu(), out_cpu)
    if w_cpu is None:
        assert w_tpu is None
    else:
        torch.testing.assert_close(w_tpu.cpu(), w_cpu)


def test_multihead_attention_takes_fast_path():
    # the fast path is what runs on "tpu" in eval + no_grad (as on CPU and CUDA)
    cpu, tpu = _pair(lambda: nn.MultiheadAttention(8, 2, batch_first=True))
    x = torch.randn(2, 3, 8, device=DEV)
    with torch.no_grad(), torch.profiler.profile() as prof:
        tpu(x, x, x)
    assert any(e.name == "aten::_native_multi_head_attention" for e in prof.events())


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("mask", [None, "key_padding", "causal"])
def test_transformer_encoder_layer_fast_path(batch_first, norm_first, activation, mask):
    cpu, tpu = _pair(
        lambda: nn.TransformerEncoderLayer(
            16, 4, 32, activation=activation, batch_first=batch_first, norm_first=norm_first
        )
    )
    x = torch.randn(3, 6, 16) if batch_first else torch.randn(6, 3, 16)
    kw_cpu, kw_tpu = {}, {}
    if mask == "key_padding":
        kpm = torch.zeros(3, 6, dtype=torch.bool)
        kpm[0, 4:] = True
        kw_cpu, kw_tpu = dict(src_key_padding_mask=kpm), dict(src_key_padding_mask=kpm.to(DEV))
    elif mask == "causal":
        m = nn.Transformer.generate_square_subsequent_mask(6)
        kw_cpu, kw_tpu = dict(src_mask=m, is_causal=True), dict(src_mask=m.to(DEV), is_causal=True)
    with torch.no_grad():
        with torch.profiler.profile() as prof_cpu:
            y_cpu = cpu(x, **kw_cpu)
        with recorded_only(), torch.profiler.profile() as prof:
            y_tpu = tpu(x.to(DEV), **kw_tpu)

    # "tpu" takes the fast path exactly when CPU does (batch_first, ...)
    def fast(p):
        return any(e.name == "aten::_transformer_encoder_layer_fwd" for e in p.events())

    assert fast(prof) == fast(prof_cpu)
    assert fast(prof) or not batch_first or mask == "causal"
    torch.testing.assert_close(y_tpu.cpu(), y_cpu)


def test_transformer_encoder_end_to_end():
    # nn.TransformerEncoder (a ViT-style stack) in eval + no_grad, as torchvision's vit_b_32 runs it
    def make():
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)

    cpu, tpu = _pair(make)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        y_cpu = cpu(x)
        with recorded_only():
            y_tpu = tpu(x.to(DEV))
    torch.testing.assert_close(y_tpu.cpu(), y_cpu)
    # and in training mode with autograd (the slow path, through scaled_dot_product_attention)
    cpu.train(), tpu.train()
    cpu(x).sum().backward()
    tpu(x.to(DEV)).sum().backward()
    for a, b in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


def test_weight_normed_conv_end_to_end():
    # wav2vec2/hubert's positional convolution: weight_norm over dim=2 of a grouped Conv1d
    def make():
        conv = nn.Conv1d(16, 16, 5, padding=2, groups=4)
        return nn.Sequential(nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2), nn.GELU())

    cpu, tpu = _pair(make)
    cpu.train(), tpu.train()
    x = torch.randn(2, 16, 20)
    y_cpu = cpu(x)
    y_tpu = tpu(x.to(DEV))
    torch.testing.assert_close(y_tpu.cpu(), y_cpu)
    y_cpu.pow(2).mean().backward()
    y_tpu.pow(2).mean().backward()
    for a, b in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


# ---- scaled dot product attention ------------------------------------------------------

OVERRIDEABLE = 4  # torch.nn.attention.SDPBackend.OVERRIDEABLE


def _sdpa_case(case):
    torch.manual_seed(1)
    B, H, L, S, E = 2, 4, 5, 7, 8
    kv_heads = 2 if case == "gqa" else H
    q = torch.randn(B, H, L, E, dtype=torch.float64)
    k = torch.randn(B, kv_heads, S, E, dtype=torch.float64)
    v = torch.randn(B, kv_heads, S, E, dtype=torch.float64)
    kw = {}
    if case == "causal":
        kw["is_causal"] = True
    elif case == "bool_mask":
        m = torch.rand(L, S) > 0.3
        m[:, 0] = True
        kw["attn_mask"] = m
    elif case == "float_mask":
        kw["attn_mask"] = torch.randn(B, 1, L, S, dtype=torch.float64)
    elif case == "scale":
        kw["scale"] = 0.3
    elif case == "gqa":
        kw["enable_gqa"] = True
    return q, k, v, kw


SDPA_CASES = ["plain", "causal", "bool_mask", "float_mask", "scale", "gqa"]
FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION


@pytest.mark.parametrize("overrideable", [False, True], ids=["default", "overrideable_only"])
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_forward_backward(case, overrideable):
    # By default the device makes CPU's choice (CPU's fused kernel, called by ATen's SDPA
    # directly, with CPU's autograd node); sdpa_kernel(OVERRIDEABLE) selects the device's
    # overrideable entry points, which record the same kernel. Values and gradients: CPU's.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, kw = _sdpa_case(case)
    kw_t = {n: (a.to(DEV) if isinstance(a, torch.Tensor) else a) for n, a in kw.items()}
    qt, kt, vt = (t.to(DEV).requires_grad_() for t in (q, k, v))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    choice_kw = {n: a for n, a in kw.items() if n in ("attn_mask", "is_causal", "scale", "enable_gqa")}
    choice_kw_t = {n: a for n, a in kw_t.items() if n in choice_kw}
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    switch = sdpa_kernel(SDPBackend.OVERRIDEABLE) if overrideable else contextlib.nullcontext()
    with switch, recorded_only(), torch.profiler.profile() as prof:
        choice = torch._fused_sdp_choice(qt, kt, vt, **choice_kw_t)
        out_t = F.scaled_dot_product_attention(qt, kt, vt, **kw_t)
        go = torch.randn_like(out)
        out_t.backward(go.to(DEV))
    names = {e.name for e in prof.events()}
    fused = "aten::_scaled_dot_product_fused_attention_overrideable"
    if overrideable:
        assert choice == OVERRIDEABLE
        assert {fused, fused + "_backward"} <= names
    else:
        assert choice == torch._fused_sdp_choice(q, k, v, **choice_kw) == FLASH
        assert out_t.grad_fn.name() == out.grad_fn.name() == "ScaledDotProductFlashAttentionForCpuBackward0"
        assert not {fused, fused + "_backward"} & names
        assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in names
    out.backward(go)
    torch.testing.assert_close(out_t.cpu(), out)
    for a, b in ((qt, q), (kt, k), (vt, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_dtypes_and_layouts(dtype):
    # (B, L, H, E) inputs transposed to (B, H, L, E), as attention layers hand them over
    q = torch.randn(2, 6, 3, 16).to(dtype).transpose(1, 2)
    k = torch.randn(2, 6, 3, 16).to(dtype).transpose(1, 2)
    v = torch.randn(2, 6, 3, 16).to(dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with recorded_only():
        out_t = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), is_causal=True)
    assert out_t.dtype == dtype and out_t.shape == out.shape
    torch.testing.assert_close(out_t.cpu(), out)


# An additive bias that needs a gradient stays on the fused path (as on CUDA's
# memory-efficient kernel): the device's backward gives it dS summed to its shape.
BIAS_CASES = {
    # name: (bias shape or None, bias kind, kv heads, extra kwargs)
    "full": ((2, 4, 5, 7), "float", 4, {}),
    "broadcast_2d": ((5, 7), "float", 4, {}),
    "broadcast_batch": ((1, 4, 5, 7), "float", 4, {}),
    "broadcast_heads": ((2, 1, 5, 7), "float", 4, {}),
    "masked_row": ((2, 1, 5, 7), "masked_row", 4, {}),
    "gqa": ((2, 4, 5, 7), "float", 2, {"enable_gqa": True}),
    "gqa_broadcast": ((5, 7), "float", 1, {"enable_gqa": True}),
    "scale": ((1, 4, 5, 7), "float", 4, {"scale": 0.3}),
}


def _bias_case(name, dtype):
    shape, kind, kv_heads, kw = BIAS_CASES[name]
    torch.manual_seed(3)
    B, H, L, S, E = 2, 4, 5, 7, 8
    q = torch.randn(B, H, L, E).to(dtype)
    k = torch.randn(B, kv_heads, S, E).to(dtype)
    v = torch.randn(B, kv_heads, S, E).to(dtype)
    bias = torch.randn(shape).to(dtype)
    if kind == "masked_row":  # a query row the bias hides entirely: output 0, gradients 0
        bias[:, :, 1] = float("-inf")
    return q, k, v, bias, kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", list(BIAS_CASES))
def test_sdpa_bias_gradient_matches_cpu(name, dtype):
    # A bias that needs a gradient takes the math path, as CPU's choice does, so its
    # gradient is CPU's (the fused backward's own bias gradient serves direct calls of
    # the op: test_sdpa_overrideable_op_bias_gradient_with_causal_and_gqa).
    q, k, v, bias, kw = _bias_case(name, dtype)
    cpu = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v, bias)]
    assert torch._fused_sdp_choice(*dev[:3], attn_mask=dev[3], **kw) != OVERRIDEABLE
    out = F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3], **kw)
    go = torch.randn_like(out)
    out.backward(go)
    out_t = F.scaled_dot_product_attention(*dev[:3], attn_mask=dev[3], **kw)
    out_t.backward(go.to(DEV))
    torch.testing.assert_close(out_t.cpu(), out)
    for a, b in zip(dev, cpu):
        assert a.grad.dtype == b.grad.dtype and a.grad.shape == b.grad.shape
        torch.testing.assert_close(a.grad.cpu(), b.grad)


def _attention_reference(q, k, v, bias, is_causal, scale):
    """softmax(scale * q k^T + bias (+ causal mask)) v in float64 on CPU (GQA by repeating heads)."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    rep = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5) + bias
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_overrideable_op_bias_gradient_with_causal_and_gqa(is_causal, kv_heads):
    # The op called directly (as torch_openreg's test_sdpa does): causal and a bias together,
    # which scaled_dot_product_attention does not allow; CPU has no kernel for this op, so
    # the reference is the attention formula under CPU autograd in float64.
    torch.manual_seed(4)
    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, kv_heads, 6, 8), torch.randn(2, kv_heads, 6, 8)
    bias = torch.randn(1, 4, 6, 6)
    cpu = [t.double().requires_grad_() for t in (q, k, v, bias)]
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v, bias)]
    ref = _attention_reference(*cpu, is_causal, None)
    go = torch.randn(ref.shape, dtype=torch.float64)
    ref.backward(go)
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*dev, is_causal=is_causal)[0]
    out.backward(go.float().to(DEV))
    torch.testing.assert_close(out.cpu(), ref.float())
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad.float())
    # the backward called directly with every gradient asked for
    res = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        *(t.detach() for t in dev), is_causal=is_causal
    )

    def backward(mask):
        return torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            go.float().to(DEV),
            *(t.detach() for t in dev),
            mask,
            *res[:6],
            dropout_p=0.0,
            is_causal=is_causal,
            philox_seed=res[6],
            philox_offset=res[7],
        )

    grads = backward([True, True, True, True])
    for g, b in zip(grads, cpu):
        torch.testing.assert_close(g.cpu(), b.grad.float())
    # a gradient not asked for is undefined
    grads = backward([True, False, True, False])
    assert grads[1] is None and grads[3] is None
    torch.testing.assert_close(grads[0].cpu(), cpu[0].grad.float())


def test_sdpa_overrideable_backward_refuses_dropout_and_stays_usable():
    q = torch.randn(1, 2, 4, 8, device=DEV)
    res = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q)
    with pytest.raises(NotImplementedError, match="dropout_p must be 0"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            q,
            q,
            q,
            q,
            None,
            [True, True, True, False],
            res[0],
            res[1],
            res[2],
            res[3],
            res[4],
            res[5],
            dropout_p=0.5,
            is_causal=False,
            philox_seed=res[6],
            philox_offset=res[7],
        )
    torch.testing.assert_close(res[0].cpu(), F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu()))


def test_sdpa_falls_back_to_math_as_cpu():
    # dropout, 3-D inputs, different head dims: CPU's math path
    q = torch.randn(2, 5, 8)
    assert torch._fused_sdp_choice(q.to(DEV), q.to(DEV), q.to(DEV)) == torch._fused_sdp_choice(q, q, q)
    q4 = torch.randn(1, 2, 5, 8, device=DEV)
    assert torch._fused_sdp_choice(q4, q4, q4, dropout_p=0.5) == 0
    v4 = torch.randn(1, 2, 5, 4, device=DEV)
    assert torch._fused_sdp_choice(q4, q4, v4) == 0
    out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(F.scaled_dot_product_attention(q.to(DEV), q.to(DEV), q.to(DEV)).cpu(), out)
    # a mask with a gradient (the fused path, see test_sdpa_bias_gradient_on_the_fused_path)
    m = torch.randn(5, 5, requires_grad=True)
    mt = m.detach().to(DEV).requires_grad_()
    q4c = q4.cpu()
    F.scaled_dot_product_attention(q4c, q4c, q4c, attn_mask=m).sum().backward()
    F.scaled_dot_product_attention(q4, q4, q4, attn_mask=mt).sum().backward()
    torch.testing.assert_close(mt.grad.cpu(), m.grad)


def test_sdpa_backend_switches():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 4, 8)
    qt = q.to(DEV)
    ref = F.scaled_dot_product_attention(q, q, q)
    with sdpa_kernel(SDPBackend.OVERRIDEABLE):
        assert torch._fused_sdp_choice(qt, qt, qt) == OVERRIDEABLE
        torch.testing.assert_close(F.scaled_dot_product_attention(qt, qt, qt).cpu(), ref)
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(qt, qt, qt) == 0
        torch.testing.assert_close(F.scaled_dot_product_attention(qt, qt, qt).cpu(), ref)
    with sdpa_kernel(SDPBackend.OVERRIDEABLE):
        # no fused kernel for dropout and math disabled: CPU's error
        with pytest.raises(RuntimeError, match="No viable backend"):
            F.scaled_dot_product_attention(qt, qt, qt, dropout_p=0.5)


# ---- sparse COO ------------------------------------------------------------------------
# Sparse tpu tensors hold tpu indices/values; their kernels run at the call on the host
# (CPU's sparse kernels), as data-dependent ops do.


def _sparse_pair(dtype=torch.float32):
    i = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    v = torch.tensor([3.0, 4.0, 5.0, -1.0]).to(dtype)
    return torch.sparse_coo_tensor(i, v, (2, 3)), torch.sparse_coo_tensor(i.to(DEV), v.to(DEV), (2, 3))


def _same_sparse(t, c):
    assert t.device.type == DEV and t.layout == torch.sparse_coo
    assert t.shape == c.shape and t.dtype == c.dtype and t._nnz() == c._nnz()
    assert t.is_coalesced() == c.is_coalesced()
    assert torch.equal(t._indices().cpu(), c._indices()) and torch.equal(t._values().cpu(), c._values())


def test_sparse_construction_and_metadata():
    c, t = _sparse_pair()
    _same_sparse(t, c)
    t2 = torch.sparse_coo_tensor(c._indices(), c._values(), (2, 3), device=DEV)
    _same_sparse(t2, c)
    assert (t.sparse_dim(), t.dense_dim()) == (c.sparse_dim(), c.dense_dim())
    assert t._indices().device.type == DEV
    # indices()/values() of a coalesced tensor alias its members, as on CPU
    tc = t.coalesce()
    tc.values().mul_(2)
    assert torch.equal(tc._values().cpu(), c.coalesce()._values() * 2)
    # round trips
    _same_sparse(c.to(DEV), c)
    back = t.cpu()
    assert back.device.type == "cpu" and torch.equal(back.to_dense(), c.to_dense())
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        torch.sparse_coo_tensor(
            torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0]), (3,), check_invariants=True, device=DEV
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_sparse_ops_match_cpu(dtype):
    c, t = _sparse_pair(dtype)
    _same_sparse(t.coalesce(), c.coalesce())
    assert torch.equal(t.to_dense().cpu(), c.to_dense())
    for f in (
        lambda s: s + s,
        lambda s: s * 3,
        lambda s: s * s,
        lambda s: s - s.coalesce(),
        lambda s: -s,
        lambda s: torch.sparse.sum(s, 1),
    ):
        _same_sparse(f(t), f(c))
    if dtype.is_floating_point:
        _same_sparse(t / 2, c / 2)
    dense = torch.arange(6).view(2, 3).to(dtype)
    assert torch.equal((dense.to(DEV) + t).cpu(), dense + c)
    # dense -> sparse
    d = torch.tensor([[0, 1, 0], [2, 0, 3]]).to(dtype)
    _same_sparse(d.to(DEV).to_sparse(), d.to_sparse())
    _same_sparse(d.to(DEV).to_sparse(1), d.to_sparse(1))


def test_sparse_in_place_and_matmul():
    c, t = _sparse_pair()
    t.mul_(2)
    c.mul_(2)
    _same_sparse(t, c)
    m = torch.randn(3, 4)
    torch.testing.assert_close(torch.sparse.mm(t, m.to(DEV)).cpu(), torch.sparse.mm(c, m))
    # the queue stays usable after sparse work
    x = torch.ones(3, device=DEV) * 2
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("coalesced", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_sparse_copies_match_cpu(coalesced, dtype):
    # clone and copy_ have composite kernels that would copy between layouts through
    # _copy_from (no sparse kernel); CPU's sparse kernels decide them, for every copy path.
    import copy

    c, t = _sparse_pair(dtype)
    if coalesced:
        c, t = c.coalesce(), t.coalesce()
    _same_sparse(t.clone(), c.clone())
    _same_sparse(copy.deepcopy(t), copy.deepcopy(c))
    for src_t, src_c in ((t, c), (c, c)):  # from a tpu and from a CPU sparse tensor
        dst_t, dst_c = torch.sparse_coo_tensor(size=(2, 3), device=DEV), torch.sparse_coo_tensor(size=(2, 3))
        _same_sparse(dst_t.copy_(src_t), dst_c.copy_(src_c))
    if dtype != torch.bool:
        _same_sparse(t.clone().add_(t), c.clone().add_(c))  # in-place on a copy leaves the source alone
        _same_sparse(t, c)
    # copying between dense and sparse raises CPU's error
    with pytest.raises(RuntimeError) as cpu_err:
        torch.zeros(2, 3, dtype=dtype).copy_(c)
    with pytest.raises(RuntimeError) as dev_err:
        torch.zeros(2, 3, dtype=dtype, device=DEV).copy_(t)
    assert str(dev_err.value) == str(cpu_err.value)


# ---- cov of complex64 with inf (issue 25) ----------------------------------------------


def test_cov_complex_with_inf_matches_cpu():
    import itertools

    x = torch.tensor([0, -2, float("nan"), 10.2, float("inf")], dtype=torch.cfloat)
    y = torch.tensor([[complex(float("inf"), 0), 1 + 2j, 3 - 1j], [2 + 0j, 1j, 4 + 4j]], dtype=torch.cfloat)
    for t in (x, y):
        n = t.numel() if t.dim() < 2 else t.size(1)
        fw = torch.arange(1, n + 1)
        aw = torch.linspace(1, 2, n)
        for corr, f, a in itertools.product([0, 1, 2, n], [None, fw], [None, aw]):
            ref = torch.cov(t, correction=corr, fweights=f, aweights=a)
            got = torch.cov(
                t.to(DEV),
                correction=corr,
                fweights=None if f is None else f.to(DEV),
                aweights=None if a is None else a.to(DEV),
            ).cpu()
            torch.testing.assert_close(torch.view_as_real(got), torch.view_as_real(ref), equal_nan=True)
    # complex division by zero, element by element as CPU
    a = torch.tensor([complex(float("inf"), 0), complex(float("inf"), 1), 1 - 1j] * 7, dtype=torch.cfloat)
    torch.testing.assert_close(
        torch.view_as_real((a.to(DEV) / torch.tensor(0.0, device=DEV)).cpu()),
        torch.view_as_real(a / torch.tensor(0.0)),
        equal_nan=True,
    )


# ---- quantized tensors -----------------------------------------------------------------
# quantize_per_tensor/per_channel of a tpu tensor give a quantized tpu tensor (QTensorImpl
# over device memory); views share its storage, other quantized ops run at the call on the host.


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantize_per_tensor(dtype):
    x = torch.randn(4, 6) * 3
    q = torch.quantize_per_tensor(x, 0.05, 2 if dtype != torch.qint32 else 0, dtype)
    qt = torch.quantize_per_tensor(x.to(DEV), 0.05, 2 if dtype != torch.qint32 else 0, dtype)
    assert qt.device.type == DEV and qt.dtype == dtype and qt.is_quantized
    assert (qt.q_scale(), qt.q_zero_point()) == (q.q_scale(), q.q_zero_point())
    assert torch.equal(qt.int_repr().cpu(), q.int_repr())
    assert torch.equal(qt.dequantize().cpu(), q.dequantize())
    for f in (
        torch.flatten,
        torch.ravel,
        lambda t: t.t(),
        lambda t: t[1:, ::2],
        lambda t: t.reshape(3, 8),
        lambda t: t.view(2, 12),
    ):
        v, vt = f(q), f(qt)
        assert vt.shape == v.shape and vt.stride() == v.stride()
        assert torch.equal(vt.int_repr().cpu(), v.int_repr())
    assert torch.equal(qt.flatten().dequantize().cpu(), q.flatten().dequantize())
    back = qt.cpu()
    assert back.device.type == "cpu" and torch.equal(back.int_repr(), q.int_repr())
    assert torch.equal(q.to(DEV).int_repr().cpu(), q.int_repr())
    assert "quantization_scheme=torch.per_tensor_affine" in repr(qt) and "device='tpu:0'" in repr(qt)
    # tensor qparams
    qt2 = torch.quantize_per_tensor(x.to(DEV), torch.tensor(0.05, device=DEV), torch.tensor(1, device=DEV), dtype)
    assert torch.equal(
        qt2.int_repr().cpu(), torch.quantize_per_tensor(x, torch.tensor(0.05), torch.tensor(1), dtype).int_repr()
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantize_per_channel():
    x = torch.randn(3, 5)
    s, z = torch.tensor([0.1, 0.2, 0.05]), torch.tensor([0, 1, -2])
    q = torch.quantize_per_channel(x, s, z, 0, torch.qint8)
    qt = torch.quantize_per_channel(x.to(DEV), s.to(DEV), z.to(DEV), 0, torch.qint8)
    assert torch.equal(qt.int_repr().cpu(), q.int_repr())
    assert torch.equal(qt.dequantize().cpu(), q.dequantize())
    assert torch.equal(qt.q_per_channel_scales().cpu(), q.q_per_channel_scales())


# resize_ of a quantized tensor: CPU's quantize_per_tensor gives a resizable storage and
# its quantized resize_ grows it; on "tpu" it raised "Trying to resize storage that is not
# resizable" (found by PyTorch's test_torch.py test_nondeterministic_resize_quantized).
@pytest.mark.parametrize("size", [(10,), (3,), (2, 2)])
@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantized_resize(dtype, size):
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.0])
    q = torch.quantize_per_tensor(x, 0.1, 10 if dtype != torch.qint32 else 0, dtype)
    qt = torch.quantize_per_tensor(x.to(DEV), 0.1, 10 if dtype != torch.qint32 else 0, dtype)
    assert qt.untyped_storage().resizable() == q.untyped_storage().resizable()
    q.resize_(size)
    qt.resize_(size)
    assert qt.shape == q.shape and qt.stride() == q.stride() and qt.device.type == DEV
    kept = min(5, q.numel())  # the elements resize_ keeps (the rest are uninitialized)
    assert torch.equal(qt.int_repr().cpu().flatten()[:kept], q.int_repr().flatten()[:kept])
    assert (qt.q_scale(), qt.q_zero_point()) == (q.q_scale(), q.q_zero_point())


def test_quantized_resize_deterministic_alert():
    """Under torch.use_deterministic_algorithms(True) CPU raises its alert at the call."""
    outcomes = []
    for d in ("cpu", DEV):
        qt = torch.quantize_per_tensor(torch.tensor([-1.0, 0.0, 1.0], device=d), 0.1, 10, torch.quint8)
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with pytest.raises(RuntimeError) as info:
                qt.resize_((10,))
        finally:
            torch.use_deterministic_algorithms(before)
        outcomes.append(str(info.value))
    assert "quantized_resize_cpu_ does not have a deterministic implementation" in outcomes[0]
    assert outcomes[1] == outcomes[0]


# Ops with a QuantizedCPU kernel and a composite kernel: the composite kernel used
# to shadow the quantized fallback and fail (clone of a transposed quantized tensor
# -> "cannot call qscheme on UnknownQuantizer", so .contiguous(), .reshape(),
# .ravel() failed). Values, dtype, qparams and strides compared with CPU.
_Q_OPS = {
    "clone_t": lambda q: q.transpose(-1, -2).clone(),
    "contiguous_t": lambda q: q.transpose(-1, -2).contiguous(),
    "ravel_t": lambda q: q.transpose(-1, -2).ravel(),
    "reshape_t": lambda q: q.transpose(1, 2).reshape(2, -1),
    "channels_last": lambda q: q.contiguous(memory_format=torch.channels_last),
    "clamp": lambda q: q.clamp(-0.5, 0.5),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "hardsigmoid": F.hardsigmoid,
    "leaky_relu": F.leaky_relu,
    "gelu": F.gelu,
    "threshold": lambda q: F.threshold(q, 0.1, 0.0),
    "topk": lambda q: q.flatten().topk(3)[0],
    "sort_stable": lambda q: q.flatten().sort(stable=True)[0],
    "mean_dim": lambda q: q.mean(1),
    "max_dim": lambda q: q.max(1)[0],
    "min_dim": lambda q: q.min(1)[0],
    "cat": lambda q: torch.cat([q, q]),
    "gt_scalar": lambda q: q.gt(0.3),
    "upsample_nearest": lambda q: F.interpolate(q, scale_factor=2),
    "upsample_bilinear": lambda q: F.interpolate(q, scale_factor=2, mode="bilinear"),
    "avg_pool2d": lambda q: F.avg_pool2d(q, 2),
    "index": lambda q: q[torch.tensor([1, 0])],
    "empty_like_shape": lambda q: torch.empty_like(q)[:0],
    "squeeze_view": lambda q: q[:1].squeeze(0),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(_Q_OPS))
def test_quantized_ops_with_composite_kernels(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    q = torch.quantize_per_tensor(x, 0.1, 3, torch.quint8)
    qt = torch.quantize_per_tensor(x.to(DEV), 0.1, 3, torch.quint8)
    ref, got = _Q_OPS[name](q), _Q_OPS[name](qt)
    assert got.device.type == DEV and got.dtype == ref.dtype and got.shape == ref.shape
    assert got.stride() == ref.stride() and got.is_quantized == ref.is_quantized
    got = got.cpu()
    if ref.is_quantized:
        assert (got.q_scale(), got.q_zero_point()) == (ref.q_scale(), ref.q_zero_point())
        ref, got = ref.int_repr(), got.int_repr()
    assert torch.equal(got, ref)


# ---- slice_backward (issue 18: the rotary embedding's backward) -------------------------


def _same_tensor(got, ref):
    """Device result `got` has CPU's dtype, sizes, strides and bits."""
    assert got.device.type == DEV
    assert (got.dtype, got.shape, got.stride()) == (ref.dtype, ref.shape, ref.stride())
    got = got.cpu()
    if ref.is_floating_point():  # bits: +0.0 zeros, not -0.0
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    else:
        assert torch.equal(got, ref)


# (input sizes, dim, start, end, step): cat path (step 1, a strict sub-slice) and
# ATen's decomposition (the whole dim, another step, an empty input).
_SLICE_CASES = [
    ((2, 3, 16), -1, 0, 8, 1),
    ((2, 3, 16), -1, 8, 16, 1),
    ((2, 3, 16), 2, 3, 11, 1),
    ((2, 3, 16), 1, 1, 2, 1),
    ((5, 4), 0, -3, -1, 1),  # negative bounds
    ((5, 4), 0, 2, 100, 1),  # end clamped to the size
    ((5, 4), 0, -100, 2, 1),  # start clamped to 0
    ((5, 4), 1, 0, 4, 1),  # the whole dim
    ((6, 4), 0, 1, 6, 2),  # step 2
    ((0, 4), 1, 1, 3, 1),  # empty
]


@pytest.mark.parametrize("case", _SLICE_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_slice_backward_matches_cpu(case, dtype):
    sizes, dim, start, end, step = case
    x = torch.empty(sizes)
    slice_shape = x[(slice(None),) * (dim % len(sizes)) + (slice(start, end, step),)].shape
    grad = (torch.randn(slice_shape, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    with recorded_only():
        got = torch.ops.aten.slice_backward(grad.to(DEV), sizes, dim, start, end, step)
    _same_tensor(got, torch.ops.aten.slice_backward(grad, sizes, dim, start, end, step))


def test_slice_backward_strided_and_negative_zero_grad():
    # A transposed gradient holding -0.0, nan and inf: its bits are copied, the rest is +0.0.
    g = torch.tensor([[-0.0, float("nan")], [float("inf"), 1.5], [2.0, -3.0]]).t()  # (2, 3), strided
    with recorded_only():
        got = torch.ops.aten.slice_backward(g.to(DEV), [2, 7], 1, 2, 5, 1)
    _same_tensor(got, torch.ops.aten.slice_backward(g, [2, 7], 1, 2, 5, 1))


def test_slice_backward_broadcast_grad_and_errors_match_cpu():
    # copy_ broadcasts a gradient of size 1 along a dim, as on CPU.
    g = torch.tensor([[1.0], [2.0]])
    _same_tensor(
        torch.ops.aten.slice_backward(g.to(DEV), [2, 6], 1, 1, 4, 1),
        torch.ops.aten.slice_backward(g, [2, 6], 1, 1, 4, 1),
    )
    for args in ([[2, 6], 1, 1, 4, 0], [[2, 6], 1, 0, 6, 1], [[2, 6], 3, 0, 2, 1]):  # step 0, bad shape, bad dim
        with pytest.raises(Exception) as ref:
            torch.ops.aten.slice_backward(torch.ones(2, 3), *args)
        with pytest.raises(type(ref.value)):
            torch.ops.aten.slice_backward(torch.ones(2, 3, device=DEV), *args)
            torch.tpu.synchronize()


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_rotary_backward_fuses_and_matches_cpu():
    """The rotary embedding's backward (slice_backward of both halves, summed with
    the product's gradient) runs in fused loops, with CPU's gradient bits."""
    import torch_tpu_eager

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    cos, sin = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    up = torch.randn(2, 4, 16, 16, generator=gen)

    def grad_of(device):
        x = q.to(device, copy=True).requires_grad_()
        ((x * cos.to(device) + _rotate_half(x) * sin.to(device)) * up.to(device)).sum().backward()
        return x.grad

    ref = grad_of("cpu")
    grad_of(DEV)  # compiled once
    with torch_tpu_eager.profile() as prof:
        got = grad_of(DEV)
        torch.tpu.synchronize()
    _same_tensor(got, ref)
    ops = [op for k in prof.kernels for op in k["ops"]]
    assert "cat" in ops and "zero_" not in ops and "copy_" not in ops, ops


def test_slice_backward_double_backward_and_inference_mode_match_cpu():
    gen = torch.Generator().manual_seed(2)
    x0, w = torch.randn(3, 8, dtype=torch.float64, generator=gen), torch.randn(3, 4, dtype=torch.float64, generator=gen)

    def second(device):
        x = x0.to(device, copy=True).requires_grad_()
        (gx,) = torch.autograd.grad((x[:, 2:6] ** 3 * w.to(device)).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), x)
        return gx.detach(), ggx

    # The device's zero of a dtype may first be made under inference mode: later
    # calls outside it still work.
    with torch.inference_mode():
        in_mode = torch.ops.aten.slice_backward(w.to(DEV), [3, 8], 1, 2, 6, 1)
    _same_tensor(in_mode, torch.ops.aten.slice_backward(w, [3, 8], 1, 2, 6, 1))
    for got, ref in zip(second(DEV), second("cpu")):
        _same_tensor(got, ref)


@pytest.mark.parametrize("case", _SLICE_CASES[:4], ids=str)
def test_slice_backward_on_spyre_matches_cpu(spyre_target, case):
    sizes, dim, start, end, step = case
    x = torch.empty(sizes)
    slice_shape = x[(slice(None),) * (dim % len(sizes)) + (slice(start, end, step),)].shape
    grad = torch.randn(slice_shape, generator=torch.Generator().manual_seed(3))
    got = torch.ops.aten.slice_backward(grad.to(DEV), sizes, dim, start, end, step) * 2
    _same_tensor(got, torch.ops.aten.slice_backward(grad, sizes, dim, start, end, step) * 2)
