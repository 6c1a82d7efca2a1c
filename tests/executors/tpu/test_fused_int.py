"""Integer fused loops (executors/tpu/fused_int.cpp; issue 18 item 5): int64 / int32 / bool
elementwise math, comparisons, bitwise ops, shifts, where, clamp, floor division and
remainder, sign, pow by an integral Scalar, and casts (copy_ between int64, int32, bool
and float32) run as one loop over
int64 registers, bit-equal to CPU's kernels: int32 wraps modulo 2^32 as CPU's does, int64
values above 2^53 and INT64_MIN stay exact (a float32 loop would round them), float -> int
casts give what CPU's static_cast gives on x86 (NaN / out of range: the type's minimum).
An integer divisor of zero runs the ops op by op, where CPU's kernel raises
"ZeroDivisionError" (a RuntimeError) for the op that divides, at the flush, as the
unfused path does. Each chain is checked fused: the flush runs no ATen op on the host."""

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, flush_on_tpu

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def _values(dtype, n, seed):
    """n values of `dtype`: edge values (extremes, +-1, 0, around 2^24 and 2^53) then random
    ones over the whole range and small ones (where division and shifts are interesting)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        lo, hi = I64_MIN, I64_MAX
        edges = [I64_MIN, I64_MAX, I64_MIN + 1, 0, 1, -1, 2, -2, 2**24 + 1, -(2**24) - 1, 2**53 + 1, -(2**53) - 3]
    else:
        lo, hi = I32_MIN, I32_MAX
        edges = [I32_MIN, I32_MAX, I32_MIN + 1, 0, 1, -1, 2, -2, 2**24 + 1, -(2**24) - 1, 7, -7]
    big = torch.randint(lo, hi, (n // 2,), generator=g, dtype=dtype)
    small = torch.randint(-70, 70, (n - n // 2 - len(edges),), generator=g, dtype=dtype)
    v = torch.cat([torch.tensor(edges, dtype=dtype), big, small])
    return v[torch.randperm(n, generator=g)]


def _check_fused(fn, *cpu_args):
    got, ops = flush_on_tpu(fn, *cpu_args)
    assert_bit_equal(got, fn(*cpu_args))
    assert ops == [], ops


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=-3),
    "rsub": lambda a, b: torch.rsub(a, b, alpha=2),
    "mul": lambda a, b: a * b,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "clamp_t": lambda a, b: torch.clamp(a, min=b, max=b + 100),
    "logical_and": torch.logical_and,
    "logical_xor": torch.logical_xor,
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_wrap_as_cpu(name, dtype):
    op = BINARY[name]
    a, b = _values(dtype, 4099, 1), _values(dtype, 4099, 2)
    b[:50] = a[:50]  # equal pairs for the comparisons

    def fn(a, b):
        r = op(a, b)
        return r, torch.where(a > b, r.to(dtype) * 3, -r.to(dtype))  # a consumer in the same loop

    _check_fused(fn, a, b)


SCALAR = {
    "add": lambda a: a + 2**40 + 1,
    "mul": lambda a: a * 1000003,
    "sub": lambda a: a - 7,
    "rsub": lambda a: 5 - a,
    "gt": lambda a: a > 2**53,
    "le": lambda a: a <= -3,
    "eq": lambda a: a == 2**53 + 1,
    "and": lambda a: a & 0xFF0F,
    "xor": lambda a: a ^ -1,
    "clamp": lambda a: a.clamp(-1000, 2**31 - 1),
    "clamp_min": lambda a: a.clamp(min=-5),
    "clamp_max": lambda a: a.clamp(max=9),
    "neg": lambda a: -a,
    "abs": torch.abs,
    "not": lambda a: ~a,
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("name", sorted(SCALAR))
def test_scalar_and_unary_ops(name, dtype):
    op = SCALAR[name]
    a = _values(dtype, 3001, 3)

    def fn(a):
        r = op(a)
        return r, (r.to(dtype) | 1) + a

    _check_fused(fn, a)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_shifts_every_count(dtype):
    bits = 64 if dtype == torch.int64 else 32
    a = _values(dtype, 2 * 80, 4)
    counts = torch.arange(-5, bits + 10, dtype=dtype).repeat(3)[: a.numel()]
    counts = torch.cat([counts, counts.new_zeros(a.numel() - counts.numel())])

    def fn(a, c):
        return (a << c) + 1, (a >> c) - 1, (a << 3) ^ (a >> 70), torch.bitwise_left_shift(a, c) | 1

    _check_fused(fn, a, counts)


DIVISION = {
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("name", sorted(DIVISION))
def test_integer_division_negative_operands_and_min_by_minus_one(name, dtype):
    op = DIVISION[name]
    a = _values(dtype, 4001, 5)
    b = _values(dtype, 4001, 6)
    b[b == 0] = -1
    b[:20] = -1
    # INT_MIN // -1 wraps to INT_MIN, INT_MIN % -1 is 0. (CPU's fmod and trunc division
    # trap on INT_MIN / -1 with SIGFPE, killing the process; the loop gives 0 and INT_MIN.)
    if name not in ("fmod", "div_trunc"):
        a[:10] = torch.iinfo(dtype).min
    else:
        a[a == torch.iinfo(dtype).min] = 0

    def fn(a, b):
        return op(a * 1, b), op(a + 1, 7) - 1, op(a - 1, -3) * 2

    _check_fused(fn, a, b)


def test_index_math_chain_with_python_scalars():
    i = torch.arange(-(2**20), 2**20, 37, dtype=torch.int64) * 1000003

    def fn(i):
        return (((i * 31 + 7) % 1000 // 3),)

    _check_fused(fn, i)


@pytest.mark.parametrize("dst", [torch.int64, torch.int32, torch.bool], ids=["i64", "i32", "bool"])
def test_float_to_int_casts_as_cpu_on_x86(dst):
    inf, nan = float("inf"), float("nan")
    specials = [nan, inf, -inf, 3e9, -3e9, 1e19, -1e19, 2.0**63, -(2.0**63), 2.0**31, -(2.0**31), 2.7, -2.7, -0.5, 0.0]
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.tensor(specials), torch.randn(1000, generator=g) * 1e10, torch.randn(1000, generator=g) * 50])

    def fn(x):
        y = x.to(dst)
        return y, (y.to(torch.int64) + 1) * 3

    _check_fused(fn, x)


def test_int_casts_and_int_to_float():
    a = _values(torch.int64, 3000, 8)

    def fn(a):
        b = a.to(torch.int32)  # keeps the low 32 bits
        c = (b * 3).to(torch.int64) + a
        return b, c, c.to(torch.bool), c.to(torch.float32), (b > 0).to(torch.int32) + b

    _check_fused(fn, a)


def test_where_and_masks_from_integers():
    a, b = _values(torch.int64, 2049, 9), _values(torch.int64, 2049, 10)

    def fn(a, b):
        m = (a % 3 == 0) & (b > 0) | (a < -(2**60))
        return torch.where(m, a, b), m, torch.where(~m, a // 5, b & 7)

    _check_fused(fn, a, b)


def test_in_place_and_broadcast_operands():
    a = _values(torch.int64, 64 * 48, 11).reshape(64, 48)
    row = _values(torch.int64, 48, 12)

    def fn(a, row):
        x = a * 1
        x.mul_(3).add_(row).bitwise_xor_(row >> 2)
        x //= 7
        x %= 1000
        x <<= 3
        x >>= 1
        return x, x > row

    _check_fused(fn, a, row)

    def writes_input(a, row):
        a.add_(row).mul_(5)  # a region input written in place
        return (a,)

    got, ops = flush_on_tpu(writes_input, a, row)
    assert_bit_equal(got, writes_input(a.clone(), row))
    assert ops == [], ops


def test_mixed_float_and_int_loops_in_one_region():
    a = _values(torch.int64, 4096, 13)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(14))

    def fn(a, x):
        k = (a % 5).to(torch.float32)  # int loop, its float value read by the float loop
        y = x * 2.5 + k
        m = (a & 1) == 0
        return y, torch.where(m, y, -y), (y > 0).to(torch.int64) * a

    _check_fused(fn, a, x)


@pytest.mark.parametrize(
    "op", [lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.div(a, b, rounding_mode="trunc")]
)
def test_zero_divisor_raises_zero_division_error_as_cpu(op):
    a = torch.arange(-8, 8)
    b = torch.arange(16) % 5  # zeros
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(a * 3 + 1, b)  # CPU raises at the call
    da, db = a.to("tpu"), b.to("tpu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(da * 3 + 1, db)  # a divisor the host holds: at the call, as CPU
    r = op(da * 3 + 1, db * 1)  # a divisor computed on the device: at the read
    keep = da * 2 + 1  # a tensor recorded after: valid after the error
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        r.cpu()
    torch.testing.assert_close(keep.cpu(), a * 2 + 1)
    # the same region without a zero runs (and raises no more)
    r2 = op(da * 3 + 1, db + 1)
    torch.testing.assert_close(r2.cpu(), op(a * 3 + 1, b + 1))


def test_zero_scalar_divisor_raises():
    a = torch.arange(-8, 8)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (a * 3) // 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (a.to("tpu") * 3) // 0  # at the call, as CPU


def test_float_scalar_operand_keeps_cpu_promotion():
    # int tensor and Python float: CPU computes in float; the integer loop does not take it.
    a = _values(torch.int64, 1000, 15)

    def fn(a):
        return (a * 2) > 2.5, (a + 1) * 0.5

    got, _ = flush_on_tpu(fn, a)
    assert_bit_equal(got, fn(a))


I32_SCALAR_EDGES = {
    "gt_2^40": lambda a: (a * 1) > 2**40,  # the Scalar wraps to the op's type, as CPU casts it
    "eq_2^32+5": lambda a: (a * 1) == 2**32 + 5,
    "add_2^40": lambda a: (a * 1) + 2**40,
    "mul_2^33": lambda a: (a * 1) * 2**33,
    "shl_2^32+1": lambda a: (a * 1) << (2**32 + 1),
    "floordiv_2^32+3": lambda a: (a * 1) // (2**32 + 3),
    "floordiv_2^32": lambda a: (a * 1) // (2**32),  # 0 as int32: ZeroDivisionError
    "clamp_overflow": lambda a: (a * 1).clamp(0, 2**40),  # CPU's Scalar::to<int> raises
    "alpha_overflow": lambda a: torch.add(a * 1, a, alpha=2**40),
    "rem_true": lambda a: (a * 1) % True,
    "and_true": lambda a: (a * 1) & True,
    "pow_2^40": lambda a: (a * 1) ** 2**40,  # CPU's Scalar::to<int> raises
    "pow_true": lambda a: (a * 1) ** True,  # a copy (op by op: bool exponents are not lowered)
}


@pytest.mark.parametrize("name", sorted(I32_SCALAR_EDGES))
def test_int32_scalars_out_of_range_as_cpu(name):
    # Values, or CPU's error type and message (on "tpu" at the call when the record path
    # checks it, as for the overflowing Scalars, else at the flush: the zero divisor).
    fn = I32_SCALAR_EDGES[name]
    a = torch.tensor([5, -5, I32_MAX, I32_MIN, 0, 77], dtype=torch.int32)
    try:
        want, want_err = fn(a), None
    except RuntimeError as e:
        want, want_err = None, str(e)
    if want_err is None:
        assert_bit_equal([fn(a.to("tpu")).cpu()], [want])
    else:
        with pytest.raises(RuntimeError) as info:
            fn(a.to("tpu")).cpu()
        assert want_err in str(info.value)


@pytest.mark.parametrize("name", sorted(DIVISION))
def test_division_quotients_next_to_integers_near_2_pow_53(name):
    # a = q * b + {-1, 0, 1} with |a| up to 2^53 + a few: the float64 quotient the loop
    # starts from rounds across an integer here; its correction step must give CPU's value.
    op = DIVISION[name]
    g = torch.Generator().manual_seed(16)
    b = torch.randint(2, 2**26, (6000,), generator=g) * (torch.randint(0, 2, (6000,), generator=g) * 2 - 1)
    q = torch.randint(-(2**53), 2**53, (6000,), generator=g) // b.abs()
    a = q * b + torch.randint(-1, 2, (6000,), generator=g)
    a[:6] = torch.tensor([2**53 - 1, 2**53, 2**53 + 1, -(2**53) + 1, -(2**53), -(2**53) - 1])
    b[:6] = torch.tensor([3, 3, 3, -3, -3, -3])

    def fn(a, b):
        return op(a + 0, b), op(a - 0, 2**52 + 1)

    _check_fused(fn, a, b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_masked_fill_of_labels(dtype):
    # cross-entropy style labels: positions past a length get ignore_index, in the loop
    y = _values(dtype, 32 * 24, 17).reshape(32, 24)
    lengths = torch.randint(0, 24, (32, 1), generator=torch.Generator().manual_seed(18)).expand(32, 24).contiguous()
    pos = torch.arange(24).expand(32, 24).contiguous()

    def fn(y, lengths, pos):
        m = pos >= lengths
        return y.remainder(1000).masked_fill(m, -100), (y * 2).masked_fill_(~m, 7)

    _check_fused(fn, y, lengths, pos)


POW_EXPONENTS = [0, 1, 2, 3, 5, 31, 32, 62, 63, 64, 1000003]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_sign_and_pow_by_integral_scalars_wrap_as_cpu(dtype):
    # pow: ATen's powi by squaring, wrapped to the type (exponent 0: CPU fills 1; 1: a copy);
    # sign: (0 < a) - (a < 0). Large exponents overflow and wrap as CPU's products do.
    a = _values(dtype, 3001, 5)

    def fn(a):
        outs = [a.sign() * 5 + a, torch.sign(-a) - 1]
        outs += [(a**e) ^ a for e in POW_EXPONENTS]
        return tuple(outs)

    _check_fused(fn, a)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_pow_and_sign_in_place_and_out_as_cpu(dtype):
    a = _values(dtype, 1037, 6)

    def fn(a):
        b = a * 3
        b.pow_(3)
        out = torch.empty_like(a)
        torch.pow(b + 1, 2, out=out)
        s = torch.empty_like(a)
        torch.sign(out - a, out=s)
        return b, out, s

    _check_fused(fn, a)


@pytest.mark.parametrize("src", [torch.int64, torch.int32, torch.bool], ids=["i64", "i32", "bool"])
def test_int_to_float_cast_joins_the_float_loop(src):
    # A cast of an integer or bool tensor into float32 (copy_, as .float() / .to() record it)
    # runs in the float loop of its consumers: the source read converted as CPU's copy
    # converts (int64 to nearest even: values above 2^24 and 2^53 round), alone or broadcast.
    if src == torch.bool:
        a = _values(torch.int64, 4096, 15) > 0
    else:
        a = _values(src, 4096, 15)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(16))
    row = a[:64]

    def fn(a, x, row):
        y = a.float() * x + 1.5
        z = torch.empty(64, 64)
        z.copy_(row)  # broadcast along the leading dim
        return y, torch.sigmoid(a.to(torch.float32)), z * 2

    _check_fused(fn, a, x, row)
