"""A fused loop whose input holds an earlier failure runs op by op, so the ops that read it
raise that failure and the others keep CPU's values: whether the failure happened in an
earlier flush (not yet seen by the user) or in an earlier region of the same flush
(csrc/jit/jit.cpp run_regions' FailedInputs, csrc/executors/tpu/tpu_executor.cpp)."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="deferred errors exist only on the tpu device")


def _failing_int8(n):
    """An int8 "tpu" tensor whose value fails when it is computed (300 does not fit int8)."""
    t = torch.zeros(n, dtype=torch.int8, device="tpu")
    return t.masked_fill(torch.ones(n, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu"))


def _failing_float(n):
    """A float32 "tpu" tensor that holds the failure of its int8 source's computation."""
    return torch.zeros(n, device="tpu").copy_(_failing_int8(n))


def _float_chain(x, bad):
    # Float ops the TPU target runs as one fused loop; `dependent` reads the failed value.
    independent = (x * 2 + 1).abs() * 0.5
    dependent = (bad.float() * 2 + x).abs() * 0.5
    return independent, dependent


def _check(x, independent, dependent):
    with pytest.raises(RuntimeError, match="without overflow"):
        dependent.cpu()
    assert torch.equal(independent.cpu(), (x * 2 + 1).abs() * 0.5)


def _flush_by_another_read(x, bad):
    assert torch.equal((x.to("tpu") - 3).cpu(), x - 3)  # a read of another value flushes the failing op


def _let_the_user_see(x, bad):
    with pytest.raises(RuntimeError, match="without overflow"):
        bad.cpu()


@pytest.mark.parametrize(
    "make_bad, before",
    [
        (_failing_int8, None),  # an earlier region of the same flush
        (_failing_int8, _flush_by_another_read),  # an earlier flush, nobody saw it
        (_failing_float, _flush_by_another_read),  # the loop reads the failed float32 storage itself
        (_failing_int8, _let_the_user_see),  # the user saw it: its readers still fail
    ],
    ids=["same_flush", "earlier_flush", "earlier_flush_float", "seen"],
)
def test_a_fused_loop_reading_a_failure_raises_it(make_bad, before):
    x = cpu_randn(64, seed=4)
    bad = make_bad(64)
    if before is not None:
        before(x, bad)
    independent, dependent = _float_chain(x.to("tpu"), bad)
    _check(x, independent, dependent)


def test_flushes_after_a_failure_compute_cpu_values():
    x = cpu_randn(64, seed=7)
    bad = _failing_int8(64)
    with pytest.raises(RuntimeError, match="without overflow"):
        bad.cpu()
    del bad
    for _ in range(3):  # clean flushes again: every region runs its fused loop
        independent, dependent = _float_chain(x.to("tpu"), torch.ones(64, dtype=torch.int8, device="tpu"))
        assert torch.equal(independent.cpu(), (x * 2 + 1).abs() * 0.5)
        assert torch.equal(dependent.cpu(), ((torch.ones(64) * 2 + x).abs() * 0.5))
