"""Sizes the region creates and strides that are products of symbols (issue 21
item 3): a tensor with two or three mark_dynamic dims (`[s0, s1, s2]`: stride
`s1*s2`, elements `s0*s1*s2`) and `cat([d, d], 1)`'s `2*s0` keep one compiled
program for every shape in the ranges; the verifier checks the products over
every combination of the ranges (each symbol's values at the corners of the
others').

Values are checked against the independent df16 reference of
test_spyre_numerics (16-bit), never the executor. On main at ffb79ae each
shape built its own program (plans_built 3 in each sweep).
"""

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import _inputs, same, store

pytestmark = requires_tpu


def test_two_dynamic_dims_keep_one_program(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, (m, n) in enumerate(((40, 43), (64, 17), (100, 130))):
        a = _inputs(torch.float16, seed=80 + seed, shape=(m, n))
        d = a.to("tpu")
        tte.mark_dynamic(d, 0, 1, 256)
        tte.mark_dynamic(d, 1, 1, 256)
        got = (d * d + 1.0).cpu()
        s = a.float()
        assert same(got, store(store(s * s, torch.float16).float() + 1.0, torch.float16)) == 0
        text = spyre.dump_ktir()
        assert f"syms=[s0={m}, s1={n}] ranges=[1..256, 1..256]" in text.splitlines()[0]
        assert "elems=s0*s1\n" in text and "sizes=[s0, s1] strides=[s1, 1]" in text
        assert spyre.format_ktir(text) == text
        spyre.verify_ktir(text)
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


def test_product_strides_round_trip_and_run(spyre_target, tmp_path):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    texts = []
    for seed, shape in enumerate(((10, 9, 40), (3, 20, 7), (6, 5, 33))):
        a = _inputs(torch.float16, seed=90 + seed, shape=shape)
        d = a.to("tpu")
        for dim in range(3):
            tte.mark_dynamic(d, dim, 1, 64)
        got = (d * 2.0 + 1.0).cpu()
        assert same(got, store(store(a.float() * 2.0, torch.float16).float() + 1.0, torch.float16)) == 0
        texts.append(spyre.dump_ktir())
    assert tte.metrics()["plans_built"] == 1
    text = texts[0]
    assert "%a0 = arg in df16(f16) elems=s0*s1*s2\n" in text
    assert "offset=0 sizes=[s0, s1, s2] strides=[s1*s2, s2, 1]" in text
    assert spyre.format_ktir(text) == text
    # The dumped file, its header bound to another shape, runs by run_ktir.
    path = tmp_path / "k.ktir"
    path.write_text(text.replace("syms=[s0=10, s1=9, s2=40]", "syms=[s0=4, s1=11, s2=13]"))
    x = _inputs(torch.float16, seed=99, shape=(4, 11, 13))
    (out,) = spyre.run_ktir(str(path), x.reshape(-1))
    want = store(store(x.float() * 2.0, torch.float16).float() + 1.0, torch.float16)
    assert same(out.view(4, 11, 13), want) == 0


def test_cat_of_a_dynamic_dim_keeps_one_program(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate((40, 64, 100)):
        a = _inputs(torch.float16, seed=110 + seed, shape=(16, n))
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 256)
        got = (torch.cat([d, d], 1) + 1.0).cpu()
        want = store(torch.cat([a, a], 1).float() + 1.0, torch.float16)
        assert got.shape == (16, 2 * n) and same(got, want) == 0
        text = spyre.dump_ktir()
        assert "elems=32*s0\n" in text and "sizes=[16, 2*s0] strides=[2*s0, 1]" in text
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1


PRODUCT = (
    "ktir.kernel @k grid=[32] split=dim0(s0) rows_per_core=? cores_used=? syms=[s0=40, s1=40] "
    "ranges=[35..40, 35..40] {\n"
    "  %a0 = arg in f32 elems=40*s0+40*s1-1600\n"
    "  %a1 = arg out f32 elems=s0*s1\n"
    "  %0 = view HBM f32 %a0 offset=0 sizes=[s0, s1] strides=[s1, 1]\n"
    "  %1 = view HBM f32 %a1 offset=0 sizes=[s0, s1] strides=[s1, 1]\n"
    "  tile %0 sizes=[?, s1] at=[core*?, 0]\n"
    "  tile %1 sizes=[?, s1] at=[core*?, 0]\n"
    "  %1 = neg(%0)\n"
    "}\n"
)


def test_products_are_checked_at_every_combination(spyre_target):
    from torch_tpu_eager import spyre

    # %a0 holds s0*s1 elements while either symbol is 40 (40*s0+40*s1-1600 =
    # s0*s1 there), not when both are smaller: the check tries each value of
    # one symbol with the other at its range's ends, so it finds s0=s1=35.
    assert spyre.format_ktir(PRODUCT) == PRODUCT
    with pytest.raises(
        ValueError,
        match=r"KTIR line 4: rule 'view-bounds': %0 reaches element 1224 of %a0, which has 1200 at s0=35, s1=35",
    ):
        spyre.verify_ktir(PRODUCT)
    spyre.verify_ktir(PRODUCT.replace("ranges=[35..40, 35..40]", "ranges=[40..40, 35..40]"))
    # A bad edited size: the result's elems one short of its view.
    bad = PRODUCT.replace("ranges=[35..40, 35..40]", "ranges=[40..40, 40..40]").replace(
        "elems=s0*s1\n", "elems=s0*s1-1\n"
    )
    with pytest.raises(ValueError, match=r"KTIR line 5: rule 'view-bounds': %1 reaches element 1599 of %a1"):
        spyre.verify_ktir(bad)


BROADCAST_ROW = (
    "ktir.kernel @k grid=[32] split=dim0(s0) rows_per_core=? cores_used=? syms=[s0=4, s1=6] ranges=[1..64, 1..64] {\n"
    "  %a0 = arg in f32 elems=s0*s1\n"
    "  %a1 = arg in f32 elems=s1\n"
    "  %a2 = arg out f32 elems=s0*s1\n"
    "  %0 = view HBM f32 %a0 offset=0 sizes=[s0, s1] strides=[s1, 1]\n"
    "  %1 = view HBM f32 %a1 offset=0 sizes=[1, s1] strides=[s1, 1]\n"
    "  %2 = view HBM f32 %a2 offset=0 sizes=[s0, s1] strides=[s1, 1]\n"
    "  tile %0 sizes=[?, s1] at=[core*?, 0]\n"
    "  tile %1 sizes=[1, s1] at=[0, 0]\n"
    "  tile %2 sizes=[?, s1] at=[core*?, 0]\n"
    "  %2 = add.Tensor(%0, %1, 1)\n"
    "}\n"
)


def test_run_ktir_binds_a_product_once_the_other_symbol_is_bound(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    # s1 = 7 from the row's 7 elements, then s0 = 35 / 7 from s0*s1.
    assert spyre.format_ktir(BROADCAST_ROW) == BROADCAST_ROW
    path = tmp_path / "k.ktir"
    path.write_text(BROADCAST_ROW)
    x, r = torch.randn(35), torch.randn(7)
    (out,) = spyre.run_ktir(str(path), x, r)
    assert torch.equal(out.view(5, 7), x.view(5, 7) + r)
    with pytest.raises(ValueError, match=r"KTIR line 2: rule 'view-bounds'.*s0\*s1 elements has 36"):
        spyre.run_ktir(str(path), torch.randn(36), r)


@pytest.mark.parametrize(
    "shape, fn, text",
    [
        # d[1:, 1:] of (m, n): offset s1+1, result elems (s0-1)*(s1-1).
        (lambda n: (n, n // 2 + 3), lambda d: d[1:, 1:] * 2.0, "elems=s0*s1-s0-s1+1\n"),
        # A square tensor marked at both dims: one symbol, s0*s0 elements.
        (lambda n: (n, n), lambda d: d * 3.0, "elems=s0*s0\n"),
    ],
)
def test_float32_two_dim_slice_and_square_equal_cpu(spyre_target, shape, fn, text):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for n in (40, 64, 100):
        x = torch.randn(*shape(n))
        d = x.to("tpu")
        tte.mark_dynamic(d, 0, 1, 256)
        tte.mark_dynamic(d, 1, 1, 256)
        assert torch.equal(fn(d).cpu(), fn(x))
        assert text in spyre.dump_ktir()
    assert tte.metrics()["plans_built"] == 1
