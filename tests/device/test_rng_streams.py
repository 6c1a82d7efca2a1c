"""RNG (BR-33): reproducible, consumed at record time, distinct streams.

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu


# ---------------------------------------------------------------------------
# RNG (BR-33): reproducible, consumed at record time, distinct streams
# ---------------------------------------------------------------------------

RNG_OPS = {
    "rand": lambda d: torch.rand(6, device=d),
    "randn": lambda d: torch.randn(2, 3, device=d),
    "normal_": lambda d: torch.empty(5, device=d).normal_(2.0, 0.5),
    "uniform_": lambda d: torch.empty(5, device=d).uniform_(-3, 3),
    "bernoulli_p": lambda d: torch.bernoulli(torch.full((16,), 0.5, device=d)),
    "bernoulli_": lambda d: torch.empty(16, device=d).bernoulli_(0.3),
    "dropout": lambda d: F.dropout(torch.ones(32, device=d), p=0.5, training=True),
    "randint": lambda d: torch.randint(0, 1000, (8,), device=d),
    "randperm": lambda d: torch.randperm(20, device=d),
    "rand_like_bf16": lambda d: torch.rand_like(torch.empty(8, dtype=torch.bfloat16, device=d)),
    "multinomial": lambda d: torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4], device=d), 6, replacement=True),
    "exponential_": lambda d: torch.empty(6, device=d).exponential_(),
}


@pytest.mark.parametrize("op", sorted(RNG_OPS))
def test_rng_manual_seed_reproducible(dev, op):
    torch.manual_seed(123)
    a = RNG_OPS[op](dev)
    a2 = RNG_OPS[op](dev)
    torch.manual_seed(123)
    b = RNG_OPS[op](dev)
    b2 = RNG_OPS[op](dev)
    assert a.device.type == torch.device(dev).type
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a2.cpu(), b2.cpu())
    torch.manual_seed(124)
    c = RNG_OPS[op](dev)
    # Two draws (and draws under different seeds) differ: no stream is reused.
    assert not (torch.equal(a.cpu(), a2.cpu()) and torch.equal(a.cpu(), c.cpu()))


def test_rng_value_properties(dev):
    torch.manual_seed(7)
    u = torch.rand(4000, device=dev).cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.05
    n = torch.randn(4000, device=dev).cpu()
    assert abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1) < 0.1
    r = torch.randint(3, 9, (500,), device=dev).cpu()
    assert r.dtype == torch.int64 and r.min() >= 3 and r.max() <= 8 and len(r.unique()) == 6
    p = torch.randperm(50, device=dev).cpu()
    assert p.dtype == torch.int64 and sorted(p.tolist()) == list(range(50))
    b = torch.bernoulli(torch.full((1000,), 0.25, device=dev)).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.15 < b.mean().item() < 0.35
    x = torch.arange(1.0, 201.0).to(dev)
    y = F.dropout(x, p=0.4, training=True).cpu()
    kept = y != 0
    assert torch.allclose(y[kept], x.cpu()[kept] / 0.6) and 0.4 < kept.float().mean().item() < 0.8
    assert torch.equal(F.dropout(x, p=0.4, training=False).cpu(), x.cpu())


def test_rng_read_order_does_not_matter(dev):
    torch.manual_seed(5)
    a, b, c = torch.rand(4, device=dev), torch.randn(4, device=dev), torch.randint(0, 100, (4,), device=dev)
    fwd = [a.cpu(), b.cpu(), c.cpu()]
    torch.manual_seed(5)
    a, b, c = torch.rand(4, device=dev), torch.randn(4, device=dev), torch.randint(0, 100, (4,), device=dev)
    rev = [c.cpu(), b.cpu(), a.cpu()][::-1]
    assert all(torch.equal(x, y) for x, y in zip(fwd, rev))


def test_rng_unaffected_by_intervening_flush_or_other_ops(dev):
    torch.manual_seed(9)
    r1 = torch.rand(4, device=dev)
    r2 = torch.rand(4, device=dev)
    ref = [r1.cpu(), r2.cpu()]
    torch.manual_seed(9)
    s1 = torch.rand(4, device=dev)
    junk = (torch.arange(10.0).to(dev) * 2).sum().item()  # a flush between the draws
    _ = s1 * 3 + junk  # non-RNG ops consume no generator state
    s2 = torch.rand(4, device=dev)
    assert torch.equal(s1.cpu(), ref[0]) and torch.equal(s2.cpu(), ref[1])


def test_rng_explicit_generator(dev):
    g = torch.Generator(device=dev)
    g.manual_seed(11)
    a = torch.rand(5, generator=g, device=dev)
    g.manual_seed(11)
    b = torch.rand(5, generator=g, device=dev)
    state = g.get_state()
    c = torch.randn(5, generator=g, device=dev)
    g.set_state(state)
    e = torch.randn(5, generator=g, device=dev)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(c.cpu(), e.cpu())
    torch.manual_seed(11)
    torch.rand(100, device=dev)  # the default generator is separate from g
    g.manual_seed(11)
    assert torch.equal(torch.rand(5, generator=g, device=dev).cpu(), a.cpu())


def test_rng_fork_rng_restores_state(dev):
    # On "cpu" the CPU state is always forked; on a device, fork that device's state.
    kw = {"devices": []} if dev == "cpu" else {"device_type": torch.device(dev).type}
    torch.manual_seed(3)
    with torch.random.fork_rng(**kw):
        torch.rand(10, device=dev)
    a = torch.rand(4, device=dev)
    torch.manual_seed(3)
    b = torch.rand(4, device=dev)
    assert torch.equal(a.cpu(), b.cpu())


@requires_tpu
def test_tpu_manual_seed_and_rng_state_round_trip(dev):
    torch.tpu.manual_seed(42)
    a = torch.rand(6, device=dev)
    torch.tpu.manual_seed(42)
    b = torch.rand(6, device=dev)
    assert torch.equal(a.cpu(), b.cpu())
    state = torch.tpu.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.device.type == "cpu"
    c = torch.randn(6, device=dev)
    d = torch.bernoulli(torch.full((8,), 0.5, device=dev))
    torch.tpu.set_rng_state(state)
    c2 = torch.randn(6, device=dev)
    d2 = torch.bernoulli(torch.full((8,), 0.5, device=dev))
    assert torch.equal(c.cpu(), c2.cpu()) and torch.equal(d.cpu(), d2.cpu())
    torch.tpu.manual_seed_all(42)
    assert torch.equal(torch.rand(6, device=dev).cpu(), a.cpu())


@requires_tpu
def test_tpu_seed_independent_of_cpu_generator(dev):
    torch.manual_seed(1)
    a = torch.rand(4, device=dev)
    torch.manual_seed(1)
    torch.rand(50)  # draws on the CPU generator must not move the device stream
    b = torch.rand(4, device=dev)
    assert torch.equal(a.cpu(), b.cpu())
