"""A flush none of whose storages holds an earlier failure reads no storage's ``error`` field
while its regions run (csrc/executors/host_runtime.h, ``HostMemory::inputs_may_hold_errors``):
the op-by-op runner's input tensors and its check for a failed value an op overwrites whole
skip the read, which was a cache miss a storage between the kernels. Once an op of a region
fails, or a storage of the flush held a failed value at its start, the reads come back, so the
values and errors are CPU's either way. The counts come from ``_C._flush_work_counts()``."""

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu device's flush runs regions")


def _error_reads():
    import torch_tpu_eager

    return torch_tpu_eager._C._flush_work_counts()["storage_error_reads"]


def _on_device(values, d):
    """A long tensor of `values` computed on `d` (a flush needs its value)."""
    return torch.tensor(values, device=d) + 0


def _library_step(x, w, idx):
    """Ops the runner takes op by op (index_select, a matmul with its epilogue, a cumsum), one
    overwriting a fresh buffer whole (copy_)."""
    rows = torch.index_select(x, 0, idx)
    y = rows.mm(w).relu()
    out = torch.empty_like(y).copy_(y.cumsum(1))
    return out, rows


def test_warm_flush_without_failures_reads_no_error_field():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 5, generator=g), torch.randn(5, 4, generator=g)
    xd, wd = x.to(DEVICE), w.to(DEVICE)
    want = _library_step(x, w, torch.tensor([4, 0, 2]))
    reads = []
    for _ in range(3):
        before = _error_reads()
        got = _library_step(xd, wd, _on_device([4, 0, 2], DEVICE))
        for gt, wt in zip(got, want):
            torch.testing.assert_close(gt.cpu(), wt, rtol=0, atol=0)
        reads.append(_error_reads() - before)
    assert reads[1:] == [0, 0], reads


def test_an_op_failing_mid_region_fails_its_readers_and_the_next_flush_reads_errors():
    """index_select fails at the flush (an index past the rows); the ops of its region that
    read its result fail with CPU's error, one that does not computes CPU's value. A later flush
    reading the failed value looks for errors again (and raises CPU's)."""
    x = torch.ones(3, 4)
    with pytest.raises(IndexError) as cpu_info:
        torch.index_select(x, 0, torch.tensor([1, 3]))
    xd = x.to(DEVICE)
    rows = torch.index_select(xd, 0, _on_device([1, 3], DEVICE))
    after = rows.cumsum(1) * 2
    fine = xd.cumsum(0) * 3
    torch.testing.assert_close(fine.cpu(), x.cumsum(0) * 3, rtol=0, atol=0)
    for t in (rows, after):
        with pytest.raises(IndexError) as info:
            t.cpu()
        assert str(cpu_info.value) in str(info.value)
    before = _error_reads()
    again = rows.cumsum(0)
    with pytest.raises(IndexError):
        again.cpu()
    assert _error_reads() > before
    # An op that overwrites the failed storage whole after the user saw the error succeeds, as on CPU.
    rows.copy_(torch.full((2, 4), 2.0, device=DEVICE))
    torch.testing.assert_close(rows.cumsum(1).cpu(), torch.full((2, 4), 2.0).cumsum(1), rtol=0, atol=0)
