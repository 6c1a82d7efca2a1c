// Softmax's ring partials as native loops (ring_softmax.h).
#include "executors/spyre/ring_softmax.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "executors/cpu_vml.h"

namespace tpu_eager {
namespace spyre {

namespace {

// ATen's CeilLog2 (c10/util/MathConstants): 1 for x <= 2.
int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll(static_cast<uint64_t>(x - 1)); }

// Values per inner block: a fixed trip count is what lets GCC's -O2 (cheap)
// vectorizer take a loop (as in df16.cpp); the tail runs scalar.
constexpr int64_t kBlock = 64;

// f(j) for j < n, in blocks of kBlock, then of 8. Inlined into each caller, so it takes
// the caller's target (the AVX2 clones below vectorize it).
template <typename F>
__attribute__((always_inline)) inline void blocked(int64_t n, F f) {
  constexpr int64_t kShort = 8;  // one AVX2 vector: most of a row's tail
  int64_t j = 0;
  for (; j + kBlock <= n; j += kBlock)
    for (int64_t k = 0; k < kBlock; ++k) f(j + k);
  for (; j + kShort <= n; j += kShort)
    for (int64_t k = 0; k < kShort; ++k) f(j + k);
  for (; j < n; ++j) f(j);
}

// Column max of `len` >= 1 rows of n values (row stride n), NaN where a
// column holds one (amax's rule; a zero's sign may differ): a NaN is taken
// and then kept (no value compares greater than it).
__attribute__((target_clones("avx2", "default"))) void column_max(const float* __restrict x, int64_t len, int64_t n,
                                                                  float* __restrict m) {
  std::copy(x, x + n, m);
  for (int64_t r = 1; r < len; ++r) {
    const float* xr = x + r * n;
    blocked(n, [&](int64_t j) { m[j] = (xr[j] > m[j] || xr[j] != xr[j]) ? xr[j] : m[j]; });
  }
}

// The merge of corelet maxes a (earlier rows) and b: M = at::maximum(a, b)
// (NaN if either is), and the differences a - M, b - M.
__attribute__((target_clones("avx2", "default"))) void merged_max(float* __restrict a, const float* __restrict b,
                                                                  float* __restrict da, float* __restrict db,
                                                                  int64_t n) {
  blocked(n, [&](int64_t j) {
    const float x = a[j], y = b[j];
    const float M = (x != x) ? x : (y != y || y > x) ? y : x;
    da[j] = x - M;
    db[j] = y - M;
    a[j] = M;
  });
}

// d[r * n + j] = x[r * n + j] - m[j] for `len` rows.
__attribute__((target_clones("avx2", "default"))) void row_differences(const float* __restrict x, int64_t len,
                                                                       int64_t n, const float* __restrict m,
                                                                       float* __restrict d) {
  for (int64_t r = 0; r < len; ++r) {
    const float* xr = x + r * n;
    float* dr = d + r * n;
    blocked(n, [&](int64_t j) { dr[j] = xr[j] - m[j]; });
  }
}

__attribute__((target_clones("avx2", "default"))) void add_row(float* __restrict acc, const float* __restrict row,
                                                               int64_t n) {
  blocked(n, [&](int64_t j) { acc[j] += row[j]; });
}

// out[j] += sum of rows[i * stride + j] over i < len in the order of ATen's
// multi_row_sum (SumKernel.cpp): rows added one by one into the first of 4
// levels, a level carried up every 2^p rows (p = max(4, ceil_log2(len) /
// 4)), the levels added last. acc: 4 * n floats.
void cascade_sum(const float* rows, int64_t len, int64_t stride, int64_t n, float* acc, float* out) {
  constexpr int kLevels = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(len) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  if (len < step) {
    // One level: 0 + row 0 + row 1 + ... (the other levels add zeros; the
    // exps are never -0, so starting from row 0 gives the same values).
    if (len == 0) return std::fill(out, out + n, 0.0f);
    std::copy(rows, rows + n, out);
    for (int64_t i = 1; i < len; ++i) add_row(out, rows + i * stride, n);
    return;
  }
  std::fill(acc, acc + kLevels * n, 0.0f);
  int64_t i = 0;
  while (i + step <= len) {
    for (int64_t k = 0; k < step; ++k, ++i) add_row(acc, rows + i * stride, n);
    for (int lvl = 1; lvl < kLevels; ++lvl) {
      add_row(acc + lvl * n, acc + (lvl - 1) * n, n);
      std::fill(acc + (lvl - 1) * n, acc + lvl * n, 0.0f);
      if ((i & (mask << (lvl * power))) != 0) break;
    }
  }
  for (; i < len; ++i) add_row(acc, rows + i * stride, n);
  for (int lvl = 1; lvl < kLevels; ++lvl) add_row(acc, acc + lvl * n, n);
  std::copy(acc, acc + n, out);
}

// ATen's float32 sum kernel runs for AVX2 (and DEFAULT) with 8-float
// vectors even on AVX512 CPUs (SumKernel.cpp registers no AVX512 kernel).
constexpr int64_t kSumVec = 8;

// The column sums of `len` rows of n values (row stride n) in the order of
// ATen's sum over an outer dim (vectorized_outer_sum): the columns in whole
// blocks of 4 vectors by multi_row_sum; the rest by row_sum, which sums 4
// interleaved lanes (rows 4i + k) by multi_row_sum, adds the last len % 4
// rows to lane 0 and then lanes 1, 2, 3 to it. ATen stores 0 + the sum.
// Fewer columns than a vector: scalar_outer_sum, the columns in blocks of 4
// by multi_row_sum, the rest by row_sum. acc: 8 * n floats.
void column_sums(const float* e, int64_t len, int64_t n, float* acc, float* out) {
  const int64_t block = n >= kSumVec ? 4 * kSumVec : 4;
  const int64_t whole = n / block * block;
  if (whole > 0) cascade_sum(e, len, n, whole, acc, out);
  const int64_t rest = n - whole, quads = len / 4;
  if (rest == 0) return;
  float* lanes = acc + 4 * n;  // 4 lanes of `rest` columns
  for (int64_t k = 0; k < 4; ++k) cascade_sum(e + k * n + whole, quads, 4 * n, rest, acc, lanes + k * rest);
  for (int64_t i = quads * 4; i < len; ++i) add_row(lanes, e + i * n + whole, rest);
  for (int64_t k = 1; k < 4; ++k) add_row(lanes, lanes + k * rest, rest);
  std::copy(lanes, lanes + rest, out + whole);
}

// s = s * ea + sb * eb, each product rounded (the ATen mul, mul, add).
__attribute__((target_clones("avx2", "default"))) void rescaled_sum(float* __restrict s, const float* __restrict ea,
                                                                    const float* __restrict sb,
                                                                    const float* __restrict eb, int64_t n) {
  blocked(n, [&](int64_t j) {
    const float a = s[j] * ea[j];
    const float b = sb[j] * eb[j];
    s[j] = a + b;
  });
}

}  // namespace

void softmax_ring_partials(const float* x, int64_t G, int64_t block_stride, int64_t rows, int64_t n,
                           const int64_t* shares, int64_t corelets, float* work, float* m_out, float* s_out) {
  const int64_t gn = G * n;
  // Each corelet's max (corelet-major: [corelets][G][n]) and differences.
  // Scratch of the merges (not zeroed: each value is written before it is read).
  std::unique_ptr<float[]> buf(new float[2 * corelets * gn + 2 * gn + 8 * n]);
  float *mj = buf.get(), *sj = mj + corelets * gn, *ea = sj + corelets * gn, *eb = ea + gn, *acc = eb + gn;
  for (int64_t g = 0; g < G; ++g) {
    const float* xg = x + g * block_stride;
    float* dg = work + g * rows * n;
    for (int64_t j = 0, r0 = 0; j < corelets; r0 += shares[j], ++j) {
      float* m = mj + j * gn + g * n;
      column_max(xg + r0 * n, shares[j], n, m);
      row_differences(xg + r0 * n, shares[j], n, m, dg + r0 * n);
    }
  }
  vml::exp(work, work, G * rows * n);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0, r0 = 0; j < corelets; r0 += shares[j], ++j)
      column_sums(work + (g * rows + r0) * n, shares[j], n, acc, sj + j * gn + g * n);
  // The corelets merged in order, all blocks at once.
  std::copy(mj, mj + gn, m_out);
  std::copy(sj, sj + gn, s_out);
  for (int64_t j = 1; j < corelets; ++j) {
    merged_max(m_out, mj + j * gn, ea, eb, gn);
    vml::exp(ea, ea, gn);
    vml::exp(eb, eb, gn);
    rescaled_sum(s_out, ea, sj + j * gn, eb, gn);
  }
}

}  // namespace spyre
}  // namespace tpu_eager
