"""Spyre's 16-bit matmul (mm, bmm of float16 / bfloat16 operands) by the direct
kernel (executors/spyre/matmul16.cpp, branch spyre22b): each dot product is
summed in f32 in k order from 0 and rounded once to df16. The reference is
test_spyre_numerics' matmul_ref (one f32 add of the exact product per k, torch
ops on the df16 operands) and its df16 codec, never the kernel itself; the
AVX-512, AVX2 + FMA and baseline builds give the same bits.
"""

import pytest
import torch

from difftest import cpu_features_off, requires_tpu
from test_spyre_numerics import _inputs, matmul_ref, same, store

pytestmark = requires_tpu

DTYPES = [torch.float16, torch.bfloat16]
IDS = ["f16", "bf16"]
# (M, K, N): row blocks of 8 (AVX-512) and 6 (AVX2) with tails, panels of 32
# and 16 columns with tails, K past one 256-row pass over a panel.
SHAPES = [(96, 512, 128), (37, 33, 45), (5, 300, 17), (1, 1, 1), (129, 64, 100), (9, 600, 31)]


def _mm(a, b):
    return (a.to("tpu") @ b.to("tpu")).cpu()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mm_sums_each_dot_product_in_k_order(spyre_target, dtype, shape):
    M, K, N = shape
    a = _inputs(dtype, seed=40, shape=(M, K))
    b = _inputs(dtype, seed=41, shape=(K, N))
    got = _mm(a, b)
    assert got.dtype == dtype and got.shape == (M, N)
    assert same(got, store(matmul_ref(a, b), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_the_reference_tells_the_order(spyre_target, dtype):
    # df16 of CPU's f32 matmul (MKL's order) differs from the k-order sums in
    # some elements of a 96x512 @ 512x128 product (2 bf16, 20 f16): a kernel
    # summing in another order would fail the test above.
    a = _inputs(dtype, seed=40, shape=(96, 512))
    b = _inputs(dtype, seed=41, shape=(512, 128))
    assert same(store(a.float() @ b.float(), dtype), store(matmul_ref(a, b), dtype)) > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bmm_and_transposed_operands(spyre_target, dtype):
    q = _inputs(dtype, seed=42, shape=(4, 33, 20))
    k = _inputs(dtype, seed=43, shape=(4, 47, 20))
    got = (q.to("tpu") @ k.to("tpu").transpose(1, 2)).cpu()
    assert same(got, store(matmul_ref(q, k.transpose(1, 2)), dtype)) == 0
    w = _inputs(dtype, seed=44, shape=(20, 50))
    got = (k.to("tpu")[0] @ w.to("tpu")[:, 3:40]).cpu()
    assert same(got, store(matmul_ref(k[0], w[:, 3:40]), dtype)) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_special_values(spyre_target, dtype):
    # NaN (df16's NaN/Inf code), zeros of both signs, sums past df16's range
    # (NaN) and under its zero limit (zero).
    a = _inputs(dtype, seed=45, shape=(19, 40))
    b = _inputs(dtype, seed=46, shape=(40, 35))
    a[0, 3] = float("nan")
    b[7, 2] = float("nan")
    a[1] = 0.0
    a[2] = -0.0
    b[:, 5] = -0.0
    if dtype == torch.bfloat16:
        a[3] = 2.0**20
        b[:, 6] = 2.0**20  # row 3 . col 6 overflows df16
        a[4] = 2.0**-20
        b[:, 7] = 2.0**-20  # row 4 . col 7 is under the zero limit
    got = _mm(a, b)
    assert same(got, store(matmul_ref(a, b), dtype)) == 0
    assert torch.isnan(got[0]).all() and torch.isnan(got[:, 2]).all()


@pytest.mark.parametrize("off", [("avx512f",), ("avx512f", "avx2", "fma")], ids=["avx2", "baseline"])
def test_each_cpu_build_same_bits(spyre_target, off):
    outs = []
    for dtype in DTYPES:
        for M, K, N in [(37, 600, 45), (8, 33, 32), (13, 7, 70)]:
            a = _inputs(dtype, seed=47, shape=(M, K))
            b = _inputs(dtype, seed=48, shape=(K, N))
            wide = _mm(a, b)
            with cpu_features_off(*off):
                narrow = _mm(a, b)
            assert torch.equal(wide.view(torch.int16), narrow.view(torch.int16))
            assert same(narrow, store(matmul_ref(a, b), dtype)) == 0
            outs.append(narrow)
    assert outs
