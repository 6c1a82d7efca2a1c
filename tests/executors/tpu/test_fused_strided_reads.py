"""Fused loops reading float32 views through their strides (fused::StridedRead,
csrc/executors/tpu/fused_elementwise.cpp strided_read; staged per tile in
fused_kernels.inc stage_strided): column halves of a row (rotary embedding's
``x[..., D/2:]``), a transposed tensor of attention heads, a broadcast along a
middle dim (``cos[:, None]`` over the heads), a narrowed or stepped view. The loop
then runs without the ops' CPU kernels (asserted on the flush's host ops), and the
values are CPU's bit for bit (each op is one IEEE operation per element)."""

import pytest
import torch

from difftest import DEVICE, assert_bit_equal, cpu_randn, flush_on_tpu

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

ELEMENTWISE = ("aten::add", "aten::mul", "aten::neg", "aten::sub")


def _fused(ops):
    """Whether no elementwise op of the cases ran through its CPU kernel."""
    return not [o for o in ops if o.startswith(ELEMENTWISE)]


def _rotate_sum(g):
    # Column halves of each row: both read in place, through strides.
    h = g.shape[-1] // 2
    return (g[..., h:] * 2 + g[..., :h],)


def _heads_broadcast(g, c):
    # cos of [B, T, D] read as [B, 1, T, D] by a loop over [B, H, T, D].
    return (g * c.unsqueeze(1) + g,)


def _transposed(g, x):
    # x of [B, T, H, D] read as [B, H, T, D] (attention heads); g sets the layout.
    return ((g + x.transpose(1, 2)) * 2,)


def _narrowed(x):
    return (x[1:] * 3 + 1,)


def _stepped(x):
    return (x[..., ::2] * 2 - x[..., 1::2],)


def _expanded(x, v):
    # v of [C] expanded to [R, C] (stride 0 first) beside a dense operand.
    return (x * v.expand(x.shape[0], -1) + v.expand(x.shape[0], -1),)


CASES = {
    "column_halves": (_rotate_sum, lambda: [cpu_randn(2, 4, 16, 16, seed=1)]),
    "column_halves_odd_rows": (_rotate_sum, lambda: [cpu_randn(3, 7, 37, 42, seed=2)]),
    "heads_broadcast": (_heads_broadcast, lambda: [cpu_randn(2, 4, 16, 16, seed=3), cpu_randn(2, 16, 16, seed=4)]),
    "transposed": (_transposed, lambda: [cpu_randn(2, 4, 16, 16, seed=5), cpu_randn(2, 16, 4, 16, seed=6)]),
    # More than one tile (1,024 floats) per row block: the index carry across dims.
    "transposed_many_tiles": (_transposed, lambda: [cpu_randn(3, 5, 67, 33, seed=7), cpu_randn(3, 67, 5, 33, seed=8)]),
    "narrowed": (_narrowed, lambda: [cpu_randn(5, 300, seed=9)]),
    "stepped": (_stepped, lambda: [cpu_randn(6, 9, 50, seed=10)]),
    "expanded": (_expanded, lambda: [cpu_randn(40, 70, seed=11), cpu_randn(70, seed=12)]),
}


# Layouts whose dims the program merges (fused_elementwise.cpp coalesce_dims:
# size-1 dims dropped, dims that step through memory as one merged) and that
# stage_strided / scatter_strided walk run by run (fused_kernels.inc
# for_each_run): size-1 dims between strided ones, broadcasts over several
# adjacent dims, runs that cross a tile (1,024 floats), a 1-D stepped read,
# a view that merges into one dense run at an offset.
def _size_one_dims(g, x):
    # x of [1, T, 1, H, D] read as [1, H, 1, T, D]: heads transposed, unit dims between.
    return (g * x.permute(0, 3, 2, 1, 4) + g,)


def _broadcast_over_two_dims(x, v):
    # v of [C] expanded over [A, B, C]: stride 0 on two adjacent dims (one merged dim).
    return (x * v.expand(x.shape[0], x.shape[1], -1) - x,)


def _column_broadcast(x, v):
    # v of [A, 1, 1] expanded over [A, B, C]: stride-0 runs of B * C filled per row.
    return (x + v.expand(-1, x.shape[1], x.shape[2]) * 2,)


def _merged_to_one_run(x):
    # x[1:] of a contiguous [R, C]: one dense run at an offset (after merging).
    return (x[1:] * 3 + x[1:],)


def _stepped_1d(x):
    return (x[::3] * 2 + 1,)


def _rows_of_many_tiles(x, y):
    # Runs of 1,100 floats (a tile is 1,024): each run crosses tiles.
    return (x[:, 50:1150] * y + y,)


LAYOUT_CASES = {
    "size_one_dims": (
        _size_one_dims,
        lambda: [cpu_randn(1, 4, 1, 16, 16, seed=31), cpu_randn(1, 16, 1, 4, 16, seed=32)],
    ),
    "broadcast_over_two_dims": (
        _broadcast_over_two_dims,
        lambda: [cpu_randn(7, 9, 40, seed=33), cpu_randn(40, seed=34)],
    ),
    "column_broadcast": (_column_broadcast, lambda: [cpu_randn(6, 13, 37, seed=35), cpu_randn(6, 1, 1, seed=36)]),
    "merged_to_one_run": (_merged_to_one_run, lambda: [cpu_randn(40, 70, seed=37)]),
    "stepped_1d": (_stepped_1d, lambda: [cpu_randn(3001, seed=38)]),
    "rows_of_many_tiles": (_rows_of_many_tiles, lambda: [cpu_randn(5, 1200, seed=39), cpu_randn(5, 1100, seed=40)]),
    # Transposed heads of 8, 24 and 5 floats over many tiles: for_each_run hands whole runs
    # over in batches (copy_runs: whole vectors when the head is a multiple of the vector
    # size), and a tile of 1,024 floats starts and ends inside a head of 24 or 5.
    "transposed_heads_of_8": (_transposed, lambda: [cpu_randn(2, 4, 40, 8, seed=43), cpu_randn(2, 40, 4, 8, seed=44)]),
    # Heads of one and two whole vectors (AVX2: 8 and 16 floats, AVX512: 16 and 32):
    # copy_runs' unrolled copies.
    "transposed_heads_of_16": (
        _transposed,
        lambda: [cpu_randn(2, 4, 40, 16, seed=49), cpu_randn(2, 40, 4, 16, seed=50)],
    ),
    "transposed_heads_of_32": (
        _transposed,
        lambda: [cpu_randn(2, 3, 40, 32, seed=51), cpu_randn(2, 40, 3, 32, seed=52)],
    ),
    "transposed_heads_of_24": (
        _transposed,
        lambda: [cpu_randn(3, 6, 50, 24, seed=45), cpu_randn(3, 50, 6, 24, seed=46)],
    ),
    "transposed_heads_of_5": (
        _transposed,
        lambda: [cpu_randn(2, 3, 300, 5, seed=47), cpu_randn(2, 300, 3, 5, seed=48)],
    ),
}
CASES.update(LAYOUT_CASES)


def _stepped_transposed(x):
    # Every other float of transposed heads: a stride-2 run per head.
    return (x.transpose(1, 2)[..., ::2] * 2 + 1,)


def _first_column_expanded(x):
    # Each head's first float of transposed heads broadcast along the head: stride-0 runs.
    t = x.transpose(1, 2)
    return (t[..., :1].expand(t.shape) * 3 - 1,)


def _transposed_case(b, t, h, d, seed):
    """A _transposed case: g of [b, t, h, d] and x of [b, h, t, d], read as [b, t, h, d]."""
    return (_transposed, lambda: [cpu_randn(b, t, h, d, seed=seed), cpu_randn(b, h, t, d, seed=seed + 1)])


# Layouts whose dim outside the runs is short (few heads or rows per cycle) with
# many cycles along the next dim out: for_each_run hands whole cycles over in one
# visit (reps > 1). Tiles of 1,024 floats start and end inside a cycle and inside
# a run, the next dim out wraps into the outer dims inside a tile, and sizes 1
# and 2 stand beside odd ones.
CYCLE_CASES = {
    "cycles_of_3_heads_of_8": _transposed_case(5, 37, 3, 8, seed=61),
    "cycles_of_2_heads_of_16": _transposed_case(3, 41, 2, 16, seed=63),
    "cycles_of_1_head_of_16": _transposed_case(4, 70, 1, 16, seed=65),
    "cycles_of_2_heads_of_5": _transposed_case(3, 101, 2, 5, seed=67),
    "cycles_of_3_heads_of_32": _transposed_case(2, 19, 3, 32, seed=69),
    "cycles_of_2_heads_of_1": _transposed_case(7, 300, 2, 1, seed=71),
    "cycles_stepped": (_stepped_transposed, lambda: [cpu_randn(3, 2, 45, 16, seed=73)]),
    "cycles_stride_0": (_first_column_expanded, lambda: [cpu_randn(3, 2, 45, 16, seed=74)]),
    # rotate_half's halves of long rows: cycles of 2 half rows over many rows.
    "cycles_column_halves": (_rotate_sum, lambda: [cpu_randn(2, 3, 97, 16, seed=75)]),
}
CASES.update(CYCLE_CASES)


@pytest.mark.parametrize("case", CASES)
def test_strided_reads_fuse_and_are_bit_equal(case):
    fn, make = CASES[case]
    args = make()
    got, ops = flush_on_tpu(fn, *args)
    assert_bit_equal(got, fn(*args))
    assert _fused(ops), ops


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_16_bit_views_equal_cpu(case, dtype):
    # Strided reads are float32 only: a 16-bit view at an offset or with
    # strides must not be read as float32 elements (torch.gradient's edge
    # differences x[1:2] - x[0:1] in float16 did before the fix).
    fn, make = CASES[case]
    args = [a.to(dtype) for a in make()]
    got, _ = flush_on_tpu(fn, *args)
    assert_bit_equal(got, fn(*args))


def test_gradient_of_16_bit_values_equals_cpu():
    for dtype in (torch.float16, torch.bfloat16):
        x = cpu_randn(5, seed=13).to(dtype)
        got = [g.cpu() for g in torch.gradient(x.to(DEVICE))]
        assert_bit_equal(got, list(torch.gradient(x)))


def test_strided_read_of_a_value_the_loop_writes_is_not_fused_wrongly():
    # x is written in place, then read transposed: the loop must not read a
    # stale or half-written buffer through the strided view (it runs op by op).
    def fn(x, y):
        x.mul_(2)
        return (x.t() * y + 1, x)

    x, y = cpu_randn(33, 33, seed=13), cpu_randn(33, 33, seed=14)
    got, _ = flush_on_tpu(fn, x, y)
    assert_bit_equal(got, fn(x.clone(), y))


def test_strided_read_feeds_a_row_reduction():
    # softmax over rows of (g + x^T): the staged strided operand feeds the row loop.
    def fn(g, x):
        return (torch.softmax((g + x.transpose(1, 2)) * 0.5, -1),)

    g, x = cpu_randn(2, 4, 16, 16, seed=15), cpu_randn(2, 16, 4, 16, seed=16)
    got, _ = flush_on_tpu(fn, g, x)
    assert_bit_equal(got, fn(g, x))


def test_rotary_embedding_values_equal_cpu():
    # transformers' apply_rotary_pos_emb (q * cos + rotate_half(q) * sin), forward
    # and backward, on attention heads of a linear layer's output.
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def step(qp, cos, sin, g, device):
        qp = qp.to(device).requires_grad_()
        q = qp.view(2, 16, 4, 16).transpose(1, 2)
        c, s = cos.to(device).unsqueeze(1), sin.to(device).unsqueeze(1)
        out = q * c + rotate_half(q) * s
        out.backward(g.to(device))
        return out.cpu(), qp.grad.cpu()

    qp, cos, sin = cpu_randn(32, 64, seed=17), cpu_randn(2, 16, 16, seed=18), cpu_randn(2, 16, 16, seed=19)
    g = cpu_randn(2, 4, 16, 16, seed=20)
    assert_bit_equal(step(qp, cos, sin, g, "tpu"), step(qp, cos, sin, g, "cpu"))


def test_per_row_value_across_tiles_is_bit_equal():
    # RMSNorm's x * rsqrt(mean(x^2) + eps) * w with rows of 37 floats: the
    # per-row value is filled along rows that straddle the tiles' ends.
    def fn(x, w):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (x * rstd * w,)

    x, w = cpu_randn(3, 50, 37, seed=41), cpu_randn(37, seed=42)
    got, _ = flush_on_tpu(fn, x, w)
    assert_bit_equal(got, fn(x, w))


@pytest.mark.parametrize("seed", range(16))
def test_random_layouts_with_unit_dims_are_bit_equal(seed):
    # Random shapes with unit dims, transposed, sliced and broadcast operands.
    import random

    rng = random.Random(seed)
    nd = rng.randint(2, 6)
    shape = [rng.choice([1, 1, 2, 3, 5, 8, 16]) for _ in range(nd)]
    shape[rng.randrange(nd)] = rng.randint(17, 70)
    perm = list(range(nd))
    rng.shuffle(perm)
    x0 = cpu_randn(*[shape[p] for p in perm], seed=300 + seed)  # x0.permute(inv) has `shape`
    inv = [perm.index(d) for d in range(nd)]
    bshape = [1 if rng.random() < 0.5 else s for s in shape]
    pad = rng.random() < 0.5
    b0 = cpu_randn(*[s + (1 if pad else 0) for s in bshape], seed=400 + seed)

    def fn(g, x0, b0):
        x = x0.permute(*inv)
        b = b0[tuple(slice(0, s) for s in bshape)] if pad else b0
        return (g * x + b.expand(*shape), (g - b) * 0.5)

    g = cpu_randn(*shape, seed=500 + seed)
    got, _ = flush_on_tpu(fn, g, x0, b0)
    assert_bit_equal(got, fn(g, x0, b0))
