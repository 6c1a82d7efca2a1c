"""Errors CPU raises at the call that a deferred device could raise late: Scalar checks after a
cached meta call, bool arithmetic, Scalar overflow, unsupported dtypes, in-place casts."""

import pytest
import torch
import torch.nn.functional as F
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


def _raises_at_call(fn):
    """True when fn() raises before any value is read back (CPU raises at the call)."""
    try:
        fn()
    except RuntimeError:
        return True
    return False


# Fixed in record.cpp key_ivalue: float Scalars keyed by type also key their sign and
# finiteness (value_class), which is what meta kernels check.
def test_renorm_negative_maxnorm_raises_at_call_after_a_cached_call():
    def call(dev, maxnorm):
        return torch.renorm(torch.ones(3, 3, device=dev), 2, 0, maxnorm)

    assert _raises_at_call(lambda: call("cpu", -1.0))
    call("tpu", 1.0).cpu()  # fills the meta cache for (renorm, float Scalar)
    assert _raises_at_call(lambda: call("tpu", -1.0))


def test_softshrink_negative_lambda_raises_at_call_after_a_cached_call():
    def call(dev, lambd):
        return F.softshrink(torch.ones(3, device=dev), lambd)

    assert _raises_at_call(lambda: call("cpu", -0.5))
    call("tpu", 0.5).cpu()
    assert _raises_at_call(lambda: call("tpu", -0.5))


def test_vector_norm_negative_ord_on_empty_raises_at_call_after_a_cached_call():
    def call(dev, ord):
        return torch.linalg.vector_norm(torch.ones(0, device=dev), ord)

    assert _raises_at_call(lambda: call("cpu", -1.0))
    call("tpu", 2.0).cpu()
    assert _raises_at_call(lambda: call("tpu", -1.0))


# Fixed in record.cpp cpu_checks_at_call_time: sub/rsub with a bool operand runs CPU's check at the call.
def test_sub_with_a_bool_operand_raises_at_call():
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool), True))
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool, device="tpu"), True))
    assert _raises_at_call(lambda: torch.ones(3, dtype=torch.bool, device="tpu").sub_(True))
    assert _raises_at_call(lambda: torch.rsub(torch.ones(3, dtype=torch.bool, device="tpu"), True))
    # CPU also rejects a bool on either side with a non-bool tensor.
    assert _raises_at_call(lambda: torch.sub(torch.arange(3), True))
    assert _raises_at_call(lambda: torch.sub(torch.arange(3, device="tpu"), True))
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool, device="tpu"), 1))
    # Without a bool the op still records and matches CPU.
    torch.testing.assert_close(torch.sub(torch.arange(3, device="tpu"), 1).cpu(), torch.sub(torch.arange(3), 1))


# Fixed in ops/scalar_checks.cpp (checked at record time); sweep: tests/record/test_scalar_overflow.py.
def test_full_with_overflowing_fill_value_raises_at_call():
    assert _raises_at_call(lambda: torch.full((3,), 300, dtype=torch.int8))
    assert _raises_at_call(lambda: torch.full((3,), 300, dtype=torch.int8, device="tpu"))


# Fixed in ops/scalar_checks.cpp (float16/bfloat16/float32 rows); sweep: tests/record/test_scalar_overflow_float.py.
@pytest.mark.parametrize(
    "op",
    [
        lambda d: torch.full((3,), 1e6, dtype=torch.half, device=d),
        lambda d: torch.clamp(torch.zeros(3, dtype=torch.half, device=d), min=1e6),
    ],
    ids=["full", "clamp"],
)
def test_float16_overflowing_scalar_raises_at_call(op):
    assert _raises_at_call(lambda: op("cpu"))
    assert _raises_at_call(lambda: op("tpu"))


# Fixed in ops/cpu_probe.cpp (CPU's kernel probed on tiny twins per op and dtypes);
# the class and its neighbours: tests/record/test_dtype_errors_at_the_call.py.
def test_unsupported_dtype_raises_at_call():
    def call(dev):
        return F.hardshrink(torch.zeros(3, dtype=torch.int8, device=dev), 0.5)

    with pytest.raises(NotImplementedError):
        call("cpu")
    with pytest.raises(NotImplementedError):
        call("tpu")


# Fixed in record.cpp (seventh session's QA pass): torch 2.13's meta kernels let
# int32.mul_(0.5) and float16.add_(1j) through, where CPU raises at the call that its
# result type cannot be cast to self's dtype; the device deferred the error, so the
# call succeeded and every later read of self raised. Such calls now run eagerly.
@pytest.mark.parametrize(
    "dtype,op,other",
    [
        (torch.int32, "mul_", 0.5),
        (torch.bool, "mul_", 2),
        (torch.int32, "mul_", 1j),
        (torch.int32, "add_", 1j),
        (torch.int32, "sub_", 1j),
        (torch.float16, "mul_", 1j),
        (torch.float16, "add_", 1j),
        (torch.int32, "mul_", "cpu_scalar_tensor"),
        (torch.int32, "mul_", "tpu_tensor"),
    ],
)
def test_in_place_result_that_cannot_be_cast_raises_at_the_call(dtype, op, other):
    def run(dev):
        x = torch.tensor([1, 0, 1], dtype=dtype, device=dev)
        o = (
            torch.tensor(0.5)
            if other == "cpu_scalar_tensor"
            else torch.tensor([0.5, 1.5, 2.5], device=dev)
            if other == "tpu_tensor"
            else other
        )
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            getattr(x, op)(o)
        x.zero_()
        return x

    assert torch.equal(run("tpu").cpu(), run("cpu"))  # self is unchanged and still usable
