"""Sizes affine in the symbols (issue 21 item 3): a slice of a mark_dynamic dim
(`d[:, 1:]`, size n - 1, pitch n) keeps one compiled program for every n in the
range. The symbol is the marked size n (its base); the slice's size is `s0-1`,
the pitch `s0`, the result's storage `16*s0-16` elements. The job plan binds s0
per launch and the verifier checks the views for every value of the range.

Values are checked against the independent df16 reference of
test_spyre_numerics (16-bit) or CPU PyTorch (float32), never the executor.
"""

import pytest
import torch

from difftest import requires_tpu
from test_spyre_numerics import _inputs, same, store

pytestmark = requires_tpu

SWEEP = (40, 64, 100, 130, 200)


def _binding(spyre):
    (step,) = [s for s in spyre.job_plan()["steps"] if s["kind"] == "Compute"]
    return step["binding"]


def test_slice_of_dynamic_inner_dim_keeps_one_program(spyre_target):
    # On main at e38d103 each n built its own program (plans_built 5).
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    texts = []
    for seed, n in enumerate(SWEEP):
        a = _inputs(torch.float16, seed=50 + seed, shape=(16, n))
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 256)
        got = (d[:, 1:] * d[:, 1:] + 1.0).cpu()
        s = a[:, 1:].float()
        want = store(store(s * s, torch.float16).float() + 1.0, torch.float16)
        assert got.shape == (16, n - 1) and same(got, want) == 0
        b = _binding(spyre)
        # s0 is n (the marked size); the slice's pitch is s0, the result's s0-1.
        assert b["s0"] == n and b["%0.strides[0]"] == n
        assert b["%0.sizes[1]"] == n - 1 and b["%a1.elems"] == 16 * (n - 1)
        texts.append(spyre.dump_ktir())
    m = tte.metrics()
    assert m["compiles"] == 1 and m["plans_built"] == 1
    t = texts[0]
    assert "syms=[s0=40] ranges=[2..256]" in t.splitlines()[0]
    assert "%a0 = arg in df16(f16) elems=16*s0\n" in t
    assert "offset=1 sizes=[16, s0-1] strides=[s0, 1]" in t
    assert "elems=16*s0-16" in t and "sizes=[1, s0-1] at=[core*1, 0]" in t
    for text, n in zip(texts, SWEEP):
        assert text == t.replace("s0=40", f"s0={n}")
        assert spyre.format_ktir(text) == text
        spyre.verify_ktir(text)


def test_slices_at_both_ends_and_of_the_split_rows(spyre_target):
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    for seed, n in enumerate((33, 70, 128)):
        a = _inputs(torch.bfloat16, seed=60 + seed, shape=(8, n))
        d = a.to("tpu")
        tte.mark_dynamic(d, 1, 1, 200)
        got = (d[:, 2:] - d[:, :-2]).cpu()
        want = store(a[:, 2:].float() - a[:, :-2].float(), torch.bfloat16)
        assert same(got, want) == 0
        assert "sizes=[8, s0-2] strides=[s0, 1]" in spyre.dump_ktir()
    # Dynamic rows: d[1:] of (n, 64) marked at dim 0 splits s0-1 rows.
    for seed, n in enumerate((37, 50, 64)):
        a = _inputs(torch.float16, seed=70 + seed, shape=(n, 64))
        d = a.to("tpu")
        tte.mark_dynamic(d, 0, 1, 64)
        got = (d[1:] * 3.0).cpu()
        assert same(got, store(a[1:].float() * 3.0, torch.float16)) == 0
        text = spyre.dump_ktir()
        assert "split=dim0(s0-1) rows_per_core=? cores_used=?" in text.splitlines()[0]
        b = _binding(spyre)
        assert b["s0"] == n and b["rows_per_core"] == -(-(n - 1) // 32)
        assert spyre.format_ktir(text) == text
    m = tte.metrics()  # two regions, each built once for its three shapes
    assert m["compiles"] == 2 and m["plans_built"] == 2


def test_float32_slice_equals_cpu(spyre_target):
    tte = spyre_target

    tte.reset_metrics()
    for n in (9, 31, 77):
        x = torch.randn(5, n)
        d = x.to("tpu")
        tte.mark_dynamic(d, 1, 2, 100)
        assert torch.equal((d[:, 1:] * 0.5 + d[:, :-1]).cpu(), x[:, 1:] * 0.5 + x[:, :-1])
    assert tte.metrics()["plans_built"] == 1


AFFINE = (
    "ktir.kernel @k grid=[32] split=dim0 rows_per_core=1 cores_used=4 syms=[s0=10] ranges=[1..100] {\n"
    "  %a0 = arg in f32 elems=8*s0+8\n"
    "  %a1 = arg out f32 elems=4*s0+8\n"
    "  %0 = view HBM f32 %a0 offset=0 sizes=[4, s0+2] strides=[2*s0+2, 1]\n"
    "  %1 = view HBM f32 %a1 offset=0 sizes=[4, s0+2] strides=[s0+2, 1]\n"
    "  tile %0 sizes=[1, s0+2] at=[core*1, 0]\n"
    "  tile %1 sizes=[1, s0+2] at=[core*1, 0]\n"
    "  %1 = neg(%0)\n"
    "}\n"
)


def test_affine_sizes_round_trip_verify_and_run(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    assert spyre.format_ktir(AFFINE) == AFFINE
    spyre.verify_ktir(AFFINE)
    # s0 = 5 from the input's 48 = 8*s0+8 elements: rows of 7 = s0+2 at pitch 12 = 2*s0+2.
    path = tmp_path / "k.ktir"
    path.write_text(AFFINE)
    x = torch.arange(48, dtype=torch.float32)
    (out,) = spyre.run_ktir(str(path), x)
    assert out.numel() == 28 and torch.equal(out.view(4, 7), -x.view(4, 12)[:, :7])
    with pytest.raises(ValueError, match=r"KTIR line 2: rule 'view-bounds'.*8\*s0\+8 elements has 47"):
        spyre.run_ktir(str(path), torch.zeros(47))
    # 8*200+8 elements bind s0 = 200, outside the program's range 1..100.
    with pytest.raises(ValueError, match=r"KTIR line 1: rule 'sym-range': s0=200 is outside its range 1\.\.100"):
        spyre.run_ktir(str(path), torch.zeros(1608))


def test_range_is_verified_for_every_value(spyre_target, tmp_path):
    from torch_tpu_eager import spyre

    # A fixed 200-element argument holds rows of s0-1 at pitch s0 only while
    # 4*s0-1 < 200: every s0 up to 50.
    text = (
        "ktir.kernel @k grid=[32] split=dim0 rows_per_core=1 cores_used=4 syms=[s0=10] ranges=[2..50] {\n"
        "  %a0 = arg in f32 elems=200\n"
        "  %a1 = arg out f32 elems=4*s0-4\n"
        "  %0 = view HBM f32 %a0 offset=1 sizes=[4, s0-1] strides=[s0, 1]\n"
        "  %1 = view HBM f32 %a1 offset=0 sizes=[4, s0-1] strides=[s0-1, 1]\n"
        "  tile %0 sizes=[1, s0-1] at=[core*1, 0]\n"
        "  tile %1 sizes=[1, s0-1] at=[core*1, 0]\n"
        "  %1 = neg(%0)\n"
        "}\n"
    )
    spyre.verify_ktir(text)
    assert spyre.format_ktir(text) == text
    with pytest.raises(
        ValueError, match=r"KTIR line 4: rule 'view-bounds': %0 reaches element 203 of %a0, which has 200 at s0=51"
    ):
        spyre.verify_ktir(text.replace("ranges=[2..50]", "ranges=[2..64]"))
    # s0-2 is negative at s0=1.
    with pytest.raises(ValueError, match=r"KTIR line 4: rule 'view': %0: negative size or stride at s0=1"):
        spyre.verify_ktir(text.replace("ranges=[2..50]", "ranges=[1..50]").replace("s0-1", "s0-2"))
    with pytest.raises(ValueError, match=r"KTIR line 1: rule 'sym-range': s0=60 is outside its range 2\.\.50"):
        spyre.verify_ktir(text.replace("s0=10", "s0=60"))
    with pytest.raises(ValueError, match=r"KTIR line 1: rule 'syntax': ranges=\[\.\.\.\] has one L\.\.U per symbol"):
        spyre.verify_ktir(text.replace("ranges=[2..50]", "ranges=[2..50, 1..3]"))


def test_a_size_that_only_equals_the_symbol_narrows_the_range(spyre_target):
    # y[:, :30] of a (2, 31) y: a slice of a storage of no mark whose fixed 30
    # columns equal the marked size at the first launch, so they are s0 too
    # (its cut dim follows by value); past s0 = 31 they would read beyond y's
    # 62-element storage, so the compiled range stops at 31 (the verifier
    # checks all of it). (Branch spyre21k: a view of y[:60].view(2, 30), whose
    # 30 columns no slice cut, keeps them a number.)
    tte = spyre_target
    from torch_tpu_eager import spyre

    tte.reset_metrics()
    y = torch.randn(2, 31)
    dy = y.to("tpu")[:, :30]
    for n in (30, 31):
        x = torch.randn(2, n)
        d = x.to("tpu")
        tte.mark_dynamic(d, 1, 1, 64)
        assert torch.equal((d[:, :30] + dy).cpu(), x[:, :30] + y[:, :30])
        text = spyre.dump_ktir()
        spyre.verify_ktir(text)
        if n == 30:
            assert "syms=[s0=30] ranges=[1..31]" in text, text
    assert tte.metrics()["plans_built"] == 2  # n = 31's d[:, :30] is s0-1 of pitch s0: a program of its own
