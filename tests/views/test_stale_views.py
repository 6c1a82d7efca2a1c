"""Stale views with several aliases (BR-06).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import torch

from difftest import run_both


# ---------------------------------------------------------------------------
# stale views with several aliases (BR-06)
# ---------------------------------------------------------------------------


def test_stale_views_many_aliases(dev):
    def prog(d):
        t0 = torch.arange(12.0, device=d).view(3, 4)
        a = t0[1]
        b = t0.view(-1)
        c = t0.t()
        e = t0[:, 1:]
        f = e[::2]  # view of a view
        b[5] = 50  # t0[1, 1]
        a[1] *= 2  # must read 50
        c[1, 2] += 1  # t0[2, 1]
        e[2, 0] -= 3  # t0[2, 1] again
        f[1] = f[0] + f[1]  # rows 0 and 2 of e
        t0.mul_(-1)
        a.add_(t0[0])  # another row of the same base, after the base-wide write
        a[:3].add_(c[3].clone())  # column 3 includes a[3]; clone avoids partial overlap
        return t0, a, b, c, e, f

    run_both(prog, dev)


def test_view_of_view_created_before_base_write(dev):
    def prog(d):
        t0 = torch.arange(8.0).to(d)
        v = t0[2:]
        vv = v[1::2]
        t0.mul_(2)
        vv.add_(1)
        w = t0.view(2, 4)
        w[:, -1] = 0
        return t0, v, vv, w

    run_both(prog, dev)


def test_alias_chain_through_detach_and_views(dev):
    def prog(d):
        t0 = torch.zeros(2, 3, device=d)
        d0 = t0.detach()
        dv = d0[1]
        t0[1, 2] = 4
        dv[0] = dv[2] + 1
        return t0, d0, dv

    run_both(prog, dev)
