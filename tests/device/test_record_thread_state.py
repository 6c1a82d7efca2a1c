"""Per-thread record state and the allocator's counters across threads.

The record path keeps its per-thread state (argument stacks, meta-key buffer, meta
cache memo) in one plain thread-local struct made by a thread's first record and freed
at its exit, switches the current chip only when an op's chip is not current, and
links fresh storages into the allocator's registry under a spin lock. These tests
check what a user can see of that: memory_stats counters stay exact when threads
allocate and free at once (as CUDA's caching allocator counts every allocation), each
op's result lives on its tensors' chip whatever the current device, the current
device and stream are left as they were, and values equal CPU's.
"""

import gc

import pytest
import torch

from difftest import requires_tpu
from threaded import run_threads

pytestmark = requires_tpu

N = torch.tpu.device_count() if hasattr(torch, "tpu") else 0
two_chips = pytest.mark.skipif(N < 2, reason="needs TORCH_TPU_NUM_DEVICES >= 2")


def _work(steps):
    """A deterministic mix of recorded ops; returns the last value on CPU."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("tpu")
    b = torch.full((2, 3), 0.5, device="tpu")
    for i in range(steps):
        c = a + b
        d = (c * 2 - 1).relu()
        a = d[:, :2].sum(1, keepdim=True).expand(2, 3) / (i + 1)
    return a.cpu()


def _counts():
    gc.collect()
    torch.tpu.synchronize()
    s = torch.tpu.memory_stats()
    return (
        s["allocation.all.allocated"],
        s["allocation.all.freed"],
        s["allocated_bytes.all.allocated"],
        s["allocated_bytes.all.freed"],
        s["allocated_bytes.all.current"],
    )


def test_memory_counters_exact_across_threads():
    steps, threads = 40, 4
    expected = _work(steps)  # warm-up (meta cache, flush plans)
    before = _counts()
    _work(steps)
    one = [x - y for x, y in zip(_counts(), before)]
    assert one[0] > 0 and one[0] == one[1], "every storage one thread made was freed"
    assert one[4] == 0, "memory_allocated back to where it was"

    results = [None] * threads

    def run(k):
        results[k] = _work(steps)

    before = _counts()
    run_threads(run, [(k,) for k in range(threads)], barrier=True)
    many = [x - y for x, y in zip(_counts(), before)]
    # The same program on each thread: exactly `threads` times one thread's counts.
    assert many[:4] == [threads * x for x in one[:4]]
    assert many[4] == 0
    assert torch.tpu.memory_allocated() == before[4]
    for r in results:
        torch.testing.assert_close(r, expected, rtol=0, atol=0)


def test_alias_holders_and_counters_exact_across_threads():
    # A storage's holders outside the queue (its tensor and DLPack aliases of it)
    # and every chip counter change under the allocator's registry lock: threads
    # that make aliases and drop them in either order, while others allocate,
    # leave every storage freed and memory_allocated where it was.
    from torch.utils.dlpack import to_dlpack

    rounds, threads = 30, 4
    base_cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)

    def run(k, out):
        for i in range(rounds):
            x = (base_cpu + k).to("tpu") * 2
            alias = torch.from_dlpack(to_dlpack(x))
            alias.add_(i)  # through the alias: x sees it
            got = x.cpu()
            if (i + k) % 2:
                del x  # the alias is the last holder
                del alias
            else:
                del alias  # the tensor is the last holder
                del x
            out.append((k, i, got))

    before = _counts()
    out = []
    run_threads(run, [(k, out) for k in range(threads)], barrier=True)
    after = _counts()
    assert len(out) == rounds * threads
    for k, i, got in out:
        torch.testing.assert_close(got, (base_cpu + k) * 2 + i, rtol=0, atol=0)
    made, freed = after[0] - before[0], after[1] - before[1]
    assert made > 0 and made == freed, "every storage the threads made was freed"
    assert after[2] - before[2] == after[3] - before[3]
    assert after[4] == before[4] == torch.tpu.memory_allocated()


def test_short_lived_threads_record_and_exit():
    # Each thread's first record makes its state; its exit frees it.
    cpu = torch.linspace(-2, 2, 12).reshape(3, 4)
    out = []

    def run(k):
        x = cpu.to("tpu")
        out.append((k, ((x + k) * x - 0.5).tanh().cpu()))

    run_threads(run, [(k,) for k in range(24)], one_at_a_time=True)
    assert len(out) == 24
    for k, got in out:
        # (tanh in a fused loop may differ from CPU's vectorized tanh in the last bit)
        torch.testing.assert_close(got, ((cpu + k) * cpu - 0.5).tanh())


def test_nested_records_on_one_thread():
    # Backward records ops while the autograd engine holds the caller's frames;
    # the pooled stacks of nested records must not clobber each other.
    w_cpu = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    x_cpu = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    w = w_cpu.to("tpu").requires_grad_()
    x = x_cpu.to("tpu")
    (x @ w).sigmoid().sum().backward()
    wc = w_cpu.clone().requires_grad_()
    (x_cpu @ wc).sigmoid().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


@two_chips
def test_op_result_on_its_tensors_chip_whatever_the_current_device():
    gc.collect()
    torch.tpu.synchronize()
    a_cpu = torch.tensor([1.5, -2.0, 3.0])
    a0 = a_cpu.to("tpu:0")
    a1 = a_cpu.to("tpu:1")
    m0, m1 = torch.tpu.memory_allocated(0), torch.tpu.memory_allocated(1)
    torch.tpu.set_device(1)
    try:
        r0 = a0 * 2 + 1  # chip 0's tensors while chip 1 is current
        assert r0.device == torch.device("tpu:0")
        assert torch.tpu.current_device() == 1
        assert torch.tpu.memory_allocated(1) == m1  # nothing accounted to the current chip
        torch.tpu.synchronize(0)  # the queue frees the dead intermediate
        assert torch.tpu.memory_allocated(0) == m0 + 12  # r0
        r1 = a1 * 2 + 1  # the current chip's
        assert r1.device == torch.device("tpu:1")
        torch.tpu.synchronize(1)
        assert torch.tpu.memory_allocated(1) == m1 + 12
        assert torch.tpu.memory_allocated(0) == m0 + 12
        assert torch.tpu.current_device() == 1
    finally:
        torch.tpu.set_device(0)
    assert torch.tpu.current_device() == 0
    r1b = a1 - 1  # chip 1's tensors while chip 0 is current again
    assert r1b.device == torch.device("tpu:1")
    assert torch.tpu.current_device() == 0
    torch.testing.assert_close(r0.cpu(), a_cpu * 2 + 1)
    torch.testing.assert_close(r1.cpu(), a_cpu * 2 + 1)
    torch.testing.assert_close(r1b.cpu(), a_cpu - 1)


@two_chips
def test_op_under_another_chips_stream_keeps_the_current_stream():
    a_cpu = torch.tensor([0.25, 4.0])
    a1 = a_cpu.to("tpu:1")
    s1 = torch.tpu.Stream(device="tpu:1")
    before0 = torch.tpu.current_stream(0)
    with torch.tpu.stream(s1):
        assert torch.tpu.current_device() == 1
        r = a1.sqrt() + a1
        assert torch.tpu.current_stream(1) == s1
    assert torch.tpu.current_device() == 0
    assert torch.tpu.current_stream(0) == before0
    s1.synchronize()
    torch.testing.assert_close(r.cpu(), a_cpu.sqrt() + a_cpu)
