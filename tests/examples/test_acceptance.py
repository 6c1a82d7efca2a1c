"""The acceptance cases of /work/shared/acceptance_cases.md, one test per case.

Each test is the case's snippet with its asserted semantics unchanged; ``dev`` is the
device under test. The expected values are CPU PyTorch semantics.
"""

import math

import torch


def test_br01_column_write_through_strided_view(dev):
    x = torch.tensor([[1, 2, 3], [4, 5, 6]]).to(dev)
    x[:, 0] = 7
    x[:, 1] += 1
    assert torch.equal(x.cpu(), torch.tensor([[7, 3, 3], [7, 6, 6]]))


def test_br02_stepped_slice_assignment(dev):
    x = torch.zeros(10, device=dev)
    x[::2] = 1.0
    assert x.cpu().tolist() == [1.0, 0.0] * 5
    y = torch.zeros(4, 6, device=dev)
    y[1::2, ::3] += 2  # strided in-place on a 2-D stepped view
    assert y.cpu().sum().item() == 8 and y.cpu()[3, 3].item() == 2 and y.cpu()[0].sum().item() == 0


def test_br03_back_to_back_scalar_writes(dev):
    x = torch.zeros(3, device=dev)
    x[1] = 1
    x[2] = 3
    assert x.cpu().tolist() == [0.0, 1.0, 3.0]
    y = torch.zeros(4, device=dev)
    y[0] = 1
    for i in range(1, 4):
        y[i] = y[i - 1] * 2  # each write reads the previous pending write
    assert y.cpu().tolist() == [1.0, 2.0, 4.0, 8.0]


def test_br06_stale_view_after_write_through_other_alias(dev):
    t0 = torch.arange(6.0).view(2, 3).to(dev)
    t1 = t0[1]  # alias #1 (created first)
    flat = t0.view(-1)  # alias #2
    flat[3] = 10  # t0[1, 0] becomes 10 via alias #2
    t1[0] *= 2  # must read 10 (not the stale 3)
    assert t0.cpu().tolist() == [[0.0, 1.0, 2.0], [20.0, 4.0, 5.0]] and t1.cpu().tolist() == [20.0, 4.0, 5.0]


def test_br08_inplace_on_transposed_view(dev):
    x = torch.arange(6).reshape(2, 3).to(dev)
    b = x.t()
    b.mul_(1)
    assert torch.equal(b.cpu(), torch.tensor([[0, 3], [1, 4], [2, 5]]))
    assert b.stride() == (1, 3) and torch.equal(x.cpu(), torch.arange(6).reshape(2, 3))
    b.add_(10)  # write through the transposed view
    assert x.cpu()[0].tolist() == [10, 11, 12]


def test_br10_copy_into_select_view(dev):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev)
    v = x.select(0, 2)
    v.copy_(torch.tensor(9.0).to(dev))
    assert x.cpu().tolist() == [1.0, 2.0, 9.0, 4.0]
    x[0] = torch.tensor(7.0)  # 0-dim CPU tensor written into one device element
    assert x.cpu().tolist() == [7.0, 2.0, 9.0, 4.0]


def test_br12_out_into_transposed_and_sliced_destination(dev):
    x = torch.arange(4.0).reshape(2, 2).to(dev)
    y = torch.empty(2, 2, device=dev).t()
    torch.neg(x, out=y)
    assert torch.equal(y.cpu(), -torch.arange(4.0).reshape(2, 2))
    z = torch.zeros(2, 4, device=dev)
    torch.add(x, 1, out=z[:, 1:3])
    assert z.cpu().tolist() == [[0.0, 1.0, 2.0, 0.0], [0.0, 3.0, 4.0, 0.0]]


def test_br14_detach_aliases_clone_does_not(dev):
    a = torch.zeros(3, device=dev)
    d = a.detach()
    d.add_(1)
    c = a.clone()
    c.add_(5)
    assert a.cpu().tolist() == [1.0, 1.0, 1.0] and c.cpu().tolist() == [6.0, 6.0, 6.0]
    p = torch.ones(2, device=dev, requires_grad=True)
    with torch.no_grad():
        p.mul_(3)
    assert p.detach().cpu().tolist() == [3.0, 3.0] and p.is_leaf


def test_br15_inplace_on_expanded_raises(dev):
    y = torch.tensor(0.5).to(dev).expand(3)
    for op in (lambda: y.cos_(), lambda: y.add_(1)):
        try:
            op()
            raised = False
        except RuntimeError:
            raised = True
        assert raised
    z = torch.ones(1, 1).to(dev).expand(4, 5)
    assert torch.equal((z + 1).cpu(), torch.full((4, 5), 2.0))


def test_br17_h2d_copy_honours_offset_and_strides(dev):
    y = torch.arange(2)[1]
    assert y.to(dev).cpu().item() == 1
    c = torch.arange(9).reshape(3, 3)[:, :2]
    assert torch.equal(c.to(dev).cpu(), c)
    d = torch.arange(12.0).reshape(3, 4).t()[1:]
    assert torch.equal(d.to(dev).cpu(), d) and torch.equal(d.to(dev).t().cpu(), d.t())


def test_br21_boolean_mask_assignment(dev):
    x = torch.tensor([[1, 2, 2], [1, 2, 3]]).to(dev)
    x[x == 2] = -1
    assert x.cpu().tolist() == [[1, -1, -1], [1, -1, 3]]
    y = torch.arange(6.0).reshape(2, 3).to(dev)
    yt = y.t()
    yt[yt > 2] = 0  # mask write through a transposed view
    assert y.cpu().tolist() == [[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]]


def test_br22_accumulate_duplicate_indices(dev):
    a = torch.zeros(4, device=dev)
    idx = torch.tensor([0, 0, 2, 0]).to(dev)
    a.index_put_((idx,), torch.tensor([1.0, 2.0, 5.0, 4.0]).to(dev), accumulate=True)
    assert a.cpu().tolist() == [7.0, 0.0, 5.0, 0.0]
    b = torch.zeros(3, device=dev)
    b.index_put_((torch.tensor([0, 0]).to(dev),), torch.tensor(1.0).to(dev), accumulate=True)
    c = torch.zeros(5, device=dev).index_add_(0, torch.tensor([1, 3, 1]).to(dev), torch.ones(3, device=dev))
    assert b.cpu().tolist() == [2.0, 0.0, 0.0] and c.cpu().tolist() == [0.0, 2.0, 0.0, 1.0, 0.0]


def test_br24_int_tensor_plus_python_int(dev):
    x = torch.arange(10, dtype=torch.int32).to(dev)
    r = x + 5
    assert r.dtype == torch.int32 and r.cpu().tolist() == list(range(5, 15))
    big = torch.arange(3).to(dev) + (1 << 32)
    assert big.dtype == torch.int64 and big.cpu().tolist() == [4294967296, 4294967297, 4294967298]
    w = torch.tensor([2**31 - 1], dtype=torch.int32).to(dev) + 1  # int32 wraps exactly like CPU
    assert w.cpu().item() == -(2**31)


def test_br27_floor_trunc_remainder_fmod(dev):
    a = torch.tensor([-7, 7, -1, 5]).to(dev)
    b = torch.tensor([2, -2, 2, 3]).to(dev)
    assert torch.div(a, b, rounding_mode="floor").cpu().tolist() == [-4, -4, -1, 1]
    assert torch.div(a, b, rounding_mode="trunc").cpu().tolist() == [-3, -3, 0, 1]
    assert (a // b).cpu().tolist() == [-4, -4, -1, 1] and torch.remainder(a, b).cpu().tolist() == [1, -1, 1, 2]
    assert torch.fmod(a, b).cpu().tolist() == [-1, 1, -1, 2] and (a / b).dtype == torch.float32
    f = torch.div(
        torch.tensor([float("inf"), 1.0, -1.0]).to(dev),
        torch.tensor([1.0, -float("inf"), float("inf")]).to(dev),
        rounding_mode="floor",
    )
    assert math.isnan(f.cpu()[0].item()) and f.cpu()[1:].tolist() == [-1.0, -1.0]


def test_br31_bf16_reductions_accumulate_wide(dev):
    x = torch.ones(512, dtype=torch.bfloat16).to(dev)
    assert x.sum().item() == 512.0 and x.mean().item() == 1.0
    p = torch.softmax(torch.zeros(512, dtype=torch.bfloat16).to(dev), dim=0)
    assert p.dtype == torch.bfloat16 and bool(torch.all(p.cpu() == 2.0**-9))
    m = torch.ones(1, 1024, dtype=torch.bfloat16).to(dev) @ torch.ones(1024, 1, dtype=torch.bfloat16).to(dev)
    assert m.item() == 1024.0


def test_br33_manual_seed_reproducible_rng_at_record_time(dev):
    torch.manual_seed(0)
    a = torch.empty(5, device=dev).uniform_()
    torch.manual_seed(0)
    b = torch.empty(5, device=dev).uniform_()
    assert torch.equal(a.cpu(), b.cpu())
    torch.manual_seed(1)
    r1 = torch.rand(4, device=dev)
    r2 = torch.rand(4, device=dev)
    _ = r1.cpu()
    _ = r2.cpu()
    torch.manual_seed(1)
    s1 = torch.rand(4, device=dev)
    s2 = torch.rand(4, device=dev)
    assert torch.equal(s2.cpu(), r2.cpu()) and torch.equal(s1.cpu(), r1.cpu()) and not torch.equal(r1.cpu(), r2.cpu())


def test_br36_unflushed_graph_stays_bounded(dev):
    x = torch.zeros(4, device=dev)
    for i in range(20000):
        x = x + 1  # never observed inside the loop
    assert x.cpu().tolist() == [20000.0] * 4
    acc = torch.zeros(8, device=dev)
    for i in range(5000):
        acc.add_(torch.ones(8, device=dev))  # in-place accumulation, no sync
    assert acc.cpu().tolist() == [5000.0] * 8
