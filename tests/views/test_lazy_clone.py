"""torch._lazy_clone: copy-on-write clones, values and aliasing as on CPU.

A lazy clone shares its source's memory until either side is written; the writer then
gets a copy, and the last side still sharing keeps the original memory without a copy.
Each program runs on CPU and on the device (difftest.run_both) and returns, besides
values, what PyTorch exposes of the sharing: torch._C._is_cow_tensor, and whether data
and storage addresses equal those taken before (CPU's rules, c10/core/impl/COW.cpp).
On "tpu" the writes below stay queued until the results are read, so the copies must
order with pending writes made before and after the lazy clone."""

import pytest
import torch

from difftest import cpu_randn, requires_tpu, run_both, run_both_outcome

C = torch._C

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8]
DTYPES += [torch.bool, torch.complex64]


def _base(d, dtype=torch.float32, n=4):
    return (torch.arange(n * n, device=d) % 7).to(dtype).reshape(n, n)


def _flags(*ts):
    return [C._is_cow_tensor(t) for t in ts]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clone_shares_until_a_write(dev, dtype):
    def prog(d):
        t = _base(d, dtype)
        storage, data = C._storage_address(t), C._data_address(t)
        c = t._lazy_clone()
        shared = [
            _flags(t, c),
            C._storage_address(t) == storage,
            C._storage_address(c) != storage,
            C._data_address(t) == data,
            C._data_address(c) == data,
        ]
        view = t.view(-1)
        view += torch.ones(1, device=d, dtype=dtype)  # the source's side is written: it gets a copy
        after_t = [_flags(t, view, c), C._data_address(t) != data, C._data_address(view) == C._data_address(t)]
        after_t.append(C._data_address(c) == data)
        c += torch.ones(1, device=d, dtype=dtype)  # the last sharer keeps the memory
        after_c = [_flags(t, view, c), C._data_address(c) == data, C._storage_address(c) != storage]
        return t, c, view, shared, after_t, after_c

    run_both(prog, dev)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reads_do_not_materialize(dev, dtype):
    def prog(d):
        t = _base(d, dtype)
        c = t._lazy_clone()
        s = t + c if dtype != torch.bool else t | c
        m = c.sum()
        v = c.t().contiguous()
        return s, m, v, _flags(t, c), C._data_address(t) == C._data_address(c)

    run_both(prog, dev)


def test_clone_written_first(dev):
    def prog(d):
        t = _base(d)
        data = C._data_address(t)
        c = t._lazy_clone()
        c.mul_(3)
        first = [_flags(t, c), C._data_address(t) == data, C._data_address(c) != data]
        t.sub_(1)  # now the only sharer: written in place
        second = [_flags(t, c), C._data_address(t) == data]
        return t, c, first, second

    run_both(prog, dev)


def test_pending_write_before_the_clone_is_seen_by_both(dev):
    def prog(d):
        t = _base(d)
        t.add_(10)  # queued on the device, not yet run
        t[1].mul_(-1)
        c = t._lazy_clone()
        return t, c, _flags(t, c)

    run_both(prog, dev)


def test_pending_write_after_the_clone_is_not_seen_by_the_clone(dev):
    def prog(d):
        t = _base(d)
        t.add_(10)
        c = t._lazy_clone()
        t.mul_(2)  # copy of the queued t + 10 for t first, then the write
        c[0] = 5  # c is then the last sharer
        t.add_(c)
        return t, c, _flags(t, c)

    run_both(prog, dev)


def test_three_sharers_in_any_write_order(dev):
    def prog(d):
        a = _base(d)
        data = C._data_address(a)
        b = a._lazy_clone()
        c = b._lazy_clone()  # a lazy clone of a lazy clone shares the same memory
        trail = [_flags(a, b, c), C._data_address(c) == data]
        b.add_(1)
        trail += [_flags(a, b, c), C._data_address(b) != data]
        a.add_(2)
        trail += [_flags(a, b, c), C._data_address(a) != data]
        c.add_(3)
        trail += [_flags(a, b, c), C._data_address(c) == data]
        return a, b, c, trail

    run_both(prog, dev)


def test_clone_of_a_view_keeps_its_geometry(dev):
    def prog(d):
        t = _base(d, n=5)
        v = t[1:, ::2].t()
        c = v._lazy_clone()
        geometry = [c.shape, c.stride(), c.storage_offset(), _flags(t, v, c)]
        c.fill_(-1)  # only c's copy changes
        v.mul_(10)
        return t, v, c, geometry, _flags(t, v, c)

    run_both(prog, dev)


def test_views_of_the_clone_see_its_writes(dev):
    def prog(d):
        t = _base(d)
        c = t._lazy_clone()
        row = c[2]
        col = c[:, 1]
        row.zero_()  # the clone's storage (and so its views) gets a copy
        col.add_(5)
        return t, c, row, col, _flags(t, c, row, col)

    run_both(prog, dev)


WRITES = {
    "out=": lambda c, d: torch.add(c, 1, out=c),
    "copy_from_cpu": lambda c, d: c.copy_(torch.full(c.shape, 7.0)),
    "copy_from_device": lambda c, d: c.copy_(torch.full(c.shape, 7.0, device=d)),
    "setitem_scalar": lambda c, d: c.__setitem__((0, 0), 9.0),
    "masked_setitem": lambda c, d: c.__setitem__(c > 3, -2.0),  # index_put_ with a bool mask
    "index_put_": lambda c, d: c.index_put_((torch.tensor([0, 2], device=d),), torch.tensor(1.5, device=d)),
    "masked_fill_": lambda c, d: c.masked_fill_(c > 2, 0.5),
    "clamp_": lambda c, d: c.clamp_(1, 3),
    "addmm_": lambda c, d: c.addmm_(c, c),
    "uniform_": lambda c, d: c.uniform_(),
    "foreach_add_": lambda c, d: torch._foreach_add_([c], 1.0),
    "untyped_storage_fill_": lambda c, d: c.untyped_storage().fill_(0),
    "sort_out": lambda c, d: torch.sort(
        c.flatten()[:4].clone(), out=(c[0], torch.empty(4, dtype=torch.long, device=d))
    ),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_every_kind_of_write_materializes(dev, write):
    def prog(d):
        torch.manual_seed(0)
        t = _base(d)
        data = C._data_address(t)
        c = t._lazy_clone()
        WRITES[write](c, d)
        if write == "uniform_":
            c = (c >= 0) & (c < 1)  # values from the device generator differ from CPU's
        return t, c, _flags(t), C._data_address(t) == data

    run_both(prog, dev)


MIXED = {
    "out_of_source": lambda t, c: torch.add(t, 1, out=c),
    "copy_flipped_source": lambda t, c: c.copy_(t.flip(0)),
    "source_reads_clone": lambda t, c: t.add_(c),
    "cat_out": lambda t, c: torch.cat([t[2:], t[:2]], out=c),
    "set_shares_storage": lambda t, c: torch.empty(0, device=c.device).set_(c.untyped_storage(), 0, (4,)).fill_(8),
    "index_copy_": lambda t, c: c.index_copy_(0, torch.tensor([3, 0], device=c.device), t[:2]),
}


@pytest.mark.parametrize("op", sorted(MIXED))
def test_ops_reading_one_side_and_writing_the_other(dev, op):
    def prog(d):
        t = _base(d)
        data = C._data_address(t)
        c = t._lazy_clone()
        MIXED[op](t, c)
        return t, c, _flags(t, c), C._data_address(t) == data, C._data_address(c) == data

    run_both(prog, dev)


STORAGE_WRITES = {
    "slice_of_source": lambda t, c: t.untyped_storage()[0:8].fill_(0),
    "slice_of_clone": lambda t, c: c.untyped_storage()[4:8].fill_(0),
    "typed_setitem": lambda t, c: c.untyped_storage().__setitem__(slice(0, 4), 255),
}


@pytest.mark.parametrize("write", sorted(STORAGE_WRITES))
def test_storage_writes(dev, write):
    def prog(d):
        t = _base(d)
        c = t._lazy_clone()
        STORAGE_WRITES[write](t, c)
        return t, c, _flags(t, c)

    run_both(prog, dev)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_running_stats(dev, training):
    # Training updates the running statistics (a write: they get their own memory);
    # eval mode only reads them (they stay shared), as on CPU.
    def prog(d):
        mean, var = torch.zeros(3, device=d), torch.ones(3, device=d)
        rm, rv = mean._lazy_clone(), var._lazy_clone()
        x = cpu_randn(4, 3).to(d)
        out = torch.nn.functional.batch_norm(x, rm, rv, training=training, momentum=0.5)
        return out, mean, var, rm, rv, _flags(mean, var, rm, rv)

    run_both(prog, dev)


def test_failed_write_leaves_the_share(dev):
    def prog(d):
        t = _base(d)
        c = t._lazy_clone()
        try:
            c.add_(torch.ones(3, 4, 4, device=d))  # CPU raises at the call: broadcast shape
            raised = None
        except RuntimeError as e:
            raised = type(e).__name__
        return t, c, raised, _flags(t, c)

    run_both(prog, dev)


def test_resize_gives_new_memory(dev):
    def prog(d):
        t = _base(d)
        c = t._lazy_clone()
        c.resize_(20)
        t.add_(1)
        return t, c[:16], _flags(t, c)

    run_both(prog, dev)


@requires_tpu
def test_write_after_resize(dev):
    # CPU 2.13 keeps the lazy clone's materializer after resize_ and fails an internal
    # assert at the next write (c10/core/impl/COW.cpp: ctx != nullptr); the device writes.
    # The reference is the same program with clone(), whose values a lazy clone has.
    def prog(d, lazy):
        t = _base(d)
        c = t._lazy_clone() if lazy else t.clone()
        c.resize_(20)
        c[16:] = 3
        t.add_(1)
        return t, c

    expected = [x.clone() for x in prog("cpu", lazy=False)]
    actual = [x.cpu() for x in prog(dev, lazy=True)]
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)


def test_data_ptr_materializes(dev):
    def prog(d):
        t = _base(d)
        data = C._data_address(t)
        c = t._lazy_clone()
        ptr = t.data_ptr()  # a writable pointer: t gets its own memory, as on CPU
        return t, c, _flags(t, c), ptr != data, C._data_address(c) == data

    run_both(prog, dev)


def test_source_dies_then_clone_written(dev):
    def prog(d):
        t = _base(d)
        data = C._data_address(t)
        c = t._lazy_clone()
        del t
        c.mul_(4)  # the only sharer left: no copy
        return c, _flags(c), C._data_address(c) == data

    run_both(prog, dev)


def test_gradient_flows_through(dev):
    def prog(d):
        x = cpu_randn(3, 4).to(d).requires_grad_()
        y = x._lazy_clone()
        (y * y).sum().backward()
        return x.grad, y.detach(), type(y.grad_fn).__name__

    run_both(prog, dev)


def test_conjugate_view_is_resolved(dev):
    def prog(d):
        z = torch.tensor([1 + 2j, -3j], device=d).conj()
        c = z._lazy_clone()
        return c, c.is_conj(), _flags(c)

    run_both(prog, dev)


def test_clone_of_a_dlpack_import_raises(dev):
    def prog(d):
        x = torch.arange(4.0, device=d)
        y = torch.from_dlpack(x)
        return y._lazy_clone()

    exc = run_both_outcome(prog, dev)
    assert isinstance(exc, RuntimeError)


def test_materializing_in_a_parallel_region_raises(dev):
    def prog(d):
        a = _base(d)._lazy_clone()
        with pytest.raises(RuntimeError, match="Materializing a storage"):
            torch._test_parallel_materialize(a, 1, False)
        torch._test_parallel_materialize(_base(d), 1, False)  # not a lazy clone: no error
        return a, _flags(a)

    run_both(prog, dev)


def test_large_clone_after_a_zero_copy_host_read(dev):
    # >= 1 MiB: on "tpu" t.cpu() may share the device buffer with the host (copy-on-write).
    def prog(d):
        t = torch.arange(512 * 1024, dtype=torch.float32, device=d)
        host = t.to("cpu", copy=True)  # on CPU, t.cpu() would be t itself
        c = t._lazy_clone()
        t.add_(1)
        c.mul_(2)
        host2 = c.to("cpu", copy=True)
        c.sub_(1)
        return host.to(d), host2.to(d), t, c, _flags(t, c)

    run_both(prog, dev)


@requires_tpu
def test_defer_never_mode(dev):
    def prog(d):
        t = _base(d)
        c = t._lazy_clone()
        t.add_(1)
        c.add_(2)
        return t, c, _flags(t, c)

    with torch.tpu.set_eager_mode("DEFER_NEVER"):
        run_both(prog, dev)


@requires_tpu
def test_memory_is_released(dev):
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    for first in ("source", "clone", "neither"):
        t = torch.ones(1024, device=dev)
        c = t._lazy_clone()
        if first == "source":
            t.add_(1)
        elif first == "clone":
            c.add_(1)
        d = c._lazy_clone()
        assert float((t + c + d).sum()) == {"source": 4096.0, "clone": 5120.0, "neither": 3072.0}[first]
        del t, c, d
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before


@requires_tpu
def test_second_chip(dev):
    def prog(d):
        dd = d if d == "cpu" else "tpu:1"
        t = _base(dd)
        c = t._lazy_clone()
        t.add_(1)
        return t.to(d).clone(), c.to(d).clone(), _flags(t, c)

    run_both(prog, dev)


@requires_tpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.float32], ids=str)
def test_spyre_target(dev, spyre_target, dtype):
    # Small integers: exact in df16 and in Spyre's int32-held int64, so CPU is the reference.
    def prog(d):
        t = _base(d, dtype)
        c = t._lazy_clone()
        t.add_(1)
        c.mul_(2)
        return t, c, _flags(t, c)

    run_both(prog, dev)


def _failed_write(t):
    """index_add_ with indices computed on the device: CPU raises at the call, "tpu" at
    the first read of t (the error is then seen). Either way the call raised once."""
    idx = torch.tensor([0, 1], device=t.device) + 100
    try:
        t.index_add_(0, idx, torch.ones(2, *t.shape[1:], device=t.device, dtype=t.dtype))
        t.cpu()
    except (RuntimeError, IndexError):
        pass


@pytest.mark.parametrize("when", ["failed_then_cloned", "cloned_then_source_failed", "cloned_then_clone_failed"])
@pytest.mark.parametrize("write", ["out", "eager_out", "copy", "fill"])
def test_overwriting_a_clone_of_a_failed_value(dev, when, write):
    """A lazy clone whose shared bytes a failed op left: overwriting it whole is a valid
    use, as on CPU (whose failed call raised once, at the call); its error is not raised again."""

    def prog(d):
        t = torch.zeros(15, 2, dtype=torch.int64, device=d)
        x = torch.arange(16.0, device=d).reshape(4, 4)
        if when == "failed_then_cloned":
            _failed_write(t)
            c = t._lazy_clone()
        else:
            c = t._lazy_clone()
            _failed_write(t if when == "cloned_then_source_failed" else c)
        if write == "out":
            torch.add(torch.ones(15, 2, dtype=torch.int64, device=d), 1, out=c)
        elif write == "eager_out":
            torch.nonzero(x, out=c)  # data-dependent: runs eagerly, into c's 15 x 2
        elif write == "copy":
            c.copy_(torch.full((15, 2), 3, device=d))
        else:
            c.fill_(4)
        return c

    run_both(prog, dev)


def test_a_value_computed_from_a_failed_value_can_be_overwritten(dev):
    """u = t + 1 after t's op failed (and raised): u holds no new error, so out= into it succeeds."""

    def prog(d):
        t = torch.zeros(4, 3, device=d)
        _failed_write(t)
        u = t + 1
        try:
            u.cpu()  # "tpu": t's error again (u was computed from it)
        except RuntimeError:
            pass
        torch.mul(torch.ones(4, 3, device=d), 5, out=u)
        return u

    run_both(prog, dev)
