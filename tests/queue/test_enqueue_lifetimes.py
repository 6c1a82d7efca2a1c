"""Storage lifetimes around an op's enqueue (ops/record.cpp: the node's references are made
before the op's arguments are dropped). These programs free, grow and flush storages
around that window: a flush inside the enqueue (another stream, another matmul precision,
eager mode DEFER_NEVER), an out= argument whose storage grows under an input that views
it, and temporaries whose only holders are the op's arguments. Each checks CPU's values
and that every storage is freed when its last user goes (memory_allocated back where it
started). They guard any change that holds fewer references at record time (one was tried
and reverted: docs/performance.md, "ref20")."""

import gc
import warnings

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the queue's storage references are the tpu device's")


def _settled():
    """Bytes allocated on the device once nothing is pending and earlier tests' cycles are collected."""
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def _grow_out_over_an_input_view(dev):
    base = torch.arange(4, dtype=torch.float32, device=dev)
    inp = base[:2]  # elements 0-1 of the storage
    x = base[3:]  # element 3: 2 elements from there need a storage of 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "An output with one or more elements was resized"
        torch.add(inp, 10, out=x)
    mid = inp * 2  # reads the grown storage
    return [t.cpu() for t in (base, inp, x, mid)], base.untyped_storage().nbytes()


def test_an_out_argument_whose_storage_grows_under_an_input_that_views_it():
    before = _settled()
    got, got_bytes = _grow_out_over_an_input_view("tpu")
    want, want_bytes = _grow_out_over_an_input_view("cpu")
    assert got_bytes == want_bytes
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert _settled() == before


def test_an_op_on_another_stream_flushes_ops_on_temporaries_inside_its_enqueue():
    x, y = cpu_randn(9, seed=11), cpu_randn(9, seed=12)
    before = _settled()
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    a, b = x.to("tpu"), y.to("tpu")
    with torch.tpu.stream(s1):
        p = (a * 3) * (b + 1)  # pending on s1, over temporaries only the queue holds
    with torch.tpu.stream(s2):
        q = (a - b) + p  # its first op flushes s1's ops
    del a, b
    torch.testing.assert_close(q.cpu(), (x - y) + (x * 3) * (y + 1))
    del p, q
    assert _settled() == before


def test_a_matmul_at_another_precision_flushes_inside_its_enqueue():
    x = cpu_randn(8, 8, seed=13)
    before = _settled()
    a = x.to("tpu")
    y = (a + 1) @ (a * 2)
    with torch.tpu.precision("medium"):
        z = (a - 1) @ a.t()  # flushes the pending ops recorded at the other precision first
    del a
    torch.testing.assert_close(y.cpu(), (x + 1) @ (x * 2), rtol=1e-4, atol=1e-4)
    bf16 = (x - 1).bfloat16().float() @ x.t().bfloat16().float()  # "medium": one bfloat16 pass (the MXU's)
    torch.testing.assert_close(z.cpu(), bf16, rtol=1e-5, atol=1e-4)
    del y, z
    assert _settled() == before


def test_every_op_flushed_at_its_enqueue_frees_its_temporaries():
    x = cpu_randn(5, 3, seed=14)
    before = _settled()
    with torch.tpu.set_eager_mode("DEFER_NEVER"):
        a = x.to("tpu")
        h = a
        for i in range(5):
            h = (h * 0.5 + a).relu() - float(i)  # each op's flush runs before its arguments are dropped
        a.add_(h)  # in place on a storage the queue no longer holds
    torch.testing.assert_close(h.cpu(), _cpu_chain(x))
    torch.testing.assert_close(a.cpu(), x + _cpu_chain(x))
    del a, h
    assert _settled() == before


def _cpu_chain(x):
    h = x
    for i in range(5):
        h = (h * 0.5 + x).relu() - float(i)
    return h


def test_one_storage_read_written_and_returned_by_one_op_across_flushes():
    x = cpu_randn(6, seed=15)
    before = _settled()
    a = x.to("tpu")
    want = x.clone()
    for i in range(3):
        r = torch.add(a, a, alpha=0.5, out=a)  # three references to one storage in one node
        assert r is a
        a.mul_(a)  # an in-place op whose read and write repeat the storage
        want = (want + 0.5 * want) ** 2
        if i == 1:
            torch.testing.assert_close(a.cpu(), want)  # a flush between the nodes
    torch.testing.assert_close(a.cpu(), want)
    del a, r
    assert _settled() == before
