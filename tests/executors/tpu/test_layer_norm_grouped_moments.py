"""layer_norm rows of whole vectors take their moments four rows at a time, the rows'
Welford chains side by side (csrc/executors/tpu/layer_norm_row.inc, when the loop gives
it blocks of four rows or more). That may not change a value: out, mean and rstd equal
CPU's torch.native_layer_norm bit for bit (NaN where CPU has NaN) for rows of 1 to 272
chunks of 16 vectors, with a partial last chunk, row counts that leave a block of fewer
than four rows, at 1 and 2 threads, with plain and non-temporal stores, with the input
read from its buffer or computed by a producer, and with an input whose rows start off
the vector alignment."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused row loops exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

# Whole AVX-512 vectors (16 floats): one partial chunk (64), 1 chunk (256), 2 (512), 3,
# 4, 4 and a partial chunk of 3 vectors (1072), 5, 17 (a cascade deeper than 4 levels),
# 272 chunks; 1000 is whole AVX2 vectors only (8 chunks there).
COLS = [64, 256, 512, 768, 1024, 1072, 1280, 4352, 69632, 1000]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]
AFFINE_IDS = ["weight+bias", "weight", "bias", "neither"]


@pytest.fixture(params=[(1, -1), (2, -1), (1, 0), (2, 0)], ids=["1thread", "2threads", "1thread-nt", "2threads-nt"])
def setting(request):
    """Thread count and stream-store threshold (-1: the default, 0: every loop streams)."""
    threads, threshold = request.param
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch_tpu_eager._C._set_stream_store_threshold(threshold)
    yield
    torch_tpu_eager._C._set_stream_store_threshold(-1)
    torch.set_num_threads(saved)


def _rows(cols):
    # 70 rows (a last block of 2), or fewer long ones (input and output below the 8 MB up to
    # which long rows are taken four at a time); 2 threads split them.
    return max(7, min(70, (1 << 19) // cols))


def _assert_equal(got, expected):
    for name, g, e in zip(("out", "mean", "rstd"), got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0, equal_nan=True, msg=f"{name} differs from CPU")


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
def test_rows_equal_cpu(setting, cols, affine):
    rows = _rows(cols)
    x, r = cpu_randn(rows, cols, seed=71) * 4 + 3, cpu_randn(rows, cols, seed=72)
    x[1] = x[1] * 1e-3 + 1e4  # a large mean over a small spread: Welford's order shows
    x[2, cols // 3] = float("inf")
    w = cpu_randn(cols, seed=73) if affine[0] else None
    b = cpu_randn(cols, seed=74) if affine[1] else None
    dev = [None if t is None else t.to("tpu") for t in (w, b)]
    xd, rd = x.to("tpu"), r.to("tpu")
    # The input read from its buffer, then computed in the loop by a producer.
    _assert_equal(torch.native_layer_norm(xd, (cols,), *dev, 1e-5), torch.native_layer_norm(x, (cols,), w, b, 1e-5))
    _assert_equal(
        torch.native_layer_norm(xd + rd, (cols,), *dev, 1e-5), torch.native_layer_norm(x + r, (cols,), w, b, 1e-5)
    )


@pytest.mark.parametrize("rows,offset", [(40, 1), (40, 5), (40, 16), (520, 1), (520, 8), (520, 16)])
def test_rows_off_the_vector_alignment_equal_cpu(setting, rows, offset):
    # Rows of 1024 starting `offset` floats into a wider buffer: a non-contiguous input,
    # whose loads are unaligned, and which the region reads through a gather or a copy.
    # 520 rows put input and output over 4 MB: the AVX-512 chunk pairs below.
    base = cpu_randn(rows, 1040, seed=75)
    w, b = cpu_randn(1024, seed=76), cpu_randn(1024, seed=77)
    x = base[:, offset : offset + 1024]
    xd = base.to("tpu")[:, offset : offset + 1024]
    _assert_equal(
        torch.native_layer_norm(xd, (1024,), w.to("tpu"), b.to("tpu"), 1e-5),
        torch.native_layer_norm(x, (1024,), w, b, 1e-5),
    )
    _assert_equal(
        torch.native_layer_norm(xd * 2 - 1, (1024,), None, b.to("tpu"), 1e-5),
        torch.native_layer_norm(x * 2 - 1, (1024,), None, b, 1e-5),
    )


# torch registers its layer_norm kernel for AVX2 only, so on an AVX-512 machine CPU runs
# the AVX2 arithmetic; the loop gives those values with AVX-512 instructions, two 8-float
# chunk chains in one register (layer_norm_row_avx2_on_avx512), for weight and bias on
# rows of at least two chunks of whole 8-float vectors in blocks of fewer than four rows
# (input and output over 4 MB). Rows of 2 to 32 chunks: 264 = 2 and a partial one,
# 392 = 3 and a partial (an odd count of pairs), 1000 = 7 and a partial, 1024 = 8,
# 2056 = 16 and a partial (a 5-level cascade), 4096 = 32; NaN and inf in the rows; plain
# and non-temporal stores. Without AVX-512: the AVX2 loop.
AVX2_COLS = [264, 392, 1000, 1024, 2056, 4096]


@pytest.mark.parametrize("cols", AVX2_COLS)
def test_avx2_rows_on_avx512_equal_cpu(setting, cols):
    rows = (1 << 19) // cols + 3  # input and output just over 4 MB: blocks of fewer than four rows
    x, r = cpu_randn(rows, cols, seed=81) * 4 + 3, cpu_randn(rows, cols, seed=82)
    x[1] = x[1] * 1e-3 + 1e4  # a large mean over a small spread: Welford's order shows
    x[2, cols // 3] = float("inf")
    x[3, cols - 1] = float("nan")  # in the last chunk (partial or not)
    w, b = cpu_randn(cols, seed=83), cpu_randn(cols, seed=84)
    wd, bd, xd, rd = w.to("tpu"), b.to("tpu"), x.to("tpu"), r.to("tpu")
    _assert_equal(torch.native_layer_norm(xd, (cols,), wd, bd, 1e-5), torch.native_layer_norm(x, (cols,), w, b, 1e-5))
    _assert_equal(
        torch.native_layer_norm(xd + rd, (cols,), wd, bd, 1e-5), torch.native_layer_norm(x + r, (cols,), w, b, 1e-5)
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_streamed_rows_at_the_default_threshold_equal_cpu(threads):
    # 4096x1024 (input and output over the default stream threshold): CPU's in-order moments
    # for the rows read from the input buffer, each thread's last row (no later row in the
    # buffer for it) by its chunks side by side: both paths of an AVX-512 machine.
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = cpu_randn(4096, 1024, seed=85) * 4 + 3
        x[1] = x[1] * 1e-3 + 1e4  # a large mean over a small spread: Welford's order shows
        x[4094, 17] = float("nan")  # a thread's last rows (no row after next)
        w, b = cpu_randn(1024, seed=86), cpu_randn(1024, seed=87)
        got = torch.native_layer_norm(x.to("tpu"), (1024,), w.to("tpu"), b.to("tpu"), 1e-5)
        _assert_equal(got, torch.native_layer_norm(x, (1024,), w, b, 1e-5))
    finally:
        torch.set_num_threads(saved)


# Rows of one 16-vector chunk of 8 floats (8 to 128 floats: a small model's features, e.g.
# nanoGPT's 64) with weight and bias, on an AVX-512 machine: eight rows' moments at once, two
# rows in each 512-bit register (lanes 0-7 one row, 8-15 the next), then each row's lanes
# merged in order, and the normalize 16 floats a step (layer_norm_row_avx2_on_avx512's short
# rows). Every width 8..128 (odd counts of 8-float vectors, widths not a multiple of 16), 136
# (two chunks: not taken); row counts leaving 1 to 7 rows past the groups of eight; a large
# mean over a small spread, inf and NaN in rows of both halves of a register; input read from
# its buffer and computed by a producer. Without AVX-512: the AVX2 loop.
SHORT_COLS = list(range(8, 129, 8)) + [136]


@pytest.mark.parametrize("rows", [8, 13, 67])
@pytest.mark.parametrize("cols", SHORT_COLS)
def test_short_rows_in_register_pairs_equal_cpu(setting, cols, rows):
    x, r = cpu_randn(rows, cols, seed=91) * 4 + 3, cpu_randn(rows, cols, seed=92)
    x[1] = x[1] * 1e-3 + 1e4  # a large mean over a small spread: Welford's order shows
    x[2, cols // 3] = float("inf")
    x[5, cols - 1] = float("nan")
    w, b = cpu_randn(cols, seed=93), cpu_randn(cols, seed=94)
    wd, bd, xd, rd = w.to("tpu"), b.to("tpu"), x.to("tpu"), r.to("tpu")
    _assert_equal(torch.native_layer_norm(xd, (cols,), wd, bd, 1e-5), torch.native_layer_norm(x, (cols,), w, b, 1e-5))
    _assert_equal(
        torch.native_layer_norm(xd + rd, (cols,), wd, bd, 1e-5), torch.native_layer_norm(x + r, (cols,), w, b, 1e-5)
    )
