"""softmax over the last dim, rows of 16 to 4,096 floats: rows of up to
kSoftmaxExpRowFloats (1,536) keep their exp values in a row of their own and scale them
into the output, longer rows store them into the output and scale them there, rows of
up to kSoftmaxPrefetchRowFloats (2,048) prefetching the row after next meanwhile
(fused_kernels.inc, softmax_row). All must give CPU's float32 bits: each width is
compared bit for bit with CPU (NaN payloads too) on random rows and on rows of signed
zeros, infinities, NaN and huge values, for a device input (whose next row's max is
reduced inside the exp pass) and for a fused producer, on one and two threads."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn, run_avx2_child

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the fused row loops exist only on the tpu device")

# Below, at and past the 1,536 and 2,048 bounds; whole vectors of 16 and 8 floats, and partial ones.
WIDTHS = [16, 17, 31, 100, 255, 512, 1000, 1023, 1024, 1025, 1535, 1536, 1537, 1552, 2047, 2048, 2049, 4095, 4096]


def _rows(cols, seed):
    """12 rows: random ones (spread so that the sum's rounding depends on its order)
    between rows holding NaN, +-inf, an all -inf row, signed-zero maxima and huge values."""
    x = cpu_randn(12, cols, seed=seed) * 6
    x[1, cols // 2] = float("nan")
    x[3, 0] = float("inf")
    x[4, cols - 1] = float("-inf")
    x[5] = float("-inf")
    x[6] = -0.0
    x[7, ::2] = 0.0
    x[7, 1::2] = -0.0
    x[8, cols - 1] = 3e38
    x[9, 0] = -3e38
    x[10, cols // 3] = 1e-40
    return x


def _assert_bits_equal(got, expected, what):
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    bad = (got.view(torch.int32) != expected.view(torch.int32)).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} floats differ from CPU's, first at {bad[0].tolist()}"


def _other_orders(x):
    """softmax of x by two other orders of the same operations: the exp values divided
    by the sum (not multiplied by its inverse) and summed from the row's end."""
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True), e * (1 / e.flip(-1).cumsum(-1)[..., -1:])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cols", WIDTHS)
def test_softmax_rows_equal_cpu_bit_for_bit(cols, threads):
    x = _rows(cols, seed=cols)
    expected = F.softmax(x, dim=-1)
    # The comparison can fail: another order of the operations gives other bits on these rows.
    for other in _other_orders(x[[0, 2, 11]]):
        assert not torch.equal(other, expected[[0, 2, 11]])
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xd = x.to("tpu")
        _assert_bits_equal(F.softmax(xd, dim=-1).cpu(), expected, "device input")
        _assert_bits_equal(F.softmax(xd * 0.5, dim=-1).cpu(), F.softmax(x * 0.5, dim=-1), "fused producer")
    finally:
        torch.set_num_threads(previous)


def test_softmax_output_block_reused_with_other_values():
    # The device gives the second result the first one's freed block: every float of it
    # must come from this call's exp row, none from the block's earlier contents.
    first, second = cpu_randn(64, 1024, seed=1) * 6, cpu_randn(64, 1024, seed=2) * 6
    second[3, 1023] = float("nan")
    F.softmax(first.to("tpu"), dim=-1).cpu()
    _assert_bits_equal(F.softmax(second.to("tpu"), dim=-1).cpu(), F.softmax(second, dim=-1), "second call")


# At AVX2 a NaN row is NaN throughout: the sum's NaN, except in its last, partial vector of
# 8 floats, where each lane keeps its own exp value's NaN (read from the exp row, not from
# the output's earlier contents). A NaN input with its own payload in that vector makes
# those lanes' bits differ from the sum's, so the comparison of their bits can fail.
_AVX2_CHILD = r"""
import json, torch, torch_tpu_eager
import torch.nn.functional as F
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
res = {"capability": torch.backends.cpu.get_cpu_capability(), "bad": []}
for cols in [23, 1021, 1023, 1535, 2045]:
    x = torch.randn(4, cols, generator=g) * 6
    x.view(torch.int32)[1, cols - 1] = 0x7FC12345
    x[2, 0] = float("nan")
    F.softmax(torch.full((4, cols), 7.0).to("tpu"), -1).cpu()  # leaves finite values in the block
    expected, actual = F.softmax(x, -1), F.softmax(x.to("tpu"), -1).cpu()
    whole = cols - cols % 8
    tail_bits = expected.view(torch.int32)[1, whole:], actual.view(torch.int32)[1, whole:]
    if not torch.equal(actual.isnan(), expected.isnan()) or not torch.equal(actual.nan_to_num(), expected.nan_to_num()):
        res["bad"].append(f"{cols}: values")
    if len(set(tail_bits[0].tolist())) < 2 or not torch.equal(*tail_bits):
        res["bad"].append(f"{cols}: the partial vector's NaN bits")
print(json.dumps(res))
"""


def test_softmax_nan_rows_at_avx2_are_nan_throughout(tmp_path):
    assert run_avx2_child(_AVX2_CHILD, tmp_path)["bad"] == []
