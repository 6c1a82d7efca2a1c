"""Overlap (BR-15): in-place writes whose destination overlaps must raise like CPU.

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both

OVERLAP_MSG = "single memory location"


# ---------------------------------------------------------------------------
# overlap (BR-15): in-place writes whose destination overlaps must raise like CPU
# ---------------------------------------------------------------------------

EXPANDED_WRITES = {
    "cos_": lambda y, d: y.cos_(),
    "add_": lambda y, d: y.add_(1),
    "mul_tensor": lambda y, d: y.mul_(torch.ones(y.shape, device=d)),
    "clamp_": lambda y, d: y.clamp_(max=0),
    "copy_": lambda y, d: y.copy_(torch.ones(y.shape, device=d)),
    "out": lambda y, d: torch.neg(torch.ones(y.shape, device=d), out=y),
    "fill_tensor": lambda y, d: y.fill_(torch.tensor(2.0, device=d)),
}

EXPANDED_VIEWS = {
    "expand_0dim": lambda d: torch.tensor(0.5).to(d).expand(3),
    "expand_rows": lambda d: torch.arange(4.0).to(d).expand(2, 4),
    "expand_cols": lambda d: torch.arange(3.0).to(d).unsqueeze(1).expand(3, 5),
    "as_strided_stride0": lambda d: torch.arange(4.0).to(d).as_strided((3, 3), (1, 0)),
}


@pytest.mark.parametrize("write", sorted(EXPANDED_WRITES))
@pytest.mark.parametrize("view", sorted(EXPANDED_VIEWS))
def test_inplace_on_internally_overlapping_raises(dev, view, write):
    y = EXPANDED_VIEWS[view](dev)
    with pytest.raises(RuntimeError, match=OVERLAP_MSG):
        EXPANDED_WRITES[write](y, dev)
        y.cpu()  # a lazy device may only notice at the flush; it must still raise


def test_failed_overlapping_write_leaves_base_unchanged(dev):
    def prog(d):
        base = torch.arange(4.0).to(d)
        y = base.expand(2, 4)
        try:
            y.add_(1)
        except RuntimeError:
            pass
        return base, y

    run_both(prog, dev)


def test_fill_on_expanded_is_allowed_like_cpu(dev):
    # CPU allows fill_/zero_ with a Python scalar on an expanded tensor (all writes agree).
    def prog(d):
        b = torch.zeros(1, 3, device=d)
        y = b.expand(4, 3)
        y.fill_(2)
        z = torch.ones(2, device=d)
        z.unsqueeze(0).expand(5, 2).zero_()
        return b, y, z

    run_both(prog, dev)


def test_select_write_into_expanded_reaches_base(dev):
    def prog(d):
        b = torch.zeros(1, device=d)
        y = b.expand(3)
        y[1] = 4  # a 0-dim view of the single shared element
        return b, y

    run_both(prog, dev)


PARTIAL_OVERLAP = {
    "add_shifted": lambda x: x[2:5].add_(x[0:3]),
    "copy_shifted": lambda x: x[1:].copy_(x[:-1]),
    "out_shifted": lambda x: torch.add(x[0:3], 1, out=x[1:4]),
    "out_prefix_of_input": lambda x: torch.add(x, 1, out=x[:3]),
    "add_transposed_self": lambda x: x[:9].view(3, 3).add_(x[:9].view(3, 3).t()),
}


@pytest.mark.parametrize("case", sorted(PARTIAL_OVERLAP))
def test_partial_overlap_between_input_and_output_raises(dev, case):
    x = torch.arange(10.0).to(dev)
    with pytest.raises(RuntimeError, match=OVERLAP_MSG):
        PARTIAL_OVERLAP[case](x)
        x.cpu()
    assert x.cpu().tolist() == torch.arange(10.0).tolist()


def test_full_overlap_and_disjoint_writes_are_fine(dev):
    def prog(d):
        x = torch.arange(10.0).to(d)
        torch.add(x, 1, out=x)  # identical input and output
        x[:5].copy_(x[5:])  # disjoint halves
        x[::2].mul_(x[1::2])  # interleaved, disjoint
        t = torch.arange(9.0, device=d).reshape(3, 3)
        t.t().add_(1)  # transposed write has no internal overlap
        return x, t

    run_both(prog, dev)
