"""Fused loops reading float32 views through their strides (fused::StridedRead,
csrc/executors/tpu/fused_elementwise.cpp strided_read; staged per tile in
fused_kernels.inc stage_strided): column halves of a row (rotary embedding's
``x[..., D/2:]``), a transposed tensor of attention heads, a broadcast along a
middle dim (``cos[:, None]`` over the heads), a narrowed or stepped view. The loop
then runs without the ops' CPU kernels (asserted on the flush's host ops), and the
values are CPU's bit for bit (each op is one IEEE operation per element)."""

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, cpu_randn, flush_on_tpu

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

ELEMENTWISE = ("aten::add", "aten::mul", "aten::neg", "aten::sub")


def _fused(ops):
    """Whether no elementwise op of the cases ran through its CPU kernel."""
    return not [o for o in ops if o.startswith(ELEMENTWISE)]


def _rotate_sum(g):
    # Column halves of each row: both read in place, through strides.
    h = g.shape[-1] // 2
    return (g[..., h:] * 2 + g[..., :h],)


def _heads_broadcast(g, c):
    # cos of [B, T, D] read as [B, 1, T, D] by a loop over [B, H, T, D].
    return (g * c.unsqueeze(1) + g,)


def _transposed(g, x):
    # x of [B, T, H, D] read as [B, H, T, D] (attention heads); g sets the layout.
    return ((g + x.transpose(1, 2)) * 2,)


def _narrowed(x):
    return (x[1:] * 3 + 1,)


def _stepped(x):
    return (x[..., ::2] * 2 - x[..., 1::2],)


def _expanded(x, v):
    # v of [C] expanded to [R, C] (stride 0 first) beside a dense operand.
    return (x * v.expand(x.shape[0], -1) + v.expand(x.shape[0], -1),)


CASES = {
    "column_halves": (_rotate_sum, lambda: [cpu_randn(2, 4, 16, 16, seed=1)]),
    "column_halves_odd_rows": (_rotate_sum, lambda: [cpu_randn(3, 7, 37, 42, seed=2)]),
    "heads_broadcast": (_heads_broadcast, lambda: [cpu_randn(2, 4, 16, 16, seed=3), cpu_randn(2, 16, 16, seed=4)]),
    "transposed": (_transposed, lambda: [cpu_randn(2, 4, 16, 16, seed=5), cpu_randn(2, 16, 4, 16, seed=6)]),
    # More than one tile (1,024 floats) per row block: the index carry across dims.
    "transposed_many_tiles": (_transposed, lambda: [cpu_randn(3, 5, 67, 33, seed=7), cpu_randn(3, 67, 5, 33, seed=8)]),
    "narrowed": (_narrowed, lambda: [cpu_randn(5, 300, seed=9)]),
    "stepped": (_stepped, lambda: [cpu_randn(6, 9, 50, seed=10)]),
    "expanded": (_expanded, lambda: [cpu_randn(40, 70, seed=11), cpu_randn(70, seed=12)]),
}


@pytest.mark.parametrize("case", CASES)
def test_strided_reads_fuse_and_are_bit_equal(case):
    fn, make = CASES[case]
    args = make()
    got, ops = flush_on_tpu(fn, *args)
    assert_bit_equal(got, fn(*args))
    assert _fused(ops), ops


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_16_bit_views_equal_cpu(case, dtype):
    # Strided reads are float32 only: a 16-bit view at an offset or with
    # strides must not be read as float32 elements (torch.gradient's edge
    # differences x[1:2] - x[0:1] in float16 did before the fix).
    fn, make = CASES[case]
    args = [a.to(dtype) for a in make()]
    got, _ = flush_on_tpu(fn, *args)
    assert_bit_equal(got, fn(*args))


def test_gradient_of_16_bit_values_equals_cpu():
    for dtype in (torch.float16, torch.bfloat16):
        x = cpu_randn(5, seed=13).to(dtype)
        got = [g.cpu() for g in torch.gradient(x.to(DEVICE))]
        assert_bit_equal(got, list(torch.gradient(x)))


def test_strided_read_of_a_value_the_loop_writes_is_not_fused_wrongly():
    # x is written in place, then read transposed: the loop must not read a
    # stale or half-written buffer through the strided view (it runs op by op).
    def fn(x, y):
        x.mul_(2)
        return (x.t() * y + 1, x)

    x, y = cpu_randn(33, 33, seed=13), cpu_randn(33, 33, seed=14)
    got, _ = flush_on_tpu(fn, x, y)
    assert_bit_equal(got, fn(x.clone(), y))


def test_strided_read_feeds_a_row_reduction():
    # softmax over rows of (g + x^T): the staged strided operand feeds the row loop.
    def fn(g, x):
        return (torch.softmax((g + x.transpose(1, 2)) * 0.5, -1),)

    g, x = cpu_randn(2, 4, 16, 16, seed=15), cpu_randn(2, 16, 4, 16, seed=16)
    got, _ = flush_on_tpu(fn, g, x)
    assert_bit_equal(got, fn(g, x))


def test_rotary_embedding_values_equal_cpu():
    # transformers' apply_rotary_pos_emb (q * cos + rotate_half(q) * sin), forward
    # and backward, on attention heads of a linear layer's output.
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def step(qp, cos, sin, g, device):
        qp = qp.to(device).requires_grad_()
        q = qp.view(2, 16, 4, 16).transpose(1, 2)
        c, s = cos.to(device).unsqueeze(1), sin.to(device).unsqueeze(1)
        out = q * c + rotate_half(q) * s
        out.backward(g.to(device))
        return out.cpu(), qp.grad.cpu()

    qp, cos, sin = cpu_randn(32, 64, seed=17), cpu_randn(2, 16, 16, seed=18), cpu_randn(2, 16, 16, seed=19)
    g = cpu_randn(2, 4, 16, 16, seed=20)
    assert_bit_equal(step(qp, cos, sin, g, "tpu"), step(qp, cos, sin, g, "cpu"))
