"""A compiled op-by-op region keeps its ops' CPU argument and out= tensors across runs
(region_runner.h KeptTensors): a cache hit only gives each kept tensor the run's storage.
Every run of the same compiled region with other buffers (fresh inputs, other input
buffers alternated, buffers freed in between, a run after a failed one) computes CPU's
values bit for bit: nothing of an earlier run's buffers is read."""

import gc

import pytest
import torch
import torch_tpu_eager

from difftest import DEVICE, assert_bit_equal, cpu_randint, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="kept host tensors are the tpu executor's")


def _lone_mm(a, b):
    """A weight-gradient-like mm alone in its region (transposed first operand)."""
    return torch.mm(a.t(), b)


def _mm_relu(a, b):
    """An mm with an epilogue: the MXU op runs op by op, then the fused loop."""
    return torch.relu(torch.mm(a.t(), b))


def _sum_then_mm(a, b):
    """The mm reads a value the flush made (transient memory), then a column sum."""
    return torch.mm((a * 2).t(), b).sum(0)


def _gather_mm(a, b):
    """index_select (a library call) feeding an mm."""
    idx = torch.tensor([3, 0, 2, 2]).to(a.device)
    return torch.mm(torch.index_select(a, 0, idx).t(), b[:4])


CASES = {"lone_mm": _lone_mm, "mm_relu": _mm_relu, "sum_then_mm": _sum_then_mm, "gather_mm": _gather_mm}


def _inputs(seed):
    return cpu_randn(6, 4, seed=seed), cpu_randn(6, 5, seed=seed + 100)


def _check(fn, a, b):
    """fn on tpu equals fn on CPU bit for bit; returns the metrics of the tpu run."""
    want = fn(a, b)
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    got = fn(a.to("tpu"), b.to("tpu"))
    torch.tpu.synchronize()
    metrics = torch_tpu_eager.metrics()
    assert_bit_equal([got.cpu()], [want])
    return metrics


@pytest.mark.parametrize("name", sorted(CASES))
def test_fresh_buffers_every_run(name):
    fn = CASES[name]
    _check(fn, *_inputs(0))  # compiles
    for seed in range(1, 6):
        m = _check(fn, *_inputs(seed))
        assert m["compiles"] == 0 and m["plans_built"] == 0, "not the same compiled region"


@pytest.mark.parametrize("name", sorted(CASES))
def test_alternating_buffers(name):
    # Device inputs that stay alive, used in turn: each run reads its own buffers.
    fn = CASES[name]
    sets = [_inputs(s) for s in (10, 20, 30)]
    dev = [(a.to("tpu"), b.to("tpu")) for a, b in sets]
    fn(*dev[0]).cpu()
    for k in (0, 1, 2, 1, 0, 2, 0):
        torch_tpu_eager.reset_metrics()
        got = fn(*dev[k]).cpu()
        assert torch_tpu_eager.metrics()["compiles"] == 0
        assert_bit_equal([got], [fn(*sets[k])])


def test_buffers_freed_between_runs():
    # A run's inputs and result die before the next run: the next run neither reads
    # nor frees them again.
    for seed in range(4):
        a, b = _inputs(seed)
        da, db = a.to("tpu"), b.to("tpu")
        got = _lone_mm(da, db)
        del da, db
        gc.collect()
        assert_bit_equal([got.cpu()], [_lone_mm(a, b)])
        del got
        gc.collect()


def test_in_place_out_into_its_own_input():
    # mm(out=) into a buffer the next run reads: the kept tensors follow the buffers.
    a, b = cpu_randn(5, 5, seed=1), cpu_randn(5, 5, seed=2)
    da, db = a.to("tpu"), b.to("tpu")
    ca = a.clone()
    for _ in range(4):
        torch.mm(da, db, out=da)
        torch.mm(ca, b, out=ca)
        assert_bit_equal([da.cpu()], [ca])


def test_run_after_a_failed_run():
    # The same region raises IndexError as CPU does, then runs with good indices.
    x = cpu_randn(5, 3, seed=7)
    w = cpu_randn(5, 4, seed=8)

    def fn(idx, xx, ww):
        return torch.mm(torch.index_select(xx, 0, idx).t(), ww[: idx.numel()])

    good = cpu_randint(0, 5, (4,), seed=3)
    bad = torch.tensor([0, 1, 9, 2])
    dx, dw = x.to("tpu"), w.to("tpu")
    assert_bit_equal([fn(good.to("tpu"), dx, dw).cpu()], [fn(good, x, w)])
    with pytest.raises(IndexError):
        fn(bad, x, w)
    with pytest.raises(IndexError):
        fn(bad.to("tpu"), dx, dw).cpu()
    for seed in (4, 5):
        idx = cpu_randint(0, 5, (4,), seed=seed)
        assert_bit_equal([fn(idx.to("tpu"), dx, dw).cpu()], [fn(idx, x, w)])


def test_conjugate_operand():
    # A conjugated view is not kept (its bit lives on the tensor): values as CPU's.
    a = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    b = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    for conj in (False, True, False, True):
        x = a.conj() if conj else a
        got = torch.mm(x.to("tpu").t(), b.to("tpu"))
        assert_bit_equal([got.cpu()], [torch.mm(x.t(), b)])


# ---- traffic counted once per compiled region, device-buffer wrappers kept ----


def _kernel_traffic(fn, *args):
    """(result on CPU, [(ops, bytes_read, bytes_written, padding_bytes)] of the run's kernels)."""
    torch.tpu.synchronize()
    with torch_tpu_eager.profile() as prof:
        out = fn(*args).cpu()
    return out, [(k["ops"], k["bytes_read"], k["bytes_written"], k["padding_bytes"]) for k in prof.kernels]


def test_lone_mm_traffic_every_run():
    # The first run counts the views' traffic; later runs of the same compiled region
    # add what it recorded: each run's equals the independent count.
    from test_tpu_target import tiled_bytes

    for seed in range(4):
        a, b = _inputs(seed)
        got, kernels = _kernel_traffic(_lone_mm, a.to("tpu"), b.to("tpu"))
        assert_bit_equal([got], [_lone_mm(a, b)])
        reads = [(4, 6), (6, 5)]  # a.t() as read, b
        logical_read, logical_written = 4 * (4 * 6 + 6 * 5), 4 * 4 * 5
        padding = sum(tiled_bytes(s, 4) for s in reads) - logical_read + tiled_bytes((4, 5), 4) - logical_written
        assert kernels == [(["mm"], logical_read, logical_written, padding)]


def test_traffic_after_failed_runs():
    # A region (clamp, index_select, cat) that fails at its first run (nothing
    # recorded), then runs, fails again (recorded traffic in use), runs again: each
    # good run counts the same traffic and CPU's values; each bad run raises IndexError.
    x, w = cpu_randn(5, 3, seed=11), cpu_randn(4, 3, seed=12)
    dx, dw = x.to("tpu"), w.to("tpu")

    def fn(idx, xx, ww):
        return torch.cat([torch.index_select(xx, 0, idx.clamp(max=3)), torch.index_select(ww, 0, idx)])

    good, bad = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 9, 2])
    with pytest.raises(IndexError):
        fn(bad.to("tpu"), dx, dw).cpu()
    seen = []
    for idx in (good, bad, good, bad, bad, good):
        if idx is bad:
            with pytest.raises(IndexError):
                fn(idx.to("tpu"), dx, dw).cpu()
            continue
        got, kernels = _kernel_traffic(fn, idx.to("tpu"), dx, dw)
        assert_bit_equal([got], [fn(idx, x, w)])
        seen.append(kernels)
    assert seen[0] and all(k == seen[0] for k in seen), seen
    # Two regions: the clamp (its index transient) and x's select read the index and x
    # and write the select's value; w's select and the cat read the index, w and that
    # value and write the result (int64 index, float32 values).
    assert [k[:3] for k in seen[0]] == [
        (["clamp", "index_select"], 4 * 8 + 5 * 3 * 4, 4 * 3 * 4),
        (["index_select", "cat"], 4 * 8 + 4 * 3 * 4 + 4 * 3 * 4, 8 * 3 * 4),
    ], seen[0]


def test_wrappers_over_buffers_of_other_sizes():
    # Device buffers of several sizes and dtypes, alive and freed, flush after flush:
    # each flush reads and writes its own buffers (a kept CPU storage wrapper is
    # pointed at the flush's buffer and its size).
    shapes = [(6, 4, 5), (3, 7, 2), (9, 1, 8), (6, 4, 5)]
    alive = []
    for k in range(12):
        m, n, p = shapes[k % len(shapes)]
        a, b = cpu_randn(m, n, seed=k), cpu_randn(m, p, seed=k + 50)
        da, db = a.to("tpu"), b.to("tpu")
        got = torch.mm(da.t(), db)
        i = torch.tensor([k % n, 0]).to("tpu")
        sel = torch.index_select(got, 0, i).double()
        assert_bit_equal(
            [got.cpu(), sel.cpu()], [torch.mm(a.t(), b), torch.index_select(torch.mm(a.t(), b), 0, i.cpu()).double()]
        )
        if k % 3 == 0:
            alive.append((da, db, got))
        del da, db, got, sel
        gc.collect()
    for da, db, got in alive:  # buffers kept alive across later flushes still hold their values
        assert_bit_equal([got.cpu()], [torch.mm(da.cpu().t(), db.cpu())])


@pytest.mark.parametrize("name", sorted(CASES))
def test_views_over_storages_of_other_sizes(name):
    # The same views (a transposed slice: dense only in some order; a plain slice)
    # over storages of 6 to 40 rows, in turn: a kept tensor with the view's geometry
    # takes each run's storage, and each run reads its own buffers (CPU's values).
    fn = CASES[name]
    for k, rows in enumerate((6, 20, 6, 40, 9, 20)):
        big_a, big_b = cpu_randn(rows, 4, seed=60 + k), cpu_randn(rows, 5, seed=70 + k)
        da, db = big_a.to("tpu"), big_b.to("tpu")
        got = fn(da[:6], db[:6]).cpu()
        assert_bit_equal([got], [fn(big_a[:6], big_b[:6])])


# ---- flush temporaries' storages kept for reuse (host_runtime.h HostMemory::scratch) ----


def _temporaries_chain(a, b, idx):
    """Op-by-op ops whose values live only inside the flush: mms, an index_select and a
    cat of several sizes, each freed after its last use and its memory taken by the next."""
    h = torch.mm(a.t(), b)  # (n, p)
    g = torch.index_select(h, 0, idx)  # (2, p)
    c = torch.cat([h, g, h[:1]])  # (n + 3, p)
    return torch.mm(c.t(), c).sum(0)  # (p,)


def test_temporaries_of_several_sizes_reused_flush_after_flush():
    # The same and other sizes in turn, an intermediate sometimes kept by the user
    # (then it is device memory, not a temporary): every flush computes CPU's values.
    shapes = [(6, 4, 5), (3, 7, 2), (6, 4, 5), (9, 2, 8), (3, 7, 2), (6, 4, 5)]
    kept = []
    for k, (m, n, p) in enumerate(shapes):
        a, b = cpu_randn(m, n, seed=80 + k), cpu_randn(m, p, seed=90 + k)
        idx = torch.tensor([n - 1, 0])
        da, db, di = a.to("tpu"), b.to("tpu"), idx.to("tpu")
        if k % 2:
            h = torch.mm(da.t(), db)
            kept.append((h, torch.mm(a.t(), b)))
        got = _temporaries_chain(da, db, di).cpu()
        assert_bit_equal([got], [_temporaries_chain(a, b, idx)])
    for h, want in kept:
        assert_bit_equal([h.cpu()], [want])
