// Softmax's ring partials as native loops (ring_softmax.h).
#include "executors/spyre/ring_softmax.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "executors/cpu_vml.h"
#include "executors/spyre/blocked_loop.h"
#include "executors/spyre/paired_columns.h"

namespace tpu_eager {
namespace spyre {

namespace {

// ATen's CeilLog2 (c10/util/MathConstants): 1 for x <= 2.
int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll(static_cast<uint64_t>(x - 1)); }

// Column max of `len` >= 1 rows of `width` values (row stride n), NaN where
// a column holds one (amax's rule; a zero's sign may differ): a NaN is taken
// and then kept (no value compares greater than it), so the column's last NaN.
template <typename In>
__attribute__((always_inline)) inline void column_max(const In* __restrict x, int64_t len, int64_t n, int64_t width,
                                                      float* __restrict m) {
  int64_t j = 0;
  for (; j + kLanes <= width; j += kLanes) {
    F8 acc = load8(x + j);
    for (int64_t r = 1; r < len; ++r) {
      const F8 v = load8(x + r * n + j);
      const I8 take = (v > acc) | (v != v);
      acc = take ? v : acc;
    }
    store8(m + j, acc);
  }
  for (; j < width; ++j) {
    float acc = widen(x[j]);
    for (int64_t r = 1; r < len; ++r) {
      const float v = widen(x[r * n + j]);
      acc = (v > acc || v != v) ? v : acc;
    }
    m[j] = acc;
  }
}

// d[r * n + j] = x[r * n + j] - m[j] for `len` rows of `width` values.
template <typename In>
__attribute__((always_inline)) inline void row_differences(const In* __restrict x, int64_t len, int64_t n,
                                                           int64_t width, const float* __restrict m,
                                                           float* __restrict d) {
  for (int64_t r = 0; r < len; ++r) {
    const In* xr = x + r * n;
    float* dr = d + r * n;
    int64_t j = 0;
    for (; j + kLanes <= width; j += kLanes) store8(dr + j, load8(xr + j) - load8(m + j));
    for (; j < width; ++j) dr[j] = widen(xr[j]) - m[j];
  }
}

// bfloat16 rows are read in paired order (paired_columns.h): the partials
// keep each whole block of 16 columns in that order (8 even columns, then 8
// odd ones; the columns past the last whole block in place): every step after
// the loads (differences, exps, column sums, merges) treats each column alike
// and apart, so only the merged max and sum are put back in column order.

// The running max of a block of 16 bfloat16 columns in even/odd order, one
// max instruction per 8 values: `v > acc ? v : acc` keeps a NaN acc but drops
// a NaN v (see paired_column_max).
struct PairMax {
  F8 even, odd;
  void start(const uint16_t* p) { load16(p, even, odd); }
  void take(const uint16_t* p) {
    F8 e, o;
    load16(p, e, o);
    even = e > even ? e : even;
    odd = o > odd ? o : odd;
  }
  void store(float* m) const {
    store8(m, even);
    store8(m + kLanes, odd);
  }
};

// Column max of `len` >= 1 rows of n bfloat16 values (row stride n): the
// whole 16-column blocks' maxes in even/odd order (kPair), two blocks per row
// step, the rest by column_max. Where a block's column holds a NaN, its max
// may be the column's largest other value (or NaN); the corelet's sum of that
// column is NaN all the same, which makes every softmax and log_softmax value
// of the column NaN, as a NaN max does (the merges carry a NaN sum: NaN * 0
// is NaN).
__attribute__((always_inline)) inline void paired_column_max(const uint16_t* __restrict x, int64_t len, int64_t n,
                                                             float* __restrict m) {
  const int64_t whole = n / kPair * kPair;
  int64_t j = 0;
  for (; j + 2 * kPair <= whole; j += 2 * kPair) {
    PairMax a, b;
    a.start(x + j);
    b.start(x + j + kPair);
    for (int64_t r = 1; r < len; ++r) {
      a.take(x + r * n + j);
      b.take(x + r * n + j + kPair);
    }
    a.store(m + j);
    b.store(m + j + kPair);
  }
  if (j < whole) {
    PairMax a;
    a.start(x + j);
    for (int64_t r = 1; r < len; ++r) a.take(x + r * n + j);
    a.store(m + j);
  }
  column_max(x + whole, len, n, n - whole, m + whole);
}

// row_differences of bfloat16 rows into the even/odd order of paired_column_max.
__attribute__((always_inline)) inline void paired_row_differences(const uint16_t* __restrict x, int64_t len, int64_t n,
                                                                  const float* __restrict m, float* __restrict d) {
  const int64_t whole = n / kPair * kPair;
  for (int64_t r = 0; r < len; ++r) {
    const uint16_t* xr = x + r * n;
    float* dr = d + r * n;
    for (int64_t j = 0; j < whole; j += kPair) {
      F8 e, o;
      load16(xr + j, e, o);
      store8(dr + j, e - load8(m + j));
      store8(dr + j + kLanes, o - load8(m + j + kLanes));
    }
  }
  row_differences(x + whole, len, n, n - whole, m + whole, d + whole);
}

// Each corelet's column max and its rows' differences from it, for the
// blocks g0 .. g1 - 1: maxes [corelets][G][n], differences of block g at
// work + (g - g0) * rows * n; bfloat16 columns in the even/odd order.
template <typename In>
__attribute__((always_inline)) inline void maxes_and_differences(const In* __restrict x, int64_t g0, int64_t g1,
                                                                 int64_t G, int64_t block_stride, int64_t rows,
                                                                 int64_t n, const int64_t* shares, int64_t corelets,
                                                                 float* __restrict mj, float* __restrict work) {
  for (int64_t g = g0; g < g1; ++g) {
    const In* xg = x + g * block_stride;
    float* dg = work + (g - g0) * rows * n;
    for (int64_t j = 0, r0 = 0; j < corelets; r0 += shares[j], ++j) {
      float* m = mj + (j * G + g) * n;
      if constexpr (std::is_same_v<In, uint16_t>) {
        paired_column_max(xg + r0 * n, shares[j], n, m);
        paired_row_differences(xg + r0 * n, shares[j], n, m, dg + r0 * n);
      } else {
        column_max(xg + r0 * n, shares[j], n, n, m);
        row_differences(xg + r0 * n, shares[j], n, n, m, dg + r0 * n);
      }
    }
  }
}

// maxes_and_differences of each input type, built for AVX2 and the baseline
// (the loader picks the CPU's).
__attribute__((target_clones("avx2", "default"))) void block_partials(const float* x, int64_t g0, int64_t g1, int64_t G,
                                                                      int64_t block_stride, int64_t rows, int64_t n,
                                                                      const int64_t* shares, int64_t corelets,
                                                                      float* mj, float* work) {
  maxes_and_differences(x, g0, g1, G, block_stride, rows, n, shares, corelets, mj, work);
}
__attribute__((target_clones("avx2", "default"))) void block_partials(const uint16_t* x, int64_t g0, int64_t g1,
                                                                      int64_t G, int64_t block_stride, int64_t rows,
                                                                      int64_t n, const int64_t* shares,
                                                                      int64_t corelets, float* mj, float* work) {
  maxes_and_differences(x, g0, g1, G, block_stride, rows, n, shares, corelets, mj, work);
}

// Rows of n values in even/odd order (kPair) put back in column order.
__attribute__((target_clones("avx2", "default"))) void unpair_columns(const float* __restrict src, int64_t count,
                                                                      int64_t n, float* __restrict dst) {
  const int64_t whole = n / kPair * kPair;
  for (int64_t i = 0; i < count; i += n) {
    for (int64_t j = i; j < i + whole; j += kPair) {
      const F8 even = load8(src + j), odd = load8(src + j + kLanes);
      store8(dst + j, __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11));
      store8(dst + j + kLanes, __builtin_shufflevector(even, odd, 4, 12, 5, 13, 6, 14, 7, 15));
    }
    std::copy(src + i + whole, src + i + n, dst + i + whole);
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

__attribute__((target_clones("avx2", "default"))) void add_row(float* __restrict acc, const float* __restrict row,
                                                               int64_t n) {
  blocked(n, [&](int64_t j) { acc[j] += row[j]; });
}

// add_row of `count` rows (stride apart) in row order: each element's adds
// are add_row's, four rows per pass over acc (acc stays in registers).
__attribute__((target_clones("avx2", "default"))) void add_rows(float* __restrict acc, const float* __restrict rows,
                                                                int64_t count, int64_t stride, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const float *r0 = rows + i * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
    blocked(n, [&](int64_t j) { acc[j] = (((acc[j] + r0[j]) + r1[j]) + r2[j]) + r3[j]; });
  }
  for (; i < count; ++i) {
    const float* r = rows + i * stride;
    blocked(n, [&](int64_t j) { acc[j] += r[j]; });
  }
}

// out[j] = the sum of rows[i * stride + j] over i < len in the order of
// ATen's multi_row_sum (SumKernel.cpp): rows added one by one into the first
// of 4 levels, a level carried up every 2^p rows (p = max(4, ceil_log2(len)
// / 4)), the levels added last. acc: 4 * n floats.
void cascade_sum(const float* rows, int64_t len, int64_t stride, int64_t n, float* acc, float* out) {
  constexpr int kLevels = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(len) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  if (len < step) {
    // One level: 0 + row 0 + row 1 + ... (the other levels add zeros; the
    // exps are never -0, so starting from row 0 gives the same values).
    if (len == 0) return std::fill(out, out + n, 0.0f);
    std::copy(rows, rows + n, out);
    return add_rows(out, rows + stride, len - 1, stride, n);
  }
  std::fill(acc, acc + kLevels * n, 0.0f);
  int64_t i = 0;
  while (i + step <= len) {
    add_rows(acc, rows + i * stride, step, stride, n);
    i += step;
    for (int lvl = 1; lvl < kLevels; ++lvl) {
      add_row(acc + lvl * n, acc + (lvl - 1) * n, n);
      std::fill(acc + (lvl - 1) * n, acc + lvl * n, 0.0f);
      if ((i & (mask << (lvl * power))) != 0) break;
    }
  }
  add_rows(acc, rows + i * stride, len - i, stride, n);
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
// rows to lane 0 and then lanes 1, 2, 3 to it. Fewer columns than a vector:
// scalar_outer_sum, the columns in blocks of 4 by multi_row_sum, the rest by
// row_sum. acc: 8 * n floats.
void column_sums(const float* e, int64_t len, int64_t n, float* acc, float* out) {
  const int64_t block = n >= kSumVec ? 4 * kSumVec : 4;
  const int64_t whole = n / block * block;
  if (whole > 0) cascade_sum(e, len, n, whole, acc, out);
  const int64_t rest = n - whole, quads = len / 4;
  if (rest == 0) return;
  float* lanes = acc + 4 * n;  // 4 lanes of `rest` columns
  for (int64_t k = 0; k < 4; ++k) cascade_sum(e + k * n + whole, quads, 4 * n, rest, acc, lanes + k * rest);
  add_rows(lanes, e + quads * 4 * n + whole, len - quads * 4, n, rest);
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

// Differences, exps and sums of the blocks in chunks of about kChunk values,
// whose exps stay in L2 between the steps (one exp call per chunk: MKL's
// VML costs a microsecond or so per call).
constexpr int64_t kChunk = 1 << 15;

template <typename In>
void partials(const In* x, int64_t G, int64_t block_stride, int64_t rows, int64_t n, const int64_t* shares,
              int64_t corelets, float* m_out, float* s_out) {
  const int64_t gn = G * n, block = rows * n;
  const int64_t per_chunk = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, block));
  // Each corelet's max and sum ([corelets][G][n]), the merges' factors, the
  // sums' levels and the chunk's exps (not zeroed: each value is written
  // before it is read).
  std::unique_ptr<float[]> buf(new float[2 * corelets * gn + 2 * gn + 8 * n + std::min(per_chunk, G) * block]);
  float *mj = buf.get(), *sj = mj + corelets * gn, *ea = sj + corelets * gn, *eb = ea + gn, *acc = eb + gn;
  float* work = acc + 8 * n;
  for (int64_t g0 = 0; g0 < G; g0 += per_chunk) {
    const int64_t g1 = std::min(G, g0 + per_chunk);
    block_partials(x, g0, g1, G, block_stride, rows, n, shares, corelets, mj, work);
    vml::exp(work, work, (g1 - g0) * block);
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t j = 0, r0 = 0; j < corelets; r0 += shares[j], ++j)
        column_sums(work + (g - g0) * block + r0 * n, shares[j], n, acc, sj + (j * G + g) * n);
  }
  // The corelets merged in order, all blocks at once, into corelet 0's
  // partials (bfloat16: in even/odd order, then put back in column order).
  for (int64_t j = 1; j < corelets; ++j) {
    merged_max(mj, mj + j * gn, ea, eb, gn);
    vml::exp(ea, ea, gn);
    vml::exp(eb, eb, gn);
    rescaled_sum(sj, ea, sj + j * gn, eb, gn);
  }
  if constexpr (std::is_same_v<In, uint16_t>) {
    unpair_columns(mj, gn, n, m_out);
    unpair_columns(sj, gn, n, s_out);
  } else {
    std::copy(mj, mj + gn, m_out);
    std::copy(sj, sj + gn, s_out);
  }
}

}  // namespace

void softmax_ring_partials(const void* x, bool bf16, int64_t G, int64_t block_stride, int64_t rows, int64_t n,
                           const int64_t* shares, int64_t corelets, float* m_out, float* s_out) {
  if (bf16)
    partials(static_cast<const uint16_t*>(x), G, block_stride, rows, n, shares, corelets, m_out, s_out);
  else
    partials(static_cast<const float*>(x), G, block_stride, rows, n, shares, corelets, m_out, s_out);
}

}  // namespace spyre
}  // namespace tpu_eager
