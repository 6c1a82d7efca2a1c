// The Spyre target's 16-bit matmul as a direct kernel (matmul16.h).
#include "executors/spyre/matmul16.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "executors/cpu_features.h"
#include "executors/spyre/convert16.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace spyre {
namespace {

// Rows of b per pass over a panel: a panel's kKc rows (kKc x 32 floats with
// AVX-512, 32 KiB) stay in L1 while every row block of a passes over them.
constexpr int64_t kKc = 256;

// Elements per thread chunk of the operands' widening and the result's store.
constexpr int64_t kConvertGrain = 1 << 15;

// One block of R rows of c and 2 vectors of columns (STEP floats each): c[r, :]
// continues its k-order sum over kc more rows of the panel bp (kc x 2 STEP,
// unit stride), from 0 when `first`, else from the partial sums c holds (the
// same order: a sum stored and reloaded is the same float). Written once for
// both vector widths (V, its intrinsics).
#define TPU_MATMUL16_BLOCK(V, STEP, ZERO, LOAD, STORE, SET1, FMADD)              \
  {                                                                              \
    V lo[R], hi[R];                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                        \
      lo[r] = first ? ZERO() : LOAD(c + r * ldc);                                \
      hi[r] = first ? ZERO() : LOAD(c + r * ldc + STEP);                         \
    }                                                                            \
    for (int64_t k = 0; k < kc; ++k) {                                           \
      const V b0 = LOAD(bp + k * 2 * STEP), b1 = LOAD(bp + k * 2 * STEP + STEP); \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                      \
        const V x = SET1(a[r * lda + k]);                                        \
        lo[r] = FMADD(x, b0, lo[r]);                                             \
        hi[r] = FMADD(x, b1, hi[r]);                                             \
      }                                                                          \
    }                                                                            \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                        \
      STORE(c + r * ldc, lo[r]);                                                 \
      STORE(c + r * ldc + STEP, hi[r]);                                          \
    }                                                                            \
  }

// R <= 8 rows of 32 columns.
template <int R>
__attribute__((target("avx512f"))) void block_avx512(const float* a, int64_t lda, const float* bp, float* c,
                                                     int64_t ldc, int64_t kc, bool first) {
  TPU_MATMUL16_BLOCK(__m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps);
}

// R <= 6 rows of 16 columns.
template <int R>
__attribute__((target("avx2,fma"))) void block_avx2(const float* a, int64_t lda, const float* bp, float* c, int64_t ldc,
                                                    int64_t kc, bool first) {
  TPU_MATMUL16_BLOCK(__m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps);
}
#undef TPU_MATMUL16_BLOCK

using BlockFn = void (*)(const float*, int64_t, const float*, float*, int64_t, int64_t, bool);

// A vector build: its panel width, its most rows per block, and its block
// of each row count (rows[r - 1] takes r rows).
struct Build {
  int64_t nr, mr;
  BlockFn rows[8];
};

constexpr Build kAvx512{32,
                        8,
                        {block_avx512<1>, block_avx512<2>, block_avx512<3>, block_avx512<4>, block_avx512<5>,
                         block_avx512<6>, block_avx512<7>, block_avx512<8>}};
constexpr Build kAvx2{
    16, 6, {block_avx2<1>, block_avx2<2>, block_avx2<3>, block_avx2<4>, block_avx2<5>, block_avx2<6>}};

// The vector builds' loop: b packed one panel of nr columns at a time (the
// last one padded with zeros), each panel's rows kKc at a time, the row
// blocks of a over them. A partial last panel runs on a scratch block of c.
void run_panels(const Build& v, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                int64_t M, int64_t N, int64_t K) {
  const int64_t nr = v.nr, mr = v.mr;
  std::unique_ptr<float[]> panel(new float[K * nr]);
  float tmp[8 * 32];
  for (int64_t j0 = 0; j0 < N; j0 += nr) {
    const int64_t w = std::min(nr, N - j0);
    for (int64_t k = 0; k < K; ++k) {
      float* row = panel.get() + k * nr;
      std::memcpy(row, b + k * ldb + j0, w * sizeof(float));
      std::fill(row + w, row + nr, 0.0f);
    }
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      const bool first = k0 == 0;
      for (int64_t i0 = 0; i0 < M; i0 += mr) {
        const int64_t rows = std::min(mr, M - i0);
        const BlockFn f = v.rows[rows - 1];
        const float* ai = a + i0 * lda + k0;
        float* ci = c + i0 * ldc + j0;
        if (w == nr) {
          f(ai, lda, panel.get() + k0 * nr, ci, ldc, kc, first);
          continue;
        }
        for (int64_t r = 0; r < rows && !first; ++r) std::copy(ci + r * ldc, ci + r * ldc + w, tmp + r * nr);
        f(ai, lda, panel.get() + k0 * nr, tmp, nr, kc, first);
        for (int64_t r = 0; r < rows; ++r) std::copy(tmp + r * nr, tmp + r * nr + w, ci + r * ldc);
      }
    }
  }
}

// The baseline build: the same fused multiply-adds, element by element.
void run_scalar(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t M, int64_t N,
                int64_t K) {
  for (int64_t i = 0; i < M; ++i) {
    float* ci = c + i * ldc;
    std::fill(ci, ci + N, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float x = a[i * lda + k];
      const float* bk = b + k * ldb;
      for (int64_t j = 0; j < N; ++j) ci[j] = std::fma(x, bk[j], ci[j]);
    }
  }
}

}  // namespace

void matmul_in_k_order(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t M,
                       int64_t N, int64_t K) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
    return;
  }
  if (cpu::has(cpu::Feature::kAvx512f))
    run_panels(kAvx512, a, lda, b, ldb, c, ldc, M, N, K);
  else if (cpu::has(cpu::Feature::kAvx2) && cpu::has(cpu::Feature::kFma))
    run_panels(kAvx2, a, lda, b, ldb, c, ldc, M, N, K);
  else
    run_scalar(a, lda, b, ldb, c, ldc, M, N, K);
}

bool matmul16_call(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                   const std::vector<c10::ScalarType>& result_dtypes) {
  const Lowering& lowering = lowering_of(op);
  const bool mm = lowering.mxu == MxuOp::kMm, bmm = lowering.mxu == MxuOp::kBmm;
  if ((!mm && !bmm) || lowering.form != OpForm::kFunctional || stack.size() != 2 || !stack[0].isTensor() ||
      !stack[1].isTensor())
    return false;
  const at::Tensor& a = stack[0].toTensor();
  const at::Tensor& b = stack[1].toTensor();
  const int64_t d = mm ? 2 : 3;
  if (!a.defined() || !b.defined() || !is_dtype16(a.scalar_type()) || b.scalar_type() != a.scalar_type() ||
      result_dtypes.empty() || result_dtypes[0] != a.scalar_type() || !a.device().is_cpu() || !b.device().is_cpu() ||
      a.dim() != d || b.dim() != d)
    return false;
  const int64_t batch = bmm ? a.size(0) : 1, M = a.size(d - 2), K = a.size(d - 1), N = b.size(d - 1);
  if ((bmm && b.size(0) != batch) || b.size(d - 2) != K || batch == 0 || M == 0 || N == 0 || K == 0) return false;
  // The operands' f32 values (exact), row-major, widened from their 16-bit
  // bits (a strided operand is made contiguous in its dtype first), and the
  // f32 product, in one buffer: no ATen conversion, no f32 tensors.
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const c10::ScalarType dt = a.scalar_type();
  const int64_t na = batch * M * K, nb = batch * K * N, nc = batch * M * N;
  std::unique_ptr<float[]> buf(new float[na + nb + nc]);
  float* ap = buf.get();
  float* bp = ap + na;
  float* cp = bp + nb;
  auto bits = [](const at::Tensor& t) { return static_cast<const uint16_t*>(t.const_data_ptr()); };
  at::parallel_for(0, na, kConvertGrain, [&](int64_t i, int64_t e) { widen16(dt, bits(ac) + i, ap + i, e - i); });
  at::parallel_for(0, nb, kConvertGrain, [&](int64_t i, int64_t e) { widen16(dt, bits(bc) + i, bp + i, e - i); });
  for (int64_t g = 0; g < batch; ++g)
    matmul_in_k_order(ap + g * M * K, K, bp + g * K * N, N, cp + g * M * N, N, M, N, K);
  at::Tensor out = at::empty(mm ? std::vector<int64_t>{M, N} : std::vector<int64_t>{batch, M, N}, a.options());
  auto* out_bits = static_cast<uint16_t*>(out.mutable_data_ptr());
  at::parallel_for(0, nc, kConvertGrain, [&](int64_t i, int64_t e) { store16(dt, cp + i, out_bits + i, e - i); });
  stack.clear();
  stack.emplace_back(std::move(out));
  return true;
}

}  // namespace spyre
}  // namespace tpu_eager
