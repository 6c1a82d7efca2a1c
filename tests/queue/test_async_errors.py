"""A failed op's error that no read reports is raised at the chip's next synchronizing call.

On CPU an op whose indices (or targets, or fill value) are bad raises at its call. Deferred,
when the bad values are computed on the device the op fails at a flush, and a read of its
result raises its error (test_error_isolation.py). When nothing reads the result, the error
is reported as CUDA reports a device-side assert: at the next call that synchronizes with
the chip -- torch.tpu.synchronize(), torch.accelerator.synchronize(), Stream.synchronize(),
Event.synchronize(), or, once no tensor holds the failed value, a read of any of its tensors
to the host -- once, with CPU's exception type and message, naming the op
(csrc/lazy/async_errors.h, docs/errors.md). Unlike CUDA, the queue and every tensor the
failure did not reach stay valid afterwards.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn
from threaded import run_threads

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="deferred errors exist only on the tpu device")


def _on_device(values, d):
    """A long tensor of `values` on `d`, computed there on a device (so a flush needs its
    value: an op reading it cannot check it at the call)."""
    return torch.tensor(values, device=d) + 0


# Each case: a call CPU rejects for the values of an argument computed on the device.
CASES = {
    "embedding": lambda d: F.embedding(_on_device([0, 5], d), torch.ones(3, 4, device=d)),
    "index_select": lambda d: torch.index_select(torch.ones(3, 4, device=d), 0, _on_device([1, 3], d)),
    "gather": lambda d: torch.gather(torch.ones(2, 3, device=d), 1, _on_device([[0, 3]], d)),
    "scatter_": lambda d: torch.zeros(2, 3, device=d).scatter_(1, _on_device([[4]], d), 1.0),
    "index_put_": lambda d: torch.zeros(3, device=d).index_put_((_on_device([7], d),), torch.tensor(1.0, device=d)),
    # the fill value does not fit int8
    "masked_fill_int8": lambda d: torch.zeros(3, dtype=torch.int8, device=d).masked_fill(
        torch.ones(3, dtype=torch.bool, device=d), _on_device(300, d)
    ),
    "nll_loss": lambda d: F.nll_loss(torch.zeros(2, 3, device=d).log_softmax(1), _on_device([0, 3], d)),
    "take": lambda d: torch.take(torch.zeros(3, device=d), _on_device([4], d)),
    "index_fill_": lambda d: torch.zeros(3, device=d).index_fill_(0, _on_device([4], d), 1.0),
    # an integer divisor with a zero: "ZeroDivisionError"
    "fmod": lambda d: torch.fmod(torch.ones(2, dtype=torch.long, device=d), _on_device([2, 0], d)),
    "remainder": lambda d: torch.remainder(5, _on_device([0, 3], d)),
    "floor_divide": lambda d: torch.ones(2, dtype=torch.long, device=d) // _on_device([0, 3], d),
    "div": lambda d: torch.div(torch.ones(2, dtype=torch.long, device=d), _on_device([0, 3], d), rounding_mode="trunc"),
}


def _cpu_error(case):
    with pytest.raises(Exception) as info:
        CASES[case]("cpu")
    return info.value


def _event_sync():
    e = torch.tpu.Event()
    e.record()
    e.synchronize()


SYNCS = {
    "tpu.synchronize": lambda: torch.tpu.synchronize(),
    "accelerator.synchronize": lambda: torch.accelerator.synchronize(),
    "stream.synchronize": lambda: torch.tpu.current_stream().synchronize(),
    "event.synchronize": _event_sync,
    # A read of an unrelated tensor: the failed value died unread, so no read of it can
    # report the failure any more.
    "host_read": lambda: torch.arange(3, device="tpu").cpu(),
    "item": lambda: torch.ones(1, device="tpu").sum().item(),
}


def _assert_cpu_error(raised, cpu_exc, op):
    assert type(raised) is type(cpu_exc), f"CPU raised {type(cpu_exc).__name__}, the device {type(raised).__name__}"
    assert str(cpu_exc) in str(raised), f"not CPU's message {str(cpu_exc)!r}: {raised}"
    assert f"aten::{op}" in str(raised), f"the message does not name aten::{op}: {raised}"


def _flush_without_reporting():
    """Runs every pending op without raising (as the profiler's flush does)."""
    import torch_tpu_eager

    torch_tpu_eager._C._flush(torch_tpu_eager._C.FLUSH_SYNCHRONIZE, raise_error=False)


OP_NAMED = {
    "embedding": "index_select",
    "index_put_": "_index_put_impl_",
    "nll_loss": "nll_loss",
    "masked_fill_int8": "masked_fill",
}


@pytest.fixture(params=["tpu-v5e", "spyre"])
def target(request):
    import torch_tpu_eager

    torch.tpu.synchronize()
    before = torch_tpu_eager.get_target()
    torch_tpu_eager.set_target(request.param)
    try:
        yield request.param
    finally:
        torch_tpu_eager.set_target(before)


@pytest.mark.parametrize("sync", sorted(SYNCS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unread_failure_raises_at_the_next_synchronizing_call(target, case, sync):
    cpu_exc = _cpu_error(case)
    x = cpu_randn(4, seed=1)
    before = x.to("tpu") * 3  # pending before the failing op
    CASES[case]("tpu")  # nothing keeps or reads the result
    after = before + 1  # recorded after it
    with pytest.raises(type(cpu_exc)) as info:
        SYNCS[sync]()
    _assert_cpu_error(info.value, cpu_exc, OP_NAMED.get(case, case.rstrip("_")))
    # Once: the next synchronizing calls do not raise it again; the queue and the
    # other tensors stay valid.
    torch.tpu.synchronize()
    torch.accelerator.synchronize()
    assert torch.equal(before.cpu(), x * 3)
    assert torch.equal(after.cpu(), x * 3 + 1)
    assert torch.equal((after * 2).cpu(), (x * 3 + 1) * 2)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_failure_a_read_raised_is_not_raised_again(target, case):
    cpu_exc = _cpu_error(case)
    bad = CASES[case]("tpu")
    with pytest.raises(type(cpu_exc)):
        bad.cpu()
    torch.tpu.synchronize()  # already reported by the read
    torch.arange(2, device="tpu").cpu()
    with pytest.raises(type(cpu_exc)):
        bad.cpu()  # the tensor keeps its error


def test_ops_reading_a_failed_value_carry_its_error(target):
    cpu_exc = _cpu_error("embedding")
    s = CASES["embedding"]("tpu").sum()
    with pytest.raises(type(cpu_exc)) as info:
        s.item()
    _assert_cpu_error(info.value, cpu_exc, "index_select")
    torch.tpu.synchronize()  # reported once


def test_backward_of_an_unread_failed_forward_raises_at_synchronize(target):
    # The user's case: backward never reads the failed forward value (the gradient of
    # sum is ones), so no read raises; CPU raises at the forward, CUDA at the next
    # synchronizing call.
    with pytest.raises(IndexError) as cpu:
        F.embedding(torch.tensor([0, 5]), torch.ones(3, 4, requires_grad=True))
    w = torch.randn(3, 4, device="tpu", requires_grad=True)
    unrelated = w.detach() * 2
    F.embedding(_on_device([0, 5], "tpu"), w).sum().backward()
    with pytest.raises(IndexError) as info:
        torch.tpu.synchronize()
    _assert_cpu_error(info.value, cpu.value, "index_select")
    torch.tpu.synchronize()
    assert torch.equal(unrelated.cpu(), w.detach().cpu() * 2)
    good = F.embedding(_on_device([0, 2], "tpu"), w)
    assert torch.equal(good.cpu(), w.detach().cpu()[[0, 2]])


def test_a_read_of_another_tensor_leaves_a_held_failure_to_its_tensor(target):
    # While a tensor holds the failed value, its own read reports the failure, so reads of
    # other tensors stay valid (as before this rule); synchronize reports it if the tensor
    # is never read, and once the tensor dies unread, the next read of any tensor does.
    cpu_exc = _cpu_error("gather")
    bad = CASES["gather"]("tpu")
    good = torch.arange(3.0, device="tpu") * 2
    assert good.cpu().tolist() == [0.0, 2.0, 4.0]  # the flush ran the failing gather too
    with pytest.raises(type(cpu_exc)) as info:
        torch.tpu.synchronize()
    _assert_cpu_error(info.value, cpu_exc, "gather")
    with pytest.raises(type(cpu_exc)):
        bad.cpu()  # the tensor keeps its error

    bad = CASES["gather"]("tpu")
    assert (good + 1).cpu().tolist() == [1.0, 3.0, 5.0]
    del bad  # dies unread: no read can report its failure now
    with pytest.raises(type(cpu_exc)):
        good.cpu()
    assert good.cpu().tolist() == [0.0, 2.0, 4.0]


def test_spyre_int64_result_outside_int32_nobody_reads_raises_at_synchronize(spyre_target):
    # Spyre holds int64 as int32: a result outside it fails with OverflowError naming the op
    # (test_spyre_target.py). Unread, the chip's next synchronize reports it.
    a = torch.tensor([2**30, 5], dtype=torch.int64).to("tpu")
    b = a * 4  # noqa: F841 (kept, never read)
    assert (a + 1).cpu().tolist() == [2**30 + 1, 6]  # another tensor's read stays valid
    with pytest.raises(OverflowError, match="mul"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()
    assert (a - 1).cpu().tolist() == [2**30 - 1, 4]


def test_backward_of_an_unread_failed_forward_raises_at_the_next_host_read():
    w = torch.randn(3, 4, device="tpu", requires_grad=True)
    F.embedding(_on_device([0, 5], "tpu"), w).sum().backward()
    with pytest.raises(IndexError, match="index out of range in self"):
        w.grad.cpu()  # the next read synchronizes, as on CUDA
    assert w.grad.cpu().shape == (3, 4)  # the read itself is valid: reported once


def test_a_tensor_holding_a_reported_error_is_valid_after_a_whole_overwrite(target):
    # The error of a failure from an earlier flush, reported by synchronize, has
    # reached the user: as after a read, an op that overwrites the tensor whole makes
    # it valid (CPU: the failing call raised once, the overwrite succeeds).
    t = torch.zeros(3, dtype=torch.int8, device="tpu")
    t.masked_fill_(torch.ones(3, dtype=torch.bool, device="tpu"), _on_device(300, "tpu"))
    _flush_without_reporting()  # the failure happens in this flush; nothing reports it
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.tpu.synchronize()
    t.zero_()
    assert torch.equal(t.cpu(), torch.zeros(3, dtype=torch.int8))


def test_each_failure_is_reported_once_in_order():
    CASES["index_select"]("tpu")
    _flush_without_reporting()
    CASES["masked_fill_int8"]("tpu")
    with pytest.raises(IndexError):
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()


@pytest.mark.skipif(DEVICE == "tpu" and torch.tpu.device_count() < 2, reason="needs two simulated chips")
def test_errors_are_reported_per_chip():
    # As CUDA's errors belong to a device: synchronizing chip 0 or reading its tensors
    # does not report chip 1's failure; chip 1's synchronize does.
    with torch.tpu.device(1):
        CASES["gather"]("tpu")
        torch.tpu.synchronize(0)
        assert torch.arange(3, device="tpu:0").cpu().tolist() == [0, 1, 2]
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.tpu.synchronize(1)
    torch.tpu.synchronize(1)


def test_a_failure_recorded_by_another_thread_is_reported_here():
    # The error belongs to the chip, not to the thread that recorded the op (CUDA).
    run_threads(CASES["index_select"], [("tpu",)])
    with pytest.raises(IndexError, match="index out of range"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()
