"""Pooling and upsampling on Spyre walk the tile steps (issue 21): they work
on the last 1-3 dims, each plane of the leading dims on its own, so dim 0 (a
batch or channel dim) splits over the cores like any row-local op
(docs/ktir.md, "Row-local ops"); before, their regions ran whole.

The reference is CPU's float32 op on the inputs as they sit on the device
(df16 values), rounded once with the df16 codec of test_spyre_numerics: 0
mismatches for float16 and bfloat16, bit for bit for float32; max pooling's
indices equal CPU's. Gradients likewise (one op, one rounding).
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import _inputs, same, store

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["f16", "bf16", "f32"]

OPS = {
    "avg_pool2d": lambda t: F.avg_pool2d(t, 2),
    "avg_pool2d_pad": lambda t: F.avg_pool2d(t, 3, stride=2, padding=1, count_include_pad=False),
    "max_pool2d": lambda t: F.max_pool2d(t, 2),
    "max_pool1d": lambda t: F.max_pool1d(t.flatten(2), 3),
    "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, (3, 5)),
    "adaptive_max_pool2d": lambda t: F.adaptive_max_pool2d(t, (3, 5)),
    "upsample_nearest2d": lambda t: F.interpolate(t, scale_factor=2),
    "upsample_bilinear2d": lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
}


def _want(y32, dtype):
    return y32 if dtype == torch.float32 else store(y32, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_pool_and_upsample_walk_tiles_with_one_rounding(spyre_target, name, dtype):
    from torch_tpu_eager import metrics, reset_metrics, spyre

    x = _inputs(dtype, seed=70, shape=(1000, 3, 8, 8))
    reset_metrics()
    got = OPS[name](x.to("tpu")).cpu()
    s = spyre.last_schedule()[-1]
    assert s["executed"] == "tiles", s["whole_reason"]
    assert metrics()["library_calls"] == 0
    want = _want(OPS[name](x.float()), dtype)
    assert got.shape == want.shape and got.dtype == dtype
    assert same(got, want) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_max_pool_indices_equal_cpus(spyre_target, dtype):
    from torch_tpu_eager import spyre

    x = _inputs(dtype, seed=71, shape=(700, 4, 6, 6))
    x[::3, :, ::2] = 1.0  # ties inside windows
    v, i = F.max_pool2d(x.to("tpu"), 2, return_indices=True)
    v, i = v.cpu(), i.cpu()
    assert spyre.last_schedule()[-1]["executed"] == "tiles"
    wv, wi = F.max_pool2d(x.float(), 2, return_indices=True)
    assert same(v, _want(wv, dtype)) == 0
    assert torch.equal(i, wi)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", ["avg_pool2d", "max_pool2d", "adaptive_avg_pool2d", "upsample_bilinear2d"])
def test_pool_gradients_round_once(spyre_target, name, dtype):
    x = _inputs(dtype, seed=72, shape=(600, 3, 8, 8))
    d = x.to("tpu").requires_grad_()
    OPS[name](d).sum().backward()
    got = d.grad.cpu()
    x32 = x.float().requires_grad_()
    OPS[name](x32).sum().backward()
    assert same(got, _want(x32.grad, dtype)) == 0


def test_pool_of_a_too_small_input_raises_cpus_error(spyre_target):
    x = torch.randn(40, 3, 1, 1)
    with pytest.raises(RuntimeError):
        F.max_pool2d(x, 2)
    with pytest.raises(RuntimeError):
        F.max_pool2d(x.to("tpu"), 2).cpu()
