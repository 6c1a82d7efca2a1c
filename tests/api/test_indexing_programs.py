"""Indexing (BR-21, BR-22).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import cpu_randn, run_both


# ---------------------------------------------------------------------------
# indexing (BR-21, BR-22)
# ---------------------------------------------------------------------------


def test_boolean_mask_reads(dev):
    host = cpu_randn(4, 5, seed=1)

    def prog(d):
        x = host.to(d)
        return (
            x[x > 0],
            x[x > 0.5].sum(),
            torch.masked_select(x, x < 0),
            x[torch.tensor([True, False, True, True]).to(d)],
            x[:, torch.tensor([False, True, False, True, True]).to(d)],
            x.t()[x.t() > 0],
            x[x > 100],
        )

    run_both(prog, dev)


MASK_WRITES = {
    "scalar": lambda x, m, d: x.__setitem__(m, -1),
    "tensor_values": lambda x, m, d: x.__setitem__(m, torch.arange(int(m.sum().item()), dtype=x.dtype).to(d)),
    "zero_dim_value": lambda x, m, d: x.__setitem__(m, torch.tensor(9, dtype=x.dtype).to(d)),
    "cpu_zero_dim_value": lambda x, m, d: x.__setitem__(m, torch.tensor(8, dtype=x.dtype)),
    "masked_fill_": lambda x, m, d: x.masked_fill_(m, 5),
    "masked_scatter_": lambda x, m, d: x.masked_scatter_(m, torch.arange(100, 130, dtype=x.dtype).to(d)),
    "inplace_add_via_mask": lambda x, m, d: x.__setitem__(m, x[m] + 10),
    "row_mask": lambda x, m, d: x.__setitem__(m.any(1), 0),
}


@pytest.mark.parametrize("target", ["base", "transposed", "stepped"])
@pytest.mark.parametrize("write", sorted(MASK_WRITES))
def test_boolean_mask_writes(dev, write, target):
    def prog(d):
        base = torch.tensor([[1, 2, 2, 4], [1, 2, 3, 2], [0, 2, 5, 6]]).to(d)
        x = {"base": base, "transposed": base.t(), "stepped": base[:, ::2]}[target]
        m = x == 2
        MASK_WRITES[write](x, m, d)
        return base, x

    run_both(prog, dev)


def test_index_put_accumulate_duplicates_int_and_float(dev):
    def prog(d):
        a = torch.zeros(5, dtype=torch.int64, device=d)
        a.index_put_((torch.tensor([4, 1, 4, 4, 0]).to(d),), torch.tensor([1, 2, 3, 4, 5]).to(d), accumulate=True)
        b = torch.zeros(3, 4, device=d)
        rows = torch.tensor([0, 2, 0, 0, 1]).to(d)
        cols = torch.tensor([1, 3, 1, 1, 0]).to(d)
        b.index_put_((rows, cols), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).to(d), accumulate=True)
        c = torch.zeros(3, 4, dtype=torch.int32, device=d)
        c.index_put_(
            (torch.tensor([[0, 2], [0, 0]]).to(d),), torch.ones(4, dtype=torch.int32, device=d), accumulate=True
        )
        e = torch.zeros(4, device=d)
        e.index_put_((torch.tensor([3, 3, 3]).to(d),), torch.tensor(0.5).to(d), accumulate=True)
        f = torch.ones(2, 3, device=d)
        f.t().index_put_((torch.tensor([1, 1]).to(d),), torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(d), accumulate=True)
        g = torch.zeros(3, device=d)
        g.index_put_((torch.tensor([True, False, True]).to(d),), torch.tensor([1.0, 2.0]).to(d), accumulate=True)
        return a, b, c, e, f, g

    run_both(prog, dev)


def test_index_add_duplicates(dev):
    def prog(d):
        a = torch.zeros(5, device=d).index_add_(0, torch.tensor([1, 3, 1, 1]).to(d), torch.arange(4.0).to(d), alpha=2)
        b = torch.ones(3, 4, dtype=torch.int64, device=d)
        b.index_add_(1, torch.tensor([0, 0, 3]).to(d), torch.arange(9, device=d).reshape(3, 3))
        c = torch.zeros(4, 3, device=d)
        c.t().index_add_(0, torch.tensor([2, 2]).to(d), torch.ones(2, 4, device=d))
        return a, b, c

    run_both(prog, dev)


def test_scatter_add_and_gather(dev):
    def prog(d):
        src = torch.arange(1.0, 13.0, device=d).reshape(3, 4)
        idx = torch.tensor([[0, 1, 0, 0], [2, 2, 1, 0], [0, 0, 0, 0]]).to(d)
        sa0 = torch.zeros(3, 4, device=d).scatter_add_(0, idx, src)
        sa1 = torch.zeros(3, 3, device=d).scatter_add_(1, idx[:, :3], src[:, :3])
        si = torch.zeros(3, 4, dtype=torch.int64, device=d).scatter_add_(0, idx, src.long())
        g0 = torch.gather(src, 0, idx)
        g1 = torch.gather(src, 1, torch.tensor([[3, 3], [0, 1], [2, 0]]).to(d))
        gt = torch.gather(src.t(), 1, torch.tensor([[1, 2], [0, 0], [2, 1], [1, 1]]).to(d))
        sr = torch.zeros(3, device=d).scatter_reduce_(
            0,
            torch.tensor([0, 2, 0, 2]).to(d),
            torch.tensor([5.0, 1.0, 7.0, -2.0]).to(d),
            reduce="amax",
            include_self=False,
        )
        sc = torch.zeros(2, 4, device=d).scatter_(1, torch.tensor([[3, 0], [1, 2]]).to(d), 9.0)
        return sa0, sa1, si, g0, g1, gt, sr, sc

    run_both(prog, dev)


def test_advanced_indexing_reads_and_writes(dev):
    def prog(d):
        x = torch.arange(20.0, device=d).reshape(4, 5)
        r1 = x[torch.tensor([-1, 0, 2]).to(d)]
        r2 = x[torch.tensor([[0], [3]]).to(d), torch.tensor([1, 4]).to(d)]  # broadcast index tensors
        r3 = x[1:, torch.tensor([0, 0, 3]).to(d)]
        r4 = x[torch.tensor([0, 2], dtype=torch.int32).to(d)]
        r5 = torch.take(x, torch.tensor([[19, 0], [7, 7]]).to(d))
        r6 = x.index_select(1, torch.tensor([4, 4, 1]).to(d))
        x[torch.tensor([1, 3]).to(d), 2:] = torch.tensor([-1.0, -2.0, -3.0]).to(d)
        x.index_fill_(1, torch.tensor([0]).to(d), 0.5)
        x.index_copy_(0, torch.tensor([2, 0]).to(d), torch.full((2, 5), 7.0).to(d))
        return x, r1, r2, r3, r4, r5, r6

    run_both(prog, dev)
