"""The JIT's flush cache (csrc/jit/flush_cache.h, issue 18: a cache-hit flush only binds and runs).

A flush with the same structure as an earlier one (same ops, argument relations and exact
geometry, same storages observed after it, same structural argument values) reuses that
flush's partition, structural keys, kernels and flush-local memory schedule
(``metrics()["flush_cache_hits"]``); a flush that differs in one of those details plans
anew. Runtime scalars (Python floats, 0-dim tensors) are bound per flush. Errors poison
the same storages on a hit as on the flush that planned. The cache is bounded (LRU,
``flush_cache_size`` <= ``flush_cache_limit``). Values are compared with CPU PyTorch."""

import pytest
import torch

from difftest import DEVICE, cpu_randn
from threaded import run_threads

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the flush cache exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager as tte


def _chain(x, s=0.25):
    y = (x + 1.0) * x
    y = y.sin().exp() - x
    return (y * s).abs() + x


def _hits():
    return tte.metrics()["flush_cache_hits"]


def test_repeated_flush_hits_and_equals_cpu():
    x = cpu_randn(4, 4, seed=1)
    xd = x.to("tpu")
    for _ in range(2):  # plans this structure (the first flush may also hold the copy to the device)
        _chain(xd).cpu()
    tte.reset_metrics()
    for _ in range(3):
        torch.testing.assert_close(_chain(xd).cpu(), _chain(x))
    m = tte.metrics()
    assert m["flush_cache_hits"] == 3, m
    assert m["compiles"] == 0 and m["cache_hits"] == m["regions_run"] > 0, m
    assert 1 <= m["flush_cache_size"] <= m["flush_cache_limit"], m


def test_runtime_scalars_are_bound_on_a_hit():
    # The scale is a Python float (a runtime parameter): every value hits the same plan.
    # add's alpha of 1 and of other values take different tile functions in the fused loop.
    x, y = cpu_randn(3, 5, seed=2), cpu_randn(3, 5, seed=3)
    xd, yd = x.to("tpu"), y.to("tpu")
    _chain(xd, 0.5).cpu()
    before = _hits()
    for s in (0.5, -2.0, 3.0, 1.0, 0.125):
        torch.testing.assert_close(_chain(xd, s).cpu(), _chain(x, s))
        torch.testing.assert_close(torch.add(xd * 2, yd, alpha=s).neg().cpu(), torch.add(x * 2, y, alpha=s).neg())
    assert _hits() - before >= 8


@pytest.mark.parametrize(
    "variant",
    ["transposed_input", "offset_view", "other_size", "reduction_dim", "observed_intermediate", "dtype"],
)
def test_a_flush_differing_in_one_detail_misses(variant):
    base = cpu_randn(6, 6, seed=4)

    def program(x, kind):
        if kind == "transposed_input":
            x = x.t()  # same sizes, other strides
        elif kind == "offset_view":
            x = x.view(-1)[1:].view(5, 7)[:, :6]  # same ops on a view at another offset
        elif kind == "other_size":
            x = x[:5]
        elif kind == "dtype":
            x = x.double()
        keep = x * 3.0
        y = (keep + 1.0).exp().sum(dim=1 if kind == "reduction_dim" else 0)
        return y, keep

    xd = base.to("tpu")
    for _ in range(2):  # the base structure, planned then hit
        y = program(xd, "base")[0]  # `keep` dies before the flush: nothing observes it
        torch.testing.assert_close(y.cpu(), program(base, "base")[0])
    before = _hits()
    y, keep = program(xd, variant)
    if variant != "observed_intermediate":
        del keep  # as in the base program
    expected_y, expected_keep = program(base, variant)
    torch.testing.assert_close(y.cpu(), expected_y)
    assert _hits() == before, f"{variant}: a flush of another structure must not hit"
    if variant == "observed_intermediate":
        torch.testing.assert_close(keep.cpu(), expected_keep)


def _failing(x, value, mask):
    w = (x * 2).abs() + 1
    t = (w * 10).to(torch.int8)
    bad = t.masked_fill(mask, value)  # 300 does not fit int8: fails when it runs
    after = w - 1  # independent of the failing op
    dependent = bad + 1
    return w, after, bad, dependent


def test_an_error_in_a_cached_flush_poisons_what_it_did_on_the_planning_flush():
    x = cpu_randn(4, 8, seed=5)
    mask = torch.ones(4, 8, dtype=torch.bool)
    xd, maskd = x.to("tpu"), mask.to("tpu")
    w_cpu, after_cpu, _, _ = _failing(x, torch.tensor(3), mask)
    messages = []
    for attempt in range(3):  # the first flush plans, the later ones hit
        hits = _hits()
        w, after, bad, dependent = _failing(xd, torch.tensor(300, device="tpu"), maskd)
        with pytest.raises(RuntimeError, match="without overflow") as first:
            bad.cpu()
        if attempt > 0:
            assert _hits() == hits + 1
        torch.testing.assert_close(after.cpu(), after_cpu)
        torch.testing.assert_close(w.cpu(), w_cpu)
        with pytest.raises(RuntimeError, match="without overflow") as second:
            dependent.cpu()
        assert str(second.value) == str(first.value)
        messages.append(str(first.value))
    assert messages[1] == messages[2]
    # The same cached structure without the error computes CPU's values.
    w, after, bad, dependent = _failing(xd, torch.tensor(3, device="tpu"), maskd)
    _, _, bad_cpu, dependent_cpu = _failing(x, torch.tensor(3), mask)
    torch.testing.assert_close(dependent.cpu(), dependent_cpu)
    torch.testing.assert_close(bad.cpu(), bad_cpu)


def test_verifier_runs_on_a_hit():
    x = cpu_randn(5, seed=6)
    xd = x.to("tpu")
    # On for the rest of the session, as tests/jit/test_partition.py leaves it (no getter to restore).
    tte._C._jit_set_verify(True)
    before = _hits()
    for _ in range(3):
        torch.testing.assert_close(_chain(xd).cpu(), _chain(x))
    assert _hits() - before >= 2


def test_cache_stays_within_its_bound():
    before = tte.metrics()["flush_cache_limit"]
    tte._C._set_flush_cache_limit(4)
    try:
        x = cpu_randn(8, seed=7)
        xd = x.to("tpu")
        for n in range(1, 30):  # 29 distinct structures: chains of n ops
            y, yc = xd, x
            for _ in range(n):
                y, yc = y * 1.5 + 1.0, yc * 1.5 + 1.0
            torch.testing.assert_close(y.cpu(), yc)
            m = tte.metrics()
            assert m["flush_cache_size"] <= 4 == m["flush_cache_limit"], m
    finally:
        tte._C._set_flush_cache_limit(before)
    assert tte.metrics()["flush_cache_limit"] == before


def test_a_tensor_list_argument_is_cacheable():
    # cat's Tensor[] argument (its tensors recorded as inputs) is part of the structure.
    x = cpu_randn(3, 4, seed=8)
    xd = x.to("tpu")
    for _ in range(2):
        torch.cat([xd * 2, xd + 1]).exp().cpu()
    before = _hits()
    for _ in range(2):
        torch.testing.assert_close(torch.cat([xd * 2, xd + 1]).exp().cpu(), torch.cat([x * 2, x + 1]).exp())
    assert _hits() - before == 2


def test_a_dropped_plan_is_not_reused_and_lru_order_holds():
    # A hit first compares the plans this thread used last (flush_cache.cpp); a plan the
    # cache evicted or cleared must still plan anew, and a hit found that way still
    # counts as the most recent use for the LRU order.
    before = tte.metrics()["flush_cache_limit"]
    x = cpu_randn(6, seed=11)
    xd = x.to("tpu")
    xd.cpu()

    def chain(t, k):
        for _ in range(k):
            t = t * 1.5 + 1.0
        return t

    def hit(k):
        h = _hits()
        torch.testing.assert_close(chain(xd, k).cpu(), chain(x, k))
        return _hits() - h == 1

    tte._C._set_flush_cache_limit(2)
    try:
        hit(1)
        assert hit(1)  # A planned, then hit
        assert not hit(2)  # B planned: the cache holds A and B
        assert hit(1)  # A again (not this thread's last plan): now the most recently used
        assert not hit(3)  # C planned: evicts B, the least recently used
        assert hit(1)
        assert not hit(2)  # B was evicted: planned anew (the cache now holds B and A)
        tte._C._set_flush_cache_limit(1)  # keeps B only
        assert not hit(1)
        tte._C._clear_cache()
        assert not hit(1)  # cleared: planned anew
        assert hit(1)
    finally:
        tte._C._set_flush_cache_limit(before)


def _mixed(x, kind):
    # Arguments of every kind the structure reads, in the middle of a trace: an int list,
    # a string, an int, a bool, a float; then a detail changed at one op.
    y = x.permute(1, 0) * 2.0
    y = torch.div(y, 3.0, rounding_mode="floor" if kind != "trunc" else "trunc")
    y = y.sum(dim=[0] if kind != "dim1" else [1], keepdim=kind != "nokeep")
    y = y + x.narrow(0, 1 if kind != "narrow2" else 2, 2).sum(0, keepdim=True).sum()
    return (y.clamp(min=-1.5) if kind != "max" else y.clamp(max=1.5)) * 0.5


@pytest.mark.parametrize("kind", ["trunc", "dim1", "nokeep", "narrow2", "max"])
def test_a_detail_changed_mid_trace_misses_and_gives_cpu_values(kind):
    x = cpu_randn(5, 5, seed=11) * 4
    xd = x.to("tpu")
    for _ in range(2):  # planned, then hit
        torch.testing.assert_close(_mixed(xd, "base").cpu(), _mixed(x, "base"))
    before = _hits()
    torch.testing.assert_close(_mixed(xd, "base").cpu(), _mixed(x, "base"))
    assert _hits() == before + 1
    torch.testing.assert_close(_mixed(xd, kind).cpu(), _mixed(x, kind))
    assert _hits() == before + 1, f"{kind}: a flush of another structure must not hit"
    torch.testing.assert_close(_mixed(xd, "base").cpu(), _mixed(x, "base"))  # the base plan again
    assert _hits() == before + 2


def test_per_thread_flush_memory_reused_across_flush_sizes():
    # A thread reuses one storage numbering and one HostMemory for its flushes; a long
    # flush grows them, a short one after it shrinks or reuses them: values stay CPU's.
    x = cpu_randn(8, 8, seed=12)
    xd = x.to("tpu")

    def long_chain(t, n):
        for i in range(n):
            t = (t * 0.5 + float(i % 3)).sin()
        return t

    for n in (300, 2, 300, 1, 40, 2):
        for _ in range(2):
            torch.testing.assert_close(long_chain(xd, n).cpu(), long_chain(x, n))


def _aliasing(a, b):
    # One pass numbers the storages as it writes the structure: which references share a
    # storage (a + a against a + b, an in-place write, a view of an operand) is part of it.
    y = a * 2.0 + b
    z = y.clone()
    z.add_(a[0:1])
    return (z * b).sin() + y


def test_storage_sharing_is_structure_on_a_hit():
    a, b = cpu_randn(4, 6, seed=13), cpu_randn(4, 6, seed=14)
    ad, bd = a.to("tpu"), b.to("tpu")
    for _ in range(2):  # planned, then hit
        torch.testing.assert_close(_aliasing(ad, bd).cpu(), _aliasing(a, b))
    before = _hits()
    torch.testing.assert_close(_aliasing(ad, ad).cpu(), _aliasing(a, a))  # b is a: other numbering
    assert _hits() == before, "a flush whose references share other storages must not hit"
    for _ in range(2):
        torch.testing.assert_close(_aliasing(ad, bd).cpu(), _aliasing(a, b))
        torch.testing.assert_close(_aliasing(ad, ad).cpu(), _aliasing(a, a))
    assert _hits() == before + 4


def _loops_between_library_ops(x, w):
    # Fused loops read and write raw device memory (HostMemory::data_for / device_data);
    # library calls (matmul, cumsum) between them bind CPU storages over the same
    # storages, and some intermediates are flush-local (HostMemory::set_transient).
    h = x @ w  # library call: its result buffer may become the device memory
    h = (h * 0.5 + 1.0).tanh()  # a fused loop over it
    c = h.cumsum(1)  # library call reading the loop's output
    u = (c - h).sigmoid() * 2.0  # a fused loop reading both
    return u @ w.t(), h


def test_fused_loops_and_library_calls_share_buffers_on_hits():
    x, w = cpu_randn(5, 7, seed=15), cpu_randn(7, 7, seed=16)
    xd, wd = x.to("tpu"), w.to("tpu")
    want = _loops_between_library_ops(x, w)
    before = _hits()
    for _ in range(4):  # planned, then hits
        got = _loops_between_library_ops(xd, wd)
        torch.testing.assert_close(got[0].cpu(), want[0])
        torch.testing.assert_close(got[1].cpu(), want[1])
    # The second output dropped: h becomes flush-local memory (another plan), then hits.
    for _ in range(3):
        torch.testing.assert_close(_loops_between_library_ops(xd, wd)[0].cpu(), want[0])
    assert _hits() - before >= 4


@pytest.mark.parametrize("rank", [5, 6, 8])
def test_tensors_of_more_than_four_dims_hit_and_equal_cpu(rank):
    # The structure makes room per reference for up to four dims (Dims' inline size); a
    # reference of more makes room for its whole op first, at any position of the trace.
    x = cpu_randn(*(2, 1, 3, 1, 2, 1, 2, 3)[:rank], seed=17)
    s = cpu_randn(2, 3, seed=18)
    xd, sd = x.to("tpu"), s.to("tpu")

    def f(t, small):
        y = (small * 2.0).sin()  # small references first
        z = t.permute(*range(t.dim() - 1, -1, -1)) * 0.5 + 1.0  # then five to eight dims, strided
        w = z.sum(dim=[0, 2]) + y.sum()
        return w.unsqueeze(0).unsqueeze(0).exp(), (y + 1.0).cos()

    want = f(x, s)
    before = _hits()
    for _ in range(3):
        got = f(xd, sd)
        torch.testing.assert_close(got[0].cpu(), want[0])
        torch.testing.assert_close(got[1].cpu(), want[1])
    assert _hits() - before >= 2


def test_inactive_targets_last_flush_is_empty_after_each_switch(spyre_target):
    # The inactive executor's last-flush state is emptied at the first flush after a
    # switch (not at every flush): Spyre's schedule, KTIR and job plan show its own last
    # flush while it is active, and nothing once a TPU flush ran, however many follow.
    tte = spyre_target
    from torch_tpu_eager import spyre

    x = cpu_randn(8, 64, seed=19)
    for _ in range(2):
        xd = x.to("tpu")
        torch.testing.assert_close(((xd * 2.0) + 1.0).cpu(), (x * 2.0) + 1.0)
        assert spyre.last_schedule() and spyre.dump_ktir() and spyre.job_plan()["steps"]
        tte.set_target("tpu-v5e")
        for _ in range(3):
            yd = x.to("tpu")
            torch.testing.assert_close(((yd * 2.0) + 1.0).cpu(), (x * 2.0) + 1.0)
            assert spyre.last_schedule() == [] and spyre.dump_ktir() == "", "a TPU flush empties Spyre's"
            assert spyre.job_plan()["steps"] == [], spyre.job_plan()
        tte.set_target("spyre")


# A node recorded with an interned meta key (Node::meta_id, issue 18) enters the structure as
# that id and its storage numbers only. The id must stand for everything else exactly: each
# variant runs the base program's ops on an operand (or with an argument) that differs in one
# detail only the id carries. (Storage sharing: test_storage_sharing_is_structure_on_a_hit.)
def _detail_program(t, s=2.0, mode="floor"):
    y = torch.div(torch.add(t, t, alpha=s), 0.75, rounding_mode=mode)  # alpha: a Scalar argument
    return (y + t).abs()


@pytest.mark.parametrize("kind", ["offset", "stride", "shape", "dtype", "scalar_beyond_float", "string_arg"])
def test_interned_node_ids_are_exact(kind):
    big = cpu_randn(40, seed=21)
    base = big[:36].view(6, 6)
    operands = {  # CPU tensor -> its device twin, made (and flushed) before the program
        "base": base,
        "offset": big[1:37].view(6, 6),  # same sizes and strides, storage offset 1
        "stride": base.t(),  # same sizes and storage, column-major strides
        "shape": base[:, :5],
        "dtype": base.double(),
    }
    bigd = big.to("tpu")
    on_device = {
        "base": bigd[:36].view(6, 6),
        "offset": bigd[1:37].view(6, 6),
        "stride": bigd[:36].view(6, 6).t(),
        "shape": bigd[:36].view(6, 6)[:, :5],
        "dtype": operands["dtype"].to("tpu"),
    }
    tte.synchronize()
    args = {"scalar_beyond_float": {"s": 1e39}, "string_arg": {"mode": "trunc"}}.get(kind, {})
    # (An alpha beyond float's range is CPU's overflow error for a float32 operand: float64.)
    first = "dtype" if kind == "scalar_beyond_float" else "base"
    t, src = on_device.get(kind, on_device[first]), operands.get(kind, operands[first])
    for _ in range(2):  # planned, then hit
        torch.testing.assert_close(_detail_program(on_device[first]).cpu(), _detail_program(operands[first]))
    before = _hits()
    for k in range(2):  # the variant: planned (a miss), then its own hit
        torch.testing.assert_close(_detail_program(t, **args).cpu(), _detail_program(src, **args), equal_nan=True)
        assert _hits() == before + k, f"{kind}: a flush differing in that detail must not hit"


def test_hits_make_no_new_meta_key_ids():
    # A repeated step finds every op's meta key interned: no new id, the flush hits.
    x = cpu_randn(5, 3, seed=23)
    xd = x.to("tpu")
    for _ in range(2):
        _chain(xd, 0.5).cpu()
    ids, before = tte._C._meta_cache_stats()["last_id"], _hits()
    for s in (0.5, 0.25, 4.0):
        torch.testing.assert_close(_chain(xd, s).cpu(), _chain(x, s))
    assert tte._C._meta_cache_stats()["last_id"] == ids
    assert _hits() == before + 3


def test_threads_recording_at_once_share_ids_and_equal_cpu():
    # Four threads record at once into the chip's one queue (their flushes interleave
    # in whatever order the scheduler gives, so which flushes hit is not fixed):
    # interning under contention gives exactly one id per distinct key, every result is
    # CPU's, and a plan made before the threads still serves its structure after them.
    import threading

    def last_id():
        return tte._C._meta_cache_stats()["last_id"]

    def run(x, s=0.25):
        torch.testing.assert_close(_chain(x.to("tpu"), s).cpu(), _chain(x, s))

    # Empty the meta cache first: keys an earlier test interned would take no new id.
    limit = tte._C._meta_cache_stats()["limit"]
    tte._C._set_meta_cache_limit(1)
    tte._C._set_meta_cache_limit(limit)
    ids = last_id()
    run(cpu_randn(9, 3, seed=23))
    per_shape = last_id() - ids  # ids one new shape of the program takes
    assert per_shape > 0
    warm = cpu_randn(6, 4, seed=24)
    run(warm)  # planned before the threads start
    shared = cpu_randn(5, 4, seed=22)  # interned by whichever thread records it first
    barrier = threading.Barrier(4)

    def work(tid):
        own = cpu_randn(3 + tid, 2, seed=25 + tid)
        barrier.wait()
        for i in range(20):
            run(shared, 0.5 + i)
            run(own)
            run(warm, 0.5 + i)

    ids = last_id()
    run_threads(work, [(t,) for t in range(4)])
    assert last_id() - ids == 5 * per_shape  # the shared shape once, and each thread's own
    ids, before = last_id(), _hits()
    run(warm, 2.0)
    assert _hits() == before + 1 and last_id() == ids


def _two_operands(p, q):
    # p read first, q second: one structure whichever float32 (3, 8) tensors p and q are.
    return ((p * 2.0 + q).exp() - p).tanh() * 0.5


def test_a_hit_binds_each_flushs_own_buffers():
    # A plan's regions bind their buffers through this flush's storage numbers
    # (Region::storage_numbers, HostMemory::numbered): the same structure over other
    # tensors, or over the same tensors in the other order, reads and writes each flush's own.
    xs = [cpu_randn(3, 8, seed=40 + k) for k in range(4)]
    ds = [x.to("tpu") for x in xs]
    torch.testing.assert_close(_two_operands(ds[0], ds[1]).cpu(), _two_operands(xs[0], xs[1]))  # planned
    before = _hits()
    for i, j in [(1, 0), (2, 3), (3, 2), (0, 3), (1, 0)]:
        torch.testing.assert_close(_two_operands(ds[i], ds[j]).cpu(), _two_operands(xs[i], xs[j]))
    assert _hits() - before == 5
    # In place into a tensor from outside the loop that the loop also reads, fresh tensors each flush.
    for i, j in [(0, 1), (1, 0), (2, 1), (3, 0)]:
        a, b, ac, bc = ds[i].clone(), ds[j] + 0.0, xs[i].clone(), xs[j] + 0.0
        a.mul_(b).add_(1.0).exp_()
        ac.mul_(bc).add_(1.0).exp_()
        torch.testing.assert_close(a.cpu(), ac)
        torch.testing.assert_close(b.cpu(), bc)
    assert _hits() - before >= 8


def test_one_region_layout_in_two_plans_alternating():
    # One kernel (the chain's region, one exact layout) runs in two flush plans: the chain
    # alone, and the chain with a library op after it. The kernel keeps one plan's layout
    # signature object and compares the other's words (TpuKernel::same_layout): both plans
    # alternate, each hit computing CPU's values; a third layout (a transposed input) gets its own plan.
    x = cpu_randn(5, 5, seed=50)
    xd = x.to("tpu")
    before = _hits()
    for _ in range(3):
        torch.testing.assert_close(_chain(xd).cpu(), _chain(x))
        torch.testing.assert_close(_chain(xd).cumsum(0).cpu(), _chain(x).cumsum(0))
        torch.testing.assert_close(_chain(xd.t()).cpu(), _chain(x.t()))
    assert _hits() - before >= 6
