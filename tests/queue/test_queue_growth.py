"""Lazy-runtime growth (BR-36).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import torch

from difftest import requires_tpu, run_both


# ---------------------------------------------------------------------------
# lazy-runtime growth (BR-36)
# ---------------------------------------------------------------------------


def test_long_loop_mixed_ops_no_reads(dev):
    def prog(d):
        x = torch.zeros(4, 3, device=d)
        v = x[:, 1]
        for i in range(3000):
            x = x * 0.5 + 1 if i % 2 else x + v.unsqueeze(1)
            v = x[:, i % 3]
            x[i % 4, (i + 1) % 3] += 0.25
        return x

    run_both(prog, dev)


def test_long_chain_of_views_no_reads(dev):
    def prog(d):
        x = torch.zeros(8, device=d)
        for i in range(4000):
            x[i % 8] += 1
            x[(i * 3) % 8 : (i * 3) % 8 + 1].mul_(1.0)
        return x

    run_both(prog, dev)


def test_many_pending_tensors_kept_alive(dev):
    def prog(d):
        base = torch.arange(4.0).to(d)
        outs = [base * i for i in range(2000)]
        base.zero_()  # must not affect the values computed before
        return torch.stack(outs[::97]), outs[-1]

    run_both(prog, dev)


def test_many_pending_ops_on_tensors_of_five_to_seven_dims(dev):
    # A recorded tensor's sizes and strides are held in the op's node, inline up to four
    # dims and on the heap past that: many such nodes pending (and moved as the queue
    # grows), read and written through strided views, then one flush.
    def prog(d):
        outs = []
        for rank in (5, 6, 7):
            x = torch.arange(float(2**rank)).reshape((2,) * rank).to(d)
            v = x.transpose(0, rank - 1)[1]  # a strided view of rank - 1 dims
            for i in range(120):
                v.mul_(0.5).add_(float(i % 3))
                x = x + v.unsqueeze(0) if i % 2 else x.permute(*range(rank - 1, -1, -1)) * 1.0
            outs.append(x.sum(dim=tuple(range(rank - 2))))
        return outs

    run_both(prog, dev)


@requires_tpu
def test_queue_autoflushes_without_reads(dev):
    import torch_tpu_eager

    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    x = torch.zeros(4, device=dev)
    for _ in range(20000):
        x = x + 1
    m = torch_tpu_eager.metrics()
    assert m["ops_recorded"] >= 20000
    assert m["flushes"] >= 1, "20000 ops without a read must trigger an automatic flush"
    assert sum(m["flush_reasons"].values()) == m["flushes"]
    if hasattr(torch_tpu_eager, "queue_limits"):
        max_ops = torch_tpu_eager.queue_limits()[0]
        # Each flush drains at most max_ops pending ops, so the queue never held more.
        assert m["flushes"] >= 20000 // max_ops
    assert x.cpu().tolist() == [20000.0] * 4


@requires_tpu
def test_inplace_loop_autoflushes_and_stays_correct(dev):
    import torch_tpu_eager

    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    acc = torch.zeros(8, device=dev)
    views = [acc[i::4] for i in range(4)]
    for i in range(6000):
        views[i % 4].add_(1)
    assert torch_tpu_eager.metrics()["flushes"] >= 1
    assert acc.cpu().tolist() == [1500.0] * 8
