"""Storage lifetimes through the queue: each pending op's reference keeps its storage alive
until the flush that runs it is done (csrc/lazy/queue.h, TensorRef). These programs use one
storage in many pending ops, across flushes, through views, in place, in foreach ops and in
a failing flush, and check CPU's values and that every storage is freed when its last user
goes (memory_allocated back where it started). They guard any change to how references are
held (a per-queue storage table was tried and reverted: docs/performance.md, "ref19")."""

import gc

import pytest
import torch

from difftest import DEVICE, cpu_randn
from threaded import run_threads

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the queue's storage references are the tpu device's")

if DEVICE == "tpu":
    import torch_tpu_eager


def _settled():
    """Bytes allocated on the device once nothing is pending and earlier tests' cycles are collected."""
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def test_a_storage_read_by_many_pending_ops_whose_tensor_died_is_freed_after_the_flush():
    x = cpu_randn(257, seed=1)
    before = _settled()
    a = x.to("tpu")
    acc = a * 1.5
    for i in range(40):
        acc = acc + a * float(i % 3)  # a: one storage, 80 references in one flush
    del a  # only the pending ops hold it now
    got = acc.cpu()
    want = x * 1.5
    for i in range(40):
        want = want + x * float(i % 3)
    torch.testing.assert_close(got, want)
    del acc
    assert _settled() == before


def test_a_storage_pending_in_two_flushes_keeps_its_value_and_is_freed():
    x, y = cpu_randn(6, 5, seed=2), cpu_randn(6, 5, seed=3)
    before = _settled()
    a, b = x.to("tpu"), y.to("tpu")
    s1 = (a * b).sum()
    assert torch.equal(s1.cpu(), (x * y).sum())  # flush 1 held a and b
    a.mul_(2).add_(b)  # flush 2 holds a again, written in place
    v = a[1:4, ::2]  # a view of a's storage: the same table entry
    v.sub_(1)
    c = a + b
    del a, b, v
    want_a = x * 2 + y
    want_a[1:4, ::2] -= 1
    torch.testing.assert_close(c.cpu(), want_a + y)
    del s1, c
    assert _settled() == before


def test_views_and_in_place_writes_of_one_storage_in_one_flush_match_cpu():
    def prog(dev):
        base = torch.arange(24, dtype=torch.float32, device=dev).reshape(4, 6)
        t = base.t()  # one storage, three views, each read and written
        row = base[2]
        row.mul_(3)
        t[1].add_(row[:4])
        out = base.sum(0) + t.sum(1) + row
        base.zero_()
        return out, base, row

    got = prog("tpu")
    want = prog("cpu")
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_ops_over_tensors_that_die_before_the_flush():
    xs = [cpu_randn(7, seed=10 + i) for i in range(5)]
    before = _settled()
    ts = [x.to("tpu") for x in xs]
    outs = torch._foreach_mul(ts, 2.0)
    torch._foreach_add_(outs, ts)  # a foreach node is expanded at the flush: its references copied
    total = outs[0] + outs[4]
    del ts, outs
    torch.testing.assert_close(total.cpu(), (xs[0] * 2 + xs[0]) + (xs[4] * 2 + xs[4]))
    del total
    assert _settled() == before


def test_a_failing_flush_frees_its_storages_and_leaves_the_queue_usable():
    x = cpu_randn(8, seed=4)
    before = _settled()
    a = x.to("tpu")
    w = (a * 10).to(torch.int8)
    bad = w.masked_fill(torch.ones(8, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu"))
    ok = a + a
    with pytest.raises(RuntimeError, match="without overflow"):
        bad.cpu()
    torch.testing.assert_close(ok.cpu(), x + x)
    torch.testing.assert_close((a * 3).cpu(), x * 3)
    del a, w, bad, ok
    assert _settled() == before


def test_ops_recorded_by_two_threads_on_shared_storages():
    x = cpu_randn(33, seed=5)
    a = x.to("tpu")
    results = {}

    def work(k):
        acc = a * 0
        for i in range(200):
            acc = acc + a * float(k)
            if i % 37 == 0:
                acc.sum().item()  # flushes while the other thread records on a
        results[k] = acc.cpu()

    run_threads(work, [(1,), (2,)])
    for k in (1, 2):
        want = x * 0
        for _ in range(200):
            want = want + x * float(k)
        torch.testing.assert_close(results[k], want)


def test_the_flush_cache_still_hits_with_numbers_given_at_record_time():
    x = cpu_randn(4, 4, seed=6)
    a = x.to("tpu")

    def step():
        h = a
        for _ in range(6):
            h = (h * 0.5 + a).relu()
        return h.cpu()

    step()
    torch_tpu_eager.reset_metrics()
    got = [step() for _ in range(3)]
    assert torch_tpu_eager.metrics()["flush_cache_hits"] == 3
    want = x
    for _ in range(6):
        want = (want * 0.5 + x).relu()
    for g in got:
        torch.testing.assert_close(g, want)
