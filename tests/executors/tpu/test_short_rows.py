"""Row ops over rows shorter than one vector (1-15 floats: below AVX-512's 16 lanes, and
1-7 below AVX2's 8), where the fused row loops reduce a row by scalar folds in place of
at::vec's reduce_all slow path (fused_kernels.inc, fold_max / fold_sum). Each result is
compared with CPU's bit for bit (the float32 bits; NaN in the same places), on random rows
and on rows of signed zeros, infinities, NaN and large values, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randint, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the fused row loops exist only on the tpu device")

COLS = list(range(1, 16))

# Rows whose max and sum depend on the fold's order and on at::vec::maximum's NaN and zero rules.
SPECIAL_ROWS = [
    [-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0],
    [0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0],
    [1.0, float("nan"), 2.0, -3.0, 0.5, 4.0, -1.0, 7.0, 0.25, -2.0, 3.0, 1.5, -0.5, 2.5, 9.0],
    [float("-inf"), 1.0, float("inf"), 2.0, -1.0, 0.0, 3.0, -2.0, 4.0, 5.0, -3.0, 6.0, 7.0, -4.0, 8.0],
    [float("-inf")] * 15,
    [3e38, -3e38, 1e38, 2e38, 88.0, -88.0, 104.0, -104.0, 1e-45, -1e-45, 0.0, 1.0, -1.0, 2.0, 80.0],
    [1e-3, 1.0, 1e3, 1e-7, 1e7, 16.0, 1e-30, 0.1, 0.2, 0.3, 1e30, 5.0, 6.0, 7.0, 8.0],
]


def _rows(cols, seed):
    """Random rows (scaled to spread the values) then the special rows cut to ``cols``."""
    random = cpu_randn(40, cols, seed=seed) * 6
    special = torch.tensor([row[:cols] for row in SPECIAL_ROWS])
    return torch.cat([random, special])


def _assert_bits_equal(got, expected, what):
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaN in other places than CPU's"
    assert torch.equal(got.view(torch.int32)[~nan], expected.view(torch.int32)[~nan]), f"{what}: differs from CPU"


ROW_OPS = {
    "softmax": lambda h: F.softmax(h, dim=-1),
    "log_softmax": lambda h: F.log_softmax(h, dim=-1),
    "logsumexp": lambda h: torch.logsumexp(h, dim=-1),
}


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("op", list(ROW_OPS))
def test_short_row_ops_equal_cpu_bit_for_bit(op, cols):
    x, r = _rows(cols, seed=cols), cpu_randn(47, cols, seed=100 + cols)
    fn = ROW_OPS[op]
    xt, rt = x.to("tpu"), r.to("tpu")
    _assert_bits_equal(fn(xt + rt * 0.5).cpu(), fn(x + r * 0.5), f"{op} of a fused producer")
    _assert_bits_equal(fn(xt).cpu(), fn(x), f"{op} of an input")


@pytest.mark.parametrize("cols", COLS)
def test_short_row_cross_entropy_and_its_backward_equal_cpu(cols):
    # The digits MLP's loss shape class: 64 rows of 10 logits is one of these.
    x = cpu_randn(64, cols, seed=200 + cols) * 3
    y = cpu_randint(0, cols, (64,), seed=300 + cols)
    xc = x.clone().requires_grad_()
    loss_c = F.cross_entropy(xc, y)
    loss_c.backward()
    xt = x.to("tpu").requires_grad_()
    loss_t = F.cross_entropy(xt, y.to("tpu"))
    loss_t.backward()
    _assert_bits_equal(loss_t.detach().cpu(), loss_c.detach(), "loss")
    _assert_bits_equal(xt.grad.cpu(), xc.grad, "grad")


@pytest.mark.parametrize("cols", COLS)
def test_short_row_layer_norm_backward_equals_cpu(cols):
    x, w, b = cpu_randn(33, cols, seed=400 + cols), cpu_randn(cols, seed=500), cpu_randn(cols, seed=501)
    g = cpu_randn(33, cols, seed=600 + cols)
    leaves_c = [t.clone().requires_grad_() for t in (x, w, b)]
    F.layer_norm(leaves_c[0], (cols,), leaves_c[1], leaves_c[2]).backward(g)
    leaves_t = [t.to("tpu").requires_grad_() for t in (x, w, b)]
    F.layer_norm(leaves_t[0], (cols,), leaves_t[1], leaves_t[2]).backward(g.to("tpu"))
    for name, lt, lc in zip(("x", "weight", "bias"), leaves_t, leaves_c):
        _assert_bits_equal(lt.grad.cpu(), lc.grad, f"grad of {name}")
