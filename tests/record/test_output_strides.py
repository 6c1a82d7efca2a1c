"""Result strides of kernels that are not structured, over mixed operand layouts.

CPU's floor_divide, logical_and/or/xor, complex, polar, ldexp, hardtanh/hardswish/dropout
backward, huber_loss, binary_cross_entropy (and backward) and mse_loss_backward lay
out a fresh result with their TensorIterator (or empty_like(self)); they have no
C++ meta function, and the Python reference meta kernels choose other strides for
mixed layouts, expanded operands and size-1 dims. The op table's kIteratorLayout,
kOtherContiguous, kEmptyLikeSelf and kContiguousResult traits give CPU's rule
(csrc/ops/memory_format.cpp). Every case compares sizes, strides and values with
CPU; structured neighbours (where, lerp) guard the other path. Structured kernels whose
TensorIterator converts inputs of another dtype before it orders the dims (add, mul, eq,
atan2, ...: test_mixed_dtype_result_strides) take the same kIteratorLayout rule.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)

A = torch.ops.aten


def _layouts():
    """name -> (CPU base tensor maker, view applied on each device): each layout is made
    on the device from the same base values, so both devices see the same geometry."""
    return {
        "contiguous": (lambda: torch.randn(2, 3, 4, 5), lambda t: t),
        "transposed": (lambda: torch.randn(2, 5, 4, 3), lambda t: t.transpose(1, 3)),
        "channels_last": (lambda: torch.randn(2, 3, 4, 5), lambda t: t.contiguous(memory_format=torch.channels_last)),
        "expanded": (lambda: torch.randn(1, 3, 1, 5), lambda t: t.expand(2, 3, 4, 5)),
        "size1": (lambda: torch.randn(2, 1, 4, 1), lambda t: t),
        "size1_transposed": (lambda: torch.randn(4, 1, 2, 1), lambda t: t.transpose(0, 2)),
        "permuted": (lambda: torch.randn(5, 4, 3, 2), lambda t: t.permute(3, 2, 1, 0)),
    }


LAYOUTS = _layouts()
PAIRS = list(itertools.product(LAYOUTS, LAYOUTS))

# name -> fn(a, b) with a, b float tensors on one device (shapes broadcast to (2, 3, 4, 5))
OPS = {
    # kIteratorLayout
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "floor_divide_int": lambda a, b: torch.floor_divide((a * 10).to(torch.int32), (b * 10).to(torch.int32) | 1),
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "logical_and_bool_float": lambda a, b: torch.logical_and(a > 0, b),
    "logical_or_bool": lambda a, b: torch.logical_or(a > 0, b > 0),
    "complex": torch.complex,
    "polar": lambda a, b: torch.polar(a.abs(), b),
    "hardtanh_backward": lambda a, b: A.hardtanh_backward(a, b, -1.0, 1.0),
    "hardswish_backward": lambda a, b: A.hardswish_backward(a, b),
    "native_dropout_backward": lambda a, b: A.native_dropout_backward(a, b > 0, 2.0),
    # kIteratorLayout + kOtherContiguous
    "ldexp": torch.ldexp,
    # kEmptyLikeSelf
    "huber_loss": lambda a, b: F.huber_loss(a, b, reduction="none"),
    "binary_cross_entropy": lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), reduction="none"),
    "binary_cross_entropy_backward": lambda a, b: A.binary_cross_entropy_backward(a, b.sigmoid(), a.sigmoid(), None, 0),
    # structured neighbours (their C++ meta function gives the layout)
    "add": torch.add,
    "atan2": torch.atan2,
    "where": lambda a, b: torch.where(b > 0, a, b),
    "eq": torch.eq,
    "lerp_tensor_weight": lambda a, b: torch.lerp(a, b, b),
}

# Called directly with operands of different shapes, CPU's binary_cross_entropy_backward
# iterates over squeezed operands (an error for most pairs, which the device does not raise).
SAME_SHAPE_ONLY = {"binary_cross_entropy_backward"}


def _pair(la, lb):
    (ma, fa), (mb, fb) = LAYOUTS[la], LAYOUTS[lb]
    a0, b0 = ma(), mb()
    return (fa(a0), fb(b0)), (fa(a0.to("tpu")), fb(b0.to("tpu")))


def _check(expected, got):
    assert got.device.type == "tpu"
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    assert got.stride() == expected.stride(), (expected.stride(), got.stride())
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("la,lb", PAIRS, ids=[f"{x}-{y}" for x, y in PAIRS])
def test_fresh_result_strides(op, la, lb):
    (a, b), (ta, tb) = _pair(la, lb)
    assert (ta.stride(), tb.stride()) == (a.stride(), b.stride())
    if op in SAME_SHAPE_ONLY and a.shape != b.shape:
        pytest.skip("operands of different shapes: CPU's kernel squeezes them (not a broadcast this test covers)")
    try:
        expected = OPS[op](a, b)
    except (RuntimeError, ValueError) as e:  # CPU rejects the pair: so must the device, with its error
        with pytest.raises(type(e)):
            OPS[op](ta, tb)
        return
    _check(expected, OPS[op](ta, tb))


# out= with an empty out tensor: CPU's kernel resizes it and lays it out as a fresh result.
OUT_OPS = {
    "floor_divide": lambda a, b, out: torch.floor_divide(a, b, out=out),
    "logical_xor": lambda a, b, out: torch.logical_xor(a, b, out=out),
    "complex": lambda a, b, out: torch.complex(a, b, out=out),
    "polar": lambda a, b, out: torch.polar(a.abs(), b, out=out),
    "huber_loss": lambda a, b, out: torch._C._nn.huber_loss(a, b, 0, 1.0, out=out),
}
OUT_DTYPES = {"logical_xor": torch.bool, "complex": torch.complex64, "polar": torch.complex64}


@pytest.mark.parametrize("op", list(OUT_OPS))
@pytest.mark.parametrize(
    "la,lb",
    [("contiguous", "transposed"), ("expanded", "channels_last"), ("size1", "permuted"), ("transposed", "size1")],
)
def test_resized_out_strides(op, la, lb):
    (a, b), (ta, tb) = _pair(la, lb)
    dtype = OUT_DTYPES.get(op, torch.float32)
    out, tout = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype, device="tpu")
    OUT_OPS[op](a, b, out)
    OUT_OPS[op](ta, tb, tout)
    _check(out, tout)


@pytest.mark.parametrize("op", ["floor_divide", "logical_and"])
def test_out_of_the_right_shape_keeps_its_strides(op):
    # CPU writes into an out= of the result's shape as it is (here: transposed).
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(4, 3, dtype=torch.bool if op == "logical_and" else torch.float32).t()
    tout = out.to("tpu").t().contiguous().t()
    assert tout.stride() == out.stride()
    getattr(torch, op)(a, b, out=out)
    getattr(torch, op)(a.to("tpu"), b.to("tpu"), out=tout)
    _check(out, tout)


@pytest.mark.parametrize("la", ["contiguous", "transposed", "channels_last", "permuted"])
def test_mse_loss_backward_is_contiguous(la):
    # CPU allocates grad_input with zeros_like(input, contiguous) and iterates into it.
    (g, x), (tg, tx) = _pair(la, la)
    y = torch.randn_like(x)
    expected = A.mse_loss_backward(g, x, y, 0)
    _check(expected, A.mse_loss_backward(tg, tx, y.to("tpu"), 0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int8, torch.float16])
@pytest.mark.parametrize(
    "la,lb", [("contiguous", "transposed"), ("expanded", "permuted"), ("size1_transposed", "channels_last")]
)
def test_floor_divide_dtypes(dtype, la, lb):
    (a, b), (ta, tb) = _pair(la, lb)
    a, ta = (a * 20).to(dtype), (ta * 20).to(dtype)
    b, tb = (b * 20).to(dtype).abs() + 1, (tb * 20).to(dtype).abs() + 1  # no integer division by zero
    assert (ta.stride(), tb.stride()) == (a.stride(), b.stride())
    _check(torch.floor_divide(a, b), torch.floor_divide(ta, tb))


# Structured TensorIterator kernels that promote their inputs to a common dtype: CPU's iterator
# replaces an input of another dtype by its `.to(common)` copy before it orders the dims, so an
# expanded int32 operand of a float32 op enters contiguous (its copy's layout) and decides the
# result's layout; the meta kernel's iterator converts nothing (kIteratorLayout now names them).
# Found by tests/executors/tpu/test_random_fused.py: add(expanded int32, permuted float32).
MIXED_OPS = {
    "add": torch.add,
    "sub": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": torch.mul,
    "div": torch.div,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "eq": torch.eq,
    "lt": torch.lt,
    "maximum": torch.maximum,
    "fmin": torch.fmin,
    "pow": torch.pow,
    "atan2": torch.atan2,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "copysign": torch.copysign,
    "xlogy": torch.xlogy,
    "clamp_min_tensor": lambda a, b: torch.clamp(b, min=a),
    "clamp_tensor_self_int": lambda a, b: torch.clamp(a, min=b),
    "addcmul": lambda a, b: torch.addcmul(b, a, b),
    "bitwise_xor": lambda a, b: torch.bitwise_xor(a, b.to(torch.int64)),
}
MIXED_PAIRS = [
    ("expanded", "permuted"),
    ("permuted", "expanded"),
    ("expanded", "transposed"),
    ("size1", "channels_last"),
]


@pytest.mark.parametrize("op", list(MIXED_OPS))
@pytest.mark.parametrize("la,lb", MIXED_PAIRS, ids=[f"{x}-{y}" for x, y in MIXED_PAIRS])
def test_mixed_dtype_result_strides(op, la, lb):
    (ma, fa), (mb, fb) = LAYOUTS[la], LAYOUTS[lb]
    a0, b0 = (ma() * 4).to(torch.int32), mb()  # the int32 base, then the same view on each device
    if op == "bitwise_xor":
        b0 = (b0 * 4).to(torch.int32)
    f = MIXED_OPS[op]
    _check(f(fa(a0), fb(b0)), f(fa(a0.to("tpu")), fb(b0.to("tpu"))))


# Unary ops CPU computes into a TensorIterator's output (abs, angle and logical_not through their
# out= kernel on an empty tensor; isnan and isinf as comparisons): a contiguous input with
# size-1 dims (strides (5, 5, 1, 1)) gets contiguous strides (5, 5, 5, 1) there; the meta
# kernel's empty_like kept the input's. Found by tests/executors/tpu/test_random_fused.py.
UNARY_ITERATOR_OPS = {
    "abs": torch.abs,
    "angle": torch.angle,
    "logical_not": torch.logical_not,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
}
UNARY_VIEWS = {
    "size1_transposed": ((1, 1, 5, 1), lambda t: t.transpose(-1, -2)),
    "transposed": ((4, 5), lambda t: t.t()),
    "sliced": ((4, 10), lambda t: t[:, ::2]),
    "channels_last": ((2, 3, 4, 5), lambda t: t.contiguous(memory_format=torch.channels_last)),
    "expanded": ((1, 5), lambda t: t.expand(3, 5)),
    "permuted": ((2, 3, 4), lambda t: t.permute(2, 0, 1)),
}


@pytest.mark.parametrize("op", list(UNARY_ITERATOR_OPS))
@pytest.mark.parametrize("view", list(UNARY_VIEWS))
def test_unary_iterator_result_strides(op, view):
    shape, v = UNARY_VIEWS[view]
    base = torch.randn(shape)
    f = UNARY_ITERATOR_OPS[op]
    _check(f(v(base)), f(v(base.to("tpu"))))


# nan_to_num and hardtanh: CPU's result is empty_like(self) (a dense self's strides exactly,
# size-1 dims included); the meta kernel recomputed the strides of size-1 dims
# (kPreservesSelfStrides). Found by the slow tier of tests/executors/tpu/test_random_fused.py.
@pytest.mark.parametrize("op", ["nan_to_num", "hardtanh"])
@pytest.mark.parametrize("view", [*UNARY_VIEWS, "size1_3d"])
def test_self_strides_result(op, view):
    shape, v = ((1, 5, 1), lambda t: t.transpose(-1, -2)) if view == "size1_3d" else UNARY_VIEWS[view]
    base = torch.randn(shape)
    f = torch.nan_to_num if op == "nan_to_num" else F.hardtanh
    _check(f(v(base)), f(v(base.to("tpu"))))


# A Python scalar operand: CPU's Scalar overloads (eq.Scalar, remainder.Scalar, bitwise_and.Scalar,
# remainder.Scalar_Tensor, ...) wrap it in a 0-dim tensor the iterator counts, so the operands'
# shapes differ and the iterator orders the dims by the tensor's strides instead of taking its
# contiguous fast path: a (5, 1) tensor of strides (1, 5) gives a result of strides (1, 5), not
# (1, 1). Found by tests/executors/tpu/test_random_fused.py (seed 2405: `eq(v7, 1.5)`).
SCALAR_OPERAND_OPS = {
    "eq": lambda t: torch.eq(t, 1.5),
    "lt": lambda t: t < 0.5,
    "ge": lambda t: torch.ge(t, -0.25),
    "ne": lambda t: t != 2,
    "remainder": lambda t: torch.remainder(t, 1.5),
    "remainder_scalar_self": lambda t: torch.remainder(1.5, t),
    "fmod": lambda t: torch.fmod(t, 2),
    "bitwise_and": lambda t: (t > 0) & True,
    "xlogy_scalar_self": lambda t: torch.xlogy(2.0, t),
    "add": lambda t: torch.add(t, 1.5),
    "div_floor": lambda t: torch.div(t, 2, rounding_mode="floor"),
}
SCALAR_OPERAND_VIEWS = {
    "size1_transposed": ((1, 5), lambda t: t.t()),
    "size1_4d": ((1, 1, 5, 1), lambda t: t.transpose(-1, -2)),
    "expanded_sliced": ((1, 5), lambda t: t[:, :1].expand(3, 5)[:, ::2].t()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("op", list(SCALAR_OPERAND_OPS))
@pytest.mark.parametrize("view", list(SCALAR_OPERAND_VIEWS))
def test_scalar_operand_result_strides(op, view, dtype):
    shape, v = SCALAR_OPERAND_VIEWS[view]
    base = (torch.randn(shape) * 3).to(dtype)
    f = SCALAR_OPERAND_OPS[op]
    _check(f(v(base)), f(v(base.to("tpu"))))
