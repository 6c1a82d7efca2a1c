// Sums of 16-bit rows and columns read in place (reduce16.h).
#include "executors/spyre/reduce16.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "executors/cpu_features.h"
#include "executors/direct_kernels.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/df16_ops.h"
#include "executors/spyre/paired_columns.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace spyre {
namespace {

#define TPU_INLINE __attribute__((always_inline)) inline

// ATen's CeilLog2 (c10/util/MathConstants): 1 for x <= 2.
TPU_INLINE int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll(static_cast<uint64_t>(x - 1)); }

// How 16-bit values are widened: bfloat16 by a shift; float16 by bit
// operations, or (kF16c, in the F16C build only) by vcvtph2ps, which is exact.
enum Mode : int { kBf16, kF16Bits, kF16c };

// The exact float32 value of bfloat16 (kBf16) or float16 bits, one or 8 at a
// time. float16: its exponent and fraction moved into place and scaled by
// 2^112 (exact for normal and subnormal values alike), the top exponent as
// f32's infinity / NaN, the sign put back.
template <int kMode>
TPU_INLINE float widen1(uint16_t h) {
  if constexpr (kMode == kBf16) return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
  const uint32_t em = static_cast<uint32_t>(h & 0x7FFFu) << 13;
  uint32_t u = (h & 0x7C00u) == 0x7C00u ? (em | 0x7F800000u)
                                        : __builtin_bit_cast(uint32_t, __builtin_bit_cast(float, em) * 0x1p112f);
  return __builtin_bit_cast(float, u | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// The float16 values in the low 16 bits of w's lanes (the rest zero), widened.
// U / F / I: 32-bit unsigned, float and signed vectors of one lane count (8 or 4).
template <typename F = F8, typename I = I8, typename U>
TPU_INLINE F widen_bits(U w) {
  const U em = (w & 0x7FFFu) << 13;
  const U scaled = reinterpret_cast<U>(reinterpret_cast<F>(em) * 0x1p112f);
  const I top = (w & 0x7C00u) == 0x7C00u;
  const U u = top ? (em | 0x7F800000u) : scaled;
  return reinterpret_cast<F>(u | ((w & 0x8000u) << 16));
}

// The 16-bit values at p (H: their vector, as many lanes as U), widened exactly by bit
// operations: bfloat16 by a shift, float16 by widen_bits.
template <int kMode, typename H, typename U, typename F, typename I>
TPU_INLINE F widen_lanes(const uint16_t* p) {
  H h;
  std::memcpy(&h, p, sizeof h);
  const U w = __builtin_convertvector(h, U);
  if constexpr (kMode == kBf16) return reinterpret_cast<F>(w << 16);
  return widen_bits<F, I>(w);
}

// 8 float16 values at p by F16C's vcvtph2ps (GCC 12 converts _Float16
// vectors one value at a time). Only the F16C build reaches it. The builtin
// behind _mm256_cvtph_ps: the intrinsic carries target("f16c"), which the
// always_inline templates between it and the F16C build do not, so GCC
// refuses to inline it; the builtin is checked where it is expanded, in
// the F16C build (one vcvtph2ps with a memory operand, objdump).
TPU_INLINE F8 cvtph8(const uint16_t* p) {
  typedef short Half8 __attribute__((vector_size(16), aligned(2), may_alias));
  return __builtin_ia32_vcvtph2ps256(*reinterpret_cast<const Half8*>(p));
}

// 4 float16 / bfloat16 values at p as a 4-float vector, widened exactly (float16 by bit
// operations in every build: the lanes of 4 columns summed side by side).
typedef float F4 __attribute__((vector_size(16)));
typedef uint32_t U4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef uint16_t H4 __attribute__((vector_size(8)));
template <int kMode>
TPU_INLINE F4 widen4(const uint16_t* p) {
  return widen_lanes<kMode, H4, U4, F4, I4>(p);
}

template <int kMode>
TPU_INLINE F8 widen8(const uint16_t* p) {
  if constexpr (kMode == kF16c) return cvtph8(p);
  return widen_lanes<kMode, H8, U8, F8, I8>(p);
}

// Four accumulators (the 4 rows of ATen's multi_row_sum), held in registers.
template <typename T>
struct Quad {
  T v[4];
};
template <typename T>
TPU_INLINE void add4(Quad<T>& a, const Quad<T>& b) {
  a.v[0] += b.v[0], a.v[1] += b.v[1], a.v[2] += b.v[2], a.v[3] += b.v[3];
}

// ATen's multi_row_sum with 4 rows (SumKernel.cpp): item i of the 4 rows
// (`load(i, q)` fills q) added one by one into the first of 4 levels, a level
// carried up every 2^p items (p = max(4, ceil_log2(size) / 4)), the levels
// added last. T: float or F8. Without a carry (size < 2^p) the upper levels
// stay zero and their adds are skipped: adding +0 only turns a -0 into +0,
// which a sum started at +0 never is.
template <typename T, typename Load>
TPU_INLINE Quad<T> multi_row_sum4(int64_t size, Load load) {
  const int64_t power = std::max<int64_t>(4, ceil_log2(size) / 4);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  Quad<T> l0{}, l1{}, l2{}, l3{};
  auto pass = [&](int64_t from, int64_t to) __attribute__((always_inline)) {
    Quad<T> a = l0;
    for (int64_t r = from; r < to; ++r) {
      Quad<T> q;
      load(r, q);
      add4(a, q);
    }
    l0 = a;
  };
  if (size < step) {
    pass(0, size);
    return l0;
  }
  int64_t i = 0;
  while (i + step <= size) {
    pass(i, i + step);
    i += step;
    add4(l1, l0), l0 = Quad<T>{};
    if ((i & (mask << power)) != 0) continue;
    add4(l2, l1), l1 = Quad<T>{};
    if ((i & (mask << (2 * power))) != 0) continue;
    add4(l3, l2), l2 = Quad<T>{};
  }
  pass(i, size);
  add4(l0, l1), add4(l0, l2), add4(l0, l3);
  return l0;
}

// 16 values at p as two F8 in paired order (paired_columns.h): the even
// ones (p[0], p[2], ...) and the odd ones, widened exactly.
// kF16c: the 16 values in column order instead (p[0..7], p[8..15]).
template <int kMode>
TPU_INLINE void load_pair(const uint16_t* p, F8& even, F8& odd) {
  if constexpr (kMode == kF16c) {
    even = cvtph8(p);
    odd = cvtph8(p + kLanes);
  } else if constexpr (kMode == kBf16) {
    load16(p, even, odd);
  } else {
    U8 w;
    std::memcpy(&w, p, sizeof w);
    even = widen_bits(w & 0xFFFFu);
    odd = widen_bits(w >> 16);
  }
}

// Paired lanes back in order: lanes 0-3 of (even, odd) interleaved, then 4-7.
// (kF16c's loads are in order already.)
template <int kMode>
TPU_INLINE F8 unpair_lo(F8 even, F8 odd) {
  if constexpr (kMode == kF16c) return even;
  return __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11);
}
template <int kMode>
TPU_INLINE F8 unpair_hi(F8 even, F8 odd) {
  if constexpr (kMode == kF16c) return odd;
  return __builtin_shufflevector(even, odd, 4, 12, 5, 13, 6, 14, 7, 15);
}

// ATen's row_sum: `size` items as 4 interleaved lanes (items 4i + k) by
// multi_row_sum4, the last size % 4 items added to lane 0, then lanes 1, 2, 3.
template <typename T>
TPU_INLINE T lanes_sum(const Quad<T>& p) {
  return p.v[0] + p.v[1] + p.v[2] + p.v[3];
}
template <typename T, typename Load>
TPU_INLINE T row_sum(int64_t size, Load load) {
  const int64_t quads = size / 4;
  Quad<T> p = multi_row_sum4<T>(
      quads, [&](int64_t i, Quad<T> & q) __attribute__((always_inline)) {
        for (int k = 0; k < 4; ++k) q.v[k] = load(4 * i + k);
      });
  for (int64_t i = quads * 4; i < size; ++i) p.v[0] += load(i);
  return lanes_sum(p);
}

// One row of n values: vectorized_inner_sum (n >= 8: 8-float vectors by
// row_sum, the last n % 8 values summed from 0, then the vector's lanes in
// order) or scalar_inner_sum; added to the zeroed output. The vectors'
// groups of 4 (32 values) are read as two paired loads: each lane sums the
// same values in the same order; the lanes are put back in order after the
// cascade.
template <int kMode>
TPU_INLINE float one_row(const uint16_t* x, int64_t n) {
  if (n < kLanes)
    return 0.0f + row_sum<float>(
                      n, [&](int64_t i) __attribute__((always_inline)) { return widen1<kMode>(x[i]); });
  const int64_t vecs = n / kLanes, quads = vecs / 4;
  const Quad<F8> s = multi_row_sum4<F8>(
      quads, [&](int64_t i, Quad<F8> & q) __attribute__((always_inline)) {
        load_pair<kMode>(x + i * 4 * kLanes, q.v[0], q.v[1]);
        load_pair<kMode>(x + i * 4 * kLanes + kPair, q.v[2], q.v[3]);
      });
  Quad<F8> p{{unpair_lo<kMode>(s.v[0], s.v[1]), unpair_hi<kMode>(s.v[0], s.v[1]), unpair_lo<kMode>(s.v[2], s.v[3]),
              unpair_hi<kMode>(s.v[2], s.v[3])}};
  for (int64_t i = quads * 4; i < vecs; ++i) p.v[0] += widen8<kMode>(x + i * kLanes);
  const F8 v = lanes_sum(p);
  float f = 0.0f;
  for (int64_t k = vecs * kLanes; k < n; ++k) f += widen1<kMode>(x[k]);
  for (int l = 0; l < kLanes; ++l) f += v[l];
  return 0.0f + f;
}

template <int kMode>
TPU_INLINE void rows_impl(const uint16_t* x, int64_t rows, int64_t n, int64_t rs, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = one_row<kMode>(x + r * rs, n);
}

// vectorized_outer_sum (n >= 8): columns in whole blocks of 4 vectors by
// multi_row_sum4 over the rows (one chain per column; read as paired loads,
// put back in order at the store), the rest by row_sum (8 columns at a time,
// then one by one); scalar_outer_sum (n < 8): blocks of 4 columns by
// multi_row_sum4, the rest by row_sum. Added to the zeroed output.
template <int kMode>
TPU_INLINE void columns_impl(const uint16_t* x, int64_t len, int64_t n, int64_t rs, float* out) {
  const bool vec = n >= kLanes;
  const int64_t whole = vec ? n / (4 * kLanes) * (4 * kLanes) : n / 4 * 4;
  int64_t j = 0;
  for (; vec && j < whole; j += 4 * kLanes) {
    const Quad<F8> s = multi_row_sum4<F8>(
        len, [&](int64_t i, Quad<F8> & q) __attribute__((always_inline)) {
          load_pair<kMode>(x + i * rs + j, q.v[0], q.v[1]);
          load_pair<kMode>(x + i * rs + j + kPair, q.v[2], q.v[3]);
        });
    store8(out + j, F8{} + unpair_lo<kMode>(s.v[0], s.v[1]));
    store8(out + j + kLanes, F8{} + unpair_hi<kMode>(s.v[0], s.v[1]));
    store8(out + j + 2 * kLanes, F8{} + unpair_lo<kMode>(s.v[2], s.v[3]));
    store8(out + j + 3 * kLanes, F8{} + unpair_hi<kMode>(s.v[2], s.v[3]));
  }
  for (; !vec && j < whole; j += 4) {
    const Quad<float> s = multi_row_sum4<float>(
        len, [&](int64_t i, Quad<float> & q) __attribute__((always_inline)) {
          for (int k = 0; k < 4; ++k) q.v[k] = widen1<kMode>(x[i * rs + j + k]);
        });
    for (int k = 0; k < 4; ++k) out[j + k] = 0.0f + s.v[k];
  }
  for (; vec && j + kLanes <= n; j += kLanes)
    store8(out + j,
           F8{} + row_sum<F8>(
                      len, [&](int64_t i) __attribute__((always_inline)) { return widen8<kMode>(x + i * rs + j); }));
  // The last columns 4 at a time as the lanes of one vector (each lane its column's row_sum, the
  // same adds in the same order), then one by one.
  for (; vec && j + 4 <= n; j += 4) {
    const F4 r =
        F4{} + row_sum<F4>(
                   len, [&](int64_t i) __attribute__((always_inline)) { return widen4<kMode>(x + i * rs + j); });
    std::memcpy(out + j, &r, sizeof r);
  }
  for (; j < n; ++j)
    out[j] = 0.0f + row_sum<float>(
                        len, [&](int64_t i) __attribute__((always_inline)) { return widen1<kMode>(x[i * rs + j]); });
}

// Each loop built for AVX2 (float16 by F16C when the CPU has it) and for the
// baseline (the same IEEE adds in the same order, so the same bits), chosen by
// cpu::has at each call.
#define TPU_REDUCE16_BUILDS(name, impl)                                                                            \
  __attribute__((target("avx2,f16c"))) void name##_f16c(const uint16_t* x, int64_t a, int64_t n, int64_t rs,       \
                                                        float* out) {                                              \
    impl<kF16c>(x, a, n, rs, out);                                                                                 \
  }                                                                                                                \
  __attribute__((target("avx2"))) void name##_avx2(const uint16_t* x, bool bf16, int64_t a, int64_t n, int64_t rs, \
                                                   float* out) {                                                   \
    bf16 ? impl<kBf16>(x, a, n, rs, out) : impl<kF16Bits>(x, a, n, rs, out);                                       \
  }                                                                                                                \
  void name##_base(const uint16_t* x, bool bf16, int64_t a, int64_t n, int64_t rs, float* out) {                   \
    bf16 ? impl<kBf16>(x, a, n, rs, out) : impl<kF16Bits>(x, a, n, rs, out);                                       \
  }
TPU_REDUCE16_BUILDS(rows, rows_impl)
TPU_REDUCE16_BUILDS(columns, columns_impl)
#undef TPU_REDUCE16_BUILDS

// Float32 rows in CPU's sum kernel's order: its 8-float vectors (torch 2.13
// builds SumKernel.cpp for AVX2 and DEFAULT only, both 8 floats a vector: an
// AVX512 CPU runs the AVX2 kernel; host::cpu_sum_kernel_width() says 8 then).

// 8 unaligned floats at p (an unaligned vector type's load: GCC folds it into the add, where a
// memcpy into F8 went through the stack).
TPU_INLINE F8 loadu8(const float* p) {
  typedef float Unaligned __attribute__((vector_size(32), aligned(4), may_alias));
  return *reinterpret_cast<const Unaligned*>(p);
}

// One float32 row of n values (unit stride) as CPU's sum kernel sums it: vectorized_inner_sum for
// n >= 8 (8-float vectors by row_sum, the last n % 8 values summed from 0, then the vector's lanes in
// order), scalar_inner_sum below (row_sum of the values); added to the zeroed output.
TPU_INLINE float one_row_f32(const float* x, int64_t n) {
  if (n < kLanes)
    return 0.0f + row_sum<float>(
                      n, [&](int64_t i) __attribute__((always_inline)) { return x[i]; });
  // row_sum over the vectors, its 4 loads written out (a loop over them kept the vectors on the stack).
  const int64_t vecs = n / kLanes, quads = vecs / 4;
  Quad<F8> p = multi_row_sum4<F8>(
      quads, [&](int64_t i, Quad<F8> & q) __attribute__((always_inline)) {
        const float* r = x + i * 4 * kLanes;
        q.v[0] = loadu8(r), q.v[1] = loadu8(r + kLanes), q.v[2] = loadu8(r + 2 * kLanes),
        q.v[3] = loadu8(r + 3 * kLanes);
      });
  for (int64_t i = quads * 4; i < vecs; ++i) p.v[0] += loadu8(x + i * kLanes);
  const F8 v = lanes_sum(p);
  float f = 0.0f;
  for (int64_t k = vecs * kLanes; k < n; ++k) f += x[k];
  for (int l = 0; l < kLanes; ++l) f += v[l];
  return 0.0f + f;
}

TPU_INLINE void rows_f32_impl(const float* x, int64_t rows, int64_t n, int64_t rs, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = one_row_f32(x + r * rs, n);
}

// The float32 row loop built for AVX2 and the baseline (two SSE vectors per F8: the same adds in the
// same order, so the same bits); chosen by cpu::has at each call.
__attribute__((target("avx2"))) void rows_f32_avx2(const float* x, int64_t rows, int64_t n, int64_t rs, float* out) {
  rows_f32_impl(x, rows, n, rs, out);
}
void rows_f32_base(const float* x, int64_t rows, int64_t n, int64_t rs, float* out) {
  rows_f32_impl(x, rows, n, rs, out);
}

// a[j] += b[j], j < n (f32 adds; 8 at a time, the same values), built for AVX2 (one vector an
// add: the ring partials' adds were two SSE ones each) and the baseline, chosen by cpu::has.
TPU_INLINE void add_rows_impl(float* a, const float* b, int64_t n) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) store8(a + j, load8(a + j) + load8(b + j));
  for (; j < n; ++j) a[j] += b[j];
}
__attribute__((target("avx2"))) void add_rows_avx2(float* a, const float* b, int64_t n) { add_rows_impl(a, b, n); }
void add_rows_base(float* a, const float* b, int64_t n) { add_rows_impl(a, b, n); }
void add_rows(float* a, const float* b, int64_t n, bool avx2) {
  avx2 ? add_rows_avx2(a, b, n) : add_rows_base(a, b, n);
}

}  // namespace

void row_sums16(const uint16_t* x, bool bf16, int64_t rows, int64_t n, int64_t row_stride, float* out) {
  if (!bf16 && cpu::has(cpu::Feature::kAvx2) && cpu::has(cpu::Feature::kF16c))
    rows_f16c(x, rows, n, row_stride, out);
  else if (cpu::has(cpu::Feature::kAvx2))
    rows_avx2(x, bf16, rows, n, row_stride, out);
  else
    rows_base(x, bf16, rows, n, row_stride, out);
}

void column_sums16(const uint16_t* x, bool bf16, int64_t len, int64_t n, int64_t row_stride, float* out) {
  if (!bf16 && cpu::has(cpu::Feature::kAvx2) && cpu::has(cpu::Feature::kF16c))
    columns_f16c(x, len, n, row_stride, out);
  else if (cpu::has(cpu::Feature::kAvx2))
    columns_avx2(x, bf16, len, n, row_stride, out);
  else
    columns_base(x, bf16, len, n, row_stride, out);
}

bool row_sums_f32(const float* x, int64_t rows, int64_t n, int64_t row_stride, float* out) {
  if (host::cpu_sum_kernel_width() != kLanes) return false;
  if (cpu::has(cpu::Feature::kAvx2))
    rows_f32_avx2(x, rows, n, row_stride, out);
  else
    rows_f32_base(x, rows, n, row_stride, out);
  return true;
}

int64_t sum_rows_width(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                       const std::vector<c10::ScalarType>& result_dtypes) {
  if (lowering_of(op).row != RowReduce::kSum || stack.size() != 4 || !stack[0].isTensor() || !stack[1].isIntList() ||
      !stack[2].isBool() || !stack[3].isNone())
    return 0;
  const at::Tensor& x = stack[0].toTensor();
  const bool f32 = x.defined() && x.scalar_type() == c10::kFloat;
  if (!x.defined() || !(is_dtype16(x.scalar_type()) || (f32 && host::cpu_sum_kernel_width() == kLanes)) ||
      !x.device().is_cpu() || x.dim() < 1 || !x.is_contiguous() || result_dtypes.empty() ||
      result_dtypes[0] != x.scalar_type())
    return 0;
  const std::vector<int64_t> dims = stack[1].toIntVector();
  const int64_t last = x.dim() - 1, n = x.size(last);
  if (dims.size() != 1 || (dims[0] != last && dims[0] != -1) || n == 0 || n >= at::internal::GRAIN_SIZE) return 0;
  return n;
}

int64_t sum16_rows_width(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         const std::vector<c10::ScalarType>& result_dtypes) {
  if (stack.empty() || !stack[0].isTensor() || !stack[0].toTensor().defined() ||
      !is_dtype16(stack[0].toTensor().scalar_type()))
    return 0;
  return sum_rows_width(op, stack, result_dtypes);
}

bool sum16_call(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                const std::vector<c10::ScalarType>& result_dtypes) {
  const int64_t n = sum16_rows_width(op, stack, result_dtypes);
  if (n == 0) return false;
  const at::Tensor& x = stack[0].toTensor();
  const int64_t rows = x.numel() / n, last = x.dim() - 1;
  at::Tensor f = at::empty({rows}, x.options().dtype(at::kFloat));
  row_sums16(static_cast<const uint16_t*>(x.const_data_ptr()), x.scalar_type() == c10::kBFloat16, rows, n, n,
             f.mutable_data_ptr<float>());
  std::vector<int64_t> sizes = x.sizes().vec();
  if (stack[2].toBool())
    sizes[last] = 1;
  else
    sizes.pop_back();
  at::Tensor out = df16_store(f, x.scalar_type()).view(sizes);
  stack.clear();
  stack.emplace_back(std::move(out));
  return true;
}

bool sum_partials_fit(const at::Tensor& X, const std::vector<int64_t>& shares) {
  const bool f32 = X.scalar_type() == c10::kFloat;
  if (!(is_dtype16(X.scalar_type()) || f32) || X.dim() < 3 || X.size(1) == 0 || X.size(0) == 0) return false;
  const int64_t n = X.numel() / (X.size(0) * X.size(1));
  if (n < 2 || !X[0].is_contiguous() || X.stride(1) != n) return false;
  if (!f32) return true;
  // float32: host::cpu_column_sums' cases (CPU's order reproduced, every share of 2 rows or more).
  if (host::cpu_sum_kernel_width() == 0) return false;
  return std::all_of(shares.begin(), shares.end(), [](int64_t m) { return m >= 2; });
}

void sum_partials_into(const at::Tensor& X, const std::vector<int64_t>& shares, float* acc, bool add) {
  const int64_t G = X.size(0), n = X.numel() / (G * X.size(1));
  // Partials of one block, each written before it is read (no zeroing).
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(2 * n)) scratch.resize(2 * n);
  float *part = scratch.data(), *core = part + n;
  const bool avx2 = cpu::has(cpu::Feature::kAvx2);
  const bool f32 = X.scalar_type() == c10::kFloat, bf16 = X.scalar_type() == c10::kBFloat16;
  const auto* x16 = f32 ? nullptr : static_cast<const uint16_t*>(X.const_data_ptr());
  const auto* x32 = f32 ? static_cast<const float*>(X.const_data_ptr()) : nullptr;
  for (int64_t g = 0; g < G; ++g) {
    float* a = acc + g * n;
    float* o = add ? core : a;
    int64_t r0 = 0;
    for (size_t c = 0; c < shares.size(); r0 += shares[c], ++c) {
      // ring_merge's add of the later corelet's partial (f32, in order).
      const int64_t at_row = g * X.stride(0) + r0 * X.stride(1);
      float* dst = c == 0 ? o : part;
      if (f32) {
        TORCH_CHECK(host::cpu_column_sums(x32 + at_row, shares[c], n, dst), "sum_partials_into: no CPU column sum");
      } else {
        column_sums16(x16 + at_row, bf16, shares[c], n, X.stride(1), dst);
      }
      if (c > 0) add_rows(o, part, n, avx2);
    }
    if (add) add_rows(a, o, n, avx2);  // the step's partial after the core's earlier ones
  }
}

at::Tensor sum_partials(const at::Tensor& X, const std::vector<int64_t>& shares) {
  std::vector<int64_t> sizes = X.sizes().vec();
  sizes[1] = 1;
  at::Tensor q = at::empty(sizes, X.options().dtype(at::kFloat));
  sum_partials_into(X, shares, q.mutable_data_ptr<float>(), false);
  return q;
}

}  // namespace spyre
}  // namespace tpu_eager
