"""Alias/identity (BR-14): detach and friends alias; clone does not.

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both


# ---------------------------------------------------------------------------
# alias/identity (BR-14): detach and friends alias; clone does not
# ---------------------------------------------------------------------------

ALIASES = {
    "detach": lambda a: a.detach(),
    "data": lambda a: a.data,
    "ellipsis": lambda a: a[...],
    "full_slice": lambda a: a[:],
    "view_as": lambda a: a.view_as(a),
    "aten_alias": lambda a: torch.ops.aten.alias(a),
    "contiguous_of_contiguous": lambda a: a.contiguous(),
    "reshape_same": lambda a: a.reshape(a.shape),
    "flatten_unflatten": lambda a: a.flatten().view(a.shape),
}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_alias_writes_are_visible(dev, alias):
    def prog(d):
        a = torch.arange(6.0, device=d).reshape(2, 3)
        v = ALIASES[alias](a)
        v.add_(1)
        a[0, 0] = -5
        return a, v

    run_both(prog, dev)


COPIES = {
    "clone": lambda a: a.clone(),
    "clone_contiguous_format": lambda a: a.clone(memory_format=torch.contiguous_format),
    "contiguous_of_transposed": lambda a: a.t().contiguous(),
    "reshape_of_transposed": lambda a: a.t().reshape(-1),
    "to_copy": lambda a: a.to(a.device, copy=True),
    "detach_clone": lambda a: a.detach().clone(),
    "flatten_of_transposed": lambda a: a.t().flatten(),
}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_copies_are_independent(dev, copy):
    def prog(d):
        a = torch.arange(6.0, device=d).reshape(2, 3)
        c = COPIES[copy](a)
        c.mul_(10)
        a.add_(1)
        return a, c

    run_both(prog, dev, check_stride=True)


def test_clone_of_transposed_preserves_strides(dev):
    run_both(lambda d: torch.arange(6.0, device=d).reshape(2, 3).t().clone(), dev, check_stride=True)


def test_detach_shares_version_counter(dev):
    # Writing through a detached alias invalidates a saved tensor, exactly as on CPU.
    def prog(d):
        leaf = torch.ones(3, device=d, requires_grad=True)
        a = leaf * 2
        b = a.sin()
        a.detach().add_(1)
        b.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prog("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prog(dev)


def test_no_grad_inplace_on_leaf_keeps_leaf(dev):
    def prog(d):
        p = torch.ones(2, 2, device=d, requires_grad=True)
        with torch.no_grad():
            p[0].mul_(3)
            p.add_(torch.ones(2, device=d))
        return p.detach(), p.is_leaf, p.requires_grad

    run_both(prog, dev)
