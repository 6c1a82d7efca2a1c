"""A Scalar that does not fit the integer dtype CPU's kernel converts it to raises at the call.

CPU's kernels convert fill values, alpha/beta, clamp bounds, thresholds, pad
values, linspace ends and integer exponents with an overflow check and raise
RuntimeError("value cannot be converted to type int8_t without overflow") at the
call. The device must raise the same error at the call (not at the next flush),
also when an earlier call with a fitting value filled the meta cache (which keys
Scalars by type), and leave the queue and other tensors valid.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


def _t(dev, dtype, n=4):
    return torch.zeros(n, dtype=dtype, device=dev)


def _m(dev):
    return torch.ones(4, dtype=torch.bool, device=dev)


# name -> fn(dev, dtype, value): one op call whose `value` CPU converts to `dtype`.
CASES = {
    "full": lambda d, dt, v: torch.full((3,), v, dtype=dt, device=d),
    "full_like": lambda d, dt, v: torch.full_like(_t(d, dt), v),
    "new_full": lambda d, dt, v: _t(d, dt).new_full((3,), v),
    "fill_": lambda d, dt, v: _t(d, dt).fill_(v),
    "fill": lambda d, dt, v: torch.fill(_t(d, dt), v),
    "fill_diagonal_": lambda d, dt, v: torch.zeros(3, 3, dtype=dt, device=d).fill_diagonal_(v),
    "masked_fill": lambda d, dt, v: _t(d, dt).masked_fill(_m(d), v),
    "masked_fill_": lambda d, dt, v: _t(d, dt).masked_fill_(_m(d), v),
    "masked_fill_cpu_0dim_value": lambda d, dt, v: _t(d, dt).masked_fill(_m(d), torch.tensor(v)),
    "index_fill": lambda d, dt, v: _t(d, dt).index_fill(0, torch.tensor([1], device=d), v),
    "index_fill_cpu_0dim_value": lambda d, dt, v: _t(d, dt).index_fill(0, torch.tensor([1], device=d), torch.tensor(v)),
    "scatter_value": lambda d, dt, v: _t(d, dt).scatter(0, torch.tensor([1], device=d), v),
    "scatter_value_reduce": lambda d, dt, v: _t(d, dt).scatter(0, torch.tensor([1], device=d), v, reduce="add"),
    "where_scalar": lambda d, dt, v: torch.where(_m(d), _t(d, dt), v),
    "constant_pad": lambda d, dt, v: F.pad(_t(d, dt), (1, 1), value=v),
    "add_alpha": lambda d, dt, v: torch.add(_t(d, dt), _t(d, dt), alpha=v),
    "add_scalar_alpha": lambda d, dt, v: torch.add(_t(d, dt), 1, alpha=v),
    "add__alpha": lambda d, dt, v: _t(d, dt).add_(_t(d, dt), alpha=v),
    "sub_alpha": lambda d, dt, v: torch.sub(_t(d, dt), _t(d, dt), alpha=v),
    "rsub_alpha": lambda d, dt, v: torch.rsub(_t(d, dt), 1, alpha=v),
    "addcmul": lambda d, dt, v: torch.addcmul(_t(d, dt), _t(d, dt), _t(d, dt), value=v),
    "addmm_alpha": lambda d, dt, v: torch.addmm(
        torch.zeros(2, 2, dtype=dt, device=d),
        torch.zeros(2, 2, dtype=dt, device=d),
        torch.zeros(2, 2, dtype=dt, device=d),
        alpha=v,
    ),
    "addmm_beta": lambda d, dt, v: torch.addmm(
        torch.zeros(2, 2, dtype=dt, device=d),
        torch.zeros(2, 2, dtype=dt, device=d),
        torch.zeros(2, 2, dtype=dt, device=d),
        beta=v,
    ),
    "addmv": lambda d, dt, v: torch.addmv(_t(d, dt, 2), torch.zeros(2, 2, dtype=dt, device=d), _t(d, dt, 2), alpha=v),
    "addr": lambda d, dt, v: torch.addr(torch.zeros(2, 2, dtype=dt, device=d), _t(d, dt, 2), _t(d, dt, 2), beta=v),
    "baddbmm": lambda d, dt, v: torch.baddbmm(*[torch.zeros(1, 2, 2, dtype=dt, device=d)] * 3, alpha=v),
    "addbmm": lambda d, dt, v: torch.addbmm(
        torch.zeros(2, 2, dtype=dt, device=d), *[torch.zeros(1, 2, 2, dtype=dt, device=d)] * 2, beta=v
    ),
    "clamp_min": lambda d, dt, v: torch.clamp(_t(d, dt), min=v),
    "clamp_max": lambda d, dt, v: torch.clamp(_t(d, dt), max=v),
    "clamp_min_fn": lambda d, dt, v: torch.clamp_min(_t(d, dt), v),
    "clamp__": lambda d, dt, v: _t(d, dt).clamp_(max=v),
    "threshold_value": lambda d, dt, v: F.threshold(_t(d, dt), 0, v),
    "threshold_threshold": lambda d, dt, v: F.threshold(_t(d, dt), v, 0),
    "linspace": lambda d, dt, v: torch.linspace(0, v, 3, dtype=dt, device=d),
    "logspace": lambda d, dt, v: torch.logspace(0, v, 3, dtype=dt, device=d),
    "pow_exponent": lambda d, dt, v: torch.pow(_t(d, dt), v),
    "out_fill": lambda d, dt, v: torch.full((3,), v, out=torch.empty(3, dtype=dt, device=d)),
}
# (dtype, a value that overflows it, a value that fits)
DTYPES = [
    (torch.int8, 300, 5),
    (torch.uint8, 300, 5),
    (torch.int8, 300.0, 2.0),
    (torch.int16, 70000, 5),
    (torch.int32, 2**40, 5),
    (torch.int64, 2.0**70, 2.0),
]


def _outcome(fn):
    """("ok", value) or (exception type, message) of fn()."""
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return type(e), str(e).split("\n")[0]
    return "ok", r.cpu() if isinstance(r, torch.Tensor) else r


@pytest.mark.parametrize("dtype,big,fits", DTYPES, ids=[f"{d}-{b}".replace("torch.", "") for d, b, _ in DTYPES])
@pytest.mark.parametrize("name", list(CASES))
def test_overflowing_scalar_raises_at_call_like_cpu(name, dtype, big, fits):
    fn = CASES[name]
    cpu_big = _outcome(lambda: fn("cpu", dtype, big))
    cpu_fits = _outcome(lambda: fn("cpu", dtype, fits))
    # A fitting call first: its meta outcome is cached for this (op, Scalar type).
    tpu_fits = _outcome(lambda: fn("tpu", dtype, fits))
    assert tpu_fits[0] == cpu_fits[0]
    if cpu_fits[0] == "ok":
        torch.testing.assert_close(tpu_fits[1], cpu_fits[1])
    pending = torch.arange(4, device="tpu") * 2  # queued work that must survive the error
    tpu_big = _outcome(lambda: fn("tpu", dtype, big))  # no value is read back: an error here is at the call
    assert tpu_big[0] == cpu_big[0], f"cpu: {cpu_big}, tpu: {tpu_big}"
    if cpu_big[0] == "ok":
        torch.testing.assert_close(tpu_big[1], cpu_big[1])
    else:
        assert tpu_big[1] == cpu_big[1]
    torch.testing.assert_close(pending.cpu(), torch.arange(4) * 2)


def test_the_sweep_covers_cpu_overflow_errors():
    # Guards the sweep against going vacuous: CPU rejects int8 300 in each case.
    for name, fn in CASES.items():
        kind, msg = _outcome(lambda: fn("cpu", torch.int8, 300))
        assert kind is RuntimeError and "without overflow" in msg, name


@pytest.mark.parametrize(
    "op",
    [lambda t: t + 300, lambda t: t * 300, lambda t: t == 300, lambda t: torch.rsub(t, 300), lambda t: t.fill_(-1)],
    ids=["add", "mul", "eq", "rsub", "uint8_fill_minus_one"],
)
def test_scalars_cpu_wraps_without_a_check_still_record(op):
    # An operand Scalar wraps into a 0-dim tensor on CPU (no overflow check); uint8 accepts -1.
    for dt in (torch.int8, torch.uint8):
        c = op(torch.arange(4, dtype=dt))
        t = op(torch.arange(4, dtype=dt, device="tpu"))
        torch.testing.assert_close(t.cpu(), c)


def test_queue_and_tensors_stay_valid_after_the_error():
    a = torch.arange(6, dtype=torch.int8, device="tpu")
    b = a * 2  # pending
    with pytest.raises(RuntimeError, match="without overflow"):
        a.fill_(1000)
    with pytest.raises(RuntimeError, match="without overflow"):
        a.masked_fill_(a > 2, -1000)
    torch.testing.assert_close(a.cpu(), torch.arange(6, dtype=torch.int8))  # untouched
    torch.testing.assert_close(b.cpu(), torch.arange(6, dtype=torch.int8) * 2)
    torch.testing.assert_close(a.fill_(7).cpu(), torch.full((6,), 7, dtype=torch.int8))


@pytest.mark.parametrize(
    "op",
    [
        lambda d: torch.zeros(3, dtype=torch.int64, device=d).add_(
            torch.ones(3, dtype=torch.int64, device=d), alpha=2.0
        ),
        lambda d: torch.zeros(3, dtype=torch.int64, device=d).sub_(
            torch.ones(3, dtype=torch.int64, device=d), alpha=2.0
        ),
        lambda d: torch.add(torch.zeros(3, dtype=torch.int8, device=d), 1, alpha=0.5),
        lambda d: torch.rsub(torch.zeros(3, dtype=torch.int8, device=d), 1, alpha=0.5),
        lambda d: torch.add(
            torch.zeros(3, dtype=torch.int64, device=d),
            torch.ones(3, dtype=torch.int64, device=d),
            alpha=2.0,
            out=torch.empty(3, dtype=torch.int64, device=d),
        ),
        lambda d: torch.add(
            torch.zeros(3, dtype=torch.int64, device=d), torch.ones(3, device=d), alpha=2.0
        ),  # CPU accepts
    ],
    ids=["add_", "sub_", "add_scalar", "rsub", "add_out", "int_plus_float_tensor"],
)
def test_float_alpha_with_integer_self_behaves_like_cpu_at_the_call(op):
    # CPU's alpha_check rejects a float alpha for integer inputs at the call.
    cpu = _outcome(lambda: op("cpu"))
    pending = torch.ones(2, device="tpu") * 5
    tpu = _outcome(lambda: op("tpu"))
    assert tpu[0] == cpu[0], f"cpu: {cpu}, tpu: {tpu}"
    if cpu[0] == "ok":
        torch.testing.assert_close(tpu[1], cpu[1])
    torch.testing.assert_close(pending.cpu(), torch.full((2,), 5.0))
