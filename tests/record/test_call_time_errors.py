"""Errors CPU raises at the call are raised by "tpu" at the call: same type, same message.

DESIGN §4: everything CPU checks before it computes is checked when the op is
recorded — the C++ meta functions of ATen's structured kernels (the code CPU's
kernel runs first: TensorIterator's broadcast, in-place shape, out= dtype and
overlap checks), index_put_'s and masked_scatter_'s shape/dtype checks, the RNG
ops' argument checks, reductions over no elements, and index bounds when the
indices are already on the host. A rejected call writes nothing: every tensor
stays readable and holds CPU's values.

Each case is a pair (build, act): ``build(device)`` makes the tensors, ``act``
makes the call under test (difftest.run_both_at_call).
"""

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu, run_both, run_both_at_call


def _f(*shape, dtype=torch.float32):
    """Deterministic values (no RNG), so both devices build the same tensors."""
    n = 1
    for s in shape:
        n *= s
    return lambda d: torch.arange(1, n + 1, device=d).reshape(shape).to(dtype) / (n + 1)


def _pair(a, b):
    return lambda d: (a(d), b(d))


# ---- in-place op whose other operand broadcasts to a larger shape ------------
# CPU: "output with shape [3] doesn't match the broadcast shape [2, 3]"; the
# in-place self is never resized.
INPLACE_BINARY = [
    "atan2_",
    "eq_",
    "fmod_",
    "ge_",
    "gt_",
    "le_",
    "lt_",
    "ne_",
    "pow_",
    "remainder_",
    "add_",
    "mul_",
    "div_",
    "sub_",
    "hypot_",
    "copysign_",
    "maximum",
    "logaddexp",
    "xlogy_",
    "nextafter_",
    "float_power_",
    "ldexp_",
    "igamma_",
]


@pytest.mark.parametrize("op", INPLACE_BINARY)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_inplace_broadcast_to_larger_shape(dev, op, layout):
    def build(d):
        small = _f(3, 2)(d).t() if layout == "transposed" else _f(3)(d)
        return small, _f(4, *small.shape)(d) + 0.5

    def act(small, big):
        if op.endswith("_"):
            return getattr(small, op)(big)
        return getattr(torch, op)(small, big, out=small)

    run_both_at_call(build, act, dev)


INPLACE_OTHER = {
    "lerp_": lambda s, b: s.lerp_(b, 0.5),
    "lerp_weight": lambda s, b: s.lerp_(s, b),
    "addcmul_": lambda s, b: s.addcmul_(b, b),
    "addcdiv_": lambda s, b: s.addcdiv_(s, b),
    "clamp_min_tensor": lambda s, b: s.clamp_(min=b),
    "where_out": lambda s, b: torch.where(b > 0.5, s, b, out=s),
    "masked_fill_": lambda s, b: s.masked_fill_(b > 0.5, 1.0),
    "masked_scatter_": lambda s, b: s.masked_scatter_(b > 0, b),
    "copy_": lambda s, b: s.copy_(b),
    "logical_and_": lambda s, b: s.logical_and_(b),
    "bitwise_and_int": lambda s, b: s.to(torch.int64).bitwise_and_(b.to(torch.int64)),
}


@pytest.mark.parametrize("case", sorted(INPLACE_OTHER))
def test_inplace_other_ops_never_resize_self(dev, case):
    run_both_at_call(_pair(_f(3), _f(2, 3)), INPLACE_OTHER[case], dev)


# ---- out= dtype and shape ------------------------------------------------------
OUT = {
    "neg_double_out": (
        lambda d: (torch.tensor(1.0, device=d), torch.zeros(0, dtype=torch.float64, device=d)),
        lambda x, o: torch.neg(x, out=o),
    ),
    "neg_int_out": (
        lambda d: (_f(3)(d), torch.zeros(3, dtype=torch.int64, device=d)),
        lambda x, o: torch.neg(x, out=o),
    ),
    "abs_half_out": (
        lambda d: (_f(3)(d), torch.zeros(3, dtype=torch.float16, device=d)),
        lambda x, o: torch.abs(x, out=o),
    ),
    "floor_complex_out": (
        lambda d: (torch.tensor([1 + 1j], device=d), torch.zeros(1, dtype=torch.complex64, device=d)),
        lambda x, o: torch.floor(x, out=o),
    ),
    "ceil_complex_out": (
        lambda d: (torch.tensor([1 + 1j], device=d), torch.zeros(1, dtype=torch.complex64, device=d)),
        lambda x, o: torch.ceil(x, out=o),
    ),
    "trunc_complex_out": (
        lambda d: (torch.tensor([1 + 1j], device=d), torch.zeros(1, dtype=torch.complex64, device=d)),
        lambda x, o: torch.trunc(x, out=o),
    ),
    "sin_int_out": (
        lambda d: (_f(3)(d), torch.zeros(3, dtype=torch.int32, device=d)),
        lambda x, o: torch.sin(x, out=o),
    ),
    "add_int_out": (
        lambda d: (_f(3)(d), torch.zeros(3, dtype=torch.int64, device=d)),
        lambda x, o: torch.add(x, x, out=o),
    ),
    "eq_float_out": (
        lambda d: (_f(3)(d), torch.zeros(3, dtype=torch.float32, device=d)),
        lambda x, o: torch.eq(x, x, out=o),
    ),
    "sum_int_out": (
        lambda d: (_f(2, 3)(d), torch.zeros(2, dtype=torch.int64, device=d)),
        lambda x, o: torch.sum(x, 1, out=o),
    ),
    "cat_dtype_out": (
        lambda d: (_f(2)(d), torch.zeros(4, dtype=torch.int64, device=d)),
        lambda b, o: torch.cat([b, b], out=o),
    ),
}


@pytest.mark.parametrize("case", sorted(OUT))
def test_out_checks(dev, case):
    build, act = OUT[case]
    run_both_at_call(build, act, dev)


CAT_GROW = {
    "same_tensor_twice": lambda b, o: torch.cat([b, b], out=b),
    "self_then_other": lambda b, o: torch.cat([b, o], out=b),
    "other_then_self_dim1": lambda b, o: torch.cat([o.reshape(1, -1), b.reshape(1, -1)], dim=1, out=b.reshape(1, -1)),
    "stack_into_input": lambda b, o: torch.stack([b, o], out=b),
}


@pytest.mark.parametrize("case", sorted(CAT_GROW))
def test_cat_into_its_own_input_that_must_grow(dev, case):
    # CPU resizes the out= tensor, then its overlap check rejects the call: the
    # tensor comes back grown (new elements uninitialized: only the old ones and
    # the geometry are compared), on "tpu" too, even when it came first as an input.
    outcomes = []
    for d in ("cpu", dev):
        b, o = _f(2)(d), _f(2)(d) + 1
        with pytest.raises(RuntimeError) as info:
            CAT_GROW[case](b, o)
        outcomes.append((str(info.value), b.shape, b.stride(), b.reshape(-1)[:2].cpu(), o.cpu()))
    assert outcomes[0][:3] == outcomes[1][:3]
    torch.testing.assert_close(outcomes[1][3:], outcomes[0][3:])


# ---- indexing ----------------------------------------------------------------
INDEX = {
    "put_int_into_double": (
        lambda d: (torch.zeros(2, 3, dtype=torch.double, device=d), torch.ones(2, 1, dtype=torch.int32, device=d)),
        lambda a, v: a.__setitem__((slice(None), [1]), v),
    ),
    "put_float_into_half": (
        lambda d: (torch.zeros(4, dtype=torch.half, device=d), torch.ones(2, device=d)),
        lambda a, v: a.__setitem__(torch.tensor([0, 2], device=a.device), v),
    ),
    "put_true_index_expanded": (
        lambda d: (_f(1, 2, 3)(d),),
        lambda a: a.__setitem__(torch.tensor(True), a.expand(5, 1, 2, 3)),
    ),
    "put_value_too_big": (
        lambda d: (torch.zeros(4, 3, device=d), torch.ones(2, 4, device=d)),
        lambda a, v: a.__setitem__(torch.tensor([0, 1], device=a.device), v),
    ),
    "put_0dim_no_index": (
        lambda d: (torch.tensor(1.0, device=d), torch.tensor([1.0], device=d)),
        lambda s, v: s.index_put([], v, True),
    ),
    "put_0dim_no_index_inplace": (
        lambda d: (torch.tensor(1.0, device=d), torch.tensor([1.0], device=d)),
        lambda s, v: s.index_put_([], v),
    ),
    "put_too_many_indices": (
        lambda d: (torch.zeros(3, device=d), torch.ones(1, device=d)),
        lambda a, v: a.index_put_((torch.tensor([0], device=a.device),) * 2, v),
    ),
    "put_float_index": (
        lambda d: (torch.zeros(3, device=d), torch.ones(1, device=d)),
        lambda a, v: a.index_put_((torch.tensor([0.0], device=a.device),), v),
    ),
    "put_non_adjacent": (
        lambda d: (torch.zeros(2, 3, 4, device=d), torch.ones(3, device=d)),
        lambda a, v: a.index_put_(
            (torch.tensor([0, 1], device=a.device), None, torch.tensor([1, 2], device=a.device)), v
        ),
    ),
    "put_non_adjacent_ok": (
        lambda d: (torch.zeros(2, 3, 4, device=d), torch.ones(2, 3, device=d)),
        lambda a, v: a.index_put_(
            (torch.tensor([0, 1], device=a.device), None, torch.tensor([1, 2], device=a.device)), v
        ),
    ),
    "get_empty_dim": (lambda d: (torch.empty(10, 0, device=d),), lambda a: a[:, [0, 1]]),
    "get_out_of_bounds": (lambda d: (_f(6)(d),), lambda a: a[torch.tensor([1, 7], device=a.device)]),
    "get_out_of_bounds_negative": (
        lambda d: (_f(2, 3)(d),),
        lambda a: a[:, torch.tensor([[1, -9], [9, 0]], device=a.device)],
    ),
    "get_out_of_bounds_second_index": (
        lambda d: (_f(2, 3, 4)(d),),
        lambda a: a[torch.tensor([0], device=a.device), torch.tensor([5], device=a.device)],
    ),
    "get_list_out_of_bounds": (lambda d: (_f(2, 3)(d),), lambda a: a[[0, 2]]),
    "put_out_of_bounds": (lambda d: (_f(6)(d),), lambda a: a.__setitem__(torch.tensor([7], device=a.device), 1.0)),
    "put_out_of_bounds_accumulate": (
        lambda d: (_f(6)(d), torch.ones(1, device=d)),
        lambda a, v: a.index_put_((torch.tensor([-7], device=a.device),), v, accumulate=True),
    ),
    "fill_bool_with_complex": (
        lambda d: (torch.zeros(3, dtype=torch.bool, device=d),),
        lambda a: a.index_fill_(0, torch.tensor([1], device=a.device), 1 + 2j),
    ),
    "fill_bool_with_float": (
        lambda d: (torch.zeros(3, dtype=torch.bool, device=d),),
        lambda a: a.index_fill_(0, torch.tensor([1], device=a.device), 2.5),
    ),
    "byte_mask_scalar": (
        lambda d: (torch.zeros(3, device=d),),
        lambda x: x.__setitem__(torch.tensor([1, 0, 1], dtype=torch.uint8, device=x.device), 2.0),
    ),
}


@pytest.mark.parametrize("case", sorted(INDEX))
def test_indexing_checks(dev, case):
    build, act = INDEX[case]
    run_both_at_call(build, act, dev)


# ---- index values held on the host: every op taking an `index` ------------------
# CPU's kernels check each index at the call (each op its own type and message;
# put_, take and index_fill_ wrap negative ones). Found by the random aliasing
# programs (tests/views/test_random_aliasing.py): index_add_ with
# torch.tensor([-1], device="tpu") raised only at the next flush, after bumping
# the version counter, and scatter_ into an empty view never raised.
def _idx(*vals):
    return lambda d: torch.tensor(vals, device=d)


INDEX_VALUES = {
    "index_add_negative": (lambda a, i: a.index_add_(0, i(-1), torch.ones(1, device=a.device))),
    "index_add_too_big": (lambda a, i: a.index_add_(0, i(2, 6), torch.ones(2, device=a.device), alpha=2)),
    "index_copy_negative": (lambda a, i: a.index_copy_(0, i(-5), torch.ones(1, device=a.device))),
    "index_fill_negative_wraps": (lambda a, i: a.index_fill_(0, i(-1, 0), 5.0)),
    "index_fill_too_small": (lambda a, i: a.index_fill_(0, i(-7), 5.0)),
    "index_reduce_too_big": (lambda a, i: a.index_reduce_(0, i(6), torch.ones(1, device=a.device), "prod")),
    "index_select_too_big": (lambda a, i: a.index_select(0, i(0, 6))),
    "index_select_negative": (lambda a, i: a.index_select(0, i(-1))),
    "gather_too_big": (lambda a, i: a.gather(0, i(9))),
    "scatter_too_big": (lambda a, i: a.scatter_(0, i(6), 1.0)),
    "scatter_add_negative": (lambda a, i: a.scatter_add_(0, i(-1), torch.ones(1, device=a.device))),
    "scatter_reduce_too_big": (lambda a, i: a.scatter_reduce_(0, i(7), torch.ones(1, device=a.device), "sum")),
    "scatter_into_empty_view": (lambda a, i: a[:0].scatter_(0, i(0), 1.0)),
    "put_too_big": (lambda a, i: a.put_(i(6), torch.ones(1, device=a.device))),
    "put_negative_wraps": (lambda a, i: a.put_(i(-2), torch.full((1,), 9.0, device=a.device))),
    "take_too_small": (lambda a, i: a.take(i(-7))),
    "take_negative_wraps": (lambda a, i: a.take(i(-1, 0))),
    "index_select_dim_out_of_range": (lambda a, i: a.index_select(1, i(0))),
    "index_add_in_range": (lambda a, i: a.index_add_(0, i(5, 0), torch.ones(2, device=a.device))),
}


@pytest.mark.parametrize("case", sorted(INDEX_VALUES))
def test_index_values_on_the_host_checked_at_the_call(dev, case):
    act = INDEX_VALUES[case]
    run_both_at_call(lambda d: (_f(6)(d),), lambda a: act(a, lambda *v: _idx(*v)(a.device)), dev)


# A class target whose values the host holds (labels copied from the host, as a training loop
# does): CPU's nll_loss / cross_entropy / multi_margin_loss check every target that is not
# ignore_index against the class count at the call ("Target 5 is out of bounds.", IndexError).
# "tpu" raised it only at the first read of the loss (break21). The controls (targets in range,
# out-of-range ones equal to ignore_index) must compute as CPU does.
TARGET_VALUES = {
    "nll_loss_too_big": (lambda x, t: F.nll_loss(x, t(0, 5))),
    "nll_loss_negative": (lambda x, t: F.nll_loss(x, t(-1, 0))),
    "nll_loss_1d_input": (lambda x, t: F.nll_loss(x[0], t(3)[0])),
    "nll_loss_sum_weighted": (
        lambda x, t: F.nll_loss(x, t(2, 3), weight=torch.ones(3, device=x.device), reduction="sum")
    ),
    "cross_entropy_too_big": (lambda x, t: F.cross_entropy(x, t(1, 3))),
    "cross_entropy_no_reduction": (lambda x, t: F.cross_entropy(x, t(7, 0), reduction="none")),
    "cross_entropy_smoothing": (lambda x, t: F.cross_entropy(x, t(0, 4), label_smoothing=0.1)),
    "nll_loss2d_too_big": (lambda x, t: F.nll_loss(x.reshape(1, 3, 2, 1), t(0, 3).reshape(1, 2, 1))),
    "multi_margin_loss_too_big": (lambda x, t: F.multi_margin_loss(x, t(0, 3))),
    "nll_loss_ignore_index_padding": (lambda x, t: F.nll_loss(x, t(-100, 2))),
    "cross_entropy_ignore_index_out_of_range": (lambda x, t: F.cross_entropy(x, t(9, 1), ignore_index=9)),
    "nll_loss_ignore_index_other_bad": (lambda x, t: F.nll_loss(x, t(-100, -3))),
    "cross_entropy_in_range": (lambda x, t: F.cross_entropy(x, t(2, 0))),
}


@pytest.mark.parametrize("case", sorted(TARGET_VALUES))
def test_target_values_on_the_host_checked_at_the_call(dev, case):
    act = TARGET_VALUES[case]
    run_both_at_call(lambda d: (_f(2, 3)(d),), lambda x: act(x, lambda *v: _idx(*v)(x.device)), dev)


def test_cross_entropy_target_checked_before_backward(dev):
    """A training step's loss: the bad label raises at F.cross_entropy, the weights stay valid."""

    def step(d):
        w = torch.ones(4, 3, device=d, requires_grad=True)
        labels = torch.tensor([0, 1, 3], device=d)
        try:
            F.cross_entropy(torch.eye(3, 4, device=d) @ w, labels)
        except IndexError as e:
            return str(e), w.detach().cpu()
        return None, None

    cpu_msg, cpu_w = step("cpu")
    dev_msg, dev_w = step(dev)
    assert cpu_msg is not None and dev_msg == cpu_msg
    assert torch.equal(dev_w, cpu_w)


# ---- integer division by zero ----------------------------------------------------
# fmod / remainder / floor_divide / div(rounding_mode=...) on integers: CPU's kernel raises
# RuntimeError "ZeroDivisionError" at the call. "tpu" raises it at the call when the divisor
# is a Python number or a tensor whose values the host holds (a divisor computed on the device
# raises when the op runs: tests/queue/test_async_errors.py). Found by PyTorch's
# test_binary_ufuncs.py (test_fmod_remainder_by_zero_integral): the call did not raise, and an
# unread result never did. The controls (a nonzero divisor, floating operands, true division,
# an empty divisor) must compute as CPU does.
def _ints(*vals, dtype=torch.int32):
    return lambda d: torch.tensor(vals, dtype=dtype, device=d)


_DIVIDEND = _ints(7, -7, 3, 0)
INTEGER_DIVISOR = {
    "fmod_tensor": (_pair(_DIVIDEND, _ints(2, 0, 1, 3)), torch.fmod),
    "fmod_scalar": (lambda d: (_DIVIDEND(d),), lambda a: torch.fmod(a, 0)),
    "fmod_inplace": (_pair(_DIVIDEND, _ints(0, 1, 1, 1)), lambda a, b: a.fmod_(b)),
    "fmod_out": (
        lambda d: (_DIVIDEND(d), _ints(0, 1, 1, 1)(d), _ints(9, 9, 9, 9)(d)),
        lambda a, b, o: torch.fmod(a, b, out=o),
    ),
    "remainder_tensor_int8": (_pair(_ints(5, 6, dtype=torch.int8), _ints(0, 4, dtype=torch.int8)), torch.remainder),
    "remainder_scalar": (lambda d: (_DIVIDEND(d),), lambda a: a % 0),
    "remainder_scalar_inplace": (lambda d: (_DIVIDEND(d),), lambda a: a.remainder_(0)),
    "remainder_scalar_tensor": (lambda d: (_ints(3, 0, dtype=torch.int64)(d),), lambda b: torch.remainder(5, b)),
    "floor_divide_uint8": (_pair(_ints(5, 6, dtype=torch.uint8), _ints(1, 0, dtype=torch.uint8)), lambda a, b: a // b),
    "floor_divide_python_zero": (lambda d: (_DIVIDEND(d),), lambda a: a // 0),
    "floor_divide_inplace": (_pair(_DIVIDEND, _ints(1, 1, 0, 1)), lambda a, b: a.floor_divide_(b)),
    "div_trunc": (_pair(_DIVIDEND, _ints(1, 0, 1, 1)), lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    "div_floor_scalar": (lambda d: (_DIVIDEND(d),), lambda a: torch.div(a, 0, rounding_mode="floor")),
    "div_floor_inplace_int64": (
        _pair(_ints(4, 5, dtype=torch.int64), _ints(0, 2, dtype=torch.int64)),
        lambda a, b: a.div_(b, rounding_mode="floor"),
    ),
    "broadcast_zero_row": (_pair(lambda d: _DIVIDEND(d).reshape(2, 2), _ints(0, 3)), torch.remainder),
    "rfloordiv_python_number": (lambda d: (_ints(0, 2)(d),), lambda b: 5 // b),
    "fmod_by_false": (lambda d: (_DIVIDEND(d),), lambda a: torch.fmod(a, False)),
    "remainder_by_bool_tensor": (
        _pair(_DIVIDEND, lambda d: torch.tensor([True, False, True, True], device=d)),
        torch.remainder,
    ),
    "fmod_cpu_0dim_divisor": (lambda d: (_DIVIDEND(d),), lambda a: torch.fmod(a, torch.tensor(0, dtype=torch.int32))),
    "div_trunc_out": (
        lambda d: (_DIVIDEND(d), _ints(1, 0, 1, 1)(d), _ints(9, 9, 9, 9)(d)),
        lambda a, b, o: torch.div(a, b, rounding_mode="trunc", out=o),
    ),
    # controls: CPU computes
    "fmod_no_zero": (_pair(_DIVIDEND, _ints(2, -3, 5, 1)), torch.fmod),
    "remainder_float_divisor": (_pair(_DIVIDEND, lambda d: torch.zeros(4, device=d)), torch.remainder),
    "fmod_float_scalar_zero": (lambda d: (_DIVIDEND(d),), lambda a: torch.fmod(a, 0.0)),
    "div_true_division": (_pair(_DIVIDEND, _ints(0, 0, 1, 2)), torch.div),
    "floor_divide_empty_divisor": (
        _pair(lambda d: _ints(dtype=torch.int32)(d), _ints(dtype=torch.int32)),
        torch.floor_divide,
    ),
    "floor_divide_empty_dividend": (
        _pair(lambda d: _ints(dtype=torch.int32)(d).reshape(0, 1), _ints(0, 0)),
        torch.floor_divide,
    ),
}


@pytest.mark.parametrize("case", sorted(INTEGER_DIVISOR))
def test_integer_division_by_zero_on_the_host_raises_at_the_call(dev, case):
    build, act = INTEGER_DIVISOR[case]
    run_both_at_call(build, act, dev)


def test_rejected_integer_division_leaves_the_version(dev):
    """An in-place division CPU rejects does not count as a write (its values: the cases above)."""
    a, b = _DIVIDEND(dev), _ints(1, 0, 1, 1)(dev)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        a.remainder_(b)
    assert a._version == 0


@pytest.mark.parametrize("case", ["index_add_negative", "scatter_too_big", "put_too_big"])
def test_rejected_index_write_leaves_the_version(dev, case):
    """A call CPU rejects does not count as a write: the version counter stays."""
    a = _f(6)(dev)
    with pytest.raises((IndexError, RuntimeError)):
        INDEX_VALUES[case](a, lambda *v: _idx(*v)(dev))
    assert a._version == 0


def test_byte_mask_assignment_warns_like_cpu(dev):
    # CPU warns that uint8 masks are deprecated (once per call) and then masks.
    build = lambda d: (torch.zeros(3, 2, device=d), torch.ones(2, 2, device=d))  # noqa: E731
    act = lambda x, v: x.__setitem__(torch.tensor([1, 0, 1], dtype=torch.uint8, device=x.device), v)  # noqa: E731
    run_both_at_call(build, act, dev, check_warnings=True)


# Calls whose meta inference warns and then gives up (data-dependent shapes), so CPU's
# kernel runs at the call: each warning comes once, as on CPU (the meta kernels' warnings
# are held until inference succeeds).
WARN_ONCE = {
    "getitem_byte_mask": (
        lambda d: (torch.ones(10, 10, device=d),),
        lambda y: y[torch.zeros(10, dtype=torch.uint8, device=y.device)],
    ),
    "getitem_two_byte_masks": (
        lambda d: (torch.ones(5, 7, 3, device=d),),
        lambda v: v[
            torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8, device=v.device),
            :,
            torch.tensor([1, 1, 1], dtype=torch.uint8, device=v.device),
        ],
    ),
    "index_put_byte_mask_accumulate": (
        lambda d: (torch.ones(10, 10, device=d), torch.ones(0, 10, device=d)),
        lambda y, v: y.index_put_((torch.zeros(10, dtype=torch.uint8, device=y.device),), v, accumulate=True),
    ),
    "out_resized": (
        lambda d: (torch.ones(4, device=d), torch.empty(3, device=d)),
        lambda a, o: torch.add(a, 1, out=o),
    ),
    "nonzero_out_resized": (
        lambda d: (torch.tensor([0.0, 1.0, 2.0], device=d), torch.empty(1, dtype=torch.int64, device=d)),
        lambda a, o: torch.nonzero(a, out=o),
    ),
}


@pytest.mark.parametrize("case", sorted(WARN_ONCE))
def test_meta_inference_warnings_come_once(dev, case):
    build, act = WARN_ONCE[case]
    run_both_at_call(build, act, dev, check_warnings=True)


# ---- masked_scatter_ ------------------------------------------------------------
MASKED_SCATTER = {
    "source_too_small": (3, (5,), (5,), True),
    "source_large_enough": (5, (5,), (5,), True),
    "mask_larger_than_self": (6, (3,), (2, 3), True),
    "mask_broadcasts": (6, (2, 3), (3,), True),
    "source_other_dtype": (6, (2, 3), (2, 3), False),
}


@pytest.mark.parametrize("case", sorted(MASKED_SCATTER))
def test_masked_scatter_checks(dev, case):
    n, self_shape, mask_shape, same_dtype = MASKED_SCATTER[case]

    def build(d):
        src = _f(n)(d) if same_dtype else _f(n, dtype=torch.float64)(d)
        return torch.zeros(self_shape, device=d), torch.ones(mask_shape, dtype=torch.bool, device=d), src

    run_both_at_call(build, lambda s, m, src: s.masked_scatter_(m, src), dev)


# ---- reductions over no elements ------------------------------------------------
EMPTY_REDUCTIONS = {
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "max_int": lambda x: x.to(torch.int64).max(),
    "min_bool": lambda x: x.to(torch.bool).min(),
    "max_2d": lambda x: x.reshape(0, 3).max(),
    "amax": lambda x: x.amax(),
    "argmin": lambda x: x.argmin(),
    "aminmax": lambda x: torch.aminmax(x),
    "max_dim": lambda x: x.reshape(0, 3).max(0),
    "median_dim": lambda x: x.reshape(0, 3).median(0),
    "nanmedian_dim": lambda x: x.reshape(0, 3).nanmedian(0),
    "mode": lambda x: x.reshape(0, 3).mode(0),
    "kthvalue": lambda x: x.reshape(0, 3).kthvalue(1, 0),
    "max_out": lambda x: torch.max(x, out=torch.empty(0, device=x.device)),
    "sum": lambda x: x.sum(),
    "prod_dim": lambda x: x.reshape(0, 3).prod(0),
    "logsumexp": lambda x: x.logsumexp(0),
    "median": lambda x: x.median(),
    "inf_norm": lambda x: torch.linalg.vector_norm(x, float("inf")),
    "softmax": lambda x: x.softmax(0),
}


@pytest.mark.parametrize("mode", ["defer_and_fuse", "defer_never"])
@pytest.mark.parametrize("case", sorted(EMPTY_REDUCTIONS))
def test_reductions_of_empty_input(dev, case, mode):
    def run():
        run_both_at_call(lambda d: (torch.empty(0, device=d),), EMPTY_REDUCTIONS[case], dev)

    if dev == "tpu" and mode == "defer_never":
        with torch.tpu.set_eager_mode("DEFER_NEVER"):
            run()
    else:
        run()


# ---- RNG argument checks ----------------------------------------------------------
RANDOM = {
    "random_from_below_int8": (torch.int8, lambda t: t.random_(-200, 5)),
    "random_to_above_int8": (torch.int8, lambda t: t.random_(0, 300)),
    "random_to_above_uint8": (torch.uint8, lambda t: t.random_(256 + 1)),
    "random_bool_range": (torch.bool, lambda t: t.random_(0, 3)),
    "random_empty_range": (torch.int64, lambda t: t.random_(5, 5)),
    "uniform_from_above_to": (torch.float32, lambda t: t.uniform_(3, 1)),
    "normal_negative_std": (torch.float32, lambda t: t.normal_(0, -1)),
    "exponential_negative": (torch.float32, lambda t: t.exponential_(-1)),
    "geometric_p_above_1": (torch.float32, lambda t: t.geometric_(2)),
    "bernoulli_p_above_1": (torch.float32, lambda t: t.bernoulli_(2.0)),
    "cauchy_negative_sigma": (torch.float32, lambda t: t.cauchy_(0, -1)),
    "log_normal_negative_std": (torch.float32, lambda t: t.log_normal_(0, -1)),
    "random_int_on_float_ok": (torch.float32, lambda t: t.random_(0, 1)),
}


@pytest.mark.parametrize("case", sorted(RANDOM))
def test_random_argument_checks(dev, case):
    dtype, act = RANDOM[case]
    run_both_at_call(lambda d: (torch.zeros(4, dtype=dtype, device=d),), act, dev)


@pytest.mark.parametrize("shape", [(0,), (3,)])
@pytest.mark.parametrize("factory", ["rand", "randn"])
def test_float_random_factories_reject_integer_dtypes(dev, shape, factory):
    run_both_at_call(lambda d: (), lambda: getattr(torch, factory)(shape, dtype=torch.int64, device=dev), dev)


RANDPERM = {
    "uint8_257": (257, torch.uint8),
    "uint8_256": (256, torch.uint8),
    "half_2049": (2**11 + 1, torch.half),
    "half_2050": (2**11 + 2, torch.half),
    "float_2pow24_plus_2": (2**24 + 2, torch.float32),
    "int8_129": (129, torch.int8),
}


@pytest.mark.parametrize("case", sorted(RANDPERM))
@pytest.mark.parametrize("with_out", [False, True])
def test_randperm_n_too_large_for_dtype(dev, case, with_out):
    n, dtype = RANDPERM[case]

    def act(out):
        r = torch.randperm(n, out=out) if with_out else torch.randperm(n, dtype=dtype, device=out.device)
        if with_out:
            out.copy_(r.sort().values)  # the order is random: compare the values sorted
        return r.shape

    run_both_at_call(lambda d: (torch.empty(0, dtype=dtype, device=d),), act, dev)


@pytest.mark.parametrize("op", [torch.complex, torch.polar])
@pytest.mark.parametrize(
    "dtypes", [(torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float32, torch.float32)]
)
def test_complex_parts_of_different_dtypes(dev, op, dtypes):
    run_both_at_call(lambda d: (_f(2, dtype=dtypes[0])(d), _f(2, dtype=dtypes[1])(d)), op, dev)


# ---- memory overlap ---------------------------------------------------------------
OVERLAP = {
    "add_partial": lambda x: x[1:].add_(x[:-1]),
    "mul_out_partial": lambda x: torch.mul(x[:-1], 2, out=x[1:]),
    "neg_out_partial": lambda x: torch.neg(x[:-1], out=x[1:]),
    "sigmoid_out_partial": lambda x: torch.sigmoid(x[:-1], out=x[1:]),
    "exp_out_same": lambda x: torch.exp(x, out=x),
    "copy_partial": lambda x: x[1:].copy_(x[:-1]),
    "index_select_out_overlap": lambda x: torch.index_select(x, 0, torch.tensor([0, 1], device=x.device), out=x[:2]),
    "expanded_add_": lambda x: x[:1].expand(5).add_(1),
    "expanded_copy_same": lambda x: x[:1].expand(3, 3).copy_(x[:1].expand(3, 3).transpose(0, 0)),
    "expanded_copy_other": lambda x: x[:1].expand(3).copy_(x[1:4]),
    "cat_out_input": lambda x: torch.cat([x[:2], x[:2]], out=x[1:5]),
    "index_fill_own_index": lambda x: x.to(torch.int64).index_fill_(0, x.to(torch.int64)[:1] * 0, 0),
    "put_own_index": lambda x: (lambda i: i.put_(i, i))(torch.tensor([2, 1, 0], device=x.device)),
    "index_put_own_index": lambda x: (lambda i: i.index_put_((i,), i))(torch.tensor([2, 1, 0], device=x.device)),
    "index_put_value_view": lambda x: x.index_put_((torch.tensor([2, 1, 0], device=x.device),), x[0]),
    "scatter_own_src": lambda x: x.scatter_(0, torch.tensor([0, 1], device=x.device), x),
    "mul_self_ok": lambda x: x.mul_(x),
    "add_out_self_ok": lambda x: torch.add(x, x, out=x),
}


@pytest.mark.parametrize("case", sorted(OVERLAP))
def test_memory_overlap(dev, case):
    run_both_at_call(lambda d: (_f(6)(d),), OVERLAP[case], dev)


# ---- the queue survives ---------------------------------------------------------------
@requires_tpu
def test_pending_work_survives_a_rejected_call():
    x = torch.arange(6.0, device="tpu")
    pending = x * 2
    small = torch.arange(3.0, device="tpu")
    small_before = small + 0
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        small.atan2_(torch.ones(2, 3, device="tpu"))
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 6"):
        x[torch.tensor([9], device="tpu")]
    assert pending.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert small.shape == (3,) and small.cpu().tolist() == small_before.cpu().tolist()


# ---- Python API arguments -------------------------------------------------------------
@requires_tpu
@pytest.mark.parametrize("value", [2**64, 2**63, -(2**63) - 1])
def test_api_int_arguments_past_int64(value):
    import torch_tpu_eager as tte

    before = tte.queue_limits()
    with pytest.raises(OverflowError, match="set_queue_limits: max_ops="):
        tte.set_queue_limits(value)
    with pytest.raises(OverflowError, match="set_queue_limits: max_bytes="):
        tte.set_queue_limits(100, value)
    assert tte.queue_limits() == before
    t = torch.zeros(4, device="tpu")
    with pytest.raises((OverflowError, ValueError), match="mark_dynamic"):
        tte.mark_dynamic(t, 0, 1, value)
    with pytest.raises(TypeError, match="set_queue_limits: max_ops must be an integer"):
        tte.set_queue_limits(1.5)


# ---- torch.use_deterministic_algorithms --------------------------------------
# CPU's index-writing kernels read the flag when they run: index_copy takes a
# deterministic order for duplicate indices, put_ (accumulate=False) raises or
# warns "put_ does not have a deterministic implementation". The flag is the one
# set at the call: results are read after the mode was switched off again.
def _deterministic(act, warn_only=False):
    def call(*tensors):
        before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        try:
            return act(*tensors)
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    return call


def _dup_index(n, size, computed):
    """n indices into [0, size) with many duplicates; `computed`: made on the device (pending)."""
    if computed:
        return lambda d: (torch.arange(n, device=d) * 7) % size
    vals = [(i * 7) % size for i in range(n)]
    return lambda d: torch.tensor(vals, device=d)


DETERMINISTIC = {
    "index_copy_dim0": (
        lambda i: lambda d: (torch.zeros(5, 4, device=d), i(d), _f(60, 4)(d)),
        lambda x, i, s: torch.index_copy(x, 0, i, s),
    ),
    "index_copy_dim1_inplace": (
        lambda i: lambda d: (torch.zeros(3, 5, 2, device=d), i(d), _f(3, 60, 2)(d)),
        lambda x, i, s: x.index_copy_(1, i, s),
    ),
    "index_copy_out": (
        lambda i: lambda d: (torch.zeros(5, 4, device=d), i(d), _f(60, 4)(d), torch.empty(5, 4, device=d)),
        lambda x, i, s, o: torch.index_copy(x, 0, i, s, out=o),
    ),
    "index_put_accumulate": (
        lambda i: lambda d: (torch.zeros(5, 4, device=d), i(d), _f(60, 4)(d)),
        lambda x, i, s: x.index_put_((i,), s, accumulate=True),
    ),
    "index_add": (
        lambda i: lambda d: (torch.zeros(5, 4, device=d), i(d), _f(60, 4)(d)),
        lambda x, i, s: x.index_add_(0, i, s),
    ),
    "put_accumulate": (
        lambda i: lambda d: (torch.zeros(5, device=d), i(d), _f(60)(d)),
        lambda x, i, s: x.put_(i, s, accumulate=True),
    ),
    "put_alert": (lambda i: lambda d: (torch.zeros(5, device=d), i(d), _f(60)(d)), lambda x, i, s: x.put_(i, s)),
    "put_functional_alert": (
        lambda i: lambda d: (torch.zeros(5, device=d), i(d), _f(60)(d)),
        lambda x, i, s: x.put(i, s),
    ),
    "gather_unaffected": (lambda i: lambda d: (_f(5, 4)(d), i(d).reshape(15, 4)), lambda x, i: torch.gather(x, 0, i)),
}


@pytest.mark.parametrize("computed", [False, True], ids=["host_index", "device_index"])
@pytest.mark.parametrize("case", sorted(DETERMINISTIC))
def test_deterministic_mode_is_the_one_set_at_the_call(dev, case, computed):
    build, act = DETERMINISTIC[case]
    run_both_at_call(build(_dup_index(60, 5, computed)), _deterministic(act), dev)


@pytest.mark.parametrize("case", ["put_alert", "put_functional_alert", "index_copy_dim0"])
def test_deterministic_warn_only_warns_at_the_call(dev, case):
    build, act = DETERMINISTIC[case]
    run_both_at_call(build(_dup_index(60, 5, True)), _deterministic(act, warn_only=True), dev, check_warnings=True)


# max_unpool's CPU kernel raises (or, warn_only, warns) its nondeterministic alert
# when it runs, from the mode in force then. The mode that counts is the one of the
# call, not of a later flush: a call made with the mode off or warn_only must not
# raise when its value is computed under the mode (found by PyTorch's test_torch.py:
# a warn_only call's deferred value failed at the next test's read).
UNPOOL = {
    "max_unpool1d": ((1, 2, 8), lambda x: F.max_unpool1d(*F.max_pool1d(x, 2, return_indices=True), 2)),
    "max_unpool2d": ((1, 2, 4, 4), lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)),
    "max_unpool3d": ((1, 1, 4, 4, 4), lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2)),
}


@contextlib.contextmanager
def _mode(on, warn_only=False):
    """torch.use_deterministic_algorithms(on, warn_only) for the block, then the previous mode."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _alerts(act):
    """Runs act(); the number of nondeterministic-alert warnings it gave."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        act()
    return sum("does not have a deterministic implementation" in str(x.message) for x in w)


@pytest.mark.parametrize("first", ["off", "warn_only"])
@pytest.mark.parametrize("op", sorted(UNPOOL))
def test_deterministic_mode_of_the_call_not_of_the_flush(dev, op, first):
    shape, unpool = UNPOOL[op]

    def program(d):
        x = _f(*shape)(d)
        out = []
        with _mode(first == "warn_only", warn_only=True):
            warned = _alerts(lambda: out.append(unpool(x)))
        with _mode(True):  # a read under the mode: CPU computed the value already
            total = out[0].sum().item()
        return out[0], torch.tensor([total, warned], device=d)

    run_both(program, dev)


@pytest.mark.parametrize("op", sorted(UNPOOL))
def test_deterministic_warn_only_call_then_alert_leaves_no_error(dev, op):
    """A warn_only call, then a call under the mode that raises (at the call on
    both devices): later reads of either result and of unrelated tensors work."""
    shape, unpool = UNPOOL[op]

    def program(d):
        x = _f(*shape)(d)
        with _mode(True, warn_only=True):
            warned = _alerts(lambda: unpool(x))  # its result dies unread
            kept = unpool(x)
        with _mode(True), pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            unpool(x)
        return kept, torch.arange(3, device=d) * 2, torch.tensor([warned], device=d)

    run_both(program, dev)


def test_deterministic_mode_set_after_an_index_write(dev):
    """An index write queued with the mode off runs under that mode: changing the mode
    runs the queue first (torch_tpu_eager/_deterministic.py)."""

    def program(d):
        x = torch.zeros(5, device=d)
        x.put_(torch.tensor([0, 1, 1, 3], device=d), torch.arange(4.0, device=d))
        with _mode(True):
            total = x.sum().item()
        return x, torch.tensor([total], device=d)

    run_both(program, dev)


@requires_tpu
def test_deterministic_mode_change_leaves_a_queued_error_to_its_tensor():
    """The mode change runs the queue without raising: a queued op that fails (indices
    computed on the device) raises at the read of its tensor; other tensors stay readable."""
    x = torch.zeros(5, device="tpu")
    x.put_(torch.arange(3, device="tpu") + 5, torch.ones(3, device="tpu"))
    with _mode(True):
        pass
    with pytest.raises(IndexError, match="out of range: tried to access index 5"):
        x.cpu()
    assert torch.ones(2, device="tpu").sum().item() == 2.0


# ---- normal(mean, std) with a tensor std ------------------------------------------
# CPU (and CUDA, which reads the minimum back) check every element of std at the
# call: "normal expects all elements of std >= 0.0". std = 0 draws nothing random
# (the result is the mean), so both devices agree on the values too.
def _std(values, computed):
    if computed:  # pending on the device when the call is made
        return lambda d: torch.tensor(values, device=d) * 1.0 + torch.zeros(len(values), device=d)
    return lambda d: torch.tensor(values, device=d)


NORMAL_STD = {
    "tensor_tensor_negative": ([0.0, -1.0, 2.0], lambda m, s: torch.normal(m, s)),
    "tensor_tensor_nan": ([0.0, float("nan"), 0.0], lambda m, s: torch.normal(m, s)),
    "float_tensor_negative": ([-0.5, 0.0, 0.0], lambda m, s: torch.normal(1.5, s)),
    "out_negative": ([0.0, 0.0, -3.0], lambda m, s: torch.normal(m, s, out=torch.empty(3, device=m.device))),
    "tensor_tensor_zero_ok": ([0.0, 0.0, 0.0], lambda m, s: torch.normal(m, s)),
    "float_tensor_zero_ok": ([0.0, 0.0, 0.0], lambda m, s: torch.normal(2.0, s)),
    "broadcast_zero_ok": ([0.0], lambda m, s: torch.normal(m, s[0])),
}


@pytest.mark.parametrize("computed", [False, True], ids=["host_std", "device_std"])
@pytest.mark.parametrize("case", sorted(NORMAL_STD))
def test_normal_tensor_std_checked_at_the_call(dev, case, computed):
    values, act = NORMAL_STD[case]
    std = _std(values, computed)
    run_both_at_call(lambda d: (torch.arange(3, device=d) * 1.0, std(d)), act, dev)


# ---- advanced indexing with indices on another device --------------------------------
# aten::index accepts index tensors on the CPU or on self's device only; CUDA's
# message names self's device (also for a CPU self indexed by a device tensor).
def test_index_with_indices_on_another_device(dev):
    x = torch.randn(3, 4, 4)
    ia, ib = torch.tensor([0, 2, 1]), torch.tensor([0, 2, 1], device=dev)
    for self_t, idx in [(x, (ib,)), (x, (slice(None), ia, ib)), (x, (ia, ib))]:
        with pytest.raises(
            RuntimeError,
            match=r"^indices should be either on cpu or on the same device as the "
            r"indexed tensor \(cpu\)$",
        ):
            self_t[idx]
    if torch.tpu.device_count() > 1:
        xt, other = x.to(f"{dev}:0"), ia.to(f"{dev}:1")
        with pytest.raises(RuntimeError, match=r"the same device as the indexed tensor \(tpu:0\)$"):
            xt[ia, other]
    xt = x.to(dev)  # a CPU index with a device self stays allowed
    torch.testing.assert_close(xt[ia, ib].cpu(), x[ia, ia])


# ---- CPU checks that torch 2.13's meta kernels skip (found by PyTorch's test_reductions.py) --
# nansum: CPU's make_reduction reads an empty dim list as every dim and refuses a dim list
# on more than 64 dims; the Python meta kernel reduced nothing and had no limit.
# bucketize: CPU requires 1-D boundaries, searchsorted a side of "left" or "right"; the meta
# kernels did not check, so the error came at the read, or never when the result was not read.
def _b2(d):
    return torch.tensor([[1, 2, 3], [4, 5, 6]], device=d)


META_SKIPS = {
    "nansum_empty_dim_list": (lambda d: (_f(3, 4)(d),), lambda x: x.nansum(dim=[])),
    "nansum_empty_dim_list_keepdim": (lambda d: (_f(3, 4)(d),), lambda x: x.nansum(dim=[], keepdim=True)),
    "nansum_empty_dim_list_int": (lambda d: (torch.arange(6, device=d).reshape(2, 3),), lambda x: x.nansum(dim=[])),
    "nansum_empty_dim_list_out": (
        lambda d: (_f(3, 4)(d), torch.empty(0, device=d)),
        lambda x, o: torch.nansum(x, dim=[], out=o),
    ),
    "nansum_dim_list_kept": (lambda d: (_f(3, 4)(d),), lambda x: x.nansum(dim=[1])),
    # (65-d tensors made in the call: the comparison of the arguments handles at most 64 dims)
    "nansum_65_dims": (lambda d: (torch.ones(1, device=d),), lambda x: x.reshape([1] * 65).nansum(dim=64)),
    "nansum_65_dims_negative": (lambda d: (torch.ones(1, device=d),), lambda x: x.reshape([1] * 65).nansum(dim=-1)),
    "nansum_65_dims_every_dim": (lambda d: (torch.ones(1, device=d),), lambda x: x.reshape([1] * 65).nansum()),
    "bucketize_2d_boundaries": (
        lambda d: (torch.arange(12, device=d).reshape(2, 2, 3), _b2(d)),
        lambda v, b: torch.bucketize(v, b),
    ),
    "bucketize_out_2d_boundaries": (
        lambda d: (
            torch.arange(12, device=d).reshape(2, 2, 3),
            _b2(d),
            torch.zeros(2, 2, 3, dtype=torch.int64, device=d),
        ),
        lambda v, b, o: torch.bucketize(v, b, out=o),
    ),
    "bucketize_scalar_2d_boundaries": (lambda d: (_b2(d),), lambda b: torch.bucketize(2, b)),
    "searchsorted_bad_side": (
        lambda d: (torch.arange(10, device=d), torch.tensor([3, 7], device=d)),
        lambda s, v: torch.searchsorted(s, v, side="bad"),
    ),
    "searchsorted_scalar_bad_side": (
        lambda d: (torch.arange(10, device=d),),
        lambda s: torch.searchsorted(s, 3, side="up"),
    ),
    "searchsorted_right_side": (
        lambda d: (torch.arange(10, device=d), torch.tensor([3, 7], device=d)),
        lambda s, v: torch.searchsorted(s, v, side="right"),
    ),
    "bucketize_1d_boundaries": (
        lambda d: (torch.arange(12, device=d).reshape(2, 2, 3), torch.tensor([1, 4, 9], device=d)),
        lambda v, b: torch.bucketize(v, b, right=True),
    ),
}


# ---- argument checks in CPU's kernels that the meta kernels skip (test_ops.py test_errors) --
# gelu parses `approximate` when its kernel runs, multinomial checks dtypes and counts before
# it draws; the meta kernels read neither, so the error came at the read (or at the next op).
def _probs(d, *shape, dtype=torch.float32):
    return (torch.arange(math.prod(shape), device=d).reshape(shape) % 3 + 1).to(dtype)


def _one_hot(d):
    return torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], device=d)


ARGUMENT_CHECKS = {
    "gelu_bad_approximate": (lambda d: (_f(3, 4)(d),), lambda x: F.gelu(x, approximate="asdf")),
    "gelu_inplace_bad_approximate": (lambda d: (_f(3, 4)(d),), lambda x: torch.ops.aten.gelu_(x, approximate="x")),
    "gelu_out_bad_approximate": (
        lambda d: (_f(3, 4)(d), torch.zeros(3, 4, device=d)),
        lambda x, o: torch.ops.aten.gelu.out(x, approximate="Tanh", out=o),
    ),
    "gelu_backward_bad_approximate": (
        lambda d: (_f(3, 4)(d), _f(3, 4)(d)),
        lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="erf"),
    ),
    "gelu_tanh": (lambda d: (_f(3, 4)(d),), lambda x: F.gelu(x, approximate="tanh")),
    "multinomial_integer_input": (lambda d: (_probs(d, 4, dtype=torch.int64),), lambda p: torch.multinomial(p, 2)),
    "multinomial_out_not_long": (
        lambda d: (_probs(d, 4), torch.zeros(2, dtype=torch.float64, device=d)),
        lambda p, o: torch.multinomial(p, 2, out=o),
    ),
    "multinomial_zero_samples": (lambda d: (_probs(d, 4),), lambda p: torch.multinomial(p, 0)),
    "multinomial_zero_samples_replacement": (lambda d: (_probs(d, 2, 4),), lambda p: torch.multinomial(p, 0, True)),
    "multinomial_more_samples_than_categories": (lambda d: (_probs(d, 2, 4),), lambda p: torch.multinomial(p, 5)),
    "multinomial_too_many_categories": (
        lambda d: (torch.ones(1, device=d),),
        lambda p: torch.multinomial(p.expand(2**24 + 1), 1),
    ),
    "multinomial_one_hot_with_replacement": (lambda d: (_one_hot(d),), lambda p: torch.multinomial(p, 5, True)),
    "multinomial_one_hot_out": (
        lambda d: (_one_hot(d), torch.empty(0, dtype=torch.int64, device=d)),
        lambda p, o: torch.multinomial(p, 1, out=o),
    ),
}
META_SKIPS.update(ARGUMENT_CHECKS)


@pytest.mark.parametrize("case", sorted(META_SKIPS))
def test_cpu_checks_the_meta_kernels_skip(dev, case):
    build, act = META_SKIPS[case]
    run_both_at_call(build, act, dev)


@requires_tpu
def test_bucketize_2d_boundaries_after_a_1d_call():
    # The first call's meta result is cached; the second must still raise at the call.
    v = torch.arange(12).reshape(2, 2, 3)
    torch.bucketize(v.to("tpu"), torch.tensor([1, 4, 9], device="tpu"))
    with pytest.raises(RuntimeError, match=r"^boundaries tensor must be 1 dimension, but got dim\(2\)$"):
        torch.bucketize(v.to("tpu"), _b2("tpu"))


@requires_tpu
def test_gelu_bad_approximate_after_a_cached_call():
    # A valid call fills the meta cache; the same shapes with a bad string must still raise.
    x = torch.ones(3, device="tpu")
    F.gelu(x, approximate="tanh")
    with pytest.raises(RuntimeError, match=r"^approximate argument must be either none or tanh\.$"):
        F.gelu(x, approximate="nope")


# ---- var / std with no degrees of freedom: CPU warns at the call ----------------------
# (test_reductions.py test_warn_invalid_degrees_of_freedom: the meta kernels do not warn,
# so a queued call warned at the flush, outside the caller's warnings.catch_warnings.)
DOF = {
    "std_dim": lambda x: torch.std(x, dim=-1, correction=20),
    "var_dim": lambda x: torch.var(x, dim=-1, correction=20),
    "var_mean_dim": lambda x: torch.var_mean(x, dim=-1, correction=20),
    "std_mean_dim": lambda x: torch.std_mean(x, dim=-1, correction=20),
    "var_all": lambda x: torch.var(x, correction=200),
    "var_two_dims": lambda x: torch.var(x, dim=(0, 1), correction=200),
    "var_enough": lambda x: torch.var(x, dim=-1, correction=19),
    "var_out": lambda x: torch.var(x, dim=1, correction=20, out=torch.empty(10, device=x.device)),
    "var_bad_dim": lambda x: torch.var(x, dim=2, correction=1),
}


@pytest.mark.parametrize("case", sorted(DOF))
def test_no_degrees_of_freedom_warns_at_the_call(dev, case):
    run_both_at_call(lambda d: (_f(10, 20)(d),), DOF[case], dev, check_warnings=True)


# ---- random ops whose CPU kernel has no loop for the dtype ---------------------
# The meta kernels accept every dtype; CPU's kernel raises NotImplementedError
# ('"bernoulli_tensor_cpu_p_" not implemented for 'Int''). The call-time dtype probe
# runs random ops too, with a generator of its own.
RANDOM_DTYPE = {
    "bernoulli": (lambda x: torch.bernoulli(x), [torch.int32, torch.bool, torch.uint8, torch.complex64]),
    "bernoulli_p": (lambda x: torch.bernoulli(x, 0.5), [torch.complex64]),
    "alpha_dropout": (lambda x: F.alpha_dropout(x, 0.5, True), [torch.complex64]),
    "dropout2d": (lambda x: F.dropout2d(x, 0.5, True), [torch.complex64]),
    "feature_alpha_dropout": (lambda x: F.feature_alpha_dropout(x, 0.5, True), [torch.complex64]),
    "rrelu": (lambda x: F.rrelu(x, training=True), [torch.float16, torch.int32, torch.bool, torch.uint8]),
}


@requires_tpu
@pytest.mark.parametrize(
    "name,dtype", [(n, dt) for n, (_, dts) in RANDOM_DTYPE.items() for dt in dts], ids=lambda v: str(v).split(".")[-1]
)
def test_random_op_dtype_rejected_at_the_call(name, dtype, dev):
    act = RANDOM_DTYPE[name][0]
    exc = run_both_at_call(lambda d: (_f(2, 3, 4, 5)(d).to(dtype),), act, dev)
    assert isinstance(exc, NotImplementedError)


@requires_tpu
def test_random_op_probe_draws_from_neither_generator():
    # The probe runs CPU's kernel on twins: CPU's default generator and the device's
    # stream are where they would be without it. The first pass meets new shapes
    # (meta-cache misses: probed, one rejected, one accepted), the second the same calls
    # cached (not probed): equal draws, and CPU's generator untouched by either.
    def draws():
        torch.manual_seed(3)
        state = torch.get_rng_state()
        with pytest.raises(NotImplementedError):
            torch.bernoulli(torch.ones(5, 13, device="tpu", dtype=torch.int32))
        y = torch.bernoulli(torch.full((6, 37), 0.5, device="tpu", dtype=torch.float16)).cpu()
        return y, torch.equal(torch.get_rng_state(), state)

    y_probed, kept_probed = draws()
    y_cached, kept_cached = draws()
    assert kept_probed and kept_cached
    assert torch.equal(y_probed, y_cached)
