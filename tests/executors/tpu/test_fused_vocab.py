"""The fused loops' wider vocabulary (kLowerings in csrc/executors/tpu/fused_elementwise.cpp):
comparisons with bool results, where, clamp, pow by 2 and 3, maximum / minimum, rsub, sign,
silu, erf, gelu and the backward formulas of gelu, relu, sigmoid, tanh and silu, in float32,
bfloat16 and float16 (computed in float32 and rounded to the type per op, as CPU's kernels
store them). Each op runs behind a negation, so the two are one fused region; the flush
must then run no ATen op on the host (fused), and the result must equal CPU's bit for bit.
The exceptions, named where they are tested:
- "tail": gelu(approximate='tanh') and its backward, and bfloat16 / float16 silu, silu_backward and erf call
  libm in CPU's scalar loop (the last elements of each thread's range, fewer than two
  vectors) and at::vec's routines in its vector loop, which the fused loop follows: bit-equal
  when CPU's vector loop takes every element, within 1 ulp otherwise.
- "routines": CPU runs gelu and gelu_backward (approximate='none') of contiguous tensors
  through oneDNN's kernels and float32 erf and sqrt (pow 0.5) through MKL's VML; with
  set_fused_math("cpu") the fused loop calls the same routines (bit-equal), by default
  ("sleef") at::vec's, within the bounds tested here and documented in fused_program.h."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, aten_ops_during

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops are the tpu executor's")

if DEVICE == "tpu":
    import torch_tpu_eager

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
ALL = (F32, BF16, F16)
aten = torch.ops.aten

EXACT, TAIL, ROUTINES = "exact", "tail", "routines"
# name -> (program of x, y, mask, types that fuse, how it compares with CPU: see the docstring)
OPS = {
    "add": (lambda x, y, m: x + y, ALL, EXACT),
    "add_scalar": (lambda x, y, m: x + 0.1, ALL, EXACT),
    "sub": (lambda x, y, m: x - y, ALL, EXACT),
    "sub_alpha2": (lambda x, y, m: torch.sub(x, y, alpha=2), (F32,), EXACT),
    "sub_scalar": (lambda x, y, m: x - 0.3, ALL, EXACT),
    "rsub_scalar": (lambda x, y, m: 1.0 - x, ALL, EXACT),
    "rsub": (lambda x, y, m: torch.rsub(x, y), ALL, EXACT),
    "mul": (lambda x, y, m: x * y, ALL, EXACT),
    "mul_scalar": (lambda x, y, m: x * 0.1, ALL, EXACT),
    "div": (lambda x, y, m: x / y, ALL, EXACT),
    "div_scalar": (lambda x, y, m: x / 0.3, ALL, EXACT),
    "eq": (lambda x, y, m: x == y, ALL, EXACT),
    "ne": (lambda x, y, m: x != y, ALL, EXACT),
    "lt": (lambda x, y, m: x < y, ALL, EXACT),
    "le": (lambda x, y, m: x <= y, ALL, EXACT),
    "gt": (lambda x, y, m: x > y, ALL, EXACT),
    "ge": (lambda x, y, m: x >= y, ALL, EXACT),
    "eq_scalar": (lambda x, y, m: x == 0.5, ALL, EXACT),
    "lt_scalar": (lambda x, y, m: x < 0.1, ALL, EXACT),
    "ge_scalar": (lambda x, y, m: x >= -0.3, ALL, EXACT),
    "where_cmp": (lambda x, y, m: torch.where(x > y, x, y * 2.0), ALL, EXACT),
    "where_mask": (lambda x, y, m: torch.where(m, x, y), ALL, EXACT),
    "masked_fill": (lambda x, y, m: x.masked_fill(m, 0.3), ALL, EXACT),
    "clamp": (lambda x, y, m: x.clamp(-0.5, 0.7), ALL, EXACT),
    "clamp_min": (lambda x, y, m: x.clamp_min(0.1), ALL, EXACT),
    "clamp_max": (lambda x, y, m: x.clamp(max=0.2), ALL, EXACT),
    "clamp_tensor": (lambda x, y, m: x.clamp(y, y + 1.0), ALL, EXACT),
    "clamp_min_tensor": (lambda x, y, m: x.clamp_min(y), ALL, EXACT),
    "maximum": (lambda x, y, m: torch.maximum(x, y), ALL, EXACT),
    "minimum": (lambda x, y, m: torch.minimum(x, y), ALL, EXACT),
    "pow2": (lambda x, y, m: x**2, (F32, BF16), EXACT),
    "square": (lambda x, y, m: x.square(), (F32, BF16), EXACT),
    "pow3": (lambda x, y, m: x**3, (F32, BF16), EXACT),
    "pow_half": (lambda x, y, m: x.abs() ** 0.5, (F32,), ROUTINES),
    "pow_other": (lambda x, y, m: x.abs() ** 1.7, (), EXACT),
    "sign": (lambda x, y, m: x.sign(), ALL, EXACT),
    "relu": (lambda x, y, m: x.relu(), ALL, EXACT),
    "threshold_backward": (lambda x, y, m: aten.threshold_backward(y, x, 0.0), ALL, EXACT),
    "sigmoid_backward": (lambda x, y, m: aten.sigmoid_backward(y, x), (F32, BF16), EXACT),
    "tanh_backward": (lambda x, y, m: aten.tanh_backward(y, x), ALL, EXACT),
    "gelu": (lambda x, y, m: F.gelu(x), ALL, ROUTINES),
    "gelu_tanh": (lambda x, y, m: F.gelu(x, approximate="tanh"), ALL, TAIL),
    "gelu_backward": (lambda x, y, m: aten.gelu_backward(y, x), ALL, ROUTINES),
    "gelu_tanh_backward": (lambda x, y, m: aten.gelu_backward(y, x, approximate="tanh"), ALL, TAIL),
    "silu": (lambda x, y, m: F.silu(x), ALL, TAIL),
    "silu_backward": (lambda x, y, m: aten.silu_backward(y, x), ALL, TAIL),
    "erf": (lambda x, y, m: x.erf(), ALL, ROUTINES),
}


# What a fused loop's tile runs under set_fused_math("cpu") for gelu / gelu_backward ('none').
LIBRARY_TILE_OPS = {"aten::gelu", "aten::gelu_backward", "aten::to", "aten::_to_copy", "aten::copy_"}
LIBRARY_TILE_OPS |= {"aten::empty_like", "aten::empty_strided", "aten::empty"}


@pytest.fixture
def mode():
    from difftest import restoring

    yield from restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math)


SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 0.5, 3e-39, 65504.0, 1e30]


def _inputs(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3.0
    y = torch.randn(n, generator=g) * 3.0
    same = torch.rand(n, generator=g) < 0.2  # equal pairs for the comparisons
    y = torch.where(same, x, y)
    k = min(n, len(SPECIALS))
    x[:k] = torch.tensor(SPECIALS[:k])
    y[n - k :] = torch.tensor(SPECIALS[:k])
    m = torch.rand(n, generator=g) < 0.5
    return x.to(dtype), y.to(dtype), m


def _ordered(t):
    """Integers in the order of the values (for ulp distances), NaN excluded by the caller."""
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    i = t.view(bits).long()
    sign = 1 << (torch.finfo(t.dtype).bits - 1)
    return torch.where(i < 0, -(i & (sign - 1)), i)


def _assert_bits_equal(got, want, ulps=0):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.bool:
        assert torch.equal(got, want)
        return
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), "NaN in different places"
    if ulps == 0:
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[want.dtype]
        diff = (got.view(bits) != want.view(bits)) & ~nan
        assert not diff.any(), f"{int(diff.sum())} values differ, first at {diff.nonzero()[:5].flatten().tolist()}"
    else:
        dist = (_ordered(got) - _ordered(want)).abs()[~nan]
        assert int(dist.max()) <= ulps if dist.numel() else True


def _run(prog, x, y, m):
    """(result of prog(-x, y, m) on "tpu", the ATen ops its flush ran)."""
    xd, yd, md = x.to("tpu"), y.to("tpu"), m.to("tpu")
    torch.tpu.synchronize()
    out = prog(-xd, yd, md)
    ops = aten_ops_during(torch.tpu.synchronize)
    return out.cpu(), ops


# 4,099: partial vectors and tiles, and CPU's scalar loop takes its last 3 elements
# (AVX2: 16 per step; AVX512: 32); 2,048: CPU's vector loop takes every element.
@pytest.mark.parametrize("n", [2048, 4099])
@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", OPS)
def test_op_matches_cpu_and_fuses(mode, name, dtype, n):
    prog, fuses, how = OPS[name]
    if how == ROUTINES:
        mode("cpu")  # CPU's routines: bit-equal (the default's bounds: test_sleef_mode_bounds)
    x, y, m = _inputs(n, dtype, seed=len(name) + n)
    got, ops = _run(prog, x, y, m)
    want = prog(-x, y, m)
    if dtype in fuses and how == ROUTINES:
        # The loop calls CPU's gelu / gelu_backward on each tile (no other op of the region runs alone).
        assert "aten::neg" not in ops and set(ops) <= LIBRARY_TILE_OPS, ops
    elif dtype in fuses:
        assert ops == [], f"{name} in {dtype} should run in the fused loop, ran {ops}"
    vector_only = n % 32 == 0  # CPU's vector loop (2 x 16 floats at AVX512) takes every element
    tail = how == TAIL or (name == "erf" and dtype != F32)  # reduced erf: at::vec's, libm in CPU's tail
    # CPU's scalar tail recomputed (for_each_cpu_tail)
    tail = tail and not (name in ("silu", "silu_backward") and dtype == F32)
    _assert_bits_equal(got, want, ulps=1 if tail and not vector_only else 0)


# Default fused math ("sleef"): at::vec's erf / exp (ATen's own gelu kernel, which CPU runs
# when oneDNN does not) and the correctly rounded sqrt. Bounds on finite inputs, |x| <= 12,
# |grad| <= 12: absolute error <= 16 float32 eps (gelu; gelu_backward per unit of grad),
# 8 eps for erf, 1 ulp for sqrt; bfloat16 / float16 results within 1 ulp of the type.
@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", ["gelu", "gelu_backward", "erf", "pow_half"])
def test_sleef_mode_bounds(mode, name, dtype):
    mode("sleef")
    prog, fuses, _ = OPS[name]
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(4099, generator=g) * 24 - 12).to(dtype)
    y = (torch.rand(4099, generator=g) * 24 - 12).to(dtype)
    m = torch.zeros(4099, dtype=torch.bool)
    got, ops = _run(prog, x, y, m)
    want = prog(-x, y, m)
    if dtype in fuses:
        assert ops == [], ops
    if name == "pow_half" or (name == "erf" and dtype != F32):
        _assert_bits_equal(got, want, ulps=1)
        return
    # oneDNN flushes subnormal results to zero: absolute bounds, plus one ulp of the type.
    eps32 = torch.finfo(F32).eps
    scale = y.float().abs().clamp_min(1.0) if name == "gelu_backward" else 1.0
    bound = (8 if name == "erf" else 16) * eps32 * scale + torch.finfo(dtype).eps * want.float().abs()
    assert ((got.float() - want.float()).abs() <= bound).all()


@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", ["gelu", "gelu_backward"])
def test_sleef_mode_gelu_equals_aten_kernel(mode, name, dtype):
    """By default the loop computes ATen's own gelu formula (at::vec's erf, its SLEEF exp
    inlined): bit-equal to CPU's kernel when oneDNN is off, where CPU's vector loop takes
    every element (2,048), special values included."""
    mode("sleef")
    prog = OPS[name][0]
    x, y, m = _inputs(2048, dtype, seed=len(name))
    got, ops = _run(prog, x, y, m)
    assert ops == [], ops
    with torch.backends.mkldnn.flags(enabled=False):
        want = prog(-x, y, m)
    _assert_bits_equal(got, want)


@pytest.mark.parametrize("dtype", (BF16, F16), ids=["bf16", "f16"])
def test_every_reduced_value_through_unary_ops(mode, dtype):
    # All 65,536 bit patterns of the type, through each unary op and a chain of several:
    # each op's result is rounded to the type before the next reads it, as CPU stores it.
    mode("cpu")  # gelu ('none') through CPU's routine
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    progs = [
        lambda t: (-t).relu(),
        lambda t: (-t).sign(),
        lambda t: (-t).clamp(-2.0, 3.0),
        lambda t: (-t).abs() * 0.3 + 0.1,
        lambda t: ((-t) * 1.7 - 0.2) / 3.0,
        lambda t: torch.where(t > 0.25, t * 3.0, -t),
        lambda t: F.gelu(-t),  # 65,536: every element in CPU's vector loop
        lambda t: aten.gelu_backward(t, -t),
        lambda t: F.silu(-t),
    ]
    if dtype == BF16:
        progs += [lambda t: (-t) ** 2 * 0.5, lambda t: (-t) ** 3]
    for prog in progs:
        xd = x.to("tpu")
        torch.tpu.synchronize()
        out = prog(xd)
        ops = aten_ops_during(torch.tpu.synchronize)
        assert "aten::neg" not in ops and set(ops) <= LIBRARY_TILE_OPS, ops
        _assert_bits_equal(out.cpu(), prog(x))


@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
def test_random_binary_pairs_bit_equal(dtype):
    # Many random pairs (a wide exponent range) through the exact binary ops and the
    # backward formulas, in one fused loop with a bool result and a select.
    g = torch.Generator().manual_seed(7)
    n = 1 << 16
    x = (torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())).to(dtype)
    y = (torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())).to(dtype)

    def prog(a, b):
        s = -a + b
        p = s * b
        q = p / (b - 0.5)
        c = q > s
        r = torch.where(c, torch.maximum(q, b), torch.minimum(s, p))
        t = aten.tanh_backward(r, b) + aten.threshold_backward(q, s, 0.0)
        return c, t.clamp(-1e3, 1e3)

    xd, yd = x.to("tpu"), y.to("tpu")
    torch.tpu.synchronize()
    out = prog(xd, yd)
    ops = aten_ops_during(torch.tpu.synchronize)
    assert ops == [], ops
    for got, want in zip(out, prog(x, y)):
        _assert_bits_equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
def test_broadcast_and_zero_dim_operands(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 129, generator=g) * 2).to(dtype)
    bias = torch.randn(129, generator=g).to(dtype)
    scale = torch.tensor(0.7, dtype=dtype)  # a 0-dim tensor: a runtime constant of the loop

    def prog(a, b, s):
        h = F.gelu(-a + b, approximate="tanh") * s
        return torch.where(h > b, h, b).clamp_min(b)

    xd, bd, sd = x.to("tpu"), bias.to("tpu"), scale.to("tpu")
    torch.tpu.synchronize()
    out = prog(xd, bd, sd)
    ops = aten_ops_during(torch.tpu.synchronize)
    assert ops == [], ops
    _assert_bits_equal(out.cpu(), prog(x, bias, scale), ulps=1)  # gelu: CPU's scalar tail per row


@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
def test_non_contiguous_inputs_match_cpu(dtype, mode):
    # Transposed and strided inputs do not take the contiguous loop; values must still be CPU's.
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(64, 48, generator=g) * 2).to(dtype)
    y = (torch.randn(48, 128, generator=g) * 2).to(dtype)

    def prog(a, b):
        h = torch.maximum(-a, b[:, ::2].t())
        return h, torch.where(h > 0.5, aten.gelu_backward(h, a), h.clamp(-1.0, 1.0))

    # Partition may fuse these ops around the strided reads; with CPU's routines for
    # gelu_backward's erf/exp (set_fused_math("cpu")) every value is CPU's bit for bit.
    torch_tpu_eager.set_fused_math("cpu")  # restored by the `mode` fixture
    xd, yd = x.to("tpu"), y.to("tpu")
    for got, want in zip(prog(xd, yd), prog(x, y)):
        _assert_bits_equal(got.cpu(), want)


def test_in_place_and_out_forms():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)

    def prog(a, b):
        a = a * 1.5
        a.clamp_(-1.0, 1.0)
        a.pow_(2)
        out = torch.empty_like(a)
        torch.maximum(a, b, out=out)
        mask = torch.empty(a.shape, dtype=torch.bool, device=a.device)
        torch.gt(out, 0.25, out=mask)
        return a, out, mask, torch.where(mask, out, a)

    xd, yd = x.to("tpu"), y.to("tpu")
    for got, want in zip(prog(xd, yd), prog(x, y)):
        _assert_bits_equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", ALL, ids=["f32", "bf16", "f16"])
def test_scalar_arguments_enter_as_cpus_kernel_takes_them(dtype):
    # Thresholds and bounds that round up or down in bfloat16 / float16, and values equal
    # to their rounded forms: CPU compares a reduced self with threshold_backward's
    # threshold in float32, and casts clamp's bounds, where's comparison scalar and
    # masked_fill's value to the tensor's type.
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(3000, generator=g) * 0.3).to(dtype)
    grad = torch.randn(3000, generator=g).to(dtype)
    for i, v in enumerate((0.1, 0.3, 0.3333, 0.7)):
        x[i * 20 : i * 20 + 10] = v  # rounded to the type

    def prog(a, gr):
        a = -(-a)
        out = [aten.threshold_backward(gr * 1.0, a, t) for t in (0.1, 0.3, 0.3333)]
        out.append(a.clamp(0.1, 0.3))
        out.append(torch.where(a > 0.3, a, gr))
        out.append(a.masked_fill(a <= 0.7, 0.3333))
        return out

    got = prog(x.to("tpu"), grad.to("tpu"))
    for gt, want in zip(got, prog(x, grad)):
        _assert_bits_equal(gt.cpu(), want)


def test_sum_of_two_zero_dim_tensors_runs_and_matches():
    # Both operands runtime constants (torch.trapz(y) adds y[0] and y[-1]): no loop operand
    # to read from memory, so the op does not plan; it must still run and equal CPU.
    y = torch.randn(6)
    yd = y.to("tpu")
    for got, want in ((yd[0] + yd[-1]) * 0.5, (y[0] + y[-1]) * 0.5), (torch.trapz(yd), torch.trapz(y)):
        _assert_bits_equal(got.cpu(), want)
    _assert_bits_equal((1.0 - yd[2] - yd[3]).cpu(), 1.0 - y[2] - y[3])


def test_pow_exponent_is_guarded_per_run():
    # One recorded program, two exponents: the cached loop must not reuse the first.
    x = torch.randn(512)
    xd = x.to("tpu")
    for e in (2.0, 3.0, 2.0, 1.7):
        _assert_bits_equal(((-xd) ** e).cpu(), (-x) ** e)


def test_sub_alpha_on_bfloat16_runs_op_by_op_and_matches():
    # CPU's scalar loop rounds alpha * other to bfloat16 first: only alpha = +-1 fuses.
    x, y = torch.randn(100).bfloat16(), torch.randn(100).bfloat16()
    got, ops = _run(lambda a, b, m: torch.sub(a, b, alpha=3), x, y, torch.zeros(100, dtype=torch.bool))
    assert any("sub" in o for o in ops), ops
    _assert_bits_equal(got, torch.sub(-x, y, alpha=3))


def test_debug_metrics_count_the_new_ops_as_fused():
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F, torch_tpu_eager as tte
        x = torch.randn(64, 64).to("tpu")
        y = torch.randn(64, 64).to("tpu")
        g = torch.ops.aten.gelu_backward(y, F.gelu(x * 2.0))
        torch.where(g > 0, g, x.clamp(-1, 1)).cpu()
        print(tte.metrics_report())
    """)
    env = dict(os.environ, TORCH_TPU_DEBUG="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for op in ("gelu", "gelu_backward", "gt.Scalar", "where.self", "clamp"):
        assert f"  fused.{op}: 1\n" in proc.stdout, (op, proc.stdout)
    assert "op_by_op." not in proc.stdout, proc.stdout
