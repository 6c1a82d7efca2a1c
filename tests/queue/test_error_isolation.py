"""An op that fails at a flush loses nothing else: ops of the same region that do not
depend on it still compute CPU's values, ops that read its result raise its error, and
the queue stays usable (csrc/executors/region_runner.cpp, run_ops)."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="deferred errors exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager


def _program(x, y, value, mask):
    # IEEE-exact ops: the chain runs as a fused loop (partition cuts the int8 ops out), and
    # fused transcendental ops may differ from CPU's by an ulp (test_fused_elementwise.py).
    w = (x * 2).abs() * y + 1
    t = (w * 10).to(torch.int8)
    bad = t.masked_fill(mask, value)  # 300 does not fit int8: fails when it runs
    after = w - 1  # recorded after the failing op, independent of it
    dependent = bad + 1  # reads the failing op's result
    return w, after, bad, dependent


def test_independent_ops_after_a_failing_op_keep_their_values():
    x, y = cpu_randn(4, 8, seed=1), cpu_randn(4, 8, seed=2)
    mask = torch.ones(4, 8, dtype=torch.bool)
    w_cpu, after_cpu, _, _ = _program(x, y, torch.tensor(3), mask)
    torch_tpu_eager.reset_metrics()
    w, after, bad, dependent = _program(x.to("tpu"), y.to("tpu"), torch.tensor(300, device="tpu"), mask.to("tpu"))
    with pytest.raises(RuntimeError, match="without overflow") as first:
        bad.cpu()
    assert torch_tpu_eager.metrics()["regions_run"] >= 1
    assert torch.equal(after.cpu(), after_cpu)
    assert torch.equal(w.cpu(), w_cpu)
    with pytest.raises(RuntimeError, match="without overflow") as second:
        dependent.cpu()
    assert str(second.value) == str(first.value), "a dependent op reports the failing op's error"
    assert torch.equal((after * 3).cpu(), after_cpu * 3), "the queue stays usable"


def test_an_in_place_write_by_a_failing_op_poisons_only_its_target():
    x = cpu_randn(6, seed=3)
    xd = x.to("tpu")
    target = torch.zeros(6, dtype=torch.int8, device="tpu")
    other = xd * 5
    target.masked_fill_(torch.ones(6, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu"))
    later = other + xd
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    assert torch.equal(later.cpu(), x * 5 + x)
    assert torch.equal(other.cpu(), x * 5)


def _poisoned_int8(value):
    """An int8 "tpu" tensor holding `value` (CPU int8), then poisoned: a failing op's
    result (300 does not fit int8) is copied into it and the read raises."""
    target = value.to("tpu")
    bad = torch.zeros(3, dtype=torch.int8, device="tpu").masked_fill(
        torch.ones(3, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu")
    )
    target.copy_(bad)
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    return target


_OVERWRITES = {
    "zero_": (lambda t: t.zero_(), lambda t: t.zero_()),
    "fill_": (lambda t: t.fill_(7), lambda t: t.fill_(7)),
    "copy_": (lambda t: t.copy_(torch.tensor([4, 5, 6], dtype=torch.int8)),) * 2,
    "slice_assign": (lambda t: t.__setitem__(slice(None), 9),) * 2,
    "out=": (
        lambda t: torch.add(torch.ones(3, dtype=torch.int8, device="tpu"), 2, out=t),
        lambda t: torch.add(torch.ones(3, dtype=torch.int8), 2, out=t),
    ),
}


@pytest.mark.parametrize("name", sorted(_OVERWRITES))
def test_a_full_overwrite_clears_an_earlier_failure(name):
    # On CPU the failing op raised at its call and the target kept its value; an op
    # that then replaces every element gives a valid tensor. Here the failure is
    # deferred into the target, and the same overwrite must make it valid again.
    on_tpu, on_cpu = _OVERWRITES[name]
    start = torch.tensor([1, 2, 3], dtype=torch.int8)
    target = _poisoned_int8(start)
    on_tpu(target)
    expected = start.clone()
    on_cpu(expected)
    assert torch.equal(target.cpu(), expected)
    assert torch.equal((target + 1).cpu(), expected + 1)


@pytest.mark.parametrize(
    "write",
    [lambda t: t.__setitem__(0, 5), lambda t: t.add_(1), lambda t: torch.add(t, 1, out=t)],
    ids=["partial", "in_place_read", "out_reads_self"],
)
def test_a_write_that_keeps_or_reads_the_failed_value_still_raises(write):
    # A partial overwrite leaves elements of the failed value; add_ and add(t, 1, out=t)
    # read it: each must still report the original error, never return garbage.
    target = _poisoned_int8(torch.tensor([1, 2, 3], dtype=torch.int8))
    write(target)
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()


def _poisoned_2d(shape, memory_format=torch.contiguous_format):
    """A poisoned int8 "tpu" tensor of `shape` in `memory_format` (see _poisoned_int8)."""
    target = torch.zeros(shape, dtype=torch.int8).contiguous(memory_format=memory_format).to("tpu")
    n = target.numel()
    bad = torch.zeros(n, dtype=torch.int8, device="tpu").masked_fill(
        torch.ones(n, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu")
    )
    target.copy_(bad.view(shape))
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    return target


_LAYOUT_OVERWRITES = {
    "transposed_zero_": ((2, 3), torch.contiguous_format, lambda t: t.T.zero_()),
    "transposed_copy_from_host": (
        (2, 3),
        torch.contiguous_format,
        lambda t: t.T.copy_(torch.arange(6, dtype=torch.int8).view(3, 2)),
    ),
    "permuted_fill_": ((2, 3, 4), torch.contiguous_format, lambda t: t.permute(2, 0, 1).fill_(5)),
    "channels_last_zero_": ((2, 3, 2, 2), torch.channels_last, lambda t: t.zero_()),
    "channels_last_copy_from_host": (
        (2, 3, 2, 2),
        torch.channels_last,
        lambda t: t.copy_(torch.arange(24, dtype=torch.int8).view(2, 3, 2, 2)),
    ),
}


@pytest.mark.parametrize("name", sorted(_LAYOUT_OVERWRITES))
def test_a_full_overwrite_in_another_layout_clears_an_earlier_failure(name):
    # A view that covers every byte once in another order of its dims (a transpose,
    # a permutation, channels_last) overwrites the whole storage just the same.
    shape, memory_format, write = _LAYOUT_OVERWRITES[name]
    target = _poisoned_2d(shape, memory_format)
    write(target)
    expected = torch.zeros(shape, dtype=torch.int8).contiguous(memory_format=memory_format)
    write(expected)
    assert torch.equal(target.cpu(), expected)


def test_an_overlapping_view_of_the_whole_storage_does_not_clear():
    # unfold's windows overlap: as many elements as the storage has bytes, but they do
    # not cover it (the last byte is never written), so the error stays.
    target = _poisoned_2d((6,))
    target.unfold(0, 3, 1)[:2].fill_(1)  # 2 windows x 3 = 6 elements over bytes 0..3
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()


_GROWING_OVERWRITES = {
    # out= that grows its tensor (the resize keeps the failed value's bytes, then the
    # op overwrites all of them), resize_ then zero_, and an op run eagerly at the call
    # (masked_select: data-dependent shape) writing through out=.
    "zeros_out_grows": lambda t, dev: torch.zeros(5, dtype=torch.int8, out=t),
    "resize_then_zero_": lambda t, dev: t.resize_(5).zero_(),
    "masked_select_out": lambda t, dev: torch.masked_select(
        torch.arange(5, dtype=torch.int8, device=dev), torch.ones(5, dtype=torch.bool, device=dev), out=t
    ),
}


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
@pytest.mark.parametrize("name", sorted(_GROWING_OVERWRITES))
def test_an_overwrite_that_resizes_clears_an_earlier_failure(name):
    write = _GROWING_OVERWRITES[name]
    target = _poisoned_int8(torch.tensor([1, 2, 3], dtype=torch.int8))
    write(target, "tpu")  # CPU's call succeeds: so must this one
    expected = torch.tensor([1, 2, 3], dtype=torch.int8)
    write(expected, "cpu")
    assert torch.equal(target.cpu(), expected)


def test_an_eager_op_reading_a_failed_value_still_raises():
    # masked_select runs at the call; reading the poisoned tensor raises its error there.
    target = _poisoned_int8(torch.tensor([1, 2, 3], dtype=torch.int8))
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.masked_select(target, torch.ones(3, dtype=torch.bool, device="tpu"))
    resized = _poisoned_int8(torch.tensor([1, 2, 3], dtype=torch.int8))
    resized.resize_(5)  # keeps the failed value's bytes
    with pytest.raises(RuntimeError, match="without overflow"):
        resized.cpu()


def _poison_unseen(target):
    """Copies a failing op's value into `target` without reading it: the error is
    recorded on target's storage but has not reached the user yet."""
    n = target.numel()
    bad = torch.zeros(n, dtype=torch.int8, device="tpu").masked_fill(
        torch.ones(n, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu")
    )
    target.copy_(bad.view(target.shape))


def test_an_error_nobody_saw_is_not_lost_to_an_overwrite():
    # On CPU the failing copy_ raises at its call. Deferred, the error must still reach
    # the user: an overwrite recorded before any read does not swallow it. Once the
    # user has seen it, the same overwrite makes the tensor valid.
    target = torch.tensor([1, 2, 3], dtype=torch.int8).to("tpu")
    _poison_unseen(target)
    target.zero_()
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    target.zero_()
    assert torch.equal(target.cpu(), torch.zeros(3, dtype=torch.int8))


def test_an_unseen_error_is_not_lost_to_a_host_copy_over_it():
    target = torch.tensor([1, 2, 3], dtype=torch.int8).to("tpu")
    _poison_unseen(target)
    target.copy_(torch.tensor([4, 5, 6], dtype=torch.int8))  # queued behind the failing copy
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    target.copy_(torch.tensor([4, 5, 6], dtype=torch.int8))  # written now: the error was seen
    assert torch.equal(target.cpu(), torch.tensor([4, 5, 6], dtype=torch.int8))


def test_a_host_copy_that_fails_does_not_clear_the_error():
    # Spyre keeps int64 as int32: a value past int32 makes the host-to-device copy
    # raise at its call, after which the tensor must still hold the earlier failure,
    # not the rejected values.
    previous = torch_tpu_eager.get_target()
    torch_tpu_eager.set_target("spyre")
    try:
        target = torch.tensor([1, 2, 3], device="tpu")
        n = target.numel()
        bad = torch.zeros(n, dtype=torch.int8, device="tpu").masked_fill(
            torch.ones(n, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu")
        )
        target.copy_(bad)
        with pytest.raises(RuntimeError, match="without overflow"):
            target.tolist()
        with pytest.raises(OverflowError):
            target.copy_(torch.tensor([2**40, 5, 6]))
        with pytest.raises(RuntimeError, match="without overflow"):
            target.tolist()
    finally:
        torch_tpu_eager.set_target(previous)


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "queued"])
@pytest.mark.parametrize(
    "dtype,bad",
    [(torch.int64, 2**40), (torch.float64, 1e12), (torch.float32, 3e9), (torch.uint32, 2**32 - 1)],
    ids=["int64", "float64", "float32", "uint32"],
)
def test_a_rejected_host_copy_leaves_the_destination_unchanged(dtype, bad, queued):
    # Spyre keeps int64 as int32, so a value past int32 makes the host-to-device copy
    # raise at its call; as for any bad input, the destination keeps its values, also
    # when ops on it are still queued (the copy is then staged and recorded).
    previous = torch_tpu_eager.get_target()
    torch_tpu_eager.set_target("spyre")
    try:
        target = torch.tensor([1, 2, 3], device="tpu")
        if queued:
            target.add_(1)
        else:
            torch.tpu.synchronize()
        expected = [2, 3, 4] if queued else [1, 2, 3]
        with pytest.raises(OverflowError, match="int32"):
            target.copy_(torch.tensor([5, 6, bad]).to(dtype))
        with pytest.raises(OverflowError, match="int32"):
            target[1:].copy_(torch.tensor([bad, 6]).to(dtype))  # through a view, the bad value first
        assert target.tolist() == expected
        target.copy_(torch.tensor([5, 6, 9]).to(dtype))  # a valid copy still lands
        assert target.tolist() == [5, 6, 9]
    finally:
        torch_tpu_eager.set_target(previous)


def test_an_error_raised_by_synchronize_counts_as_seen():
    # synchronize() raises the flush's first error: the user has seen it, so a whole
    # overwrite of the tensor holding it makes that tensor valid at once.
    target = torch.tensor([1, 2, 3], dtype=torch.int8).to("tpu")
    _poison_unseen(target)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.tpu.synchronize()
    target.zero_()
    assert torch.equal(target.cpu(), torch.zeros(3, dtype=torch.int8))
