"""Spyre's 16-bit sums read in place (executors/spyre/reduce16.cpp, branch
spyre22b): sum over the last dim of float16 / bfloat16 rows, and the corelet
partials of a sum or mean over the split rows (dim 0), with no f32 copy of the
input. The values must be those of CPU's float32 sum kernel on the df16
values (test_spyre_numerics' reference and ring order), every tail size,
and the same bits from the AVX2 and baseline builds.
"""

import pytest
import torch

from difftest import cpu_features_off, requires_tpu
from test_spyre_numerics import _inputs, _ring_reference, same, store

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16]
IDS = ["f16", "bf16"]
# Under 8 (ATen's scalar loop), whole and partial 8- and 32-vectors, and long
# enough rows for the cascade's carries (past 16 and 256 groups of 4 vectors).
WIDTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 31, 33, 64, 100, 300, 513, 1000, 4100, 9000]


def _specials(a):
    """a with NaN, signed zeros and float16 subnormals (df16 values) in its first rows."""
    a = a.clone()
    flat = a.view(-1)
    vals = [float("nan"), 0.0, -0.0, 2.0**-20, -3 * 2.0**-22, 2.0**-14 * 1.5]
    for i, v in enumerate(vals):
        if i * 7 < flat.numel():
            flat[i * 7] = v
    return a


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_every_width(spyre_target, dtype):
    for n in WIDTHS:
        a = _inputs(dtype, seed=50 + n, shape=(40, n))
        for keepdim in (False, True):
            got = a.to("tpu").sum(-1, keepdim=keepdim).cpu()
            assert same(got, store(a.float().sum(-1, keepdim=keepdim), dtype)) == 0, n


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_sums_special_values_and_ranks(spyre_target, dtype):
    a = _specials(_inputs(dtype, seed=60, shape=(6, 5, 300)))
    got = a.to("tpu").sum(2).cpu()
    assert same(got, store(a.float().sum(2), dtype)) == 0
    assert torch.isnan(got[0, 0])
    b = _specials(_inputs(dtype, seed=61, shape=(33, 7)))
    assert same(b.to("tpu").sum(1).cpu(), store(b.float().sum(1), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(1000, 300), (64, 2), (3000, 5), (77, 33), (500, 7), (2000, 9)])
def test_ring_sum_and_mean_over_rows(spyre_target, dtype, shape):
    from torch_tpu_eager import spyre

    a = _specials(_inputs(dtype, seed=62, shape=shape))
    for kind, f in (("sum", lambda t: t.sum(0)), ("mean", lambda t: t.mean(0))):
        got = f(a.to("tpu")).cpu()
        (sched,) = spyre.last_schedule()
        want = store(_ring_reference(a.float(), kind, (0,), sched).reshape(got.shape), dtype)
        assert same(got, want) == 0, (kind, sched["executed"], sched["whole_reason"])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_baseline_build_same_bits(spyre_target, dtype):
    for shape in [(40, 300), (40, 9), (1000, 300), (3000, 5)]:
        a = _specials(_inputs(dtype, seed=63, shape=shape))
        for f in (lambda t: t.sum(-1), lambda t: t.sum(0)):
            wide = f(a.to("tpu")).cpu()
            with cpu_features_off("avx2"):
                narrow = f(a.to("tpu")).cpu()
            assert torch.equal(wide.view(torch.int16), narrow.view(torch.int16)), shape
