"""Autograd through views and in-place ops on the device: gradients against CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from difftest import cpu_randint, cpu_randn, run_both


def _leaf(host, d):
    """A leaf tensor on device d holding host's values."""
    return host.clone().to(d).requires_grad_()


def test_column_select_in_loss(dev):
    host = cpu_randn(3, 4, seed=1)

    def prog(d):
        x = _leaf(host, d)
        loss = (x[:, 0] * 2).sum() + (x[1, 1:] ** 2).sum() + x.sum()
        loss.backward()
        return loss.detach(), x.grad

    run_both(prog, dev)


def test_inplace_on_transposed_view_of_non_leaf(dev):
    host = cpu_randn(3, 4, seed=2)
    w = cpu_randn(4, 3, seed=3)

    def prog(d):
        leaf = _leaf(host, d)
        x = leaf * 1.5
        y = x.t()
        y.mul_(2)  # in-place through a view of a non-leaf
        loss = (y * w.to(d)).sum() + (x**2).sum()  # x saw the write
        loss.backward()
        return loss.detach(), leaf.grad, x.detach(), y.grad_fn is not None

    run_both(prog, dev)


def test_inplace_on_slices_of_clone(dev):
    host = cpu_randn(4, 5, seed=4)

    def prog(d):
        leaf = _leaf(host, d)
        h = leaf.clone()
        h[:, 1].mul_(3)
        h[2] = leaf[0] * h[1].clone() + leaf[3]  # overwrite a row with a function of others
        h[1:, ::2] += 1
        h.diagonal().exp_()
        loss = (h * h).sum()
        loss.backward()
        return loss.detach(), leaf.grad

    run_both(prog, dev)


def test_split_chunk_unbind(dev):
    host = cpu_randn(6, 4, seed=5)

    def prog(d):
        x = _leaf(host, d)
        a, b, c = x.split([1, 2, 3], dim=0)
        p, q = x.chunk(2, dim=1)
        cols = x.unbind(1)
        loss = a.sum() * 2 + (b**2).sum() + c.sin().sum() + (p * 3).sum() + q.exp().sum() + cols[3].pow(3).sum()
        loss.backward()
        return loss.detach(), x.grad

    run_both(prog, dev)


def test_expand_and_broadcast_grads(dev):
    host = cpu_randn(1, 3, seed=6)
    b_host = cpu_randn(4, 1, seed=7)

    def prog(d):
        x = _leaf(host, d)
        b = _leaf(b_host, d)
        e = x.expand(4, 3)
        loss = (e * torch.arange(12.0, device=d).reshape(4, 3)).sum() + (x + b).pow(2).sum()
        loss.backward()
        return x.grad, b.grad

    run_both(prog, dev)


def test_index_and_index_put(dev):
    host = cpu_randn(5, 3, seed=8)
    v_host = cpu_randn(3, 3, seed=9)

    def prog(d):
        x = _leaf(host, d)
        v = _leaf(v_host, d)
        idx = torch.tensor([0, 2, 0, 4, 0]).to(d)  # duplicates accumulate in backward
        g1 = (x[idx] * torch.arange(15.0, device=d).reshape(5, 3)).sum()
        y = x.clone()
        y.index_put_((torch.tensor([1, 1, 3]).to(d),), v, accumulate=True)
        z = x.clone()
        z[torch.tensor([0, 4, 2]).to(d)] = v * 2  # non-accumulating, distinct indices
        g2 = (y**2).sum() + (z * 3).sum()
        (g1 + g2).backward()
        return x.grad, v.grad

    run_both(prog, dev)


def test_gather_scatter_index_select_grads(dev):
    host = cpu_randn(4, 5, seed=10)

    def prog(d):
        x = _leaf(host, d)
        gi = torch.tensor([[0, 1], [4, 4], [2, 0], [3, 3]]).to(d)
        g = torch.gather(x, 1, gi)
        s = torch.index_select(x, 0, torch.tensor([3, 3, 1]).to(d))
        sa = torch.zeros(4, 5, device=d).scatter_add(1, gi, g * 2)
        loss = (g**2).sum() + s.sum() + (sa * x).sum()
        loss.backward()
        return x.grad

    run_both(prog, dev)


def test_masked_fill_and_where(dev):
    host = cpu_randn(4, 4, seed=11)

    def prog(d):
        x = _leaf(host, d)
        m = x > 0
        y = x.masked_fill(m, 0.0) * 3
        z = torch.where(m, x * x, -x)
        w = x.clone()
        w.masked_fill_(~m, 1.0)
        loss = y.sum() + z.sum() + (w * w).sum()
        loss.backward()
        return x.grad

    run_both(prog, dev)


def test_softmax_layer_norm_cross_entropy(dev):
    xh = cpu_randn(6, 10, seed=12)
    wh = cpu_randn(10, seed=13)
    bh = cpu_randn(10, seed=14)
    target = cpu_randint(0, 10, (6,), seed=15)

    def prog(d):
        x, w, b = _leaf(xh, d), _leaf(wh, d), _leaf(bh, d)
        t = target.to(d)
        ln = F.layer_norm(x, (10,), w, b)
        sm = torch.softmax(ln, dim=1)
        lsm = torch.log_softmax(x, dim=0)
        ce = F.cross_entropy(ln, t)
        ce_ls = F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=int(target[0]))
        nll = F.nll_loss(lsm.t(), torch.arange(10).remainder(6).to(d))  # class dim is the old dim 0
        loss = (sm * torch.arange(10.0).to(d)).sum() + ce + ce_ls + nll
        loss.backward()
        return loss.detach(), x.grad, w.grad, b.grad

    run_both(prog, dev, rtol=1e-4, atol=1e-5)


def test_autograd_grad_and_double_backward(dev):
    host = cpu_randn(5, seed=16)

    def prog(d):
        x = _leaf(host, d)
        y = (x**3).sum() + (x[1:] * x[:-1]).sum()
        (gx,) = torch.autograd.grad(y, x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), x)
        return gx.detach(), ggx, x.grad is None

    run_both(prog, dev)


def test_backward_twice_retain_graph_accumulates(dev):
    host = cpu_randn(3, 3, seed=17)

    def prog(d):
        x = _leaf(host, d)
        y = (x.t() @ x).tanh().sum()
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        return first, x.grad

    run_both(prog, dev)


def test_second_backward_without_retain_raises(dev):
    for d in ("cpu", dev):
        x = torch.ones(3, device=d, requires_grad=True)
        y = (x.exp() * 2).sum()
        y.backward()
        with pytest.raises(RuntimeError, match="second time"):
            y.backward()


def test_grad_device_dtype_and_views_of_grad(dev):
    x = torch.ones(2, 3, device=dev, requires_grad=True)
    (x.t() * torch.arange(6.0, device=dev).reshape(3, 2)).sum().backward()
    assert x.grad.device.type == torch.device(dev).type and x.grad.dtype == torch.float32
    assert x.grad.shape == (2, 3) and x.grad.cpu().tolist() == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]


def test_mlp_sgd_steps_match_cpu(dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    xs = cpu_randn(5, 32, 8, seed=18)
    ys = cpu_randint(0, 4, (5, 32), seed=19)

    def prog(d):
        m = copy.deepcopy(model).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        losses = []
        for step in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(m(xs[step].to(d)), ys[step].to(d))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses, [p.detach() for p in m.parameters()], [p.grad for p in m.parameters()]

    run_both(prog, dev, rtol=1e-4, atol=1e-5)


def test_module_to_device_keeps_parameter_identity(dev):
    # Tied weights must stay tied after .to(dev) (see PrivateUse1 note 9).
    m = nn.Linear(4, 4, bias=False)
    holder = nn.Module()
    holder.a = m
    holder.b = nn.Linear(4, 4, bias=False)
    holder.b.weight = m.weight
    holder.to(dev)
    assert holder.a.weight is holder.b.weight and holder.a.weight.device.type == torch.device(dev).type


def test_cnn_forward_backward_matches_cpu(dev):
    # Convolutions reach the device as convolution_overrideable (+ backward).
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3, groups=2),
        torch.nn.ConvTranspose2d(4, 2, 3, stride=2),
    )
    x = torch.randn(2, 3, 16, 16)
    outs = {}
    for d in ("cpu", dev):
        md = m.to(d)
        xd = x.to(d).detach().requires_grad_()
        y = md(xd)
        y.square().sum().backward()
        outs[d] = (y.detach().cpu(), xd.grad.cpu(), md[0].weight.grad.cpu(), md[4].bias.grad.cpu())
        md.zero_grad()
        m = m.to("cpu")
    for a, b in zip(outs["cpu"], outs[dev]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (torch.nn.LSTM, dict(num_layers=2, bidirectional=True)),
        (torch.nn.LSTM, dict(bias=False)),
        (torch.nn.GRU, dict(num_layers=2)),
        (torch.nn.GRU, dict(bias=False, batch_first=True)),
    ],
)
def test_recurrent_layers_match_cpu(dev, cls, kwargs):
    # On PrivateUse1, nn.LSTM / nn.GRU run ATen's fused cells (pitfall 10),
    # which CPU has no kernel for: the device composes them (and their backward).
    torch.manual_seed(0)
    m = cls(5, 7, **kwargs)
    x = torch.randn(4, 3, 5)
    outs = {}
    for d in ("cpu", dev):
        md = m.to(d)
        xd = x.to(d).detach().requires_grad_()
        y, _ = md(xd)
        y.square().sum().backward()
        outs[d] = [y.detach().cpu(), xd.grad.cpu()] + [p.grad.cpu() for p in md.parameters()]
        md.zero_grad()
        m = m.to("cpu")
    for a, b in zip(outs["cpu"], outs[dev]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_forward_mask(dev, use_reentrant):
    """torch.utils.checkpoint restores the device generator before the recomputation
    (it asks ``torch.<device>._initialized``), so the backward sees the forward's
    dropout mask: the gradient is (mask * 2) @ W, computed here on CPU from the output."""
    import torch.utils.checkpoint as cp

    lin = nn.Linear(4, 4).to(dev)
    x = cpu_randn(4, 4, seed=5).to(dev).requires_grad_()
    torch.manual_seed(1)
    y = cp.checkpoint(lambda t: F.dropout(lin(t), 0.5), x, use_reentrant=use_reentrant)
    y.sum().backward()
    mask = (y.detach().cpu() != 0).float() * 2
    torch.testing.assert_close(x.grad.cpu(), mask @ lin.weight.detach().cpu())
