"""A flush with foreach nodes is keyed by its recorded nodes (csrc/jit/jit.cpp run_graph): the
per-tensor nodes follow from a foreach node's words, so the structure does not grow with them;
and on a flush-cache hit whose plan the thread's kept per-tensor nodes were written for, the
expansion writes only what differs between flushes of one structure (csrc/jit/foreach_expand.cpp,
ExpandedGraph's `plan`): storages, argument values, locations. Values are CPU's foreach path's,
bit for bit; the counts come from ``_C._flush_work_counts()``."""

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu device's flush expands foreach nodes")

SHAPES = [(5, 3), (17,), (), (4, 8)]


def _counts():
    import torch_tpu_eager

    return torch_tpu_eager._C._flush_work_counts()


def _lists(seed, n=3, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(n)]


def _adamw_step(s, a, b, k, scale):
    """AdamW's foreach calls with step-dependent scalars, and a scale by a 0-dim tensor
    (one input read at every index)."""
    torch._foreach_lerp_(s, a, 0.1 + 0.01 * k)
    torch._foreach_mul_(b, 0.999)
    torch._foreach_addcmul_(b, a, a, 0.001)
    denom = torch._foreach_sqrt(b)
    torch._foreach_div_(denom, [1.0 + 0.1 * k + 0.01 * i for i in range(len(denom))])
    torch._foreach_add_(denom, 1e-8)
    torch._foreach_addcdiv_(s, s, denom, [-1e-3 * (k + 1)] * len(s))
    torch._foreach_mul_(s, scale)
    return s


def test_repeated_foreach_flushes_refresh_their_nodes_and_equal_cpu():
    """Flushes of one structure over two sets of tensors in turn, scalars changing every
    flush: after the first flush of the structure no per-tensor node is written whole."""
    sets_cpu = [_lists(seed) for seed in (1, 2)]
    for lists in sets_cpu:
        lists[2] = [t.abs() for t in lists[2]]  # second moments: their square roots are real
    sets_dev = [[[t.to(DEVICE) for t in ts] for ts in lists] for lists in sets_cpu]
    scale_cpu = torch.tensor(0.5)
    scale_dev = scale_cpu.to(DEVICE)
    refreshed = []
    for k in range(6):
        cpu, dev = sets_cpu[k % 2], sets_dev[k % 2]
        want = _adamw_step(*cpu, k, scale_cpu)
        before = _counts()
        got = _adamw_step(*dev, k, scale_dev)
        sum(t.sum() for t in got).item()  # the flush
        after = _counts()
        for g, w in zip(got + dev[2], want + cpu[2]):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, msg=f"flush {k}")
        written = after["per_tensor_nodes_written"] - before["per_tensor_nodes_written"]
        refreshed.append(after["per_tensor_nodes_refreshed"] - before["per_tensor_nodes_refreshed"])
        if k >= 1:  # the first flush built the plan; every later one is a hit on it
            assert written == 0, (k, written)
            assert refreshed[-1] == 8 * len(SHAPES), (k, refreshed)


def test_a_changed_structure_writes_the_nodes_whole_again():
    s, a, b = [[t.to(DEVICE) for t in ts] for ts in _lists(3)]
    for k in range(2):
        torch._foreach_addcmul_(s, a, b, 0.5)
        torch.tpu.synchronize()
    before = _counts()
    torch._foreach_addcmul_(s[:3], a[:3], b[:3], 0.5)  # a shorter list: another structure
    torch.tpu.synchronize()
    torch._foreach_addcmul_(s, a, b, [2] * len(s))  # int scalars: another structure
    torch.tpu.synchronize()
    after = _counts()
    assert after["per_tensor_nodes_written"] - before["per_tensor_nodes_written"] == 3 + len(SHAPES)
    want = _lists(3)
    for _ in range(2):
        torch._foreach_addcmul_(want[0], want[1], want[2], 0.5)
    torch._foreach_addcmul_(want[0][:3], want[1][:3], want[2][:3], 0.5)
    torch._foreach_addcmul_(want[0], want[1], want[2], [2] * len(s))
    for g, w in zip(s, want[0]):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def _structure_words(n):
    """The flush structure's words of one AdamW step over n parameters of one shape."""
    params = [torch.nn.Parameter(torch.randn(4, 4, device=DEVICE)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(4, 4, device=DEVICE)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    for _ in range(2):
        opt.step()
        torch.tpu.synchronize()
    return _counts()["structure_words"]


def test_the_structure_does_not_grow_with_the_per_tensor_nodes():
    """Each per-tensor node written whole takes at least 8 words (its op, counts, and a
    reference's header, offset, sizes and strides); AdamW expands ~9 of them per parameter.
    Keyed by the recorded foreach nodes, a parameter adds its storages' words and its
    references' numbers."""
    per_param = (_structure_words(10) - _structure_words(2)) / 8
    assert 0 < per_param < 40, per_param
