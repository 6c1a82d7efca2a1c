"""Scalars that overflow a float16, bfloat16 or float32 result: the device does what CPU does, at the call.

Per kernel, CPU converts a Scalar argument to the result dtype with
Scalar::to<T>() (fill values, clamp bounds, alpha of add/addmv/addr, pow's
exponent on float16/bfloat16: 1e6 into float16 raises "value cannot be converted
to type c10::Half without overflow"), to float (addcmul's value, addmm's
alpha/beta, threshold's threshold, lerp's weight: only a value beyond float's
range raises), or wraps it into a 0-dim tensor without a check (h + 1e6,
h * 1e6, h / 1e-6, where: the result holds inf). inf and NaN convert to every
floating type. Each case runs on CPU first and the device must match it: the
same exception type and message at the call (before any value is read), or
no exception and CPU's values. The call forms are those of
tests/record/test_scalar_overflow.py plus the ops tools/sweep_scalar_conversions.py
found in op_db, and ops whose Scalars CPU does not check.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)
from test_scalar_overflow import CASES, _m, _t


def _r(dev, dtype, *shape):
    # Deterministic non-zero values (CPU and tpu get the same ones).
    n = math.prod(shape)
    return ((torch.arange(n, dtype=torch.float32) % 5 - 2) / 4).reshape(shape).to(dtype).to(dev)


# Call forms the integer sweep does not have: ops found by the CPU sweep, and
# ops whose Scalar CPU wraps or converts to double (must not raise where CPU does not).
FLOAT_CASES = {
    "_add_relu_alpha": lambda d, dt, v: torch.ops.aten._add_relu(_t(d, dt), _t(d, dt), alpha=v),
    "addcdiv": lambda d, dt, v: torch.addcdiv(_t(d, dt), _t(d, dt), _r(d, dt, 4) + 3, value=v),
    "index_add_alpha": lambda d, dt, v: _t(d, dt).index_add(0, torch.tensor([1], device=d), _r(d, dt, 1), alpha=v),
    "hardshrink": lambda d, dt, v: F.hardshrink(_r(d, dt, 4), v),
    "hardtanh_max": lambda d, dt, v: F.hardtanh(_r(d, dt, 4), -1.0, v),
    "hardtanh_both": lambda d, dt, v: F.hardtanh(_r(d, dt, 4), -v, v),
    "elu_alpha": lambda d, dt, v: F.elu(_r(d, dt, 4), alpha=v),
    "elu_input_scale": lambda d, dt, v: torch.ops.aten.elu(_r(d, dt, 4), 1.0, 1.0, v),
    "rrelu_with_noise_lower": lambda d, dt, v: torch.ops.aten.rrelu_with_noise(_r(d, dt, 4), _t(d, dt), -v, v),
    "softplus_beta": lambda d, dt, v: F.softplus(_r(d, dt, 4), beta=v),
    "softplus_threshold": lambda d, dt, v: F.softplus(_r(d, dt, 4), threshold=v),
    "lerp_weight": lambda d, dt, v: torch.lerp(_r(d, dt, 4), _t(d, dt), v),
    "histc_max": lambda d, dt, v: torch.histc(_r(d, dt, 4), bins=3, min=-1, max=v),
    "histc_min": lambda d, dt, v: torch.histc(_r(d, dt, 4), bins=3, min=-v, max=v),
    "multi_margin_loss_margin": lambda d, dt, v: F.multi_margin_loss(
        _r(d, dt, 2, 3), torch.tensor([0, 2], device=d), margin=v
    ),
    "scalar_tensor": lambda d, dt, v: torch.scalar_tensor(v, dtype=dt, device=d),
    "pow_exponent_nonzero_base": lambda d, dt, v: torch.pow(_r(d, dt, 4), v),
    "clamp_both": lambda d, dt, v: torch.clamp(_r(d, dt, 4), min=-v, max=v),
    "add_other": lambda d, dt, v: _r(d, dt, 4) + v,
    "sub_other": lambda d, dt, v: _r(d, dt, 4) - v,
    "rsub_other": lambda d, dt, v: v - _r(d, dt, 4),
    "mul_other": lambda d, dt, v: _r(d, dt, 4) * v,
    "div_other": lambda d, dt, v: _r(d, dt, 4) / v,
    "div_by_reciprocal": lambda d, dt, v: _r(d, dt, 4) / (1 / v),
    "eq_other": lambda d, dt, v: _r(d, dt, 4) == v,
    "copysign_other": lambda d, dt, v: torch.copysign(_r(d, dt, 4), v),
    "where_scalar_both": lambda d, dt, v: torch.where(_m(d), v, _r(d, dt, 4)),
    "leaky_relu_slope": lambda d, dt, v: F.leaky_relu(_r(d, dt, 4), v),
    "celu_alpha": lambda d, dt, v: F.celu(_r(d, dt, 4), alpha=v),
    "remainder_other": lambda d, dt, v: torch.remainder(_r(d, dt, 4), v),
    "fmod_other": lambda d, dt, v: torch.fmod(_r(d, dt, 4), v),
    "addmm_alpha_values": lambda d, dt, v: torch.addmm(_r(d, dt, 2, 2), _r(d, dt, 2, 2), _r(d, dt, 2, 2), alpha=v),
    "addcmul_values": lambda d, dt, v: torch.addcmul(_r(d, dt, 4), _r(d, dt, 4), _r(d, dt, 4), value=v),
    "add_alpha_values": lambda d, dt, v: torch.add(_r(d, dt, 4), _r(d, dt, 4), alpha=v),
}
ALL_CASES = {**CASES, **FLOAT_CASES}

# (dtype, value): a value that overflows float16 but not float (1e6, 70000 as
# an int), bfloat16 but not float (3.4e38), float (1e39), complex<float> and
# complex<Half> (real or imaginary part), non-finite values, and a complex value
# into a real dtype.
VALUES = (
    [(torch.float16, v) for v in (1e6, -1e6, 70000, 1e39, math.inf, -math.inf, math.nan)]
    + [(torch.bfloat16, v) for v in (3.4e38, -3.4e38, 1e39, math.inf, math.nan)]
    + [(torch.float32, v) for v in (1e39, -1e39, math.inf, math.nan)]
    + [(torch.float64, v) for v in (1e39, math.inf)]
    + [(torch.complex64, v) for v in (1e39, 1e39j, complex(math.inf, 0))]
    + [(torch.complex32, v) for v in (1e6, 1e6j)]
    + [(d, 1j) for d in (torch.float16, torch.float32, torch.float64)]
)  # a complex value into a real type
FITS = 2.0  # fits every dtype


def _call(fn):
    """("ok", result) or (exception type, first line of its message) of the call alone (no read back)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return type(e), str(e).split("\n")[0]


def _same_values(tpu, cpu):
    if isinstance(cpu, torch.Tensor):
        torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True)
    else:
        assert tpu == cpu


@pytest.mark.parametrize("dtype,value", VALUES, ids=[f"{str(d)[6:]}-{v}" for d, v in VALUES])
@pytest.mark.parametrize("name", list(ALL_CASES))
def test_scalar_into_a_float_result_behaves_like_cpu_at_the_call(name, dtype, value):
    fn = ALL_CASES[name]
    cpu = _call(lambda: fn("cpu", dtype, value))
    if cpu[0] is NotImplementedError:
        # A complex value promotes to a complex dtype the kernel lacks (the unsupported-dtype finding).
        pytest.skip(f"CPU has no kernel for the promoted dtype: {cpu[1]}")
    cpu_fits = _call(lambda: fn("cpu", dtype, FITS))
    if cpu_fits[0] != "ok":
        # Whatever the value (a kernel without this dtype: record/test_errors_at_the_call.py).
        pytest.skip(f"CPU rejects this call form for {dtype}: {cpu_fits[1]}")
    # A fitting call first fills the meta cache for (op, Scalar type).
    tpu_fits = _call(lambda: fn("tpu", dtype, FITS))
    assert tpu_fits[0] == "ok", tpu_fits
    _same_values(tpu_fits[1], cpu_fits[1])
    pending = torch.arange(4, device="tpu") * 2  # queued work that must survive the error
    tpu = _call(lambda: fn("tpu", dtype, value))
    assert tpu[0] == cpu[0], f"cpu: {cpu}, tpu: {tpu}"
    if cpu[0] == "ok":
        _same_values(tpu[1], cpu[1])
    else:
        assert tpu[1] == cpu[1]
    torch.testing.assert_close(pending.cpu(), torch.arange(4) * 2)


def test_the_sweep_has_rows_and_non_rows():
    # Guards the sweep against going vacuous: float16 1e6 is rejected by CPU in
    # the converting cases and accepted in the wrapping ones.
    def rejects(name):
        kind, msg = _call(lambda: ALL_CASES[name]("cpu", torch.float16, 1e6))
        return kind is RuntimeError and "c10::Half without overflow" in msg

    for name in (
        "full",
        "fill_",
        "masked_fill",
        "clamp_min",
        "add_alpha",
        "pow_exponent",
        "hardtanh_max",
        "index_fill",
        "addmv",
        "threshold_value",
    ):
        assert rejects(name), name
    for name in (
        "add_other",
        "mul_other",
        "div_other",
        "where_scalar",
        "lerp_weight",
        "threshold_threshold",
        "addcmul",
        "addmm_alpha",
        "scalar_tensor",
    ):
        assert not rejects(name), name


@pytest.mark.parametrize(
    "op",
    [
        lambda d: torch.addmm(
            torch.zeros(2, 2, dtype=torch.half, device=d),
            torch.zeros(2, 0, dtype=torch.half, device=d),
            torch.zeros(0, 2, dtype=torch.half, device=d),
            alpha=1e39,
        ),
        lambda d: torch.addmv(
            torch.zeros(2, dtype=torch.half, device=d),
            torch.zeros(2, 0, dtype=torch.half, device=d),
            torch.zeros(0, dtype=torch.half, device=d),
            beta=1e6,
        ),
        lambda d: torch.addmv(
            torch.zeros(2, dtype=torch.int8, device=d),
            torch.zeros(2, 0, dtype=torch.int8, device=d),
            torch.zeros(0, dtype=torch.int8, device=d),
            alpha=300,
        ),
        lambda d: torch.addmv(
            torch.zeros(2, dtype=torch.int8, device=d),
            torch.zeros(2, 0, dtype=torch.int8, device=d),
            torch.zeros(0, dtype=torch.int8, device=d),
            beta=300,
        ),
        lambda d: torch.baddbmm(
            torch.zeros(1, 2, 2, dtype=torch.half, device=d),
            torch.zeros(1, 2, 0, dtype=torch.half, device=d),
            torch.zeros(1, 0, 2, dtype=torch.half, device=d),
            beta=1e39,
        ),
        lambda d: torch.constant_pad_nd(torch.arange(4, dtype=torch.half, device=d), (0, -1), 1e6),
        lambda d: torch.constant_pad_nd(torch.arange(4, dtype=torch.int8, device=d), (-1, 0), 300),
        lambda d: torch.constant_pad_nd(torch.arange(4, dtype=torch.half, device=d), (1, -1), 1e6),
        lambda d: torch.linspace(1e6, 0, 1, dtype=torch.half, device=d),
        lambda d: torch.logspace(0, 1e6, 0, dtype=torch.half, device=d),
        lambda d: torch.zeros(4, dtype=torch.half, device=d).scatter(
            0, torch.zeros(0, dtype=torch.long, device=d), 1e6
        ),
        lambda d: torch.empty(0, dtype=torch.half, device=d).fill_(1e6),
    ],
    ids=[
        "addmm_k0",
        "addmv_k0_beta",
        "int8_addmv_k0_alpha",
        "int8_addmv_k0_beta",
        "baddbmm_k0",
        "pad_narrows",
        "int8_pad_narrows",
        "pad_grows",
        "linspace_1_step",
        "logspace_0_steps",
        "scatter_no_index",
        "fill_empty",
    ],
)
def test_shapes_where_cpu_skips_the_conversion(op):
    # CPU converts some Scalars only when the shapes need them (an empty
    # matmul, a pad that only narrows, one step): the device then runs CPU's
    # kernel, so it raises exactly where CPU raises.
    cpu = _call(lambda: op("cpu"))
    tpu = _call(lambda: op("tpu"))
    assert tpu[0] == cpu[0], f"cpu: {cpu}, tpu: {tpu}"
    if cpu[0] == "ok":
        _same_values(tpu[1], cpu[1])
    else:
        assert tpu[1] == cpu[1]


def test_queue_and_tensors_stay_valid_after_a_float16_overflow():
    a = torch.arange(6, dtype=torch.float16, device="tpu")
    b = a * 2  # pending
    c = torch.ones(3, dtype=torch.bfloat16, device="tpu") + 1  # pending
    with pytest.raises(RuntimeError, match="c10::Half without overflow"):
        a.fill_(1e6)
    with pytest.raises(RuntimeError, match="c10::Half without overflow"):
        a.clamp_(max=-70000)
    with pytest.raises(RuntimeError, match="c10::BFloat16 without overflow"):
        c.masked_fill_(c > 0, 3.4e38)
    with pytest.raises(RuntimeError, match="type float without overflow"):
        torch.ones(2, device="tpu").add_(torch.ones(2, device="tpu"), alpha=1e39)
    torch.testing.assert_close(a.cpu(), torch.arange(6, dtype=torch.float16))  # untouched
    torch.testing.assert_close(b.cpu(), torch.arange(6, dtype=torch.float16) * 2)
    torch.testing.assert_close(c.cpu(), torch.full((3,), 2, dtype=torch.bfloat16))
    torch.testing.assert_close(a.fill_(7).cpu(), torch.full((6,), 7, dtype=torch.float16))
