"""Ordering of queued writes (BR-03): program order, each write to its own offset.

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import torch

from difftest import run_both


# ---------------------------------------------------------------------------
# ordering of queued writes (BR-03): program order, each write to its own offset
# ---------------------------------------------------------------------------


def test_fibonacci_writes_read_previous_pending(dev):
    def prog(d):
        x = torch.zeros(20, dtype=torch.int64, device=d)
        x[0] = 0
        x[1] = 1
        for i in range(2, 20):
            x[i] = x[i - 1] + x[i - 2]
        return x

    run_both(prog, dev)


def test_overlapping_slice_writes_in_order(dev):
    def prog(d):
        x = torch.zeros(8, device=d)
        x[0:4] = 1
        x[2:6] *= 3
        x[4:8] += x[0:4]  # disjoint ranges
        x[1:3] = x[5:7].clone()
        x[::3] -= 0.5
        return x

    run_both(prog, dev)


def test_tuple_swap_uses_views_like_cpu(dev):
    # `x[0], x[1] = x[1], x[0]` copies view x[1] into row 0, then view x[0] (already
    # overwritten) into row 1: both rows end equal to the old x[1]. A backend that
    # snapshots views at creation would swap them instead.
    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        x[0], x[1] = x[1], x[0]
        return x

    run_both(prog, dev)


def test_out_of_place_result_is_not_affected_by_later_write(dev):
    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        y = x * 2  # value captured now
        s = x.sum()
        c = x.clone()
        tc = x.t().contiguous()  # a copy
        tr = x.t().reshape(-1)  # reshape of a non-contiguous view copies
        r = x.reshape(-1)  # reshape of a contiguous tensor is a view
        x.add_(100)
        x[1, 1] = -1
        return x, y, s, c, tc, tr, r

    run_both(prog, dev)


def test_many_small_writes_same_element(dev):
    def prog(d):
        x = torch.zeros(3, device=d)
        for i in range(50):
            x[i % 3] += i
            x[(i + 1) % 3] *= 0.5
        return x

    run_both(prog, dev)


def test_write_read_write_through_different_aliases(dev):
    def prog(d):
        x = torch.zeros(4, 4, device=d)
        row, col, diag, flat = x[2], x[:, 1], x.diagonal(), x.view(-1)
        row.fill_(1)
        col.add_(row.sum())  # reads the pending row write
        diag.copy_(col * 2)  # reads the pending column write
        flat[::5] += 1  # touches the diagonal again through a flat alias
        s = x.sum(0)
        row.mul_(s)  # s was computed before this write
        return x, row, col, diag, flat, s

    run_both(prog, dev)


def test_interleaved_reads_and_writes(dev):
    def prog(d):
        x = torch.arange(10.0).to(d)
        out = []
        for i in range(5):
            x[i] = x[9 - i] + i
            out.append(x[i].item())  # forces a read between writes
            x[9 - i] = -x[i]
        return x, out

    run_both(prog, dev)


def test_index_put_then_view_read(dev):
    def prog(d):
        x = torch.zeros(3, 4, device=d)
        v = x[:, 1:3]
        x.index_put_((torch.tensor([0, 2]).to(d), torch.tensor([1, 2]).to(d)), torch.tensor([5.0, 6.0]).to(d))
        v.add_(1)
        return x, v

    run_both(prog, dev)
