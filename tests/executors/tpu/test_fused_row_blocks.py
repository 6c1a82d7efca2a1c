"""The fused row loop (fused_kernels.inc, run_rows) over blocks of rows: layer_norm's rows of
a block normalized by one call (layer_norm_row.inc), the other row ops each with their own
loop over the block. Row counts around the block size (1,024 floats of rows), blocks split
between 2 threads, the mean / rstd outputs written or not, every affine form and streamed
stores; every output compared with CPU's bit for bit (torch.equal) at 1 and 2 threads."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion and metrics exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def nthreads(request):
    """Runs the test at the parametrized intra-op thread count, then restores it."""
    restore = restoring(torch.get_num_threads, torch.set_num_threads)
    next(restore)(request.param)
    yield request.param
    next(restore, None)


# (rows, cols): blocks of 16 rows of 64 (nanoGPT's 512 rows; one row less / more than a
# block; 1,000 rows: 63 blocks, split between 2 threads), of 42 rows of 24 (a partial last
# block), of 204 rows of 5 (shorter than a vector), and one row a block (1,500 columns).
SHAPES = [(1, 64), (15, 64), (16, 64), (17, 64), (512, 64), (1000, 64), (513, 24), (1000, 5), (70, 1500)]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]
AFFINE_IDS = ["weight+bias", "weight", "bias", "neither"]


def _layer_norm_case(rows, cols, affine, seed):
    x, r = cpu_randn(rows, cols, seed=seed) * 3 + 1, cpu_randn(rows, cols, seed=seed + 1)
    w = cpu_randn(cols, seed=seed + 2) if affine[0] else None
    b = cpu_randn(cols, seed=seed + 3) if affine[1] else None
    return x, r, w, b


def _tpu(t):
    return None if t is None else t.to("tpu")


def _one_region(fn):
    """Runs fn() (which records on "tpu" and reads back), asserting one region ran."""
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    got = fn()
    assert torch_tpu_eager.metrics()["regions_run"] == 1, "the producer and the row op should be one loop"
    return got


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
def test_layer_norm_block_rows_equal_cpu(nthreads, shape, affine):
    x, r, w, b = _layer_norm_case(*shape, affine, seed=70)
    expected = torch.native_layer_norm(x + r, (shape[1],), w, b, 1e-5)
    xt, rt, wt, bt = _tpu(x), _tpu(r), _tpu(w), _tpu(b)
    got = _one_region(lambda: [t.cpu() for t in torch.native_layer_norm(xt + rt, (shape[1],), wt, bt, 1e-5)])
    for name, g, e in zip(("out", "mean", "rstd"), got, expected):
        assert torch.equal(g, e), f"{name} differs from CPU"


@pytest.mark.parametrize("shape", [(17, 64), (1000, 64), (513, 24)], ids=["17x64", "1000x64", "513x24"])
def test_layer_norm_without_statistics_equals_cpu(nthreads, shape):
    # Only out is read: the block call gets no mean / rstd buffers.
    x, r, w, b = _layer_norm_case(*shape, (True, True), seed=80)
    xt, rt, wt, bt = _tpu(x), _tpu(r), _tpu(w), _tpu(b)
    got = _one_region(lambda: F.layer_norm(xt + rt, (shape[1],), wt, bt).cpu())
    assert torch.equal(got, F.layer_norm(x + r, (shape[1],), w, b))


@pytest.mark.parametrize("affine", AFFINE, ids=AFFINE_IDS)
def test_layer_norm_streamed_block_rows_equal_cpu(nthreads, affine):
    # Threshold 0: every loop writes with non-temporal stores (the block's rows alternate alignment).
    threshold = torch_tpu_eager._C._stream_store_threshold()
    torch_tpu_eager._C._set_stream_store_threshold(0)
    try:
        x, r, w, b = _layer_norm_case(999, 37, affine, seed=90)
        xt, rt, wt, bt = _tpu(x), _tpu(r), _tpu(w), _tpu(b)
        got = _one_region(lambda: [t.cpu() for t in torch.native_layer_norm(xt + rt, (37,), wt, bt, 1e-5)])
    finally:
        torch_tpu_eager._C._set_stream_store_threshold(-1)
    assert torch_tpu_eager._C._stream_store_threshold() == threshold
    for name, g, e in zip(("out", "mean", "rstd"), got, torch.native_layer_norm(x + r, (37,), w, b, 1e-5)):
        assert torch.equal(g, e), f"{name} differs from CPU"


ROW_OPS = {
    "softmax": lambda h: F.softmax(h, dim=-1),
    "log_softmax": lambda h: F.log_softmax(h, dim=-1),
    "logsumexp": lambda h: torch.logsumexp(h, dim=-1),
    "sum": lambda h: h.sum(-1),
    "mean": lambda h: h.mean(-1),
}


@pytest.mark.parametrize(
    "shape", [(17, 64), (1000, 64), (513, 24), (70, 1500)], ids=["17x64", "1000x64", "513x24", "70x1500"]
)
@pytest.mark.parametrize("op", list(ROW_OPS))
def test_other_row_ops_over_blocks_equal_cpu(nthreads, shape, op):
    x, r = cpu_randn(*shape, seed=100) * 4, cpu_randn(*shape, seed=101)
    fn = ROW_OPS[op]
    xt, rt = x.to("tpu"), r.to("tpu")
    got = _one_region(lambda: fn(xt * 2 + rt).cpu())
    assert torch.equal(got, fn(x * 2 + r))
