"""Fused loops whose outputs keep a permuted layout (LoopOrder in
csrc/executors/tpu/fused_elementwise.cpp): CPU's elementwise result takes the
memory order of its inputs (TensorIterator's permutation), so ``q * cos`` with
q = linear(x).view(B, T, H, D).transpose(1, 2) has q's strides. Such a loop
iterates in its outputs' memory order and reads every operand in that order (a
dense one as is, any other through its strides). Each case asserts the values
(bit for bit), dtypes, shapes and the strides of the results against CPU, and
for float32 that no elementwise op ran through its CPU kernel."""

import random

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, aten_ops_during, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

ELEMENTWISE = ("aten::add", "aten::mul", "aten::neg", "aten::sub", "aten::div", "aten::exp")


def _run(fn, *cpu_args):
    """fn on "tpu" (flushed with the region verifier on): (results, their strides, host ops)."""
    import torch_tpu_eager

    torch_tpu_eager._C._jit_set_verify(True)
    args = [a.to(DEVICE) for a in cpu_args]
    torch.tpu.synchronize()
    out = fn(*args)
    ops = aten_ops_during(torch.tpu.synchronize)
    return [o.cpu() for o in out], [o.stride() for o in out], ops


def _check(fn, args, fused=True):
    got, strides, ops = _run(fn, *args)
    want = fn(*[a.clone() for a in args])
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want], (strides, [w.stride() for w in want])
    if fused:
        assert not [o for o in ops if o.startswith(ELEMENTWISE)], ops


def _heads(x, cos):
    # rotary embedding's q * cos and q * cos * 2 + q, q of attention heads.
    q = x.view(2, 16, 4, 16).transpose(1, 2)
    c = cos.unsqueeze(1)
    a = q * c
    return a, a * 2.0 + q, (q * c).neg()


def _half_neg(x):
    # -q[..., D/2:]: a column half of transposed heads, negated (output permuted, half width).
    q = x.view(2, 16, 4, 16).transpose(1, 2)
    return (-q[..., 8:], q[..., :8] * 3.0)


def test_rotary_heads_keep_cpu_layout():
    _check(_heads, [cpu_randn(32, 64, seed=1), cpu_randn(2, 16, 16, seed=2)])


def test_column_half_of_heads():
    _check(_half_neg, [cpu_randn(32, 64, seed=3)])


def test_in_place_into_a_permuted_tensor():
    def fn(x, y):
        t = x.permute(2, 0, 1)
        t.mul_(y).add_(1.5)
        return (t, x)

    _check(fn, [cpu_randn(5, 6, 7, seed=4), cpu_randn(7, 5, 6, seed=5)])


def test_mixed_layouts_split_into_loops():
    # a keeps x's permuted layout, b = (contiguous y) * 2 is row-major, a + b is
    # permuted again (the first operand decides): two layouts, each its own loop.
    def fn(x, y):
        t = x.transpose(0, 1)
        a = t * 3.0
        b = y * 2.0
        return (a, b, a + b)

    _check(fn, [cpu_randn(9, 11, 13, seed=6), cpu_randn(11, 9, 13, seed=7)])


@pytest.mark.parametrize("seed", range(12))
def test_random_permuted_and_sliced_layouts(seed):
    rng = random.Random(seed)
    nd = rng.randint(2, 5)
    shape = [rng.randint(1, 7) for _ in range(nd)]
    shape[rng.randrange(nd)] = rng.randint(8, 40)  # more than a tile's row in some cases
    perm = list(range(nd))
    rng.shuffle(perm)
    sliced = rng.random() < 0.5
    base = cpu_randn(*[s + (2 if sliced else 0) for s in shape], seed=100 + seed)
    other_perm = list(range(nd))
    rng.shuffle(other_perm)
    bcast = [1 if rng.random() < 0.4 else s for s in shape]
    y0 = cpu_randn(*[bcast[p] for p in other_perm], seed=200 + seed)

    def fn(b, y0):
        x = b[tuple(slice(1, s + 1) for s in shape)] if sliced else b
        t = x.permute(*perm)
        inv = [other_perm.index(d) for d in range(nd)]
        y = y0.permute(*inv)  # logical dims of x, another memory order (maybe broadcast)
        yp = y.permute(*perm)
        u = t * yp
        v = u * 0.5 - t
        return (u, v, v / 3.0, -v)

    _check(fn, [base, y0], fused=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_16_bit_permuted_results_equal_cpu(dtype):
    # A 16-bit operand is read in the loop's order only when it is laid out as
    # the outputs (no strided 16-bit reads): values and strides stay CPU's.
    def fn(x, c):
        q = x.view(2, 16, 4, 16).transpose(1, 2)
        return (q * 2.0 + q, q * c.unsqueeze(1))

    _check(fn, [cpu_randn(32, 64, seed=8).to(dtype), cpu_randn(2, 16, 16, seed=9).to(dtype)], fused=False)


# cat as a loop op (Lowering::concat): the loop runs over its inputs' shape and
# writes each input through the output's strides at its offset along the cat dim.
CAT_OPS = ELEMENTWISE + ("aten::cat",)


def _check_cat(fn, args):
    got, strides, ops = _run(fn, *args)
    want = fn(*[a.clone() for a in args])
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want], (strides, [w.stride() for w in want])
    assert not [o for o in ops if o.startswith(CAT_OPS)], ops


def test_rotate_half_cat_joins_its_producers_loop():
    # transformers' rotate_half on transposed heads: cat((-x2, x1), -1) with
    # -x2 kept in q's layout and x1 a column half read through strides.
    def fn(x, cos, sin):
        q = x.view(2, 16, 4, 16).transpose(1, 2)
        r = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
        return (r, q * cos.unsqueeze(1) + r * sin.unsqueeze(1))

    _check_cat(fn, [cpu_randn(32, 64, seed=20), cpu_randn(2, 16, 16, seed=21), cpu_randn(2, 16, 16, seed=22)])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_of_loop_values_along_any_dim(dim):
    def fn(a, b):
        return (torch.cat((a * 2.0, b + 1.0, -a), dim=dim),)

    _check_cat(fn, [cpu_randn(5, 7, 9, seed=23), cpu_randn(5, 7, 9, seed=24)])


def test_cat_skips_empty_one_dim_inputs():
    # A key-value cache's first step: cat of an empty 1-D tensor and k along -2 (CPU skips it).
    def fn(k):
        return (torch.cat((torch.empty(0, device=k.device), k * 3.0), dim=-2),)

    _check_cat(fn, [cpu_randn(2, 2, 16, 16, seed=25)])


@pytest.mark.parametrize("seed", range(8))
def test_cat_of_random_permuted_layouts(seed):
    rng = random.Random(seed)
    nd = rng.randint(2, 4)
    shape = [rng.randint(1, 9) for _ in range(nd)]
    perm = list(range(nd))
    rng.shuffle(perm)
    dim = rng.randrange(-nd, nd)
    x0 = cpu_randn(*[shape[p] for p in perm], seed=300 + seed)
    y = cpu_randn(*shape, seed=400 + seed)
    inv = [perm.index(d) for d in range(nd)]

    def fn(x0, y):
        x = x0.permute(*inv)  # logical shape `shape`, permuted memory order
        a = x * 2.0
        return (a, torch.cat((-a, y, x), dim=dim))

    got, strides, ops = _run(fn, x0, y)
    want = fn(x0.clone(), y.clone())
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want]


@pytest.mark.parametrize("dim", [1, -2, -1])
def test_cat_writes_through_unit_dims_and_long_runs(dim):
    # Heads with unit dims between ([1, 4, 1, T, D] in a transposed layout) and
    # runs longer than a tile: each input's strided write walks merged dims
    # (coalesce_dims) run by run (scatter_strided).
    def fn(x0):
        x = x0.permute(0, 3, 2, 1, 4)  # [1, 4, 1, 40, 33] over [1, 40, 1, 4, 33]
        return (torch.cat((x * 2.0, -x, x + 1.0), dim=dim),)

    _check_cat(fn, [cpu_randn(1, 40, 1, 4, 33, seed=28)])


@pytest.mark.parametrize("head", [8, 16, 24, 5])
def test_cat_writes_heads_in_batches_across_tiles(head):
    # Strided writes of transposed heads over many tiles (1,024 floats): scatter_strided
    # gets whole heads in batches (for_each_run, copy_runs), and with heads of 24 or 5
    # floats a tile starts and ends inside one.
    def fn(x0):
        x = x0.transpose(1, 2)  # [2, 6, 90, head] over [2, 90, 6, head]
        return (torch.cat((x * 2.0, x + 1.0), dim=1),)

    _check_cat(fn, [cpu_randn(2, 90, 6, head, seed=29 + head)])


@pytest.mark.parametrize("shape", [(3, 37, 3, 8), (2, 41, 2, 16), (3, 101, 2, 5), (4, 70, 1, 16), (2, 19, 3, 32)])
def test_cat_writes_whole_cycles_across_tiles(shape):
    # Strided writes whose dim outside the runs is short (1-3 heads) with many
    # cycles of it along the next dim out: scatter_strided gets whole cycles in
    # one batch (for_each_run's reps), tiles start and end inside a cycle and a
    # head, and the next dim out wraps into the batch dim inside a tile.
    def fn(x0):
        x = x0.transpose(1, 2)
        return (torch.cat((x * 2.0, -x, x + 1.0), dim=1), torch.cat((x * 0.5, x - 1.0), dim=-1))

    _check_cat(fn, [cpu_randn(*shape, seed=sum(shape))])


def test_cat_not_fused_when_types_differ():
    def fn(a, b):
        return (torch.cat((a * 2.0, b), dim=-1),)

    got, strides, _ = _run(fn, cpu_randn(4, 6, seed=26), cpu_randn(4, 6, seed=27).to(torch.float64))
    want = fn(cpu_randn(4, 6, seed=26), cpu_randn(4, 6, seed=27).to(torch.float64))
    assert_bit_equal(got, want)
    assert strides == [w.stride() for w in want]
