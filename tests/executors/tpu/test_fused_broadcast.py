"""Fused loops with broadcast operands and bool masks (executors/tpu): an operand
broadcast along leading dims (a bias [N] over [M, N], positions [T, C] over [B, T, C],
an attention mask [1, 1, T, T] over [B, H, T, T]) is read modulo its size, and
masked_fill with a Scalar value is a select in the loop. An op of another shape whose
value the loop reads (the mask's `== 0`) is a loop of its own in the same region
(partition orders it first and stores its value), so the scores' scale, masked_fill
and softmax still run as one row loop. Values equal CPU's bit for
bit; the flush's ATen calls show what was fused."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, aten_ops_during, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")

if DEVICE == "tpu":
    import torch_tpu_eager


def _flush_ops(fn, *cpu_args):
    """(result on "tpu", the ATen ops its flush ran on the host)."""
    args = [a.to("tpu") for a in cpu_args]
    torch.tpu.synchronize()
    out = fn(*args)
    return out, aten_ops_during(torch.tpu.synchronize)


def _assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def _scores(b, h, t, seed=0):
    return cpu_randn(b, h, t, t, seed=seed)


def _causal(t):
    return (torch.tril(torch.ones(t, t)) == 0).view(1, 1, t, t)


# T = 32: a period (1,024) equal to the tile; 45: one longer than the tile (2,025);
# 7: many periods per tile; 100 x 8 x 64: large enough for both threads.
@pytest.mark.parametrize("b,h,t", [(2, 4, 32), (3, 2, 45), (5, 3, 7), (8, 8, 64)])
def test_scale_masked_fill_softmax_is_one_loop(b, h, t):
    def attention(s, m):
        return (s * 0.125).masked_fill(m, float("-inf")).softmax(-1)

    s, m = _scores(b, h, t), _causal(t)
    out, ops = _flush_ops(attention, s, m)
    assert ops == [], ops  # scale, select and softmax rows in the fused loop
    _assert_same(out, attention(s, m))


def test_mask_made_in_the_same_flush_runs_first():
    t = 32
    tril = torch.tril(torch.ones(t, t)).view(1, 1, t, t)

    def attention(s, tr):
        return (s * 0.25).masked_fill(tr[:, :, :t, :t] == 0, float("-inf")).softmax(-1)

    s = _scores(2, 4, t, seed=1)
    before = torch_tpu_eager.metrics()["regions_run"]
    out, ops = _flush_ops(attention, s, tril)
    # One region of two loops: the mask's, then the scores' row loop reading it.
    assert ops == [], ops
    assert torch_tpu_eager.metrics()["regions_run"] - before == 1
    _assert_same(out, attention(s, tril))


def test_attention_backward_matches_cpu():
    t = 16
    m = _causal(t)

    def grads(dev):
        s = _scores(2, 3, t, seed=2).to(dev).requires_grad_()
        v = cpu_randn(2, 3, t, 8, seed=3).to(dev)
        att = (s * 0.5).masked_fill(m.to(dev), float("-inf")).softmax(-1)
        (att @ v).square().sum().backward()
        return s.grad

    _assert_same(grads("tpu"), grads("cpu"))


@pytest.mark.parametrize("form", ["functional", "in_place"])
def test_masked_fill_specials_and_program_order(form):
    x = cpu_randn(6, 10, seed=4)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    mask = cpu_randn(10, seed=5) > 0

    def prog(x, mask):
        y = x * 2.0
        if form == "in_place":
            y.masked_fill_(mask, float("nan"))
        else:
            y = y.masked_fill(mask, 3.5)
        return (y + 1.0).abs()

    out, ops = _flush_ops(prog, x, mask)
    assert ops == [], ops
    _assert_same(out, prog(x, mask))


@pytest.mark.parametrize("name", ["bias_last", "bias_first", "positions", "sub_div"])
def test_broadcast_float_operands(name):
    x = cpu_randn(40, 6, 33, seed=6)  # ten tiles; periods 33 and 198 straddle them
    bias = cpu_randn(33, seed=7)
    pos = cpu_randn(6, 33, seed=8)
    progs = {
        "bias_last": lambda x, b, p: (x + b) * 0.5,
        "bias_first": lambda x, b, p: (b * x).abs() + 1.0,
        "positions": lambda x, b, p: (x + p).relu() * 2.0,
        "sub_div": lambda x, b, p: ((x - p) / b.abs().add(1.0)).neg(),
    }
    out, ops = _flush_ops(progs[name], x, bias, pos)
    _assert_same(out, progs[name](x, bias, pos))
    if name != "sub_div":  # b.abs().add(1.0) is a loop over [33] of its own
        assert ops == [], ops


def test_broadcast_that_is_not_along_leading_dims_runs_op_by_op():
    # A mask [B, 1, T] over [B, H, T] repeats in the middle: not read modulo its size.
    x = cpu_randn(3, 4, 5, seed=9)
    mask = cpu_randn(3, 1, 5, seed=10) > 0
    prog = lambda x, m: (x * 3.0).masked_fill(m, -1.0).exp()  # noqa: E731
    out, ops = _flush_ops(prog, x, mask)
    assert "aten::masked_fill" in ops or "aten::masked_fill_" in ops, ops
    _assert_same(out, prog(x, mask))


def test_strided_mask_runs_op_by_op():
    t = 12
    tril = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
    prog = lambda s, tr: (s + 1.0).masked_fill(tr[:, :, :t, :t] == 0, 0.0).softmax(-1)  # noqa: E731
    s = _scores(2, 2, t, seed=11)
    out, _ = _flush_ops(prog, s, tril)
    _assert_same(out, prog(s, tril))


def test_value_that_overflows_float_raises_as_cpu_and_queue_stays_valid():
    x, mask = cpu_randn(8, seed=12), cpu_randn(8, seed=13) > 0
    with pytest.raises(RuntimeError) as cpu_err:
        (x * 2.0).masked_fill(mask, 1e300)
    d, dm = x.to("tpu"), mask.to("tpu")
    keep = d - 1.0
    with pytest.raises(type(cpu_err.value)):
        (d * 2.0).masked_fill(dm, 1e300).cpu()
    assert torch.equal(keep.cpu(), x - 1.0)


def test_char_lm_attention_block_matches_cpu():
    # The example's attention with dropout 0, forward and backward, as it trains.
    torch.manual_seed(0)
    b, t, c, heads = 4, 16, 32, 4
    qkv = torch.nn.Linear(c, 3 * c)
    x = cpu_randn(b, t, c, seed=14)
    tril = torch.tril(torch.ones(t, t)).view(1, 1, t, t)

    def run(dev):
        lin = torch.nn.Linear(c, 3 * c).to(dev)
        lin.load_state_dict(qkv.state_dict())
        xx = x.to(dev).requires_grad_()
        q, k, v = lin(xx).split(c, dim=2)
        q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // heads) ** 0.5)
        att = F.softmax(att.masked_fill(tril.to(dev)[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        y.sum().backward()
        return y, xx.grad

    (y_t, g_t), (y_c, g_c) = run("tpu"), run("cpu")
    _assert_same(y_t, y_c)
    _assert_same(g_t, g_c)


def test_failing_hoisted_op_loses_nothing_else():
    # An integer division by a divisor computed on the device (z * 1) depends on
    # values the host does not hold yet, so "tpu" records it and CPU's kernel raises
    # at the flush (CPU raises at the call: values are at hand there). Here it makes
    # the mask, so it and the mask's `== 0` are hoisted ahead of the scale /
    # masked_fill / softmax loop. Its error surfaces where the mask is used; the
    # scaled scores, which do not depend on it, keep CPU's values.
    s = _scores(2, 2, 8, seed=15)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.zeros(1, 1, 8, 8, dtype=torch.int64) // torch.zeros(1, 1, 8, 8, dtype=torch.int64)
    d = s.to("tpu")
    m = torch.zeros(1, 1, 8, 8, dtype=torch.int64, device="tpu")
    z = torch.zeros(1, 1, 8, 8, dtype=torch.int64, device="tpu")
    torch.tpu.synchronize()
    scaled = d * 0.5
    out = scaled.masked_fill(m // (z * 1) == 0, float("-inf")).softmax(-1)
    with pytest.raises(type(cpu_err.value), match="ZeroDivisionError"):
        out.cpu()
    _assert_same(scaled, s * 0.5)
    _assert_same((scaled + 1.0), s * 0.5 + 1.0)  # the queue stays usable
