"""sum.dim_IntList over leading dims (a Linear bias gradient's column sum) as the host
runtime's own kernel (executors/direct_kernels.cpp, ``column_sum``): bit-equal to CPU's
sum, whose order per column depends on the column's place in its kernel's vector groups
(ATen's cascade_sum) and, at 2 threads on 32,768 elements or more, on its split of the
columns between threads. Wide-ranging magnitudes make a different order show as other bits."""

import pytest
import torch

from difftest import DEVICE, aten_ops_during, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu executor's host kernels")


@pytest.fixture
def threads():
    """Runs the test with torch's intra-op threads set as it asks, then restores them."""
    yield from restoring(torch.get_num_threads, torch.set_num_threads)


def _spread(shape, seed):
    """Normal values scaled by 2**k, k uniform in [-20, 20]: sums whose bits depend on the order."""
    g = torch.Generator().manual_seed(seed + 1)
    scale = torch.pow(2.0, torch.randint(-20, 21, shape, generator=g).float())
    return cpu_randn(*shape, seed=seed) * scale


def _bits(t):
    return t.contiguous().view(torch.int32)


# (shape, dims, keepdim): [rows, cols] and 3-D inputs; columns below, at and between the
# vector groups of 8- and 16-float kernels (4 vectors, 1 vector, a scalar tail, fewer
# columns than a vector); rows crossing the cascade's level boundaries (16, 256, 4096)
# and its level size.
CASES = [
    ((512, 64), [0], False),
    ((512, 256), [0], False),
    ((512, 192), [0], False),
    ((64, 256), [0], False),
    ((512, 100), [0], False),
    ((300, 37), [0], False),
    ((257, 24), [0], False),
    ((33, 5), [0], False),
    ((5, 3), [0], False),
    ((2, 2), [0], True),
    ((3, 130), [0], False),
    ((4100, 72), [0], False),
    ((600000, 2), [0], False),  # 2**20 rows or more: the cascade's levels grow to 32 rows
    ((8, 64, 192), [0, 1], False),
    ((8, 64, 64), [1, 0], True),
    ((8, 64, 64), [0], True),  # nanoGPT's position-embedding gradient: 8 rows of 4096
    ((6, 5, 4, 3), [-4, -3], False),
]


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("shape,dims,keepdim", CASES, ids=[f"{s}-{d}-{k}" for s, d, k in CASES])
def test_column_sum_bit_equal_to_cpu(shape, dims, keepdim, nthreads, threads):
    threads(nthreads)
    x = _spread(shape, seed=len(shape) * 1000 + shape[-1])
    want = x.sum(dims, keepdim=keepdim)
    xd = x.to(DEVICE)
    torch.tpu.synchronize()
    got = xd.sum(dims, keepdim=keepdim)
    ran = aten_ops_during(torch.tpu.synchronize)
    got = got.cpu()
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(_bits(got), _bits(want))
    assert not any(op.startswith("aten::sum") for op in ran), ran  # the host kernel, not CPU's


@pytest.mark.parametrize("nthreads", [1, 2])
def test_column_sum_special_values(nthreads, threads):
    """NaN, +-inf and -0.0: a column of -0.0 sums to +0.0 as on CPU (its output starts at zero)."""
    threads(nthreads)
    x = _spread((1024, 48), seed=7)
    x[:, 0] = -0.0
    x[5, 1] = float("nan")
    x[7, 2], x[9, 2] = float("inf"), float("-inf")
    x[11, 3] = float("inf")
    x[:, 4] = 3.0e38  # overflows to inf
    want = x.sum(0)
    got = x.to(DEVICE).sum(0).cpu()
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("nthreads", [1, 2])
def test_linear_bias_gradient_bit_equal(nthreads, threads):
    """nanoGPT's bias gradients: Linear on [8, 64, 64] input, three output widths; the
    output gradient is a given tensor (weights of the loss), so the bias gradient is its column sum."""
    threads(nthreads)
    x = cpu_randn(8, 64, 64, seed=3)
    weights = [_spread((8, 64, n), seed=n) for n in (64, 192, 256)]
    grads = {}
    for dev in ("cpu", DEVICE):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(64, w.shape[-1]).to(dev) for w in weights]
        total = sum((layer(x.to(dev)) * w.to(dev)).sum() for layer, w in zip(layers, weights))
        total.backward()
        grads[dev] = [layer.bias.grad.cpu() for layer in layers]
    for got, want in zip(grads[DEVICE], grads["cpu"], strict=True):
        assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize(
    "shape,dims,kw",
    [
        ((4, 8, 16), [1], {}),  # a middle dim: not a column sum
        ((4, 8), [1], {}),  # the last dim: a row sum
        ((4, 8), [0], {"dtype": torch.float64}),
        ((1, 8), [0], {}),  # one row
        ((4, 8, 16), [0, 1, 2], {}),  # every dim
    ],
)
def test_other_sums_equal_cpu(shape, dims, kw):
    """Calls the kernel declines run CPU's sum: same values, dtype and strides."""
    x = _spread(shape, seed=11)
    want = x.sum(dims, **kw)
    got = x.to(DEVICE).sum(dims, **kw).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


def test_column_sum_of_a_transposed_input_equals_cpu():
    """A strided (transposed) input is not the kernel's: CPU's sum runs on it."""
    x = _spread((64, 48), seed=13)
    want = x.t().sum(0)
    got = x.to(DEVICE).t().sum(0).cpu()
    assert torch.equal(_bits(got), _bits(want))


def test_column_sum_bad_dim_raises_cpu_error():
    x = cpu_randn(4, 8)
    with pytest.raises(IndexError):
        x.sum([2])
    with pytest.raises(IndexError):
        x.to(DEVICE).sum([2])
