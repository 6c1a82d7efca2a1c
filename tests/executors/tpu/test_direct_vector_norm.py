"""linalg_vector_norm's 2-norm of a whole float32 tensor (clip_grad_norm_'s per-gradient
norms) as the host runtime's own kernel (executors/direct_kernels.cpp, ``vector_norm``):
bit-equal to CPU's AVX2 norm kernel, whose sum of squares runs in 8 lanes, adds the lanes
in order and then its tail of size % 8 floats (4 rounded squares when 4 or more, the rest
as fused multiply-adds). Wide-ranging magnitudes make a different order show as other bits;
every size from 2 to 40 covers each tail. Other ords, dims, dtypes and layouts run CPU's
kernel, and clip_grad_norm_ clips as on CPU for parameter lists of several dtypes."""

import pytest
import torch

from difftest import DEVICE, aten_ops_during, restoring

# The column-sum test's values whose sums depend on the order, and their bits.
from test_direct_column_sum import _bits, _spread

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the tpu executor's host kernels")

# The host kernel reproduces CPU's AVX2 norm kernel, which x86 CPUs with AVX2 or AVX512 run.
HOST_KERNEL = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.fixture
def threads():
    """Sets torch's intra-op threads as the test asks, restored after it."""
    yield from restoring(torch.get_num_threads, torch.set_num_threads)


def _norm_on_device(x, **kw):
    """torch.linalg.vector_norm of ``x`` on the device; (result on CPU, ATen ops its flush ran)."""
    xd = x.to(DEVICE)
    torch.tpu.synchronize()
    got = torch.linalg.vector_norm(xd, **kw)
    ran = aten_ops_during(torch.tpu.synchronize)
    return got.cpu(), ran


SHAPES = [(n,) for n in range(2, 41)] + [(64, 64), (65, 64), (256, 64), (64, 192), (8, 64, 64), (3, 5, 7), (300001,)]


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_vector_norm_bit_equal_to_cpu(shape, nthreads, threads):
    threads(nthreads)
    x = _spread(shape, seed=len(shape) * 1000 + shape[-1])
    want = torch.linalg.vector_norm(x)
    got, ran = _norm_on_device(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(_bits(got), _bits(want)), (got.item(), want.item())
    if HOST_KERNEL:
        assert "aten::linalg_vector_norm" not in ran and "aten::linalg_vector_norm.out" not in ran, ran


@pytest.mark.parametrize(
    "kw", [dict(ord=2), dict(ord=2.0), dict(dim=[]), dict(keepdim=True), dict(ord=2, dim=None, keepdim=True)]
)
def test_vector_norm_spellings_of_the_whole_two_norm(kw):
    x = _spread((37, 11), seed=3)
    want = torch.linalg.vector_norm(x, **kw)
    got, ran = _norm_on_device(x, **kw)
    assert got.shape == want.shape and torch.equal(_bits(got), _bits(want))
    if HOST_KERNEL:
        assert not any(op.startswith("aten::linalg_vector_norm") for op in ran), ran


def test_vector_norm_special_values():
    """NaN and inf propagate, -0.0 squares to +0.0, huge values overflow to inf, as on CPU."""
    cases = [
        torch.tensor([1.0, float("nan"), 2.0]),
        torch.tensor([float("inf"), 1.0] * 7),
        torch.tensor([-0.0] * 9),
        torch.tensor([3e38] * 12),
        torch.tensor([1e-30, -1e-30, 2e-25] * 5),
    ]
    for x in cases:
        want = torch.linalg.vector_norm(x)
        got, _ = _norm_on_device(x)
        assert torch.equal(_bits(got), _bits(want)), (x, got, want)


# CPU's kernel runs for these (another ord, a dim, a dtype, a strided or tiny input): same values.
DECLINED = [
    ((33, 9), dict(ord=1)),
    ((33, 9), dict(ord=float("inf"))),
    ((33, 9), dict(ord=3)),
    ((33, 9), dict(dim=0)),
    ((33, 9), dict(dim=(0, 1))),
    ((33, 9), dict(dtype=torch.float64)),
    ((1,), dict()),
    ((0,), dict()),
    ((), dict()),
]


@pytest.mark.parametrize("shape,kw", DECLINED, ids=[f"{s}-{k}" for s, k in DECLINED])
def test_vector_norm_other_cases_as_cpu(shape, kw):
    x = _spread(shape, seed=11) if shape != () else torch.tensor(-2.5)
    want = torch.linalg.vector_norm(x, **kw)
    got, _ = _norm_on_device(x, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)


def test_vector_norm_of_a_transposed_view_as_cpu():
    x = _spread((24, 13), seed=5)
    want = torch.linalg.vector_norm(x.t())
    xd = x.to(DEVICE)
    got = torch.linalg.vector_norm(xd.t()).cpu()
    assert torch.equal(_bits(got), _bits(want))


def _grads(shapes, dtypes, seed):
    return [_spread(s, seed=seed + i).to(d) for i, (s, d) in enumerate(zip(shapes, dtypes))]


# Parameter lists: nanoGPT's shapes (float32), odd sizes, float64, bfloat16 and a mixed list
# (clip_grad_norm_ groups by dtype and device; the float32 ones take the host kernel).
PARAM_LISTS = [
    (
        [(65, 64), (64, 64), (64,), (64,), (192, 64), (192,), (64, 64), (256, 64), (256,), (64, 256)],
        [torch.float32] * 10,
    ),
    ([(3,), (5, 7), (9,), (1,), (17, 3)], [torch.float32] * 5),
    ([(12, 7), (31,)], [torch.float64] * 2),
    ([(12, 7), (31,)], [torch.bfloat16] * 2),
    ([(12, 7), (31,), (4, 4), (10,)], [torch.float32, torch.float64, torch.bfloat16, torch.float32]),
]


@pytest.mark.parametrize("max_norm", [1.0, 1e9])
@pytest.mark.parametrize("shapes,dtypes", PARAM_LISTS, ids=[str(i) for i in range(len(PARAM_LISTS))])
def test_clip_grad_norm_as_cpu(shapes, dtypes, max_norm):
    grads = _grads(shapes, dtypes, seed=len(shapes))
    cpu_params = [torch.zeros_like(g).requires_grad_() for g in grads]
    dev_params = [torch.zeros_like(g, device=DEVICE).requires_grad_() for g in grads]
    for p, q, g in zip(cpu_params, dev_params, grads):
        p.grad = g.clone()
        q.grad = g.to(DEVICE)
    want = torch.nn.utils.clip_grad_norm_(cpu_params, max_norm)
    got = torch.nn.utils.clip_grad_norm_(dev_params, max_norm)
    assert torch.equal(got.cpu(), want)
    for p, q in zip(cpu_params, dev_params):
        assert q.grad.dtype == p.grad.dtype and torch.equal(q.grad.cpu(), p.grad)


# _foreach_norm's 2-norms of many tensors, each in CPU's order and in its own output: every
# size 2..40 (each tail), nanoGPT's gradient sizes, equal and unequal lengths, and tensors
# CPU's kernel takes (a float64, a transposed view, one element) between the others.
FOREACH_LISTS = [
    [(n,) for n in range(2, 41)],
    [(4096,), (4160,), (64,), (12288,), (192,), (16384,), (256,), (16384,), (64,), (4096,)] * 2,
    [(8,)] * 11 + [(9,), (7,)],
    [(300001,), (5,), (1000,)],
]


@pytest.mark.parametrize("shapes", FOREACH_LISTS, ids=[str(i) for i in range(len(FOREACH_LISTS))])
def test_foreach_norm_chains_side_by_side_bit_equal_to_cpu(shapes):
    xs = [_spread(s, seed=7 * i + len(shapes)) for i, s in enumerate(shapes)]
    want = torch._foreach_norm(xs)
    dev = [x.to(DEVICE) for x in xs]
    torch.tpu.synchronize()
    got = torch._foreach_norm(dev)
    ran = aten_ops_during(torch.tpu.synchronize)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(_bits(g.cpu()), _bits(w)), (i, shapes[i], g.item(), w.item())
    if HOST_KERNEL:
        assert not any(op.startswith("aten::linalg_vector_norm") for op in ran), ran


def test_foreach_norm_with_tensors_cpu_takes_between_the_chains():
    xs = [_spread((37,), seed=1), _spread((5, 6), seed=2).t(), _spread((300,), seed=3), _spread((1,), seed=4)]
    xs += [_spread((29,), seed=5).double(), _spread((64,), seed=6), _spread((2,), seed=7)]
    want = torch._foreach_norm(xs)
    got = torch._foreach_norm([x.to(DEVICE) for x in xs])
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w), (i, g, w)
