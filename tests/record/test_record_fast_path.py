"""The unboxed record kernels (elementwise signatures: Tensor/Scalar arguments, one fresh
Tensor result, or `self` written in place and returned) put the caller's tensors on the
record stack without taking a reference.
These tests check that no reference is leaked or lost on any path (recorded, call-time
error, run eagerly, meta-cache miss), that results still match CPU when the inputs die
before the flush, and that recording from several threads stays correct."""

import sys

import pytest
import torch

from difftest import cpu_randn, run_both, run_both_at_call
from threaded import run_threads


def _refcounts(*ts):
    return [sys.getrefcount(t) for t in ts]


def test_recorded_ops_keep_input_refcounts(dev):
    a, b = cpu_randn(3, 4, seed=1).to(dev), cpu_randn(3, 4, seed=2).to(dev)
    before = _refcounts(a, b)
    outs = [
        a + b,
        a.mul(b),
        torch.add(a, b, alpha=2),
        a.exp(),
        a * 3,
        torch.ops.aten.add.Scalar(a, 2.5, 0.5),
        torch.sub(a, b),
    ]
    assert _refcounts(a, b) == before
    del outs
    assert _refcounts(a, b) == before


def test_call_time_error_keeps_refcounts_and_cpu_message(dev):
    a, b = cpu_randn(2, seed=1), cpu_randn(3, seed=2)
    with pytest.raises(RuntimeError) as cpu_err:
        a + b
    ta, tb = a.to(dev), b.to(dev)
    before = _refcounts(ta, tb)
    with pytest.raises(RuntimeError) as dev_err:
        ta + tb
    assert str(dev_err.value) == str(cpu_err.value)
    assert _refcounts(ta, tb) == before
    # Both tensors are still usable.
    torch.testing.assert_close((ta * 2).cpu(), a * 2, rtol=0, atol=0)


def test_eager_and_meta_miss_paths_keep_refcounts(dev):
    x = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    t = x.to(dev)
    before = _refcounts(t)
    nz = torch.nonzero(t)  # data-dependent shape: runs eagerly
    # A shape never seen before: the meta kernel runs (cache miss).
    odd = cpu_randn(7, 11, 13, seed=5)
    to = odd.to(dev)
    before_odd = _refcounts(to)
    r = torch.atan2(to, to * 0.5)
    assert _refcounts(t) == before and _refcounts(to) == before_odd
    torch.testing.assert_close(nz.cpu(), torch.nonzero(x), rtol=0, atol=0)
    torch.testing.assert_close(r.cpu(), torch.atan2(odd, odd * 0.5), rtol=0, atol=0)


def test_inputs_dying_before_the_flush(dev):
    def prog(d):
        a, b = cpu_randn(4, 5, seed=3).to(d), cpu_randn(4, 5, seed=4).to(d)
        c = a + b
        e = (a * b).neg()
        del a, b
        return c, e

    run_both(prog, dev)


def test_scalar_arguments_on_the_unboxed_path_match_cpu(dev):
    ints = torch.arange(6, dtype=torch.int32)
    floats = cpu_randn(6, seed=6)

    def prog(d):
        i, f = ints.to(d), floats.to(d)
        # int tensor * int / float Scalar: the Scalar's type decides the result dtype.
        outs = [i * 2, i * 2.5, i.add(3, alpha=2), f.sub(2)]
        for s in (0.5, -1.25, 3.0, float("inf")):  # changing values reuse the cached shape
            outs.append(f * s)
            outs.append(f.add(f, alpha=s))
        return outs

    run_both(prog, dev)


def _functional_step(x, shared, j):
    return (x + shared).mul(0.5) - j * 1e-3


def _in_place_step(x, shared, j):
    return x.add_(shared, alpha=0.5).mul_(0.75).sub_(j * 1e-3)


def _chains_in_threads(dev, read_inside, step=_functional_step):
    """Four threads each record a 200-step chain (``step(x, shared, j)``, 3 ops) that
    also reads a shared tensor; with ``read_inside`` each thread reads its result with
    .cpu() itself (so flushes run while the other threads record). Compared with CPU,
    bit for bit."""
    base = cpu_randn(64, seed=7)
    shared = base.to(dev)
    results = {}

    def worker(k):
        x = cpu_randn(64, seed=10 + k).to(dev)
        for j in range(200):
            x = step(x, shared, j)
        results[k] = x.cpu() if read_inside else x

    run_threads(worker, [(k,) for k in range(4)])
    for k in range(4):
        x = cpu_randn(64, seed=10 + k)
        for j in range(200):
            x = step(x, base, j)
        torch.testing.assert_close(results[k].cpu(), x, rtol=0, atol=0)


def test_recording_from_several_threads(dev):
    _chains_in_threads(dev, read_inside=False)


def test_threads_reading_their_results_while_others_record(dev):
    # A flush started by one thread's .cpu() runs while other threads record ops
    # that read values of that flush whose tensors died meanwhile: those values
    # are still observed (by the new nodes) and must be materialized.
    for _ in range(3):
        _chains_in_threads(dev, read_inside=True)


def test_short_lived_threads_record_and_exit(dev):
    # Each thread's record stacks are a per-thread pool freed at the thread's exit;
    # values recorded by threads that have exited are flushed after it.
    base = cpu_randn(16, seed=3)
    shared = base.to(dev)
    results = []

    def worker(k):
        results.append((k, (shared * (k + 1) + 0.5).exp().sub(shared)))

    run_threads(worker, [(k,) for k in range(40)], one_at_a_time=True)
    for k, r in results:
        # Default float32 tolerances: the fused exp may differ from CPU's by an ulp (as on main).
        torch.testing.assert_close(r.cpu(), (base * (k + 1) + 0.5).exp().sub(base))


def test_in_place_ops_return_self_and_keep_refcounts(dev):
    # The in-place signatures of the unboxed kernels: (), (Tensor), (Tensor, Scalar),
    # (Scalar), (Scalar, Scalar) after `self`.
    a, b = cpu_randn(3, 4, seed=1), cpu_randn(3, 4, seed=2)
    ta, tb = a.to(dev), b.to(dev)
    before = _refcounts(ta, tb)
    calls = [
        lambda x, y: x.relu_(),
        lambda x, y: x.mul_(y),
        lambda x, y: x.add_(y, alpha=2),
        lambda x, y: x.mul_(1.5),
        lambda x, y: torch.ops.aten.add_.Scalar(x, 2.5, 0.5),
        lambda x, y: x.sub_(y),
    ]
    for call in calls:
        assert call(ta, tb) is ta
        assert call(a, b) is a
    assert _refcounts(ta, tb) == before
    torch.testing.assert_close(ta.cpu(), a, rtol=0, atol=0)
    torch.testing.assert_close(tb.cpu(), b, rtol=0, atol=0)


@pytest.mark.parametrize(
    "chain, writes",
    [
        (lambda y, x, t: y.add_(x, alpha=0.5).mul_(x), 2),
        # The (Tensor, Tensor[, Scalar]) in-place signatures.
        (lambda y, x, t: y.addcmul_(x, t, value=0.5).addcdiv_(t, x.detach().abs() + 1.0).lerp_(x, t.sigmoid()), 3),
    ],
)
def test_in_place_ops_bump_the_version_and_feed_autograd(dev, chain, writes):
    w, u = cpu_randn(5, seed=3), cpu_randn(5, seed=4)

    def prog(d):
        x = w.clone().to(d).requires_grad_()  # a leaf on both devices (w itself stays as it is)
        y = x * 2
        v = y._version
        chain(y, x, u.to(d))
        assert y._version == v + writes
        y.sum().backward()
        return y.detach(), x.grad

    run_both(prog, dev)


@pytest.mark.parametrize(
    "build, act",
    [
        # int self, float other: the result type cannot be cast to self's dtype.
        (lambda d: (torch.arange(4).to(d), cpu_randn(4, seed=1).to(d)), lambda x, y: x.add_(y)),
        # A float alpha with an integer self (CPU's alpha_check).
        (lambda d: (torch.arange(4).to(d), torch.arange(4).to(d)), lambda x, y: x.add_(y, alpha=0.5)),
        # A written tensor with internal overlap (an expanded self).
        (lambda d: (cpu_randn(1, 4, seed=2).to(d).expand(3, 4), cpu_randn(3, 4, seed=3).to(d)), lambda x, y: x.mul_(y)),
        # Broadcasting `other` to a larger shape than self's.
        (lambda d: (cpu_randn(4, seed=4).to(d), cpu_randn(3, 4, seed=5).to(d)), lambda x, y: x.add_(y)),
        # Self read again as `other` (TensorIterator accepts it).
        (lambda d: (cpu_randn(4, seed=6).to(d), cpu_randn(1, seed=0).to(d)), lambda x, y: x.mul_(x)),
        # A view written in place: its base sees the write.
        (
            lambda d: (cpu_randn(4, 4, seed=7).to(d), cpu_randn(1, seed=0).to(d)),
            lambda x, y: x[1:3, ::2].add_(1.5, alpha=2),
        ),
    ],
)
def test_in_place_calls_raise_or_compute_as_cpu(dev, build, act):
    run_both_at_call(build, act, dev)


def test_in_place_ops_from_several_threads(dev):
    _chains_in_threads(dev, read_inside=False, step=_in_place_step)


def test_three_tensor_signatures_return_self_keep_refcounts_and_match_cpu(dev):
    # The unboxed signatures (Tensor, Tensor[, Scalar]) after an in-place `self` (addcmul_,
    # addcdiv_, lerp_.Tensor: the optimizers' per-tensor updates) and three tensors
    # [+ a Scalar] of a fresh result (lerp.Tensor, where.self, addcmul, addcdiv).
    a, b, c = cpu_randn(3, 4, seed=1), cpu_randn(3, 4, seed=2), cpu_randn(3, 4, seed=3).abs() + 0.5
    w = torch.rand(3, 4, generator=torch.Generator().manual_seed(4))
    ta, tb, tc, tw = a.to(dev), b.to(dev), c.to(dev), w.to(dev)
    before = _refcounts(ta, tb, tc, tw)
    in_place = [
        lambda x, y, z, u: x.addcmul_(y, z, value=0.5),
        lambda x, y, z, u: x.addcdiv_(y, z, value=-2),
        lambda x, y, z, u: x.addcmul_(y, z),
        lambda x, y, z, u: x.lerp_(y, u),
    ]
    for call in in_place:
        assert call(ta, tb, tc, tw) is ta
        assert call(a, b, c, w) is a
    fresh = [
        lambda x, y, z, u: torch.lerp(x, y, u),
        lambda x, y, z, u: torch.where(u > 0.5, x, y),
        lambda x, y, z, u: torch.addcmul(x, y, z, value=0.25),
        lambda x, y, z, u: torch.addcdiv(x, y, z, value=3),
    ]
    dev_outs = [f(ta, tb, tc, tw) for f in fresh]
    cpu_outs = [f(a, b, c, w) for f in fresh]
    assert _refcounts(ta, tb, tc, tw) == before
    for got, want in zip(dev_outs, cpu_outs):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(ta.cpu(), a, rtol=0, atol=0)
    del dev_outs
    assert _refcounts(ta, tb, tc, tw) == before


@pytest.mark.parametrize(
    "build, act",
    [
        # An integer self with float tensors: the result type cannot be cast to self's dtype.
        (
            lambda d: (torch.arange(4).to(d), cpu_randn(4, seed=1).to(d), cpu_randn(4, seed=2).to(d)),
            lambda x, y, z: x.addcmul_(y, z),
        ),
        # addcdiv_ of integer tensors (CPU refuses integer division here).
        (
            lambda d: (torch.arange(4).to(d), torch.arange(4).to(d), torch.arange(1, 5).to(d)),
            lambda x, y, z: x.addcdiv_(y, z),
        ),
        # An expanded self (internal overlap).
        (
            lambda d: (
                cpu_randn(1, 4, seed=2).to(d).expand(3, 4),
                cpu_randn(3, 4, seed=3).to(d),
                cpu_randn(4, seed=4).to(d),
            ),
            lambda x, y, z: x.lerp_(y, z),
        ),
        # The other tensors broadcasting past self's shape.
        (
            lambda d: (cpu_randn(4, seed=4).to(d), cpu_randn(3, 4, seed=5).to(d), cpu_randn(4, seed=6).to(d)),
            lambda x, y, z: x.addcmul_(y, z),
        ),
        # Mixed dtypes in lerp_ (CPU requires one dtype).
        (
            lambda d: (cpu_randn(4, seed=7).to(d), cpu_randn(4, seed=8).double().to(d), cpu_randn(4, seed=9).to(d)),
            lambda x, y, z: x.lerp_(y, z),
        ),
        # A strided view written in place, self read again as a factor.
        (
            lambda d: (cpu_randn(4, 4, seed=10).to(d), cpu_randn(2, 2, seed=11).to(d), cpu_randn(1, seed=12).to(d)),
            lambda x, y, z: x[1:3, ::2].addcmul_(x[1:3, ::2], y, value=-0.5),
        ),
    ],
)
def test_three_tensor_in_place_calls_raise_or_compute_as_cpu(dev, build, act):
    run_both_at_call(build, act, dev)
