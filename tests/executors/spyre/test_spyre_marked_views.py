"""Marked sizes through created buffers, transposed views and fixed slices
(issue 21 item 3: one compiled program serves every shape inside its
mark_dynamic range):

- `F.pad(d, (1, 1))` writes d into a buffer of `n + 2` made outside the
  region (as `cat(..., out=buf)` into `2n`): the JIT keys that size as
  following the marked `n` (jit/dynamic_shapes.h), so one region and one
  program serve every n (on main at bb12663 one compile per power-of-two
  bucket: 3 here);
- `d.t()` of a tensor marked at both dims: each mark follows its dim through
  the view's strides (`sizes=[s1, s0] strides=[1, s1]`; main: a program per
  shape);
- `d[:, :2]`: a fixed slice far from its base stays a number and the base
  names the pitch (`strides=[s0, 1]`; main: a symbol of its own, the pitch a
  number, a program per shape).

Values are checked against the independent df16 reference of
test_spyre_numerics (16-bit) or CPU (float32), never the executor.
"""

import pytest
import torch
import torch.nn.functional as F

from difftest import requires_tpu
from test_spyre_numerics import _inputs, matmul_ref, same, store

pytestmark = requires_tpu

SIZES = (40, 77, 130)  # power-of-two buckets 64, 128, 256


def _marked(tte, a, dims, upper=512):
    d = a.to("tpu")
    for dim in dims:
        tte.mark_dynamic(d, dim, 1, upper)
    return d


def _one_program_per_region(tte, seed, fn, want, texts, regions=1):
    """fn of a (16, n) float16 tensor marked at dim 1, for each n of SIZES:
    values equal to want(a), each of texts(n) in the dumped program, and one
    compile and one plan per region over all sizes."""
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for i, n in enumerate(SIZES):
        a = _inputs(torch.float16, seed=seed + i, shape=(16, n))
        got, w = fn(_marked(tte, a, (1,))).cpu(), want(a)
        assert got.shape == w.shape and same(got, w) == 0
        text = spyre.dump_ktir()
        assert all(t in text for t in texts(n)), text
    m = tte.metrics()
    assert m["compiles"] == regions and m["plans_built"] == regions


def test_pad_buffer_follows_the_mark(spyre_target):
    _one_program_per_region(
        spyre_target,
        200,
        lambda d: F.pad(d, (1, 1)) * 2.0,
        lambda a: store(F.pad(a, (1, 1)).float() * 2.0, torch.float16),
        lambda n: ["sizes=[16, s0+2] strides=[s0+2, 1]", "elems=16*s0+32\n"],
    )


def test_cat_out_buffer_follows_the_mark(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate(SIZES):
        a = _inputs(torch.float16, seed=240 + seed, shape=(16, n))
        buf = torch.empty(16, 2 * n, dtype=torch.float16, device="tpu")
        torch.cat([_marked(tte, a, (1,)), _marked(tte, a, (1,))], 1, out=buf)
        got = (buf * 2.0).cpu()
        assert same(got, store(torch.cat([a, a], 1).float() * 2.0, torch.float16)) == 0
        assert "sizes=[16, 2*s0] strides=[2*s0, 1]" in spyre.dump_ktir()
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_pad_margins_sharing_a_key_rebuild_never_bind_wrong(spyre_target):
    tte = spyre_target

    # (1, 1) and (0, 2) make the same n + 2 buffer and the same key; the
    # copy's offset differs (1 or 0), so the other margin's launch does not
    # match the first program: it plans its own, never runs with the other's
    # offset, and each later launch binds the one that fits (main at
    # 131ceab, one program per kernel: a plan at every change, 6).
    tte.reset_metrics()
    for seed, (n, pad) in enumerate(zip(SIZES + SIZES, ((1, 1), (0, 2)) * 3)):
        a = _inputs(torch.float16, seed=210 + seed, shape=(16, n))
        got = (F.pad(_marked(tte, a, (1,)), pad) * 2.0).cpu()
        assert same(got, store(F.pad(a, pad).float() * 2.0, torch.float16)) == 0
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 2


def test_transposed_view_of_two_marked_dims_keeps_one_program(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate(SIZES):
        m = n // 2 + 3
        a = _inputs(torch.float16, seed=220 + seed, shape=(n, m))
        got = (_marked(tte, a, (0, 1)).t() * 2.0 + 1.0).cpu()
        want = store(store(a.t().float() * 2.0, torch.float16).float() + 1.0, torch.float16)
        assert got.shape == (m, n) and got.stride() == (1, m) and same(got, want) == 0
        text = spyre.dump_ktir()
        assert f"syms=[s0={n}, s1={m}]" in text.splitlines()[0]
        assert "offset=0 sizes=[s1, s0] strides=[1, s1]" in text and "elems=s0*s1\n" in text
    met = tte.metrics()
    assert met["compiles"] == 1 and met["plans_built"] == 1


def test_fixed_slice_far_from_its_base_stays_a_number(spyre_target, tmp_path):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    texts = []
    for seed, n in enumerate(SIZES):
        a = _inputs(torch.float16, seed=230 + seed, shape=(16, n))
        got = (_marked(tte, a, (1,))[:, :2] * 2.0).cpu()
        assert same(got, store(a[:, :2].float() * 2.0, torch.float16)) == 0
        texts.append(spyre.dump_ktir())
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1
    text = texts[0]
    # s0 is the pitch: d[:, :2] needs s0 >= 2 (the range says so).
    assert "syms=[s0=40] ranges=[2..512]" in text.splitlines()[0]
    assert "%a0 = arg in df16(f16) elems=16*s0\n" in text
    assert "offset=0 sizes=[16, 2] strides=[s0, 1]" in text
    assert "elems=32\n" in text and "sizes=[16, 2] strides=[2, 1]" in text
    assert spyre.format_ktir(text) == text
    # The dumped program run by run_ktir on a row pitch it was not built
    # for: s0 = 11 from the argument's 16 * 11 elements.
    path = tmp_path / "k.ktir"
    path.write_text(text.replace("syms=[s0=40]", "syms=[s0=11]"))
    x = _inputs(torch.float16, seed=239, shape=(16, 11))
    (out,) = spyre.run_ktir(str(path), x.reshape(-1))
    assert same(out.view(16, 2), store(x[:, :2].float() * 2.0, torch.float16)) == 0


def _pad_then_read(d, pad=(1, 1), cols=slice(None)):
    # The pad's buffer is made by one flush and only read by the next.
    p = F.pad(d, pad)
    p.cpu()
    return p[:, cols] * 2.0


def test_buffer_made_by_one_region_keeps_the_mark_in_the_next(spyre_target):
    # main at cd32fd7: 4 compiles and 4 plans (the reading region once per
    # power-of-two bucket of n + 2); now the buffer carries the mark of the
    # n it follows (its own size the base, the range 1..512 shifted by 2).
    _one_program_per_region(
        spyre_target,
        250,
        _pad_then_read,
        lambda a: store(store(F.pad(a, (1, 1)).float(), torch.float16).float() * 2.0, torch.float16),
        lambda n: [f"syms=[s0={n + 2}] ranges=[3..514] {{", "sizes=[16, s0] strides=[s0, 1]", "elems=16*s0\n"],
        regions=2,
    )


def test_read_buffer_sharing_a_key_plans_again_never_binds_wrong(spyre_target):
    tte = spyre_target

    # p[:, 1:-1] of a (1, 1) pad and p[:, :-2] of a (0, 2) pad make the same
    # reading region and key (offsets are not in it); the other offset does
    # not match the compiled program, so that launch plans again.
    tte.reset_metrics()
    cases = [((1, 1), slice(1, -1)), ((0, 2), slice(0, -2))] * 3
    for seed, (n, (pad, cols)) in enumerate(zip(SIZES + SIZES, cases)):
        a = _inputs(torch.float16, seed=260 + seed, shape=(16, n))
        d = _marked(tte, a, (1,))
        got = (_pad_then_read(d, pad, cols) + d).cpu()
        p = store(F.pad(a, pad).float(), torch.float16).float()
        want = store(store(p[:, cols] * 2.0, torch.float16).float() + a.float(), torch.float16)
        assert same(got, want) == 0
    m = tte.metrics()
    # The pad region and the reading region: one compile each; a launch
    # that no kept program fits plans its own (8 here; main at 131ceab, one
    # program per kernel, 12).
    assert m["compiles"] == 2 and m["plans_built"] == 8


@pytest.mark.parametrize(
    "case, shape, dim, text",
    [
        ("unsqueeze", (16, 0), 1, "sizes=[1, 16, s0] strides=[16*s0, s0, 1]"),
        ("expand", (16, 0), 1, "sizes=[4, 16, s0] strides=[0, s0, 1]"),
        ("flatten", (16, 0), 1, "sizes=[16*s0] strides=[1]"),
        ("flatten", (0, 16), 0, "sizes=[16*s0] strides=[1]"),
        ("repeat", (16, 0), 1, "sizes=[16, 2*s0] strides=[2*s0, 1]"),
        ("stack", (16, 0), 1, "sizes=[16, s0, 2] strides=[2*s0, 2, 1]"),
        ("flatten a slice", (16, 0), 1, "sizes=[16*s0-16] strides=[1]"),
        # The size-1 dim's stride s0 does not break the chain to 16*s0; at n
        # = 40 the 32 rows are near n by chance: a key and plan of their own.
        ("repeat rows", (16, 0), 1, "sizes=[2, 1, 16, s0] strides=[16*s0, s0, s0, 1]"),
    ],
)
def test_views_of_another_rank_and_repeat_keep_one_program(spyre_target, case, shape, dim, text):
    tte = spyre_target
    from torch_tpu_eager import spyre

    fn = {
        "unsqueeze": lambda d: d.unsqueeze(0) * 2.0,
        "expand": lambda d: d.expand(4, 16, -1) * 2.0,
        "flatten": lambda d: d.flatten() * 2.0,
        "repeat": lambda d: d.repeat(1, 2) * 2.0,
        "stack": lambda d: torch.stack([d, d], 2) * 2.0,
        "flatten a slice": lambda d: d[:, 1:].reshape(-1) * 2.0,
        "repeat rows": lambda d: d.repeat(2, 1) * 2.0,
    }[case]
    # main at cd32fd7: a program per shape (3 plans; 3 compiles on the TPU
    # target's key too). Now the mark keeps its dim (unsqueeze, expand), the
    # merged dim is 16*s0 (flatten), a reshape of the repeat's buffer 2*s0.
    tte.reset_metrics()
    for seed, n in enumerate(SIZES):
        size = tuple(n if s == 0 else s for s in shape)
        a = _inputs(torch.float16, seed=270 + seed, shape=size)
        got = fn(_marked(tte, a, (dim,))).cpu()
        assert same(got, store(fn(a.float()), torch.float16)) == 0
        assert text in spyre.dump_ktir()
    m = tte.metrics()
    assert m["plans_built"] == (2 if case == "repeat rows" else 1)


SPLIT_SIZES = (40, 76, 132)  # multiples of 4; quotients 10, 19, 33
HEADS_SIZES = (640, 1088, 2560)  # 10, 17, 40 rows of 64: buckets 16, 32, 64


@pytest.mark.parametrize(
    "case, sizes, syms",
    [
        ("factor outside", SPLIT_SIZES, lambda n: f"syms=[s0=4, s1={n // 4}]"),
        ("factor inside", SPLIT_SIZES, lambda n: f"syms=[s0={n // 4}, s1=4]"),
        ("heads: rows of 64", HEADS_SIZES, lambda n: f"syms=[s0={n // 64}, s1=64]"),
    ],
)
def test_split_of_a_marked_dim_keeps_both_parts_symbolic(spyre_target, case, sizes, syms):
    tte = spyre_target
    from torch_tpu_eager import spyre

    fn = {
        "factor outside": lambda d: d.view(16, 4, -1) * 2.0,
        "factor inside": lambda d: d.view(16, -1, 4) * 2.0,
        "heads: rows of 64": lambda d: d.view(16, -1, 64) * 2.0,
    }[case]
    # One launch cannot tell which part is fixed, so both are symbols and
    # the marked n is their product (the pitch, the element count). main at
    # e8b6b7f: the 4 of the first two fixed (one plan); the heads split took
    # the 64 for the quotient, its rows keyed by their power of two: 3
    # compiles and a plan per shape.
    tte.reset_metrics()
    for seed, n in enumerate(sizes):
        a = _inputs(torch.float16, seed=300 + seed, shape=(16, n))
        got = fn(_marked(tte, a, (1,), upper=4096)).cpu()
        assert same(got, store(fn(a.float()), torch.float16)) == 0
        text_n = spyre.dump_ktir()
        want = ["sizes=[16, s0, s1] strides=[s0*s1, s1, 1]", "elems=16*s0*s1\n", syms(n)]
        assert all(t in text_n for t in want), text_n
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_split_guard_a_size_not_divisible_plans_its_own(spyre_target):
    # d[: n // 4 * 4].view(4, -1) of a 1-D d marked at dim 0: a split of the
    # marked n when 4 divides n (40, 44, 48: one program, s0 the quotient);
    # the (4, 10) of n = 42 or 41 is no split of n (the divisibility guard):
    # keyed and planned apart, never bound to the split program.
    tte = spyre_target

    def fn(d):
        return d[: d.shape[0] // 4 * 4].view(4, -1) * 2.0

    tte.reset_metrics()
    plans = []
    for seed, n in enumerate((40, 44, 42, 48, 41)):
        a = _inputs(torch.float16, seed=310 + seed, shape=(n,))
        got = fn(_marked(tte, a, (0,))).cpu()
        assert same(got, store(fn(a.float()), torch.float16)) == 0
        plans.append(tte.metrics()["plans_built"])
    assert plans == [1, 1, 2, 2, 2]


def test_heads_split_read_by_the_next_flush_keeps_one_program_each(spyre_target):
    # The (16, n / 64, 64) result, made by one flush, carries both parts'
    # marks to the flush that reads it. main at e8b6b7f: 3 compiles and 3
    # plans in each region.
    tte = spyre_target
    from torch_tpu_eager import spyre

    def fn(d):
        h = d.view(16, -1, 64) * 2.0
        h.cpu()
        return h[:, 1:] + 1.0

    tte.reset_metrics()
    for seed, n in enumerate(HEADS_SIZES):
        a = _inputs(torch.float16, seed=340 + seed, shape=(16, n))
        got = fn(_marked(tte, a, (1,), upper=4096)).cpu()
        want = store(store(a.view(16, -1, 64).float() * 2.0, torch.float16)[:, 1:].float() + 1.0, torch.float16)
        assert same(got, want) == 0
        assert f"syms=[s0={n // 64}, s1=64]" in spyre.dump_ktir(), spyre.dump_ktir()
    m = tte.metrics()
    assert m["compiles"] == 2 and m["plans_built"] == 2


def test_heads_split_guard_a_size_not_divisible_plans_its_own(spyre_target):
    # d[:, : n // 64 * 64].view(16, -1, 64) of a (16, n) d marked at dim 1:
    # a split of n when 64 divides it (640, 1088, 1280: one program); 650
    # and 1100 (10 and 17 rows of their slice) are no split of n: keyed and
    # planned apart, never bound to the split program.
    tte = spyre_target

    def fn(d):
        return d[:, : d.shape[1] // 64 * 64].view(16, -1, 64) * 2.0

    tte.reset_metrics()
    plans = []
    for seed, n in enumerate((640, 1088, 650, 1280, 1100)):
        a = _inputs(torch.float16, seed=350 + seed, shape=(16, n))
        got = fn(_marked(tte, a, (1,), upper=4096)).cpu()
        assert same(got, store(fn(a.float()), torch.float16)) == 0
        plans.append(tte.metrics()["plans_built"])
    assert plans == [1, 1, 2, 2, 3]


def _cat_two(d, e, out=False, read_later=False):
    if out:
        buf = torch.empty(16, d.shape[1] + e.shape[1], dtype=d.dtype, device=d.device)
        torch.cat([d, e], 1, out=buf)
        return buf * 2.0
    p = torch.cat([d, e], 1)
    if read_later:
        p.cpu()
        return p[:, 1:] * 2.0
    return p * 2.0


@pytest.mark.parametrize(
    "case, regions, text",
    [
        ("cat", 1, "sizes=[16, s0+s1] strides=[s0+s1, 1]"),
        ("cat out=", 1, "%a2 = arg out df16(f16) elems=16*s0+16*s1\n"),
        ("read by the next flush", 2, "sizes=[16, s0-1] strides=[s0, 1]"),
    ],
)
def test_sizes_from_two_marks_keep_one_program(spyre_target, case, regions, text):
    tte = spyre_target
    from torch_tpu_eager import spyre

    kw = {"cat": {}, "cat out=": {"out": True}, "read by the next flush": {"read_later": True}}[case]
    # (16, n) and (16, n // 2 + 3), each marked at dim 1: the cat's n + m is
    # s0+s1. main at ce50620: the out= buffer of n + m keyed by its power of
    # two (3 compiles), the result read by the next flush likewise (4).
    tte.reset_metrics()
    for seed, n in enumerate((77, 130, 200)):
        a = _inputs(torch.float16, seed=320 + seed, shape=(16, n))
        b = _inputs(torch.float16, seed=330 + seed, shape=(16, n // 2 + 3))
        got = _cat_two(_marked(tte, a, (1,)), _marked(tte, b, (1,)), **kw).cpu()
        assert same(got, store(_cat_two(a.float(), b.float(), **kw), torch.float16)) == 0
        assert text in spyre.dump_ktir(), spyre.dump_ktir()
    m = tte.metrics()
    assert m["compiles"] == regions and m["plans_built"] == regions


def _after(d, e, start=None):
    # d[:, m:] of a (16, n) d, m the size of e (or a fixed start), and e:
    # two results of one region.
    return d[:, e.shape[1] if start is None else start :] * 2.0, e * 3.0


def test_a_difference_of_two_marks_keeps_one_program(spyre_target):
    # (16, n) and (16, m = n // 2 - 3), each marked at dim 1: d[:, m:] is
    # n - m at offset m. n is m + t, t a symbol of its own, so the program
    # holds over the ranges' box. main at e8b6b7f: a plan per shape (the m
    # of "s0-m" and the offset were numbers).
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate((40, 77, 130, 200)):
        a = _inputs(torch.float16, seed=360 + seed, shape=(16, n))
        b = _inputs(torch.float16, seed=370 + seed, shape=(16, n // 2 - 3))
        got = [r.cpu() for r in _after(_marked(tte, a, (1,)), _marked(tte, b, (1,)))]
        want = [store(r, torch.float16) for r in _after(a.float(), b.float())]
        assert all(same(g, w) == 0 for g, w in zip(got, want))
        text = spyre.dump_ktir()
        assert f"syms=[s0={n // 2 - 3}, s1={n - n // 2 + 3}]" in text, text
        assert "offset=s0 sizes=[16, s1] strides=[s0+s1, 1]" in text and "elems=16*s0+16*s1\n" in text, text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_a_fixed_start_equal_to_a_mark_by_chance_plans_again(spyre_target):
    # d[:, 5:] next to a marked e of m = 5: the offset is taken for s0 (m);
    # at m = 7 the same key's program would start at 7, so the launch check
    # plans again (never a wrong binding): the values show which start ran.
    # (main at e8b6b7f kept the 5 a number: one plan; here two.)
    tte = spyre_target
    tte.reset_metrics()
    for seed, (n, m) in enumerate(((40, 5), (77, 7))):
        a = _inputs(torch.float16, seed=380 + seed, shape=(16, n))
        b = _inputs(torch.float16, seed=390 + seed, shape=(16, m))
        got = [r.cpu() for r in _after(_marked(tte, a, (1,)), _marked(tte, b, (1,)), start=5)]
        want = [store(r, torch.float16) for r in _after(a.float(), b.float(), start=5)]
        assert all(same(g, w) == 0 for g, w in zip(got, want))
    assert tte.metrics()["compiles"] == 1


def _qkv(d, parts=3, how="chunk"):
    # q, k, v of a (16, 3c) tensor: chunk(3) or split(c) along the marked dim
    # (of 3c + 1 columns, split(c) leaves a rest of 1: not read).
    if how == "chunk":
        return d.chunk(parts, 1)
    return d.split(d.shape[1] // parts, dim=-1)[:parts]


def _on_device(x):
    return x


def _df16(x):
    # What an intermediate in LX holds (df16), as the reference computes on.
    return store(x, torch.float16).float()


# f(d, r): r rounds an intermediate (the identity on the device).
EQUAL_PARTS = {
    # attention's q, k, v; a GLU's two halves
    "chunk(3)": (lambda d, r=_on_device: (lambda q, k, v: r(q * k) + v)(*_qkv(d)), 3),
    "split(n / 3)": (lambda d, r=_on_device: (lambda q, k, v: r(q * k) + v)(*_qkv(d, how="split")), 3),
    "chunk(2)": (lambda d, r=_on_device: (lambda a, b: a * b)(*_qkv(d, 2)), 2),
}


@pytest.mark.parametrize("case", list(EQUAL_PARTS))
def test_equal_parts_of_a_marked_dim_keep_one_program(spyre_target, case):
    # (16, q*c) marked at dim 1, cut into q equal parts: the part c is the
    # symbol, the marked size q*s0 (its pitch and element count), part j at
    # offset j*s0. main at aedf460: each c a number, a plan per shape.
    fn, q = EQUAL_PARTS[case]
    _parts_keep_one_program(spyre_target, lambda x: fn(x, _df16), fn, q, 400, "offset=s0")


def _parts_keep_one_program(tte, ref, fn, q, seed, offset):
    """fn of (16, q*c) marked at dim 1 for c = 40, 77, 130: the df16
    reference's values (ref of the float32 input), one compile and one plan,
    the part c the symbol s0 at `offset`, the pitch q*s0."""
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for i, c in enumerate((40, 77, 130)):
        a = _inputs(torch.float16, seed=seed + i, shape=(16, q * c))
        got = fn(_marked(tte, a, (1,), upper=q * 512)).cpu()
        assert same(got, store(ref(a.float()), torch.float16)) == 0
        text = spyre.dump_ktir()
        want = [f"syms=[s0={c}]", f"elems={16 * q}*s0\n", f"{offset} sizes=[16, s0] strides=[{q}*s0, 1]"]
        assert all(t in text for t in want), text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_equal_parts_guard_a_size_not_divisible_plans_its_own(spyre_target):
    # split(n // 3) of n = 3c + 1 or 3c + 2 columns cuts three parts of c and
    # a rest: the same key, but c is no third of n, so no binding of the
    # equal-parts program fits: 121 plans its own (its c = 40 a number, its
    # pitch s0), which 122 (the same c = 40) binds; values of the df16
    # reference.
    tte = spyre_target
    fn = EQUAL_PARTS["split(n / 3)"][0]
    tte.reset_metrics()
    plans = []
    for seed, n in enumerate((120, 231, 390, 121, 122)):
        a = _inputs(torch.float16, seed=410 + seed, shape=(16, n))
        got = fn(_marked(tte, a, (1,), upper=1536)).cpu()
        assert same(got, store(fn(a.float(), _df16), torch.float16)) == 0
        plans.append(tte.metrics()["plans_built"])
    assert tte.metrics()["compiles"] == 1
    assert plans == [1, 1, 1, 2, 2]


def _heads(d, parts="qkv", r=_on_device):
    # The heads split of qkv's parts: q alone, or q * k + v.
    q, k, v = _qkv(d)
    h = [x.view(16, -1, 64) for x in (q, k, v)]
    return h[0] * 2.0 if parts == "q" else r(h[0] * h[1]) + h[2]


@pytest.mark.parametrize("parts", ["q", "qkv"])
def test_heads_split_of_equal_parts_keeps_one_program(spyre_target, parts):
    # q.view(16, -1, 64) of q = qkv.chunk(3, 1)[0], qkv (16, 3 * 64r) marked
    # at dim 1: a split of an equal part; both parts are symbols, the marked
    # size 3*s0*s1. main at aedf460: the 64 keyed as the marked dim, the
    # rows by their power of two: 3 compiles, a plan per shape.
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, r in enumerate((10, 17, 40)):
        a = _inputs(torch.float16, seed=420 + seed, shape=(16, 3 * 64 * r))
        got = _heads(_marked(tte, a, (1,), upper=12288), parts).cpu()
        assert same(got, store(_heads(a.float(), parts, _df16), torch.float16)) == 0
        text = spyre.dump_ktir()
        want = [f"syms=[s0={r}, s1=64]", "elems=48*s0*s1\n", "offset=0 sizes=[16, s0, s1] strides=[3*s0*s1, s1, 1]"]
        if parts == "qkv":
            want.append("offset=2*s0*s1 sizes=[16, s0, s1] strides=[3*s0*s1, s1, 1]")
        assert all(t in text for t in want), text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_heads_split_into_equal_factors_keys_with_the_others(spyre_target):
    # n = 4096 is 64 rows of 64: its two factors are equal. main at aedf460
    # left (64, 64) no split (the 64 rows keyed by their power of two): a
    # compile and a plan of its own. Keyed as the other sizes, it binds
    # their program (s0 = s1 = 64).
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate((640, 4096, 1088)):
        a = _inputs(torch.float16, seed=430 + seed, shape=(16, n))
        got = (_marked(tte, a, (1,), upper=8192).view(16, -1, 64) * 2.0).cpu()
        assert same(got, store(a.float().view(16, -1, 64) * 2.0, torch.float16)) == 0
        assert f"syms=[s0={n // 64}, s1=64]" in spyre.dump_ktir()
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


FIRST_PART = {
    # q = qkv[..., :c] used whole (no split, no other part read)
    "chunk(3)[0]": (lambda d: d.chunk(3, 1)[0] * 2.0, 3),
    "[:, :n / 3]": (lambda d: d[:, : d.shape[1] // 3] * 2.0, 3),
    "chunk(2)[0]": (lambda d: d.chunk(2, 1)[0] * 2.0, 2),
}


@pytest.mark.parametrize("case", list(FIRST_PART))
def test_first_equal_part_read_alone_keeps_one_program(spyre_target, case):
    # A region that reads only the first of q equal parts of a marked (16,
    # q*c), unsplit: the part is the symbol, the marked size q*s0 its pitch
    # and element count. main at 73cecf6: c a number, a plan per shape.
    fn, q = FIRST_PART[case]
    _parts_keep_one_program(spyre_target, fn, fn, q, 440, "offset=0")


def test_first_part_guard_a_size_not_divisible_plans_its_own(spyre_target):
    # d[:, :n // 3] of n = 121: 40 columns, no third of 121 (the same key):
    # the part program's pitch 3*40 is not the launch's 121, so it plans its
    # own (40 a number, pitch s0), which 122 binds; 150 (a third, 50) binds
    # the part program again (kept beside the other). A fixed d[:, :8] whose 8 is a fifth of
    # the first n = 40 is taken for a part; n = 77 plans again. Values of
    # the df16 reference throughout.
    tte = spyre_target
    for fn, sizes, want in (
        (lambda d: d[:, : d.shape[1] // 3] * 2.0, (120, 231, 390, 121, 122, 150), [1, 1, 1, 2, 2, 2]),
        (lambda d: d[:, :8] + 1.0, (40, 77, 130), [1, 2, 2]),
    ):
        tte.reset_metrics()
        plans = []
        for seed, n in enumerate(sizes):
            a = _inputs(torch.float16, seed=450 + seed, shape=(16, n))
            got = fn(_marked(tte, a, (1,), upper=1536)).cpu()
            assert same(got, store(fn(a.float()), torch.float16)) == 0
            plans.append(tte.metrics()["plans_built"])
        assert tte.metrics()["compiles"] == 1
        assert plans == want


# A step slice to the end of a marked dim: (dims, shape of n, fn, texts of n).
# n = step * t + r + start - step + 1: t the slice's size (s0), r in
# [0, step - 1] (s1).
STEP_SLICES = {
    # attention's k.transpose(-2, -1) of a (n, 16) k marked at its rows, every other column
    "t()[:, ::2]": (
        (0,),
        lambda n: (n, 16),
        lambda d: d.t()[:, ::2] * 2.0,
        lambda n: (
            [f"syms=[s0={(n + 1) // 2}, s1={n - 1 - 2 * ((n + 1) // 2 - 1)}]", "elems=32*s0+16*s1-16\n"]
            + ["offset=0 sizes=[16, s0] strides=[1, 32]"]
        ),
    ),
    "t()[:, 1::2]": (
        (0,),
        lambda n: (n, 16),
        lambda d: d.t()[:, 1::2] * 2.0,
        lambda n: (
            [f"syms=[s0={n // 2}, s1={n - 2 - 2 * (n // 2 - 1)}]", "elems=32*s0+16*s1\n"]
            + ["offset=16 sizes=[16, s0] strides=[1, 32]"]
        ),
    ),
    "[:, 1::3]": (
        (1,),
        lambda n: (16, n),
        lambda d: d[:, 1::3] * 2.0,
        lambda n: (
            [f"syms=[s0={(n + 1) // 3}, s1={n - 2 - 3 * ((n + 1) // 3 - 1)}]", "elems=48*s0+16*s1-16\n"]
            + ["offset=1 sizes=[16, s0] strides=[3*s0+s1-1, 3]"]
        ),
    ),
}


@pytest.mark.parametrize("case", list(STEP_SLICES))
def test_step_slice_of_a_marked_dim_keeps_one_program(spyre_target, case):
    # The slice's size t = ceil((n - start) / step) is s0 and n is step*s0
    # + s1 + start - step + 1 (s1 in 0..step-1): one program for even and
    # odd n, its text round-trips. main at 73cecf6: a plan per shape, and a
    # compile per power of two of n for the transposed view (its mark stayed
    # on the 16 rows).
    tte = spyre_target
    from torch_tpu_eager import spyre

    dims, shape, fn, texts = STEP_SLICES[case]
    tte.reset_metrics()
    for seed, n in enumerate((40, 77, 130)):
        a = _inputs(torch.float16, seed=460 + seed, shape=shape(n))
        got = fn(_marked(tte, a, dims)).cpu()
        assert same(got, store(fn(a.float()), torch.float16)) == 0
        text = spyre.dump_ktir()
        assert all(t in text for t in texts(n)), text
        assert spyre.format_ktir(text) == text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


@pytest.mark.filterwarnings("ignore:tpu. size .* is outside its mark_dynamic range")
def test_step_slice_guards_plan_their_own(spyre_target):
    # d.t()[:, s::2] with the start s changing shares the key (offsets are
    # not in it): the other start's launch does not match the program (its
    # offset 0 or 16), so it plans its own (then kept: 42 binds the start-0
    # program again); n = 600 lies outside the mark's
    # 1..512: a key (a compile) of its own. Values of the df16 reference at
    # each.
    tte = spyre_target
    tte.reset_metrics()
    counts = []
    for seed, (n, s) in enumerate(((40, 0), (77, 0), (600, 0), (130, 1), (41, 1), (42, 0))):
        a = _inputs(torch.float16, seed=470 + seed, shape=(n, 16))
        got = (_marked(tte, a, (0,)).t()[:, s::2] * 2.0).cpu()
        assert same(got, store(a.float().t()[:, s::2] * 2.0, torch.float16)) == 0
        m = tte.metrics()
        counts.append((m["compiles"], m["plans_built"]))
    assert counts == [(1, 1), (1, 1), (2, 2), (2, 3), (2, 3), (2, 3)]


def _drop_heads(d, start=1):
    # A ViT's CLS token dropped, the rest split into heads of 64.
    return d[:, start:].view(16, -1, 64) * 2.0


def test_split_of_a_slice_keeps_one_program(spyre_target):
    # d[:, 1:].view(16, -1, 64) of (16, 64r + 1) marked at dim 1: a split of
    # a slice from a start; the parts are s0, s1 and n is s0*s1+1 (its
    # pitch and element count). main at 73cecf6: the 64 keyed as the marked
    # dim, the rows by their power of two: 3 compiles, a plan per shape.
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, r in enumerate((10, 17, 40)):
        a = _inputs(torch.float16, seed=480 + seed, shape=(16, 64 * r + 1))
        got = _drop_heads(_marked(tte, a, (1,), upper=4096)).cpu()
        assert same(got, store(_drop_heads(a.float()), torch.float16)) == 0
        text = spyre.dump_ktir()
        want = [f"syms=[s0={r}, s1=64]", "elems=16*s0*s1+16\n", "offset=1 sizes=[16, s0, s1] strides=[s0*s1+1, s1, 1]"]
        assert all(t in text for t in want), text
        assert spyre.format_ktir(text) == text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_split_of_a_slice_guard_plans_its_own(spyre_target):
    # d[:, 257:] keys as d[:, 1:] (the trim's low 8 bits), but the program
    # of n = s0*s1+1 is not the launch's (its n - 257 columns at offset
    # 257): it plans its own; d[:, 1:] after it binds the first program
    # again (kept beside it); df16 reference values.
    tte = spyre_target
    tte.reset_metrics()
    plans = []
    for seed, (r, start) in enumerate(((10, 1), (17, 1), (10, 257), (40, 1))):
        a = _inputs(torch.float16, seed=490 + seed, shape=(16, 64 * r + start))
        got = _drop_heads(_marked(tte, a, (1,), upper=4096), start).cpu()
        assert same(got, store(_drop_heads(a.float(), start), torch.float16)) == 0
        plans.append(tte.metrics()["plans_built"])
    assert tte.metrics()["compiles"] == 1
    assert plans == [1, 1, 2, 2]


def _mlp16(x, w):
    """A pre-norm MLP block as Spyre runs it in float16, or its df16
    reference on float16 tensors (each op's float32 result stored once)."""
    if x.device.type == "tpu":
        h = F.layer_norm(x, (x.shape[1],), w["g"], w["b"])
        return x + F.gelu(h @ w["w1"]) @ w["w2"]
    f = {k: v.float() for k, v in w.items()}
    h = store(F.layer_norm(x.float(), (x.shape[1],), f["g"], f["b"]), torch.float16)
    t = store(matmul_ref(h, f["w1"]), torch.float16)
    t = store(F.gelu(t.float()), torch.float16)
    t = store(matmul_ref(t, f["w2"]), torch.float16)
    return store(x.float() + t.float(), torch.float16)


def _weights16(shapes, seed):
    """float16 weights of `shapes` (scaled by 0.1, as the device holds them)
    on the host and on the device."""
    w = {
        k: store(_inputs(torch.float16, seed=seed + i, shape=s).float() * 0.1, torch.float16)
        for i, (k, s) in enumerate(shapes.items())
    }
    return w, {k: v.to("tpu") for k, v in w.items()}


def test_an_mlp_block_plans_once_when_n_equals_a_weight_size(spyre_target):
    # x (n, 64) marked at its rows, n = 64 first (w1's 64 rows, x's own 64
    # columns equal n), then 77, 16 (w1's 256 columns are 16n), 256 (w2's
    # rows): a weight (only read, of no mark) keeps its sizes as numbers and
    # is not split by rows that equal its dim 0 by chance; a result's dim the
    # size probe finds fixed (layer_norm's 64 columns) stays a number. One
    # compile and one plan per region (main at b5d23e0: 5 compiles, 9
    # plans); the df16 reference's values.
    tte = spyre_target
    from torch_tpu_eager import spyre

    w, wd = _weights16({"g": (64,), "b": (64,), "w1": (64, 256), "w2": (256, 64)}, 300)
    tte.reset_metrics()
    for i, n in enumerate((64, 77, 16, 256, 64)):
        a = _inputs(torch.float16, seed=310 + i, shape=(n, 64))
        got = _mlp16(_marked(tte, a, (0,), 611), wd).cpu()
        assert same(got, _mlp16(a, w)) == 0
        text = spyre.dump_ktir()
        assert "%0 = view HBM df16(f16) %a0 offset=0 sizes=[s0, 64] strides=[64, 1]" in text, text
    m = tte.metrics()
    assert m["compiles"] == 3 and m["plans_built"] == 3


def test_an_unmarked_whole_input_of_the_rows_size_and_a_slice(spyre_target):
    # The guards of the rule above. An input of no mark read whole that is
    # no weight (a (n, 64) tensor made on the host, unmarked) keeps its
    # sizes as numbers: each n plans its own program, never a binding of
    # another n's; marked too, one program. A slice of a storage of no mark
    # (a causal mask buffer's bias[:n, :64]) follows the rows by value: one
    # program per JIT compile (the slice, of no mark, keys by its power of
    # two: n = 40, 50, 64 one). The df16 reference's values.
    tte = spyre_target
    bias = _inputs(torch.float16, seed=350, shape=(512, 64))
    bd = bias.to("tpu")
    for mark_b, plans in ((False, 3), (True, 1)):
        tte.reset_metrics()
        for i, n in enumerate((40, 64, 77)):
            a = _inputs(torch.float16, seed=330 + i, shape=(n, 64))
            b = _inputs(torch.float16, seed=340 + i, shape=(n, 64))
            db = _marked(tte, b, (0,), 613) if mark_b else b.to("tpu")
            got = (_marked(tte, a, (0,), 613) * db).cpu()
            assert same(got, store(a.float() * b.float(), torch.float16)) == 0
        assert tte.metrics()["plans_built"] == plans
    tte.reset_metrics()
    for i, n in enumerate((40, 50, 64)):
        a = _inputs(torch.float16, seed=360 + i, shape=(n, 64))
        got = (_marked(tte, a, (0,), 617) * bd[:n]).cpu()
        assert same(got, store(a.float() * bias[:n].float(), torch.float16)) == 0
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def _attn16(x, w):
    """A pre-norm attention block (4 heads of 16, softmax in float32) as
    Spyre runs it in float16, or its df16 reference on float16 tensors (each
    op's float32 result stored once; the float32 softmax kept)."""
    n = x.shape[0]
    if x.device.type == "tpu":
        h = F.layer_norm(x, (64,), w["g"], w["b"]) @ w["wqkv"]
        q, k, v = (t.view(n, 4, 16).transpose(0, 1) for t in h.chunk(3, -1))
        p = torch.softmax(((q @ k.transpose(-2, -1)) * 0.25).float(), -1).half()
        return x + (p @ v).transpose(0, 1).reshape(n, 64) @ w["wo"]
    f = {k: v.float() for k, v in w.items()}
    h = store(F.layer_norm(x.float(), (64,), f["g"], f["b"]), torch.float16)
    h = store(matmul_ref(h, f["wqkv"]), torch.float16).float()
    q, k, v = (t.reshape(n, 4, 16).transpose(0, 1) for t in h.chunk(3, -1))
    s = store(store(matmul_ref(q, k.transpose(-2, -1)), torch.float16).float() * 0.25, torch.float16)
    p = store(torch.softmax(s.float(), -1), torch.float16).float()
    o = store(matmul_ref(p, v), torch.float16).float().transpose(0, 1).reshape(n, 64)
    return store(x.float() + store(matmul_ref(o, f["wo"]), torch.float16).float(), torch.float16)


def test_an_attention_block_plans_once_when_n_equals_the_head_dim(spyre_target):
    # x (n, 64) marked at its rows; n = 16 is the head dim: p @ v of (4, 16,
    # 16) and (4, 16, 16) has two dims equal to n, and neither operand is a
    # weight. The JIT's size probe (carry_marks: the ops rerun on meta
    # tensors with the marked dims grown) finds the head dim fixed, so the
    # regions after it key as at every other n: no compile and no plan after
    # the first n (main at 131ceab: 2 compiles and 2 plans at n = 16, and
    # more at n = 40, each bound to the n = 16 program). n = 64 is the width
    # D. The df16 reference's values.
    tte = spyre_target
    w, wd = _weights16({"g": (64,), "b": (64,), "wqkv": (64, 192), "wo": (64, 64)}, 370)
    tte.reset_metrics()
    counts = []
    for i, n in enumerate((23, 16, 40, 64, 16)):
        a = _inputs(torch.float16, seed=380 + i, shape=(n, 64))
        got = _attn16(_marked(tte, a, (0,), 619), wd).cpu()
        assert same(got, _attn16(a, w)) == 0
        m = tte.metrics()
        counts.append((m["compiles"], m["plans_built"]))
    assert counts[0][0] == counts[0][1] >= 7
    assert counts == [counts[0]] * 5


def _job_program():
    """(program, programs) of the last flush's first Compute step (None
    where the plan has no such key)."""
    from torch_tpu_eager import spyre

    step = next(s for s in spyre.job_plan()["steps"] if s["kind"] == "Compute")
    return step.get("program"), step.get("programs")


def test_a_kernel_keeps_several_programs_and_binds_each_again(spyre_target):
    # d.t()[:, s::2] with the start s alternating shares one key (offsets
    # are not in it); each start's program is kept beside the other, so a
    # launch binds the one that fits instead of planning again (main at
    # 131ceab: a plan at every change, 6). The job plan's Compute step says
    # which program (numbered in order of compiling) of how many it bound.
    # The df16 reference's values.
    tte = spyre_target
    tte.reset_metrics()
    counts = []
    for seed, (n, s) in enumerate(((40, 0), (77, 1), (130, 0), (41, 1), (42, 0), (44, 1))):
        a = _inputs(torch.float16, seed=500 + seed, shape=(n, 16))
        got = (_marked(tte, a, (0,)).t()[:, s::2] * 2.0).cpu()
        assert same(got, store(a.float().t()[:, s::2] * 2.0, torch.float16)) == 0
        m = tte.metrics()
        counts.append((m["compiles"], m["plans_built"]) + _job_program())
    assert [c[:2] for c in counts] == [(1, 1), (1, 2), (1, 2), (1, 2), (1, 2), (1, 2)]
    assert [c[2:] for c in counts] == [(0, 1), (1, 2), (0, 2), (1, 2), (0, 2), (1, 2)]


def test_a_kernel_keeps_at_most_eight_programs(spyre_target):
    # An unmarked (n, 64) input read whole keeps its sizes as numbers: a
    # program per n. Nine n make nine programs; the kernel keeps the eight
    # most recently used, so the last eight bind again and the first plans
    # again (never a binding of another n's program). df16 reference values.
    tte = spyre_target
    tte.reset_metrics()
    sizes = tuple(range(40, 49))
    plans = []
    for seed, n in enumerate(sizes + sizes[1:] + sizes[:1]):
        a = _inputs(torch.float16, seed=520 + seed, shape=(n, 64))
        b = _inputs(torch.float16, seed=560 + seed, shape=(n, 64))
        got = (_marked(tte, a, (0,), 621) * b.to("tpu")).cpu()
        assert same(got, store(a.float() * b.float(), torch.float16)) == 0
        plans.append(tte.metrics()["plans_built"])
    assert plans == list(range(1, 10)) + [9] * 8 + [10]
    assert _job_program() == (9, 8)


def test_slices_of_tables_cut_to_the_marked_size_keep_one_program(spyre_target):
    # cos[:n] of a (1024, 16) rotary table and a causal mask's mask[:n, :n]
    # of (1024, 1024), next to x (n, 16) marked at its rows: the slices'
    # cut dims key as following n (main at 131ceab: their power of two, a
    # compile per bucket) and are s0 in the program, the table's whole 16
    # columns and element count stay numbers, so n = 16 first (the columns
    # equal n) plans nothing the later n cannot bind. df16 reference values.
    tte = spyre_target
    cos = _inputs(torch.float16, seed=600, shape=(1024, 16))
    mask = _inputs(torch.float16, seed=601, shape=(1024, 1024))
    cd, md = cos.to("tpu"), mask.to("tpu")
    tte.reset_metrics()
    counts = []
    for i, n in enumerate((16, 23, 40, 64, 100)):
        a = _inputs(torch.float16, seed=610 + i, shape=(n, 16))
        d = _marked(tte, a, (0,), 623)
        assert same((d * cd[:n]).cpu(), store(a.float() * cos[:n].float(), torch.float16)) == 0
        assert same((d[:, :1] + md[:n, :n]).cpu(), store(a[:, :1].float() + mask[:n, :n].float(), torch.float16)) == 0
        m = tte.metrics()
        counts.append((m["compiles"], m["plans_built"]))
    assert counts == [(2, 2)] * 5
