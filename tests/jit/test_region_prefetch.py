"""A cache-hit flush prefetches the next regions' kernel state, nodes and storages while a
region runs (csrc/jit/jit.cpp ``prefetch_ahead``, ``Kernel::prefetch_hot``). A kernel's list of
lines is set at its run and may go stale (another layout's plan moved to the front, kept tensors
made again): prefetching a stale line must change nothing. These steps make one kernel run three
layouts a flush (q, k, v column slices of one projection), so its plans rotate every run, with
regions of every kind around them; values are CPU's over repeated cache-hit flushes."""

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu device's flush runs regions")


def _step(x, w, b, g):
    qkv = x.mm(w) + b
    q, k, v = qkv[:, :8], qkv[:, 8:16], qkv[:, 16:]
    s = (q.mm(k.t()) * 0.25).softmax(-1)
    h = s.mm(v).relu() * g
    return torch.nn.functional.layer_norm(h + x[:, :8], (8,)).sum(0), h.cumsum(0)


def _run(device, steps=6):
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(12, 24, generator=gen), torch.randn(24, 24, generator=gen)
    b, g = torch.randn(24, generator=gen), torch.randn(8, generator=gen)
    xd, wd, bd, gd = (t.to(device) for t in (x, w, b, g))
    outs = []
    for k in range(steps):
        a, c = _step(xd * (1 + 0.1 * k), wd, bd, gd)
        outs += [a.cpu(), c.cpu()]
    return outs


def test_cache_hit_flushes_with_rotating_plans_equal_cpu():
    for got, want in zip(_run(DEVICE), _run("cpu")):
        torch.testing.assert_close(got, want)
