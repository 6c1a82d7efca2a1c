"""Bounded dynamism: compile counts for growing and marked sizes."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def test_growing_size_compiles_log2_times_per_region_kind():
    tte = _tte()
    w = torch.randn(16, 16).to("tpu")
    names = {}
    with tte.profile() as prof:
        for n in range(1, 65):  # a generation loop: one more row per step
            x = torch.randn(n, 16).to("tpu")
            y = torch.softmax((x @ w).relu() * 0.5, dim=-1)
            ref = torch.softmax((x.cpu() @ w.cpu()).relu() * 0.5, dim=-1)
            torch.testing.assert_close(y.cpu(), ref)
    for k in prof.kernels:
        names.setdefault(k["name"], []).append(k["cache_hit"])
    bound = math.ceil(math.log2(64)) + 1
    for name, hits in names.items():
        assert hits.count(False) <= bound, (name, hits.count(False))


def test_mark_dynamic_range_compiles_once_and_outside_warns():
    tte = _tte()
    base = torch.randn(200, 8).to("tpu")
    tte.mark_dynamic(base, 0, 1, 100)
    (base[:3] * 2).sum().item()  # warm: compile the range's bucket
    tte.reset_metrics()
    for n in range(1, 101):
        got = (base[:n] * 2).sum()
        torch.testing.assert_close(got.cpu(), (base.cpu()[:n] * 2).sum())
    assert tte.metrics()["compiles"] == 0
    with warnings.catch_warnings(record=True):  # silences the run's warnings
        warnings.simplefilter("always")
        got = (base[:150] * 2).sum().cpu()
    torch.testing.assert_close(got, (base.cpu()[:150] * 2).sum())
    m = tte.metrics()
    # A new region: compiled, or loaded from a warm on-disk cache (TORCH_TPU_CACHE_DIR).
    assert m["compiles"] + m["disk_cache_hits"] >= 1


@pytest.mark.parametrize(
    "args",
    [
        (torch.ones(3), 0, 1, 2),  # not a tpu tensor
        ("tpu", -1, 1, 2),  # negative dim
        ("tpu", 2, 1, 2),  # dim out of range
        ("tpu", 0, 5, 2),  # lower > upper
        ("tpu", 0, -1, 2),  # negative lower
    ],
)
def test_mark_dynamic_rejects_bad_input(args):
    t, dim, lo, hi = args
    if isinstance(t, str):
        t = torch.ones(4, 4, device="tpu")
    with pytest.raises(ValueError):
        _tte().mark_dynamic(t, dim, lo, hi)


SIZES = (40, 77, 130)  # power-of-two buckets 64, 128, 256


def _compiles(tte):
    m = tte.metrics()
    return m["compiles"] + m["disk_cache_hits"]


def _cat_out(d):
    buf = torch.empty(16, 2 * d.shape[1], device=d.device)
    torch.cat([d, d], 1, out=buf)
    return buf - 0.5


# Regions that keep one compile over SIZES (on main at bb12663, 3 each):
# the mark of d's dim 1 follows it to dim 0 of d.t() (matched by stride;
# main read it at dim 1 of the view, its 16); F.pad's n + 2 buffer and
# cat(out=)'s 2n buffer, written by the region on a storage of no mark, are
# keyed as following the marked n (main: their power-of-two buckets).
FOLLOWING = {
    "transposed view": lambda d: d.t() * 2.0 - 1.0,
    "pad buffer": lambda d: F.pad(d, (1, 1)) * 3.0,
    "cat out= buffer": _cat_out,
    # Views of another rank (main at cd32fd7: 3 compiles each): the mark
    # keeps the dim of its stride (unsqueeze, expand) or the dim that merges
    # it with fixed ones (flatten: 16 * n, keyed by the range and 16); a
    # repeat's 2n buffer and a stack along a new inner dim follow n.
    "unsqueezed view": lambda d: d.unsqueeze(0) * 2.0 - 1.0,
    "expanded view": lambda d: d.expand(3, 16, -1) * 2.0 - 1.0,
    "flattened view": lambda d: d.reshape(-1) * 2.0 - 1.0,
    "repeat": lambda d: d.repeat(1, 2) * 2.0 - 1.0,
    "stack inner": lambda d: torch.stack([d, d], 2) * 2.0 - 1.0,
}


@pytest.mark.parametrize("case", sorted(FOLLOWING))
def test_marked_size_keeps_one_region(case):
    tte = _tte()
    fn = FOLLOWING[case]
    tte.reset_metrics()
    first = None
    for n in SIZES:
        a = torch.randn(16, n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        assert torch.equal(fn(d).cpu(), fn(a))
        first = _compiles(tte) if first is None else first
    # Each region compiles at the first size only (a repeat runs two: its
    # copy, then the ops reading its buffer).
    assert first <= 2 and _compiles(tte) == first


def test_a_size_near_the_mark_by_chance_gives_cpu_values():
    # e's fixed 41 columns are n + 1 at n = 40 and n - 36 at n = 77; e is
    # only read, so it keeps its power of two (a weight's columns near a
    # marked n by chance); values as CPU's at every n.
    tte = _tte()
    e_cpu = torch.randn(16, 41)
    e = e_cpu.to("tpu")
    for n in SIZES + (41, 40):
        a = torch.randn(16, n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        assert torch.equal((torch.cat([d, e], 1) + 1.0).cpu(), torch.cat([a, e_cpu], 1) + 1.0)


def _read_later(d):
    # Made by one flush, only read by the next: the buffer carries the mark
    # of the size it follows (n + 2), so the reading region keys it by range.
    p = F.pad(d, (1, 1))
    p.cpu()
    return p[:, 1:] * 3.0


def test_a_buffer_made_by_one_region_keeps_the_mark_in_the_next():
    # main at cd32fd7: 4 compiles (the pad's region once, the reading region
    # once per power-of-two bucket of n + 2: 64, 128, 256).
    tte = _tte()
    tte.reset_metrics()
    for n in SIZES:
        a = torch.randn(16, n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        assert torch.equal(_read_later(d).cpu(), _read_later(a))
    assert _compiles(tte) <= 2


def test_a_flattened_rows_mark_gives_cpu_values_at_every_size():
    # (n, 16) marked at dim 0, flattened: 16 * n at stride 1 (the marked
    # stride is 16); a launch of another k (a (n, 8) tensor) keys apart.
    tte = _tte()
    for n, cols in [(40, 16), (77, 16), (40, 8), (130, 16)]:
        a = torch.randn(n, cols)
        d = a.to("tpu")
        tte.mark_dynamic(d, 0, 1, 509)
        assert torch.equal((d.flatten() * 2.0 - 1.0).cpu(), a.flatten() * 2.0 - 1.0)


def test_a_carried_mark_near_a_size_by_chance_gives_cpu_values():
    # For n in 11..32 the pad buffer's 16 rows are n + c by chance (c from 5
    # to -16): they carry a mark too, keyed alike at every n; each launch is
    # still planned for its own layout, so the values are CPU's.
    tte = _tte()
    for n in (11, 20, 32, 16, 40):
        a = torch.randn(16, n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        assert torch.equal(_read_later(d).cpu(), _read_later(a))


def test_carried_marks_are_bounded_and_an_old_buffer_reads_right():
    # 4,096 carried marks are kept: the first buffer's is dropped after
    # 4,100 more (each (d + 1.0) result carries d's mark); it then keys by
    # its power of two (one more compile of the reading region), with CPU's
    # values. Before that it shares the key of a fresh buffer's read.
    tte = _tte()
    a = torch.randn(3, 24)
    d = a.to("tpu")
    tte.mark_dynamic(d, 1, 1, 509)
    first, second = F.pad(d, (1, 1)), F.pad(d, (1, 1))
    first.cpu(), second.cpu()
    want = F.pad(a, (1, 1))[:, 1:] * 3.0
    assert torch.equal((second[:, 1:] * 3.0).cpu(), want)
    tte.reset_metrics()
    assert torch.equal((first[:, 1:] * 3.0).cpu(), want)
    assert _compiles(tte) == 0
    for _ in range(4100):
        (d + 1.0).cpu()
    tte.reset_metrics()
    assert torch.equal((first[:, 1:] * 3.0).cpu(), want)
    assert _compiles(tte) == 1


SPLITS = {
    "factor outside": (lambda x: x.view(16, 4, -1) * 2.0 - 1.0, (40, 76, 132)),
    "factor inside": (lambda x: x.view(16, -1, 4) * 2.0 - 1.0, (40, 76, 132)),
    # The heads split: 10, 17, 40 rows of 64 (power-of-two buckets 16, 32, 64).
    "heads: rows of 64": (lambda x: x.view(16, -1, 64) * 2.0 - 1.0, (640, 1088, 2560)),
    # n = 4096 is 64 rows of 64: equal factors, keyed as every other size of
    # the range. main at aedf460: no split, its rows by their power of two
    # (2 compiles).
    "heads: 64 rows of 64": (lambda x: x.view(16, -1, 64) * 2.0 - 1.0, (640, 4096, 1088)),
}


@pytest.mark.parametrize("case", list(SPLITS))
def test_a_split_of_the_marked_dim_keeps_one_region(case):
    # d.view(16, 4, -1), d.view(16, -1, 4), d.view(16, -1, 64) of a (16, n)
    # tensor marked at dim 1: both parts of the split are keyed by the range
    # (one launch cannot tell which is fixed). main at e8b6b7f: the heads
    # split took the 64 for the quotient and keyed its rows by their power
    # of two (3 compiles).
    fn, sizes = SPLITS[case]
    # The regions share a key but for the range's upper bound (each
    # layout plans on its own): a bound per case counts each case's compiles.
    _one_region_over(sizes, lambda n: (16, n), (1,), 8192 - list(SPLITS).index(case), fn)


def _one_region_over(sizes, shape, dims, upper, fn):
    """fn of a tensor of shape(n) marked at dims in [1, upper], for each n of
    sizes: CPU's values, and one compile over all."""
    tte = _tte()
    tte.reset_metrics()
    for n in sizes:
        a = torch.randn(*shape(n))
        d = a.to("tpu")
        for dim in dims:
            tte.mark_dynamic(d, dim, 1, upper)
        assert torch.equal(fn(d).cpu(), fn(a))
    assert _compiles(tte) == 1


def test_a_heads_split_read_by_the_next_flush_keeps_one_region_each():
    # The (16, n / 64, 64) result of the split, made by one flush, carries
    # both parts' marks to the flush that reads it. main at e8b6b7f: 3
    # compiles in each of the two regions.
    tte = _tte()
    tte.reset_metrics()
    for n in (640, 1088, 2560):
        a = torch.randn(16, n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 4096)
        h = d.view(16, -1, 64) + 1.0
        h.cpu()
        assert torch.equal((h[:, 1:] * 3.0).cpu(), (a.view(16, -1, 64) + 1.0)[:, 1:] * 3.0)
    assert _compiles(tte) == 2


def test_a_split_guard_gives_cpu_values_at_every_size():
    # d[: n // 4 * 4].view(4, -1) of a 1-D d marked at dim 0 is a split of n
    # only when 4 divides n; the others (42, 41) key apart; CPU's values.
    tte = _tte()
    for n in (40, 44, 42, 48, 41, 4, 8):
        a = torch.randn(n)
        d = a.to("tpu")
        tte.mark_dynamic(d, 0, 1, 509)
        assert torch.equal((d[: n // 4 * 4].view(4, -1) * 2.0).cpu(), a[: n // 4 * 4].view(4, -1) * 2.0)


def _cat_two_out(d, e):
    buf = torch.empty(16, d.shape[1] + e.shape[1], device=d.device)
    torch.cat([d, e], 1, out=buf)
    return buf - 0.5


def _cat_two_read_later(d, e):
    p = torch.cat([d, e], 1)
    p.cpu()
    return p[:, 1:] * 3.0


@pytest.mark.parametrize("fn, regions", [(_cat_two_out, 1), (_cat_two_read_later, 2)], ids=["out=", "read later"])
def test_a_size_from_two_marks_keeps_one_region(fn, regions):
    # cat of (16, n) and (16, n // 2 + 3), each marked at dim 1: the n + m of
    # an out= buffer, or of the result a later flush reads, follows both
    # marks. main at ce50620: 3 and 4 compiles (n + m by its power of two).
    tte = _tte()
    tte.reset_metrics()
    for n in (77, 130, 200):
        a, b = torch.randn(16, n), torch.randn(16, n // 2 + 3)
        d, e = a.to("tpu"), b.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        tte.mark_dynamic(e, 1, 1, 509)
        assert torch.equal(fn(d, e).cpu(), fn(a, b))
    assert _compiles(tte) == regions


def test_a_difference_of_two_marks_gives_cpu_values_in_one_region():
    # d[:, m:] (n - m at offset m) and e of (16, n) and (16, m), each marked:
    # one key over the sizes (as on main at e8b6b7f: the layouts plan on
    # their own on this target); CPU's values at each.
    tte = _tte()
    tte.reset_metrics()
    for n in (40, 77, 130, 200):
        a, b = torch.randn(16, n), torch.randn(16, n // 2 - 3)
        d, e = a.to("tpu"), b.to("tpu")
        tte.mark_dynamic(d, 1, 1, 509)
        tte.mark_dynamic(e, 1, 1, 509)
        x, y = d[:, e.shape[1] :] * 2.0, e * 3.0
        assert torch.equal(x.cpu(), a[:, b.shape[1] :] * 2.0) and torch.equal(y.cpu(), b * 3.0)
    assert _compiles(tte) == 1


def _cpu_and_marked(cols, upper):
    """A (16, cols) CPU tensor and its device copy marked at dim 1 in [1, upper]."""
    a = torch.randn(16, cols)
    d = a.to("tpu")
    _tte().mark_dynamic(d, 1, 1, upper)
    return a, d


def _heads_of_parts(x, parts):
    # The heads split of qkv's equal parts (qkv.chunk(3, 1)): q alone, or
    # q * k + v.
    h = [p.view(16, -1, 64) for p in x.chunk(3, 1)]
    return h[0] * 2.0 - 1.0 if parts == "q" else h[0] * h[1] + h[2]


@pytest.mark.parametrize("parts", ["q", "qkv"])
def test_a_split_of_an_equal_part_keeps_one_region(parts):
    # q.view(16, -1, 64) of q = qkv.chunk(3, 1)[0], qkv (16, 3 * 64r) marked
    # at dim 1: both parts of the split of a third of the marked dim are
    # keyed by the range. main at aedf460: the 64 keyed as the marked dim,
    # the rows by their power of two (3 compiles).
    tte = _tte()
    tte.reset_metrics()
    for r in (10, 17, 40):
        a, d = _cpu_and_marked(3 * 64 * r, 12288 - len(parts))  # a bound per case: its own key
        assert torch.equal(_heads_of_parts(d, parts).cpu(), _heads_of_parts(a, parts))
    assert _compiles(tte) == 1


def test_equal_parts_and_their_guard_give_cpu_values():
    # chunk(3) of n columns: equal parts when 3 divides n, else (c+1, c+1,
    # c-1) or (c+1, c+1, c) under the same key; CPU's values at each.
    for n in (120, 121, 231, 122, 390):
        a, d = _cpu_and_marked(n, 1536)
        got = [(p * 2.0 - 1.0).cpu() for p in d.chunk(3, 1)]
        assert all(torch.equal(g, p * 2.0 - 1.0) for g, p in zip(got, a.chunk(3, 1)))


STEP_SLICES = {
    # attention's k.transpose(-2, -1) of a (n, 16) k marked at its rows,
    # every other column; from column 1; every third
    "t()[:, ::2]": ((0,), lambda n: (n, 16), lambda x: x.t()[:, ::2] * 2.0),
    "t()[:, 1::2]": ((0,), lambda n: (n, 16), lambda x: x.t()[:, 1::2] * 2.0 - 1.0),
    "t()[:, ::3]": ((0,), lambda n: (n, 16), lambda x: x.t()[:, ::3] * 3.0),
}


@pytest.mark.parametrize("case", list(STEP_SLICES))
def test_a_step_slice_of_the_marked_dim_keeps_one_region(case):
    # A step slice to the end of the marked dim of a transposed view: keyed
    # by the range on the dim of the step's stride (main
    # at 73cecf6 kept the mark at its index: the transposed view's 16 rows
    # keyed as the range, the marked columns by their power of two, 3
    # compiles); CPU's values at each size, even and odd.
    dims, shape, fn = STEP_SLICES[case]
    # a bound per case: its own key
    _one_region_over((40, 77, 130), shape, dims, 500 + list(STEP_SLICES).index(case), fn)


def test_a_split_of_a_slice_keeps_one_region():
    # d[:, 1:].view(16, -1, 64) of (16, 64r + 1) marked at dim 1 (a CLS
    # token dropped, the rest split into heads): both parts keyed by the
    # range. main at 73cecf6: the 64 keyed as the marked dim, the rows by
    # their power of two (3 compiles); CPU's values at each.
    tte = _tte()
    tte.reset_metrics()
    for r in (10, 17, 40):
        a, d = _cpu_and_marked(64 * r + 1, 4093)
        assert torch.equal((d[:, 1:].view(16, -1, 64) * 2.0).cpu(), a[:, 1:].view(16, -1, 64) * 2.0)
    assert _compiles(tte) == 1


def _mlp(x, w):
    """A pre-norm MLP block: layer_norm, x @ w1, gelu, @ w2, residual."""
    h = F.layer_norm(x, (x.shape[1],), w["g"], w["b"])
    return x + F.gelu(h @ w["w1"]) @ w["w2"]


def _mlp_weights(d, device):
    g = torch.Generator().manual_seed(5)
    shapes = {"g": (d,), "b": (d,), "w1": (d, 4 * d), "w2": (4 * d, d)}
    return {k: (torch.randn(*s, generator=g) * 0.1).to(device) for k, s in shapes.items()}


def test_an_mlp_block_keeps_one_region_each_when_n_equals_a_weight_size():
    # x (n, 64) marked at its rows, weights (64,), (64, 256), (256, 64):
    # n = 16 makes the 64 and 256 columns 4n and 16n, n = 64 and 256 equal
    # a weight's size. Those relations are the weights' (the columns of x @
    # w1 are w1's), so every n keys alike: one compile per region (main at
    # b5d23e0: 5, the chance sizes keyed as following n); CPU's values.
    tte = _tte()
    w, wd = _mlp_weights(64, "cpu"), _mlp_weights(64, "tpu")
    tte.reset_metrics()
    for n in (16, 64, 77, 256):
        x = torch.randn(n, 64)
        d = x.to("tpu")
        tte.mark_dynamic(d, 0, 1, 611)  # a bound of its own: its own keys
        torch.testing.assert_close(_mlp(d, wd).cpu(), _mlp(x, w))
    assert _compiles(tte) == 3
    # Outside the range: keyed apart (its own compiles), CPU's values.
    x = torch.randn(700, 64)
    d = x.to("tpu")
    tte.mark_dynamic(d, 0, 1, 611)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.testing.assert_close(_mlp(d, wd).cpu(), _mlp(x, w))
    assert _compiles(tte) > 3


def _attn(x, w):
    """A pre-norm attention block: 4 heads of 16, qkv chunk(3, -1), @ wo, residual."""
    n = x.shape[0]
    h = F.layer_norm(x, (64,), w["g"], w["b"]) @ w["wqkv"]
    q, k, v = (t.view(n, 4, 16).transpose(0, 1) for t in h.chunk(3, -1))
    p = torch.softmax((q @ k.transpose(-2, -1)) * 0.25, -1)
    return x + (p @ v).transpose(0, 1).reshape(n, 64) @ w["wo"]


def _block_compiles(tte, block, w, sizes, upper):
    """block(x, w) of x (n, 64) marked at its rows (1..upper) for each n of
    sizes, against CPU's values: the compile count after each n."""
    wd = {k: v.to("tpu") for k, v in w.items()}
    tte.reset_metrics()
    counts = []
    for n in sizes:
        x = torch.randn(n, 64)
        d = x.to("tpu")
        tte.mark_dynamic(d, 0, 1, upper)
        torch.testing.assert_close(block(d, wd).cpu(), block(x, w))
        counts.append(_compiles(tte))
    return counts


def test_an_attention_block_keeps_one_region_each_when_n_equals_the_head_dim():
    # x (n, 64) marked at its rows. At n = 16 (the head dim) p @ v is (4,
    # 16, 16): both dims equal n, neither operand a weight; the JIT's size
    # probe (carry_marks) finds the head dim fixed, so the regions reading
    # it key as at every other n: no compile after the first n (main at
    # 131ceab: one more at n = 16). CPU's values; n = 700 outside the range
    # compiles its own. (Six regions since llama22: the reshape's clone of the
    # transposed heads runs in p @ v's epilogue.)
    tte = _tte()
    g = torch.Generator().manual_seed(7)
    shapes = {"g": (64,), "b": (64,), "wqkv": (64, 192), "wo": (64, 64)}
    w = {k: torch.randn(*s, generator=g) * 0.1 for k, s in shapes.items()}
    counts = _block_compiles(tte, _attn, w, (23, 16, 40, 64, 16), 619)
    assert counts[0] >= 6 and counts == [counts[0]] * 5
    x = torch.randn(700, 64)
    d = x.to("tpu")
    tte.mark_dynamic(d, 0, 1, 619)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.testing.assert_close(_attn(d, {k: v.to("tpu") for k, v in w.items()}).cpu(), _attn(x, w))
    assert _compiles(tte) > counts[0]


def _llama(x, w):
    """A llama-like block: RMSNorm, 4 heads of 16 with rotary embedding and a
    causal mask sliced from (1024, ...) tables, a SwiGLU MLP (chunk(2))."""
    n = x.shape[0]

    def rms(t, g):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    def rope(t, cos, sin):
        return t * cos + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin

    q, k, v = (t.view(n, 4, 16).transpose(0, 1) for t in (rms(x, w["g"]) @ w["wqkv"]).chunk(3, -1))
    cos, sin = w["cos"][:n], w["sin"][:n]
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    p = torch.softmax((q @ k.transpose(-2, -1)) * 0.25 + w["mask"][:n, :n], -1)
    x = x + (p @ v).transpose(0, 1).reshape(n, 64) @ w["wo"]
    a, b = (rms(x, w["g2"]) @ w["w13"]).chunk(2, -1)
    return x + (F.silu(a) * b) @ w["w2"]


def test_a_llama_block_keeps_one_region_each_over_the_marked_range():
    # x (n, 64) marked at its rows, n = 16 first (the head dim; the rotary
    # tables' 16 columns), then 23, 40, 64, 100: the tables' slices cos[:n]
    # and mask[:n, :n] key as following n, and the size probe keeps the
    # head dim and x.float()'s 64 columns fixed at n = 16. No compile after
    # the first n (main at 131ceab: one per power-of-two bucket of n and
    # more at n = 16); CPU's values.
    tte = _tte()
    g = torch.Generator().manual_seed(9)
    shapes = {"g": (64,), "g2": (64,), "wqkv": (64, 192), "wo": (64, 64), "w13": (64, 512), "w2": (256, 64)}
    w = {k: torch.randn(*s, generator=g) * 0.1 for k, s in shapes.items()}
    w.update(cos=torch.randn(1024, 16, generator=g), sin=torch.randn(1024, 16, generator=g))
    w["mask"] = torch.full((1024, 1024), float("-inf")).triu(1)
    counts = _block_compiles(tte, _llama, w, (16, 23, 40, 64, 100), 627)
    assert counts[0] >= 10 and counts == [counts[0]] * 5
