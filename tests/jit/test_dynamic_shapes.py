"""Bounded dynamism: compile counts for growing and marked sizes."""

import math
import warnings

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def test_growing_size_compiles_log2_times_per_region_kind():
    tte = _tte()
    w = torch.randn(16, 16).to("tpu")
    names = {}
    with tte.profile() as prof:
        for n in range(1, 65):  # a generation loop: one more row per step
            x = torch.randn(n, 16).to("tpu")
            y = torch.softmax((x @ w).relu() * 0.5, dim=-1)
            ref = torch.softmax((x.cpu() @ w.cpu()).relu() * 0.5, dim=-1)
            torch.testing.assert_close(y.cpu(), ref)
    for k in prof.kernels:
        names.setdefault(k["name"], []).append(k["cache_hit"])
    bound = math.ceil(math.log2(64)) + 1
    for name, hits in names.items():
        assert hits.count(False) <= bound, (name, hits.count(False))


def test_mark_dynamic_range_compiles_once_and_outside_warns():
    tte = _tte()
    base = torch.randn(200, 8).to("tpu")
    tte.mark_dynamic(base, 0, 1, 100)
    (base[:3] * 2).sum().item()  # warm: compile the range's bucket
    tte.reset_metrics()
    for n in range(1, 101):
        got = (base[:n] * 2).sum()
        torch.testing.assert_close(got.cpu(), (base.cpu()[:n] * 2).sum())
    assert tte.metrics()["compiles"] == 0
    with warnings.catch_warnings(record=True):  # silences the run's warnings
        warnings.simplefilter("always")
        got = (base[:150] * 2).sum().cpu()
    torch.testing.assert_close(got, (base.cpu()[:150] * 2).sum())
    m = tte.metrics()
    # A new region: compiled, or loaded from a warm on-disk cache (TORCH_TPU_CACHE_DIR).
    assert m["compiles"] + m["disk_cache_hits"] >= 1


@pytest.mark.parametrize(
    "args",
    [
        (torch.ones(3), 0, 1, 2),  # not a tpu tensor
        ("tpu", -1, 1, 2),  # negative dim
        ("tpu", 2, 1, 2),  # dim out of range
        ("tpu", 0, 5, 2),  # lower > upper
        ("tpu", 0, -1, 2),  # negative lower
    ],
)
def test_mark_dynamic_rejects_bad_input(args):
    t, dim, lo, hi = args
    if isinstance(t, str):
        t = torch.ones(4, 4, device="tpu")
    with pytest.raises(ValueError):
        _tte().mark_dynamic(t, dim, lo, hi)
