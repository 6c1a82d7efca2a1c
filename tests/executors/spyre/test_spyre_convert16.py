"""The Spyre direct kernels' 16-bit conversions (executors/spyre/convert16.h,
branch spyre24b): float32 -> df16 held as bfloat16 / float16 (the row pass's and
the 16-bit matmul's stores) and bfloat16 / float16 -> float32 (their loads), in
each build cpu::has picks (AVX-512, AVX2 + F16C, baseline), against the tests'
own df16 codec (test_spyre_numerics.store) and torch's exact widening.
"""

import pytest
import torch

from difftest import cpu_features_off, requires_tpu
from test_spyre_numerics import store

pytestmark = requires_tpu

BUILDS = [(), ("avx512f",), ("avx512f", "avx2", "f16c")]
BUILD_IDS = ["widest", "avx2", "baseline"]
DTYPES = [torch.bfloat16, torch.float16]


def _floats():
    """Every high half of a float32 with 13 low halves around df16's rounding
    boundaries (ties, carries, the zero and NaN/Inf limits, NaN, inf, denormals)."""
    hi = torch.arange(0, 1 << 16, dtype=torch.int64) << 16
    lows = torch.tensor([0, 1, 0x1FFF, 0x2000, 0x2001, 0x3FFF, 0x4000, 0x5FFF, 0x6000, 0x7FFF, 0x8000, 0xA000, 0xFFFF])
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    return (bits - ((bits >= (1 << 31)).long() << 32)).to(torch.int32).view(torch.float32)


def _bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("off", BUILDS, ids=BUILD_IDS)
def test_store16_is_df16_then_the_dtype(off):
    from torch_tpu_eager import _C

    x = _floats()
    with cpu_features_off(*off):
        for dtype in DTYPES:
            want = store(x, dtype)
            assert torch.equal(_bits(_C._spyre_store16(x, dtype)), _bits(want)), dtype
            # Every length below two AVX-512 vectors (the builds' tails), at odd offsets.
            for n in range(1, 40):
                got = _C._spyre_store16(x[1000 + n : 1000 + 2 * n], dtype)
                assert torch.equal(_bits(got), _bits(want[1000 + n : 1000 + 2 * n])), (dtype, n)


@pytest.mark.parametrize("off", BUILDS, ids=BUILD_IDS)
def test_narrow_half_is_cpus_float16_rounding(off):
    """narrow_half (the chain pass's float16 stores and round trips) is CPU's
    float32 -> float16 to nearest even, no df16 step: every high half with
    low halves around float16's ties, overflow to inf, denormals; NaN stays NaN."""
    from torch_tpu_eager import _C

    x = _floats()
    want = x.half()
    nan = torch.isnan(x)
    with cpu_features_off(*off):
        got = _C._spyre_narrow_half(x)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
        # Every length below two AVX-512 vectors (the builds' tails), at odd offsets.
        for n in range(1, 40):
            part = slice(0x3F80 * 13 + n, 0x3F80 * 13 + 2 * n)  # around 1.0: normal float16 values
            assert torch.equal(_bits(_C._spyre_narrow_half(x[part])), _bits(want[part])), n


@pytest.mark.parametrize("off", BUILDS, ids=BUILD_IDS)
def test_widen16_is_exact(off):
    from torch_tpu_eager import _C

    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    with cpu_features_off(*off):
        for dtype in DTYPES:
            x = every.view(dtype)
            want = x.float()
            got = _C._spyre_widen16(x)
            nan = torch.isnan(want)
            assert torch.equal(torch.isnan(got), nan), dtype
            assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), dtype
            for n in range(1, 40):
                assert torch.equal(
                    _C._spyre_widen16(x[7 : 7 + n]).view(torch.int32)[~nan[7 : 7 + n]],
                    want[7 : 7 + n].view(torch.int32)[~nan[7 : 7 + n]],
                ), (dtype, n)
