"""Fused loops split their tiles and row blocks across torch's intra-op threads
(at::parallel_for). Results must not depend on the split: with two threads, inputs large
enough for several grains (ATen's 32,768 elements) give CPU PyTorch's values, bit for bit
where the single-thread loop is bit-equal (IEEE-exact producers, row reductions), and the
same bits as one thread where the fused math is SLEEF (transcendentals)."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")


@pytest.fixture
def threads():
    """Runs the test with torch's intra-op threads set as it asks, then restores them."""
    yield from restoring(torch.get_num_threads, torch.set_num_threads)


def _exact_chain(x, y):
    return ((x * 1.5 - y) / 3.0 + 0.25).abs().neg() * y


# Row counts that do not split evenly in two; one row longer than a grain;
# row loops under 32,768 elements, which split by their work (16 operations an
# element) as CPU's row kernels split (nanoGPT's 512 x 64 layer_norm rows).
ROW_SHAPES = [(1031, 256), (257, 1000), (3, 70001), (512, 64), (37, 100)]


# 20,000 elements: under ATen's grain, split since the chain runs 7 instructions an element.
@pytest.mark.parametrize("numel", [20_000, 32768 * 5 + 7, 1_000_003])
def test_elementwise_chain_matches_cpu_exactly(threads, numel):
    threads(2)
    x, y = cpu_randn(numel, seed=1), cpu_randn(numel, seed=2)
    assert torch.equal(_exact_chain(x.to("tpu"), y.to("tpu")).cpu(), _exact_chain(x, y))


@pytest.mark.parametrize("shape", [(700, 1000), (100, 100)])
def test_transcendental_chain_is_independent_of_thread_count(threads, shape):
    x = cpu_randn(*shape, seed=3)

    def chain(t):
        return (t.sin().exp() - t).tanh().cos() * t

    threads(1)
    one = chain(x.to("tpu")).cpu()
    threads(2)
    two = chain(x.to("tpu")).cpu()
    assert torch.equal(one, two)
    torch.testing.assert_close(two, chain(x))


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_rows_match_cpu_exactly(threads, shape, fn):
    threads(2)
    x, y = cpu_randn(*shape, seed=4), cpu_randn(*shape, seed=5)
    expected = fn((x * 1.5 - y) / 3.0, dim=-1)
    assert torch.equal(fn((x.to("tpu") * 1.5 - y.to("tpu")) / 3.0, dim=-1).cpu(), expected)


@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_layer_norm_rows_match_cpu_exactly(threads, shape):
    threads(2)
    x, r = cpu_randn(*shape, seed=6), cpu_randn(*shape, seed=7)
    w, b = cpu_randn(shape[-1], seed=8), cpu_randn(shape[-1], seed=9)
    expected = torch.native_layer_norm(x + r, shape[-1:], w, b, 1e-5)
    actual = torch.native_layer_norm(x.to("tpu") + r.to("tpu"), shape[-1:], w.to("tpu"), b.to("tpu"), 1e-5)
    for a, e in zip(actual, expected):
        assert torch.equal(a.cpu(), e)


@pytest.mark.parametrize("shape", ROW_SHAPES[:2])
def test_logsumexp_rows_match_cpu_exactly(threads, shape):
    threads(2)
    x, b = cpu_randn(*shape, seed=10), cpu_randn(*shape, seed=11)
    assert torch.equal(torch.logsumexp(x.to("tpu") * 2 + b.to("tpu"), -1).cpu(), torch.logsumexp(x * 2 + b, -1))
