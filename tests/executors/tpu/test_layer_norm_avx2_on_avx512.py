"""torch runs its AVX2 layer_norm kernel on AVX-512 machines (it registers none for
AVX-512); the fused row loop then computes those values with AVX-512 instructions, two
8-float chunk chains in one register (layer_norm_row_avx2_on_avx512,
csrc/executors/tpu/layer_norm_row.inc), for weight and bias on rows of at least two
chunks of whole 8-float vectors in run_rows' blocks of fewer than four rows (input and
output over 4 MB; smaller ones keep the AVX2 loop's rows side by side). Out, mean and rstd must equal CPU's
torch.native_layer_norm bit for bit (NaN where CPU has NaN): rows of 2 to 32 chunks,
with a partial last chunk, an odd count of full chunks and a cascade deeper than 4
levels, rows of whole 8-float but not 16-float vectors, at 1 and 2 threads, with plain
and non-temporal stores (the two ways the moments are read), with the input read from
its buffer, computed by a producer, or off the vector alignment. On a machine without
AVX-512 the same tests check the AVX2 loop."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused row loops exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager

# 8-float vectors, chunks of 16: 264 = 2 chunks and a partial one (one vector), 392 = 3
# and a partial, 1000 = 7 and a partial, 1024 = 8 (four pairs), 2056 = 16 and a partial
# (a 5-level cascade), 4096 = 32.
COLS = [264, 392, 1000, 1024, 2056, 4096]


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


def _assert_equal(got, expected):
    for name, g, e in zip(("out", "mean", "rstd"), got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0, equal_nan=True, msg=f"{name} differs from CPU")


@pytest.mark.parametrize("cols", COLS)
def test_weight_and_bias_rows_equal_cpu(setting, cols):
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


@pytest.mark.parametrize("offset", [1, 8, 16])
def test_rows_off_the_vector_alignment_equal_cpu(setting, offset):
    base = cpu_randn(520, 1040, seed=85)
    w, b = cpu_randn(1024, seed=86), cpu_randn(1024, seed=87)
    x = base[:, offset : offset + 1024]
    xd = base.to("tpu")[:, offset : offset + 1024]
    _assert_equal(
        torch.native_layer_norm(xd, (1024,), w.to("tpu"), b.to("tpu"), 1e-5),
        torch.native_layer_norm(x, (1024,), w, b, 1e-5),
    )
