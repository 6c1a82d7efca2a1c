"""The flush's foreach expansion writes its per-tensor nodes over the ones of the thread's
previous expansion (csrc/jit/foreach_expand.cpp, ExpandedGraph): flushes whose foreach
structures differ at the same node positions (other ops, one per-tensor op with other
argument kinds, shorter and longer lists, functional and in-place forms) give CPU's values,
and the kept nodes hold no storage after their flush (memory_allocated back where it
started)."""

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu device's flush expands foreach nodes")

SHAPES = [(5, 3), (17,), (), (4, 8)]


def _lists(seed):
    """Three lists (s, a, b) of float32 CPU tensors of SHAPES."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(3)]


def _lerp_then_addcdiv(s, a, b):
    torch._foreach_lerp_(s, a, 0.1)
    torch._foreach_addcdiv_(s, a, [t.abs() + 1 for t in b], -1e-2)
    return s


# Each runs on lists (s, a, b) and returns what it computed; one flush each, in this order,
# so every flush's expansion is written over the previous one's nodes. add_.Tensor from
# _foreach_add_.List (two inputs) and .Scalar (one input and a wrapped number) are one
# per-tensor op with other inputs; mul.out and mul_.Tensor two ops at the same positions.
STEPS = [
    lambda s, a, b: torch._foreach_addcmul_(s, a, b, 0.5) or s,
    lambda s, a, b: torch._foreach_add_(s, a) or s,
    lambda s, a, b: torch._foreach_add_(s, 0.25) or s,
    lambda s, a, b: torch._foreach_sqrt([t.abs() for t in b]),
    lambda s, a, b: torch._foreach_mul_(s[:2], 3.0) or s,
    lambda s, a, b: torch._foreach_mul_(s, a) or s,
    lambda s, a, b: torch._foreach_add(s[1:], b[1:], alpha=-0.5),
    _lerp_then_addcdiv,
    lambda s, a, b: torch._foreach_addcmul_(s, a, b, 0.5) or s,
]


def test_flushes_of_changing_foreach_structures_equal_to_cpu(cpu_math):
    cpu = _lists(0)
    dev = [[t.to(DEVICE) for t in ts] for ts in cpu]
    for k, step in enumerate(STEPS):
        want = step(*cpu)
        got = step(*dev)
        torch.tpu.synchronize()
        assert len(got) == len(want), k
        for g, w in zip(got, want):
            assert g.device.type == DEVICE and g.shape == w.shape and g.dtype == w.dtype, k
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, msg=f"step {k}")


def test_the_same_foreach_flush_twice_reads_each_flushs_tensors():
    """The second flush's nodes are the first's written over: they must name its tensors."""
    for seed in (1, 2):
        s, a, b = _lists(seed)
        want = [t.clone() for t in s]
        torch._foreach_addcmul_(want, a, b, 0.75)
        got = [t.to(DEVICE) for t in s]
        torch._foreach_addcmul_(got, [t.to(DEVICE) for t in a], [t.to(DEVICE) for t in b], 0.75)
        torch.tpu.synchronize()
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def test_no_storage_held_after_a_foreach_flush():
    # A first foreach flush over tensors that outlive the test: what an earlier test's
    # expansion left with the thread is written over, and `before` counts no storage of it.
    keep = [t.to(DEVICE) for t in _lists(4)[0]]
    torch._foreach_mul_(keep, 1.0)
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    s, a = [[t.to(DEVICE) for t in ts] for ts in _lists(3)[:2]]
    roots = torch._foreach_sqrt([t.abs() for t in a])
    torch._foreach_add_(s, roots, alpha=2.0)
    total = sum(t.sum() for t in s).item()  # the flush
    assert total == total
    del s, a, roots
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before
    assert len(keep) == len(SHAPES)
