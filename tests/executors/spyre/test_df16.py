"""The Spyre df16 (DLFloat16) codec against an independent reference written here.

The reference works on values, not on the codec's bit tricks: it splits |x| with
frexp, scales the significand to 9 fraction bits, rounds with floor(q + 1/2) (ties
away) or rint (ties even), then applies the format's rules from issue 6 (exponent
bias 31, E in 0..63, code 0 is zero, 0x7FFF is NaN/Inf). Decoding is checked against
the formula (-1)^s * 2^(E-31) * (1 + F/512).
"""

import math

import numpy as np
import pytest
import torch

from difftest import requires_tpu
from torch_tpu_eager import spyre

MODES = [(r, o) for r in ("nearest_away", "nearest_even") for o in ("nan_inf", "saturate")]


# ---------------------------------------------------------------- reference


def ref_encode(x32, rounding="nearest_away", overflow="nan_inf"):
    """df16 codes (uint16) of the float32 array x32, from the rules of issue 6."""
    x32 = np.asarray(x32, dtype=np.float32)
    neg = np.signbit(x32)
    nan = np.isnan(x32)
    a = np.abs(np.where(nan, 0, x32).astype(np.float64))  # exact (widening a signaling NaN warns)
    finite = np.isfinite(a)
    m, e = np.frexp(np.where(finite, a, 1.0))  # a = m * 2**e, m in [0.5, 1)
    q = m * 1024.0  # (1 + F/512) * 512 before rounding; exact in float64
    r = np.floor(q + 0.5) if rounding == "nearest_away" else np.rint(q)
    exp = e.astype(np.int64) - 1 + 31  # a = (q / 512) * 2**(e - 1)
    carry = r == 1024.0  # rounding reached the next power of two
    exp = np.where(carry, exp + 1, exp)
    frac = np.where(carry, 0, r.astype(np.int64) - 512)
    code = exp * 512 + frac
    ovf_code = 0x7FFF if overflow == "nan_inf" else 0x7FFE
    code = np.where((exp < 0) | (a == 0), 0, code)  # below the smallest magnitude: zero
    code = np.where(exp > 63, ovf_code, code)
    code = np.where((exp == 63) & (frac == 511), ovf_code, code)  # rounds onto the NaN/Inf code
    code = np.where(np.isinf(a), ovf_code, code)
    code = np.where(nan, 0x7FFF, code)
    return (code | np.where(neg, 0x8000, 0)).astype(np.uint16)


def ref_decode(codes):
    """float32 values of df16 codes, from (-1)^s * 2^(E-31) * (1 + F/512)."""
    out = []
    for c in np.asarray(codes, dtype=np.uint16).tolist():
        s, exp, frac = c >> 15, (c >> 9) & 63, c & 511
        sign = -1.0 if s else 1.0
        if exp == 63 and frac == 511:
            out.append(math.copysign(math.nan, sign))
        elif exp == 0 and frac == 0:
            out.append(math.copysign(0.0, sign))
        else:
            out.append(sign * math.ldexp(1 + frac / 512, exp - 31))
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------------- helpers


def encode(x32, rounding="nearest_away", overflow="nan_inf"):
    t = torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32))
    return spyre.df16_encode(t, rounding=rounding, overflow=overflow).numpy().view(np.uint16)


def decode(codes):
    t = torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint16).view(np.int16))
    return spyre.df16_decode(t).numpy()


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def assert_codes_equal(x32, got, want):
    bad = np.nonzero(got != want)[0]
    if bad.size:
        rows = [
            f"x={x32[i]!r} (0x{x32[i : i + 1].view(np.uint32)[0]:08X}): got 0x{got[i]:04X} want 0x{want[i]:04X}"
            for i in bad[:8]
        ]
        pytest.fail(f"{bad.size} of {got.size} codes differ:\n" + "\n".join(rows))


def assert_same_floats(got, want):
    """Bitwise equality of float32 arrays, NaN matching NaN of the same sign."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    both_nan = np.isnan(got) & np.isnan(want) & (np.signbit(got) == np.signbit(want))
    bad = np.nonzero(~both_nan & (got.view(np.uint32) != want.view(np.uint32)))[0]
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[:5]}: got {got[bad[:5]]} want {want[bad[:5]]}"


def edge_values():
    """±0, subnormals, normal limits, inf/NaN, and every df16 boundary and tie.

    For each f32 exponent around the df16 range (E = -3 .. 66) and each 9-bit
    fraction, the exact grid point, one f32 ulp either side, and the half-way tie
    with its two neighbours.
    """
    specials = [
        0,
        1,
        2,
        0x007FFFFF,
        0x00800000,
        0x00800001,
        0x7F7FFFFF,
        0x7F800000,
        0x7F800001,
        0x7FC00000,
        0x7FFFFFFF,
        0x3F800000,
    ]
    exp32 = np.arange(96 - 3, 96 + 67, dtype=np.uint32)
    frac9 = np.arange(512, dtype=np.uint32)
    base = ((exp32[:, None] << 23) | (frac9[None, :] << 14)).ravel()
    offsets = np.array([0, 1, 0x1FFF, 0x2000, 0x2001, 0x3FFF], dtype=np.int64)
    grid = (base[:, None].astype(np.int64) + offsets[None, :]).ravel()
    grid = np.concatenate([grid, base.astype(np.int64) - 1])
    bits = np.concatenate([np.array(specials, dtype=np.int64), grid]) & 0x7FFFFFFF
    bits = bits.astype(np.uint32)
    return f32(np.concatenate([bits, bits | np.uint32(0x80000000)]))


def random_values(n=100_000, seed=1234):
    """Random f32 bit patterns: half over every exponent, half around the df16 range."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exp = np.concatenate([rng.integers(0, 256, n // 2), rng.integers(96 - 4, 96 + 68, n - n // 2)])
    frac = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    return f32(sign | (exp.astype(np.uint32) << 23) | frac)


ALL_FP16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
ALL_CODES = np.arange(1 << 16, dtype=np.uint16)


# ---------------------------------------------------------------- the reference itself


def test_reference_matches_issue_golden_values():
    # The golden values of issue 6 hold for the reference, so it encodes the stated rules.
    x = np.array([1.0, -1.0, 2.0, 0.5, 0.1, 65504.0, 1 + 2.0**-10, 2.0**-31], dtype=np.float32)
    assert ref_encode(x).tolist() == [0x3E00, 0xBE00, 0x4000, 0x3C00, 0x3733, 0x5E00, 0x3E01, 0x0000]
    assert ref_decode([0x7FFE, 0x5E00]).tolist() == [8573157376.0, 65536.0]


# ---------------------------------------------------------------- encode


def test_golden_values():
    x = torch.tensor([1.0, -1.0, 2.0, 0.5, 0.1, 65504.0, 1 + 2.0**-10, 2.0**-31, 8573157376.0])
    got = spyre.df16_encode(x).numpy().view(np.uint16).tolist()
    assert got == [0x3E00, 0xBE00, 0x4000, 0x3C00, 0x3733, 0x5E00, 0x3E01, 0x0000, 0x7FFE]
    assert spyre.df16_decode(torch.tensor([0x7FFE, 0x5E00, 0x3E00], dtype=torch.int16)).tolist() == [
        8573157376.0,
        65536.0,
        1.0,
    ]
    assert spyre.df16_round(torch.tensor([65504.0])).item() == 65536.0


@pytest.mark.parametrize("rounding,overflow", MODES)
def test_all_fp16_bit_patterns(rounding, overflow):
    assert_codes_equal(ALL_FP16, encode(ALL_FP16, rounding, overflow), ref_encode(ALL_FP16, rounding, overflow))


@pytest.mark.parametrize("rounding,overflow", MODES)
def test_edge_values(rounding, overflow):
    x = edge_values()
    assert_codes_equal(x, encode(x, rounding, overflow), ref_encode(x, rounding, overflow))


@pytest.mark.parametrize("rounding,overflow", MODES)
def test_random_values(rounding, overflow):
    x = random_values()
    assert_codes_equal(x, encode(x, rounding, overflow), ref_encode(x, rounding, overflow))


def test_ties_and_limits():
    tie = np.float32(1 + 2.0**-10)  # half-way between 0x3E00 and 0x3E01
    odd_tie = np.float32(1 + 3 * 2.0**-10)  # half-way between 0x3E01 and 0x3E02
    assert encode([tie, odd_tie, -tie]).tolist() == [0x3E01, 0x3E02, 0xBE01]
    assert encode([tie, odd_tie, -tie], "nearest_even").tolist() == [0x3E00, 0x3E02, 0xBE00]
    # The tie between the largest finite value and the NaN/Inf code.
    top_tie = np.float32(2.0**32 * (1 + 510.5 / 512))
    assert encode([top_tie, -top_tie]).tolist() == [0x7FFF, 0xFFFF]
    assert encode([top_tie], "nearest_even").tolist() == [0x7FFE]
    assert encode([top_tie, -top_tie], overflow="saturate").tolist() == [0x7FFE, 0xFFFE]
    big = np.array([np.inf, -np.inf, 3.0e38, 2.0**33], dtype=np.float32)
    assert encode(big).tolist() == [0x7FFF, 0xFFFF, 0x7FFF, 0x7FFF]
    assert encode(big, overflow="saturate").tolist() == [0x7FFE, 0xFFFE, 0x7FFE, 0x7FFE]
    nans = f32([0x7FC00000, 0xFFC00000, 0x7F800001])
    assert encode(nans, overflow="saturate").tolist() == [0x7FFF, 0xFFFF, 0x7FFF]
    # Bottom of the range: 2**-31 is code 0 (zero); 0x0001 is reached by rounding up.
    smallest = np.float32(2.0**-31 * (1 + 2.0**-9))
    low = np.array([2.0**-31, -(2.0**-31), 2.0**-31 * (1 + 2.0**-10), smallest, 2.0**-32, 1e-45], dtype=np.float32)
    assert encode(low).tolist() == [0x0000, 0x8000, 0x0001, 0x0001, 0x0000, 0x0000]
    assert encode(low, "nearest_even").tolist() == [0x0000, 0x8000, 0x0000, 0x0001, 0x0000, 0x0000]
    assert np.signbit(decode(encode([-1e-40, -0.0]))).tolist() == [True, True]


# ---------------------------------------------------------------- decode and round trips


def test_decode_all_codes():
    assert_same_floats(decode(ALL_CODES), ref_decode(ALL_CODES))


@pytest.mark.parametrize("rounding,overflow", MODES)
def test_encode_of_decode_is_identity(rounding, overflow):
    # Every df16 value is an f32, so re-encoding gives back every code (NaN code included).
    assert_codes_equal(decode(ALL_CODES), encode(decode(ALL_CODES), rounding, overflow), ALL_CODES)


@pytest.mark.parametrize("rounding,overflow", MODES)
def test_round_is_idempotent(rounding, overflow):
    x = torch.from_numpy(np.concatenate([random_values(20_000, seed=7), ALL_FP16]))
    once = spyre.df16_round(x, rounding, overflow)
    twice = spyre.df16_round(once, rounding, overflow)
    assert_same_floats(twice.numpy(), once.numpy())


@pytest.mark.parametrize("rounding", ["nearest_away", "nearest_even"])
def test_result_is_a_nearest_df16_value(rounding):
    # A second, search-based check: in range, the result is one of the two df16
    # values around x and no farther from x than the other one.
    pos = np.sort(ref_decode(np.arange(1, 0x7FFF, dtype=np.uint16)).astype(np.float64))
    x = np.abs(random_values(50_000, seed=99))
    x = x[(x >= pos[0]) & (x <= pos[-1])].astype(np.float64)  # drops NaN too
    y = decode(encode(x.astype(np.float32), rounding)).astype(np.float64)
    hi = np.searchsorted(pos, x, side="left")
    lo = np.where(pos[hi] == x, hi, hi - 1)
    assert np.all((y == pos[lo]) | (y == pos[hi]))
    assert np.all(np.abs(y - x) <= np.minimum(x - pos[lo], pos[hi] - x))


# ---------------------------------------------------------------- tensor API


def test_shapes_dtypes_and_layouts():
    x = torch.linspace(-3, 3, 24).reshape(2, 3, 4)
    codes = spyre.df16_encode(x)
    assert codes.dtype == torch.int16 and codes.shape == x.shape
    want = ref_encode(x.numpy().ravel()).view(np.int16).reshape(2, 3, 4)
    assert codes.numpy().tolist() == want.tolist()
    # Strided input, 0-dim and empty tensors.
    xt = x.transpose(0, 2)
    assert (
        spyre.df16_encode(xt).tolist()
        == ref_encode(xt.contiguous().numpy().ravel()).view(np.int16).reshape(xt.shape).tolist()
    )
    assert spyre.df16_encode(torch.tensor(0.1)).shape == ()
    assert spyre.df16_decode(torch.zeros(0, 3, dtype=torch.int16)).shape == (0, 3)
    dec = spyre.df16_decode(codes)
    assert dec.dtype == torch.float32 and dec.shape == x.shape
    # Narrow float inputs widen exactly; float64 is rounded to float32 first.
    for dt in (torch.float16, torch.bfloat16):
        xd = x.to(dt)
        assert spyre.df16_encode(xd).tolist() == spyre.df16_encode(xd.float()).tolist()
    x64 = torch.tensor([1 + 2.0**-10 + 2.0**-40, 0.1], dtype=torch.float64)
    assert spyre.df16_encode(x64).tolist() == spyre.df16_encode(x64.float()).tolist()


def test_round_keeps_dtype_and_shape():
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = torch.tensor([[0.1, -2.5], [65504.0, 1e-3]], dtype=dt)
        r = spyre.df16_round(x)
        assert r.dtype == dt and r.shape == x.shape
        want = torch.from_numpy(ref_decode(ref_encode(x.float().numpy().ravel()))).reshape(2, 2).to(dt)
        torch.testing.assert_close(r, want, rtol=0, atol=0)
    # 65504 (fp16 max) becomes 65536 in df16, which float16 cannot hold.
    assert spyre.df16_round(torch.tensor([65504.0], dtype=torch.float16)).isinf().all()


def test_bad_input():
    x = torch.ones(3)
    with pytest.raises(ValueError, match="rounding"):
        spyre.df16_encode(x, rounding="nearest")
    with pytest.raises(ValueError, match="overflow"):
        spyre.df16_encode(x, overflow="inf")
    with pytest.raises(ValueError, match="rounding"):
        spyre.df16_round(x, rounding=None)
    for bad in (torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.cfloat)):
        with pytest.raises(TypeError, match="floating-point"):
            spyre.df16_encode(bad)
    with pytest.raises(TypeError, match="int16"):
        spyre.df16_decode(torch.ones(3))
    with pytest.raises(TypeError, match="int16"):
        spyre.df16_decode(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError):
        spyre.df16_encode([1.0, 2.0])


@requires_tpu
def test_tpu_tensors():
    x = torch.tensor([0.1, -1.0, 65504.0, 1 + 2.0**-10])
    xt = x.to("tpu") * 1  # a pending op, flushed by the codec's read
    codes = spyre.df16_encode(xt)
    assert codes.device.type == "tpu" and codes.dtype == torch.int16
    assert codes.cpu().tolist() == spyre.df16_encode(x).tolist()
    dec = spyre.df16_decode(codes)
    assert dec.device.type == "tpu" and dec.cpu().tolist() == spyre.df16_round(x).tolist()
    assert spyre.df16_round(xt).cpu().tolist() == spyre.df16_round(x).tolist()
