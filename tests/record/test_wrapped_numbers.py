"""Python numbers passed for Tensor arguments (wrapped numbers: `x + 1.0`, `x * 0.5`).

The record path keeps them as Scalars in the recorded op (lazy/queue.h Node::wrapped)
instead of the wrapped-number CPU tensor the call received. Values, dtypes (a wrapped
number promotes below any tensor) and exception types must stay CPU's, through the
fused loops, the op-by-op host loop, in-place and out= forms, and flushes that reuse an
earlier flush's plan with another value.
"""

import math

import pytest
import torch

import torch_tpu_eager

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64, torch.bool]
NUMBERS = [1.0, 0.5, -3, 7, True, False, 1 + 2j, 1e300, 2**40, -0.0, math.inf, math.nan]
OPS = {
    "add": lambda t, v: t + v,
    "radd": lambda t, v: torch.add(v, t),
    "sub_alpha": lambda t, v: torch.sub(t, v, alpha=2),
    "rsub": lambda t, v: torch.rsub(t, v),
    "mul": lambda t, v: t * v,
    "div": lambda t, v: t / v,
    "div_floor": lambda t, v: t.div(v, rounding_mode="floor"),
    "floor_divide": lambda t, v: torch.floor_divide(t, v),
    "fmod": lambda t, v: torch.fmod(t, v),
    "xlogy": lambda t, v: torch.xlogy(t, v),
    "xlogy_self": lambda t, v: torch.xlogy(v, t),
    "copysign": lambda t, v: torch.copysign(t, v),
    "chain": lambda t, v: (t * v + v) * 0.5 - 1,
}


def _base(dtype):
    x = torch.linspace(-4, 4, 12).reshape(3, 4)
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


def _run(f, *args):
    try:
        return f(*args), None
    except Exception as e:  # noqa: BLE001 - the type is compared with CPU's
        return None, type(e)


def _same(want, got):
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wrapped_number_values_dtypes_errors(op, dtype):
    x = _base(dtype)
    for v in NUMBERS:
        want, want_err = _run(OPS[op], x, v)
        got, got_err = _run(lambda: OPS[op](x.to("tpu"), v).cpu())
        assert got_err == want_err, (op, dtype, v)
        if want_err is None:
            _same(want, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32], ids=str)
def test_wrapped_number_in_place_and_out(dtype):
    x = _base(dtype)
    for v in [2, 3.5, True, -1]:
        want = x.clone()
        want_err = _run(lambda: want.add_(v).mul_(v))[1]
        t = x.to("tpu")
        got_err = _run(lambda: t.add_(v).mul_(v))[1]
        assert got_err == want_err
        if want_err is None:
            _same(want, t.cpu())
        out_cpu = torch.empty_like(x)
        want_err = _run(lambda: torch.mul(x, v, out=out_cpu))[1]
        out = torch.empty_like(x, device="tpu")
        got_err = _run(lambda: torch.mul(x.to("tpu"), v, out=out))[1]
        assert got_err == want_err
        if want_err is None:
            _same(out_cpu, out.cpu())
    # The queue stays valid after an error raised at the call.
    y = x.to("tpu") + 1
    _same(x + 1, y.cpu())


def test_wrapped_number_is_a_runtime_scalar():
    x = torch.randn(4, 4)
    t = x.to("tpu")

    def step(v, w):
        return ((t * v + w) * 0.5 - v).cpu()

    step(0.25, 3)  # compiles
    before = torch_tpu_eager.metrics()
    for v, w in [(0.5, 1), (-2.0, 7), (1e-3, -4), (3.0, 0)]:
        _same((x * v + w) * 0.5 - v, step(v, w))
    after = torch_tpu_eager.metrics()
    assert after["compiles"] == before["compiles"]
    assert after["flush_cache_hits"] - before["flush_cache_hits"] == 4


def test_wrapped_number_float_and_int_are_different_kinds():
    # 2 and 2.0 promote an int tensor differently: each flush gets CPU's dtype.
    x = torch.arange(6, dtype=torch.int32)
    for v in [2, 2.0, 3, 3.5, True]:
        _same(x * v, (x.to("tpu") * v).cpu())


def test_wrapped_number_backward():
    x = torch.randn(5, requires_grad=True)
    t = x.detach().to("tpu").requires_grad_()
    ((x * 0.5 + 2) / 3.0).pow(2).sum().backward()
    ((t * 0.5 + 2) / 3.0).pow(2).sum().backward()
    _same(x.grad, t.grad.cpu())


def test_wrapped_number_defer_never():
    x = torch.randn(3, 3)
    with torch_tpu_eager.set_eager_mode("DEFER_NEVER"):
        _same(x * 0.5 + 1, (x.to("tpu") * 0.5 + 1).cpu())
