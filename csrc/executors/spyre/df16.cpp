// df16 codec over arrays and tensors (format and rounding rules in df16.h).
#include "executors/spyre/df16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "executors/cpu_features.h"
#include "executors/cpu_vml.h"
#include "executors/spyre/blocked_loop.h"
#include "executors/spyre/paired_columns.h"

namespace tpu_eager {
namespace spyre {

namespace {

// Below this many elements one thread is faster than waking the pool.
constexpr int64_t kGrain = 1 << 15;

// dst[i] = f(src[i]) in blocks of kLoopBlock (src and dst may be the same array:
// each element is read before it is written). Inlined into each caller, so it
// takes the caller's target (the AVX2 clones below vectorize it).
template <typename In, typename Out, typename F>
inline void map_blocked(const In* src, Out* dst, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLoopBlock <= n; i += kLoopBlock)
    for (int64_t j = 0; j < kLoopBlock; ++j) dst[i + j] = f(src[i + j]);
  for (; i < n; ++i) dst[i] = f(src[i]);
}

// The modes are template parameters so each loop body is one fixed select
// chain. Works on the IEEE bits (memcpy'd floats do not vectorize).
template <Df16Rounding R, Df16Overflow O>
void encode_loop(const uint32_t* __restrict src, uint16_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_from_f32_bits(u, R, O); });
}

void decode_loop(const uint16_t* __restrict src, uint32_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint16_t h) { return df16_to_f32_bits(h); });
}

// Built for AVX2 and for the baseline; the loader picks the CPU's (ifunc).
__attribute__((target_clones("avx2", "default"))) void round_loop(const uint32_t* __restrict src,
                                                                  uint32_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_round_f32_bits(u); });
}

__attribute__((target_clones("avx2", "default"))) void round_bf16_loop(const uint32_t* __restrict src,
                                                                       uint16_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_round_bf16_bits(u); });
}

__attribute__((target_clones("avx2", "default"))) void round_bf16_in_place_loop(uint16_t* p, int64_t n) {
  map_blocked(p, p, n, [](uint16_t b) { return df16_round_bf16_half(b); });
}

// The IEEE bits of f (as memcpy gives them); unlike memcpy, the builtin
// keeps a loop over an array of floats vectorizable.
inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

// Softmax's quotient e / s by the reciprocal. With r = 1/s rounded to f32
// (|s| in [2^-126, 2^126]: r normal, relative error <= 2^-24), e * r is the
// rounding of a real within 2^-24 * t of t = e / s, less than t's ulp, and so
// within 4 f32 bit steps of e / s rounded (2 within t's binade, 4 across its
// lower edge; a subnormal t: 1).
// df16_round_bf16_bits(u) depends on u only through (u + 2^13) >> 14 (its zero
// and NaN limits, 0x30002000 and 0x4FFFA000, sit where that carries too), so
// where u = bits(e * r) is more than kReciprocalSlack steps from such a carry
// the divide rounds the same; elsewhere the divide is taken. For s = 0, +-inf
// or NaN, e * r and e / s are the same IEEE value (inf, 0 or NaN).
constexpr uint32_t kReciprocalSlack = 8;

// df16_round_bf16_bits(u) for the bits u of a quotient by the reciprocal,
// with its sign and NaN selects dropped: right for u in [+0, 0x4FFFA000)
// (below the NaN limit). `slow` gets a nonzero where u is outside that range
// or within kReciprocalSlack bit steps of a df16 carry (a = u + 2^13 near a
// multiple of 2^14), where the divide is taken instead.
inline uint16_t quotient_bf16_bits(uint32_t u, uint32_t& slow) {
  const uint32_t a = u + detail::kHalf;
  slow |= static_cast<uint32_t>(((a + kReciprocalSlack) & 0x3FFFu) < 2 * kReciprocalSlack) |
          static_cast<uint32_t>(u >= 0x4FFFA000u);
  const uint32_t v = (a & ~0x3FFFu) & (0u - static_cast<uint32_t>(static_cast<int32_t>(u) >= 0x30002000));
  return static_cast<uint16_t>((v + 0x7FFFu + ((v >> 16) & 1u)) >> 16);
}

// Whether the quotients by every s[j] (j < n) may be taken by the reciprocal:
// |s| in [2^-126, 2^126], 0, inf or NaN (see kReciprocalSlack).
bool reciprocal_fits(const float* s, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float a = std::fabs(s[j]);
    if ((a > 0.0f && a < 0x1p-126f) || (a > 0x1p126f && a < INFINITY)) return false;
  }
  return true;
}

// o[j] = bf16 bits of df16(e[j] / s[j]) for j < n: by the reciprocal rs[j] =
// 1/s[j] (kReciprocalSlack), a whole block by the divide where one of its
// quotients is slow (quotient_bf16_bits); rs == nullptr: by the divide.
__attribute__((always_inline)) inline void quotients_to_bf16(const float* __restrict e, const float* __restrict s,
                                                             const float* __restrict rs, uint16_t* __restrict o,
                                                             int64_t n) {
  auto divided = [&](int64_t j) { o[j] = df16_round_bf16_bits(f32_bits(e[j] / s[j])); };
  if (rs == nullptr) return blocked(n, divided);
  // A block of `width` quotients by the reciprocal, redone by the divide
  // when one is slow (near a carry: about 1 in 2^10 values).
  auto block = [&](int64_t j, auto width) {
    uint32_t slow = 0;
    for (int64_t k = 0; k < decltype(width)::value; ++k)
      o[j + k] = quotient_bf16_bits(f32_bits(e[j + k] * rs[j + k]), slow);
    if (slow != 0)
      for (int64_t k = 0; k < decltype(width)::value; ++k) divided(j + k);
  };
  int64_t j = 0;
  for (; j + kLoopBlock <= n; j += kLoopBlock) block(j, std::integral_constant<int64_t, kLoopBlock>{});
  for (; j + kLoopShort <= n; j += kLoopShort) block(j, std::integral_constant<int64_t, kLoopShort>{});
  for (; j < n; ++j) divided(j);
}

// d[j] = x[j] - m[j] for j < n (x: f32, or bf16 read as its f32 widening).
// Written out, not by blocked(): a lambda's captured pointers lose
// __restrict, and the float store could then alias m.
template <typename In>
__attribute__((always_inline)) inline void differences(const In* __restrict x, const float* __restrict m,
                                                       float* __restrict d, int64_t n) {
  int64_t j = 0;
  for (; j + kLoopBlock <= n; j += kLoopBlock)
    for (int64_t k = 0; k < kLoopBlock; ++k) d[j + k] = widen(x[j + k]) - m[j + k];
  for (; j + kLoopShort <= n; j += kLoopShort)
    for (int64_t k = 0; k < kLoopShort; ++k) d[j + k] = widen(x[j + k]) - m[j + k];
  for (; j < n; ++j) d[j] = widen(x[j]) - m[j];
}

// Softmax's normalizing pass over `count` contiguous values (f32, or bf16
// bits read as their exact f32 widening) whose sums and maxes repeat every
// `period` values (a whole number of rows of n; m, s and rs hold one period):
// dst[i] = bf16 bits of df16(exp(x[i] - m[i % period]) / s[i % period]). The
// difference and the quotient are IEEE f32 (as at::sub's and at::div's), the
// exp is CPU's float32 exp (vml::exp, as torch.exp), so each value is the one
// x.float().sub(m).exp().div(s) gives, rounded once. `buf` holds count
// floats (the exps); rs: the reciprocals of s, or nullptr (quotients_to_bf16).
// One exp call for all values: MKL's VML costs microseconds per call.
template <typename In>
__attribute__((always_inline)) inline void softmax_bf16_values(const In* __restrict x, const float* __restrict m,
                                                               const float* __restrict s, const float* __restrict rs,
                                                               float* __restrict buf, uint16_t* __restrict dst,
                                                               int64_t count, int64_t period) {
  for (int64_t i = 0; i < count; i += period) differences(x + i, m, buf + i, std::min(period, count - i));
  vml::exp(buf, buf, count);
  for (int64_t i = 0; i < count; i += period) quotients_to_bf16(buf + i, s, rs, dst + i, std::min(period, count - i));
}

// softmax_bf16_values of float32 x, built for AVX2 and the baseline.
__attribute__((target_clones("avx2", "default"))) void softmax_values(const float* x, const float* m, const float* s,
                                                                      const float* rs, float* buf, uint16_t* dst,
                                                                      int64_t count, int64_t period) {
  softmax_bf16_values(x, m, s, rs, buf, dst, count, period);
}

// bfloat16 input: the normalizing pass in paired order (paired_columns.h).
// m, s and rs hold each whole block of kPair values of the period in paired
// order, and so do the exps in buf; the quotients go back into column order
// with their store (store_pairs), so nothing is shuffled. Values past the
// period's (or the last period's) whole blocks stay in place.

// The quotient rounding of quotient_bf16_bits on 8 lanes of u = bits(e *
// 1/s): the bfloat16 result in the high 16 bits of each lane (the low ones
// not cleared). For the divide check, `near` keeps the lanes' least (a +
// kReciprocalSlack) mod 2^14 (a = u + 2^13; a carry within the slack below
// 2 * kReciprocalSlack) and `top` their largest u (past the NaN limit from
// 0x4FFFA000, negative values included). df16 then bfloat16: v = a rounded
// down to 2^14 (zero under the zero limit), bfloat16 ties to even on v, whose
// low 16 bits are 0, 2^14, 2^15 or 3 * 2^14: v + 2^14 + (bit 16 of v) * 2^14
// carries into bit 16 exactly where v + 0x7FFF + bit 16 does, and a's low 14
// bits add no carry to that, so a stands for v.
inline U8 quotient_lanes_high(U8 u, U8& near, U8& top, uint32_t slack = kReciprocalSlack) {
  const U8 a = u + detail::kHalf;
  const U8 t = (a + slack) & 0x3FFFu;
  near = t < near ? t : near;
  top = u > top ? u : top;
  const U8 kept = a & reinterpret_cast<U8>(reinterpret_cast<I8>(u) >= 0x30002000);
  return kept + 0x4000u + ((kept >> 2) & 0x4000u);
}

// df16_round_bf16_bits on 8 lanes (the result in the low 16 bits of each).
inline U8 round_bf16_lanes(U8 u) {
  const U8 sign = u & 0x80000000u;
  const I8 mag = reinterpret_cast<I8>(u & 0x7FFFFFFFu);
  const U8 r = (reinterpret_cast<U8>(mag) + detail::kHalf) & ~0x3FFFu;
  const U8 v = sign | (r & reinterpret_cast<U8>(mag >= 0x30002000));
  const U8 b = (v + 0x7FFFu + ((v >> 16) & 1u)) >> 16;
  return (b | reinterpret_cast<U8>(mag >= 0x4FFFA000)) & 0xFFFFu;
}

inline U8 bits8(F8 v) { return reinterpret_cast<U8>(v); }

// o = the bf16 bits of df16(e / s) of one paired block, in column order.
inline void divided_pair(const float* e, const float* s, uint16_t* o) {
  store_pairs(o, round_bf16_lanes(bits8(load8(e) / load8(s))),
              round_bf16_lanes(bits8(load8(e + kLanes) / load8(s + kLanes))) << 16);
}

// kBlocks paired blocks of quotients by the reciprocals rs, redone by the
// divide when one is slow (kReciprocalSlack).
template <int kBlocks>
__attribute__((always_inline)) inline void paired_quotients(const float* __restrict e, const float* __restrict s,
                                                            const float* __restrict rs, uint16_t* __restrict o) {
  U8 near = ~U8{}, top = U8{};
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t j = b * kPair;
    const U8 even = quotient_lanes_high(bits8(load8(e + j) * load8(rs + j)), near, top) >> 16;
    const U8 odd = quotient_lanes_high(bits8(load8(e + j + kLanes) * load8(rs + j + kLanes)), near, top);
    store_pairs(o + j, even, odd & 0xFFFF0000u);
  }
  const U8 slow = reinterpret_cast<U8>(near < 2 * kReciprocalSlack) | reinterpret_cast<U8>(top >= 0x4FFFA000u);
  uint64_t w[4];
  std::memcpy(w, &slow, sizeof w);
  if ((w[0] | w[1] | w[2] | w[3]) != 0)
    for (int b = 0; b < kBlocks; ++b) divided_pair(e + b * kPair, s + b * kPair, o + b * kPair);
}

// softmax_bf16_values of bfloat16 x in paired order: m, s and rs hold the
// period's first `paired` values (a multiple of kPair) in paired order.
__attribute__((always_inline)) inline void paired_softmax_values(const uint16_t* __restrict x,
                                                                 const float* __restrict m, const float* __restrict s,
                                                                 const float* __restrict rs, float* __restrict buf,
                                                                 uint16_t* __restrict dst, int64_t count,
                                                                 int64_t period, int64_t paired) {
  for (int64_t i = 0; i < count; i += period) {
    const int64_t len = std::min(period, count - i), whole = len / kPair * kPair;
    const uint16_t* xi = x + i;
    float* d = buf + i;
    for (int64_t j = 0; j < whole; j += kPair) {
      F8 even, odd;
      load16(xi + j, even, odd);
      store8(d + j, even - load8(m + j));
      store8(d + j + kLanes, odd - load8(m + j + kLanes));
    }
    for (int64_t j = whole; j < len; ++j) d[j] = widen(xi[j]) - m[paired_index(j, paired)];
  }
  vml::exp(buf, buf, count);
  for (int64_t i = 0; i < count; i += period) {
    const int64_t len = std::min(period, count - i), whole = len / kPair * kPair;
    const float* e = buf + i;
    uint16_t* o = dst + i;
    int64_t j = 0;
    if (rs != nullptr) {
      for (; j + 4 * kPair <= whole; j += 4 * kPair) paired_quotients<4>(e + j, s + j, rs + j, o + j);
      for (; j < whole; j += kPair) paired_quotients<1>(e + j, s + j, rs + j, o + j);
    }
    for (; j < whole; j += kPair) divided_pair(e + j, s + j, o + j);
    for (; j < len; ++j) o[j] = df16_round_bf16_bits(f32_bits(e[j] / s[paired_index(j, paired)]));
  }
}

__attribute__((target_clones("avx2", "default"))) void softmax_values(const uint16_t* x, const float* m, const float* s,
                                                                      const float* rs, float* buf, uint16_t* dst,
                                                                      int64_t count, int64_t period, int64_t paired) {
  paired_softmax_values(x, m, s, rs, buf, dst, count, period, paired);
}

// softmax's exp by an estimate (bfloat16 input, paired order): exp(d) for
// d = x - m in [-86, 0] as p(r) * 2^k (k = round(d / ln 2), r = d - k ln 2 in
// two FMA steps, p a degree-6 polynomial fitted to exp on |r| <= ln 2 / 2, in
// FMA Horner steps). Each FMA rounds once, so every build of these lanes
// gives the same bits. On every f32 d in [-86, 0] the estimate is within
// kExpEstimateSteps f32 bit steps of CPU's exp (torch.exp: MKL's VML),
// checked exhaustively by tests/executors/spyre/test_spyre_exp_estimate.py
// through df16_exp_estimate_array. Below -86, d is taken as -86: estimate and
// exp are both under 2^-124, far under df16's zero limit after a quotient by
// s >= 1 (estimate_fits).
// A quotient by the reciprocal of the estimate is then within 4 +
// 2 * (2 * kExpEstimateSteps + 1) steps of the divide's (kReciprocalSlack's 4,
// plus e's steps as at most 2 steps of the product each and a rounding, doubled
// across a binade edge), so where it is more than kEstimateSlack steps from a
// df16 carry it rounds as the reference; other blocks, NaN quotients and d > 0
// are redone with CPU's exp and the divide.
constexpr uint32_t kExpEstimateSteps = 1;
constexpr uint32_t kEstimateSlack = 16;
static_assert(kEstimateSlack > 4 + 2 * (2 * kExpEstimateSteps + 1), "slack under the estimate's bound");

// 16 float32 lanes: one AVX-512 vector (the estimate's wide build).
typedef float F16 __attribute__((vector_size(64)));
typedef uint32_t U16 __attribute__((vector_size(64)));
#define TPU_EAGER_AVX512 "avx512f,avx2,fma"

__attribute__((target("avx2,fma"), always_inline)) inline F8 fma_lanes(F8 a, F8 b, F8 c) {
  return reinterpret_cast<F8>(
      _mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
}
__attribute__((target(TPU_EAGER_AVX512), always_inline)) inline F16 fma_lanes(F16 a, F16 b, F16 c) {
  return reinterpret_cast<F16>(
      _mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
}

// The estimate's steps on lanes of type F (F8 or F16; U its unsigned
// twin), FMA by fma_lanes: one body for the 8- and 16-lane builds (each
// needs its own target, which a template cannot take), so both do the same
// operations and give the same bits.
#define TPU_EAGER_EXP_ESTIMATE(F, U)                                                      \
  {                                                                                       \
    constexpr float kShift = 0x1.8p23f; /* k + kShift holds k in its low mantissa bits */ \
    const F lowest = F{} - 86.0f, shift = F{} + kShift;                                   \
    const F c = d < lowest ? lowest : d;                                                  \
    const F t = fma_lanes(c, F{} + 0x1.715476p0f, shift); /* kShift + round(c / ln 2) */  \
    const F k = t - shift;                                                                \
    /* ln 2 = 0x1.62e43p-1 - 0x1.05c61p-29 (+ 1e-15) */                                   \
    F r = fma_lanes(k, F{} - 0x1.62e43p-1f, c);                                           \
    r = fma_lanes(k, F{} + 0x1.05c61p-29f, r);                                            \
    F p = fma_lanes(F{} + 0x1.6c1b6cp-10f, r, F{} + 0x1.1230e2p-7f);                      \
    p = fma_lanes(p, r, F{} + 0x1.555612p-5f);                                            \
    p = fma_lanes(p, r, F{} + 0x1.55549ep-3f);                                            \
    p = fma_lanes(p, r, F{} + 0.5f);                                                      \
    p = fma_lanes(p, r, F{} + 1.0f);                                                      \
    p = fma_lanes(p, r, F{} + 1.0f);                                                      \
    const U scale = (reinterpret_cast<U>(t) - reinterpret_cast<U>(shift)) << 23;          \
    return reinterpret_cast<F>(reinterpret_cast<U>(p) + scale);                           \
  }
// clang-format off
__attribute__((target("avx2,fma"), always_inline)) inline F8 exp_estimate(F8 d) TPU_EAGER_EXP_ESTIMATE(F8, U8)
__attribute__((target(TPU_EAGER_AVX512), always_inline)) inline F16 exp_estimate(F16 d) TPU_EAGER_EXP_ESTIMATE(F16, U16)
#undef TPU_EAGER_EXP_ESTIMATE

__attribute__((target("avx2,fma"))) void exp_estimate_loop(const float* x, float* y, int64_t n) {
  // clang-format on
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(y + i, exp_estimate(load8(x + i)));
  if (i < n) {
    float in[kLanes] = {}, out[kLanes];
    std::copy(x + i, x + n, in);
    store8(out, exp_estimate(load8(in)));
    std::copy(out, out + (n - i), y + i);
  }
}

__attribute__((target(TPU_EAGER_AVX512))) void exp_estimate_loop_wide(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 2 * kLanes) {
    const __mmask16 lanes = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const F16 d = reinterpret_cast<F16>(_mm512_maskz_loadu_ps(lanes, x + i));
    _mm512_mask_storeu_ps(y + i, lanes, reinterpret_cast<__m512>(exp_estimate(d)));
  }
}

bool wide_estimate_supported() { return cpu::has(cpu::Feature::kAvx512f); }

bool exp_estimate_supported() { return cpu::has(cpu::Feature::kAvx2) && cpu::has(cpu::Feature::kFma); }

// Whether the estimate may serve a period's quotients: every s >= 1 (as a
// softmax's sums are: the max's own exp is 1), +inf or NaN (NaN quotients are
// redone), and the reciprocals in use.
bool estimate_fits(const float* s, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (s[j] < 1.0f) return false;
  return true;
}

// One paired block of 16 quotients by the estimate, stored in column order;
// nonzero where a lane must be redone (near a carry, NaN or past the NaN
// limit, d > 0).
__attribute__((target("avx2,fma"), always_inline)) inline bool estimated_pair(const uint16_t* x, const float* m,
                                                                              const float* rs, uint16_t* o) {
  F8 even, odd;
  load16(x, even, odd);
  const F8 de = even - load8(m), dd = odd - load8(m + kLanes);
  U8 near = ~U8{}, top = U8{};
  const U8 ue = bits8(exp_estimate(de) * load8(rs));
  const U8 uo = bits8(exp_estimate(dd) * load8(rs + kLanes));
  const U8 lo = quotient_lanes_high(ue, near, top, kEstimateSlack) >> 16;
  const U8 hi = quotient_lanes_high(uo, near, top, kEstimateSlack);
  store_pairs(o, lo, hi & 0xFFFF0000u);
  const I8 positive = (reinterpret_cast<I8>(de) > 0) | (reinterpret_cast<I8>(dd) > 0);
  const U8 slow = reinterpret_cast<U8>(near < 2 * kEstimateSlack) | reinterpret_cast<U8>(top >= 0x4FFFA000u) |
                  reinterpret_cast<U8>(positive);
  return !_mm256_testz_si256(reinterpret_cast<__m256i>(slow), reinterpret_cast<__m256i>(slow));
}

// estimated_pair on 16 lanes in column order (m and rs not paired).
__attribute__((target(TPU_EAGER_AVX512), always_inline)) inline bool estimated_wide(const uint16_t* x, const float* m,
                                                                                    const float* rs, uint16_t* o) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  const __m512 d = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_loadu_ps(m));
  const __m512 q = _mm512_mul_ps(reinterpret_cast<__m512>(exp_estimate(reinterpret_cast<F16>(d))), _mm512_loadu_ps(rs));
  const __m512i u = _mm512_castps_si512(q);
  const __m512i a = _mm512_add_epi32(u, _mm512_set1_epi32(detail::kHalf));
  const __m512i t = _mm512_and_si512(_mm512_add_epi32(a, _mm512_set1_epi32(kEstimateSlack)), _mm512_set1_epi32(0x3FFF));
  const __mmask16 slow = _mm512_cmplt_epu32_mask(t, _mm512_set1_epi32(2 * kEstimateSlack)) |
                         _mm512_cmpge_epu32_mask(u, _mm512_set1_epi32(0x4FFFA000)) |
                         _mm512_cmpgt_epi32_mask(_mm512_castps_si512(d), _mm512_setzero_si512());
  // quotient_lanes_high's rounding: a kept above the zero limit, bfloat16 ties to even.
  const __m512i kept = _mm512_maskz_mov_epi32(_mm512_cmpge_epi32_mask(u, _mm512_set1_epi32(0x30002000)), a);
  const __m512i half = _mm512_set1_epi32(0x4000);
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(kept, half), _mm512_and_si512(_mm512_srli_epi32(kept, 2), half));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  return slow != 0;
}

// The listed values of estimated_values with CPU's exp (one call over their
// differences, in buf) and the divide: whole 16-blocks (paired order when
// paired > 0) first, then single values.
void redo_exactly(const uint16_t* x, const float* m, const float* s, float* buf, uint16_t* dst, int64_t count,
                  int64_t period, int64_t paired, const std::vector<int64_t>& redo) {
  auto in_block = [&](int64_t idx) {
    const int64_t j = idx % period;
    return j < std::min(period, count - (idx - j)) / kPair * kPair;
  };
  float* d = buf;
  for (const int64_t idx : redo) {
    if (!in_block(idx)) continue;
    const int64_t j = idx % period;
    if (paired > 0) {
      F8 even, odd;
      load16(x + idx, even, odd);
      store8(d, even - load8(m + j));
      store8(d + kLanes, odd - load8(m + j + kLanes));
    } else {
      for (int64_t k = 0; k < kPair; ++k) d[k] = widen(x[idx + k]) - m[j + k];
    }
    d += kPair;
  }
  for (const int64_t idx : redo)
    if (!in_block(idx)) *d++ = widen(x[idx]) - m[paired_index(idx % period, paired)];
  vml::exp(buf, buf, d - buf);
  const float* e = buf;
  for (const int64_t idx : redo) {
    if (!in_block(idx)) continue;
    const int64_t j = idx % period;
    if (paired > 0) {
      divided_pair(e, s + j, dst + idx);
    } else {
      for (int64_t k = 0; k < kPair; ++k) dst[idx + k] = df16_round_bf16_bits(f32_bits(e[k] / s[j + k]));
    }
    e += kPair;
  }
  for (const int64_t idx : redo)
    if (!in_block(idx)) dst[idx] = df16_round_bf16_bits(f32_bits(*e++ / s[paired_index(idx % period, paired)]));
}

// The estimate pass over count values: each whole 16-block of each period by
// `block` (x, m, rs, dst at the block; true where it must be redone), listed
// with the values past the blocks for redo_exactly. Inlined into the callers
// below, each built for its target (the block functions are inlined there).
#define TPU_EAGER_ESTIMATED_VALUES(block, paired)                                    \
  {                                                                                  \
    redo.clear();                                                                    \
    for (int64_t i = 0; i < count; i += period) {                                    \
      const int64_t len = std::min(period, count - i), whole = len / kPair * kPair;  \
      for (int64_t j = 0; j < whole; j += kPair)                                     \
        if (block(x + i + j, m + j, rs + j, dst + i + j)) redo.push_back(i + j);     \
      for (int64_t j = whole; j < len; ++j) redo.push_back(i + j);                   \
    }                                                                                \
    if (!redo.empty()) redo_exactly(x, m, s, buf, dst, count, period, paired, redo); \
  }

// clang-format off
// The estimate pass in paired order on 8 lanes (m, s, rs paired).
__attribute__((target("avx2,fma"))) void estimated_softmax_values(
    const uint16_t* __restrict x, const float* __restrict m, const float* __restrict s, const float* __restrict rs,
    float* __restrict buf, uint16_t* __restrict dst, int64_t count, int64_t period, int64_t paired,
    std::vector<int64_t>& redo) TPU_EAGER_ESTIMATED_VALUES(estimated_pair, paired)

// The estimate pass in column order on 16 lanes (m, s, rs not paired).
__attribute__((target(TPU_EAGER_AVX512))) void estimated_softmax_values_wide(
    const uint16_t* __restrict x, const float* __restrict m, const float* __restrict s, const float* __restrict rs,
    float* __restrict buf, uint16_t* __restrict dst, int64_t count, int64_t period,
    std::vector<int64_t>& redo) TPU_EAGER_ESTIMATED_VALUES(estimated_wide, 0)
#undef TPU_EAGER_ESTIMATED_VALUES

// v[0 .. paired) (a multiple of kPair) put into paired order, block by block.
void pair_values(float* v, int64_t paired) {
  // clang-format on
  for (int64_t b = 0; b < paired; b += kPair) {
    const F8 lo = load8(v + b), hi = load8(v + b + kLanes);
    store8(v + b, __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14));
    store8(v + b + kLanes, __builtin_shufflevector(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15));
  }
}

// Rows per period of the normalizing pass: the fewest whole rows of n values
// that make a whole number of kLoopBlock blocks (so the loops run no tails
// but at the end), or 1 when those would hold more than kMaxPeriod values.
int64_t rows_per_period(int64_t n) {
  constexpr int64_t kMaxPeriod = 1 << 13;  // 32 KiB per f32 array: m, s, rs stay in L2
  const int64_t k = kLoopBlock / std::gcd(n, kLoopBlock);
  return k * n <= kMaxPeriod ? k : 1;
}

}  // namespace

bool df16_softmax_bf16_available() { return vml::available(); }

void df16_softmax_bf16_into(const at::Tensor& out, const at::Tensor& x, const at::Tensor& m, const at::Tensor& s) {
  const int64_t n = s.numel();
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  if (rows == 0) return;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const void* in = x.const_data_ptr();
  const float* mv = m.const_data_ptr<float>();
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
  const float* sv = s.const_data_ptr<float>();
  // m, s and (when every quotient may be taken by them) the reciprocals of s
  // repeated over a period of k rows.
  const int64_t k = rows_per_period(n), period = k * n;
  std::vector<float> mt(period), st(period), rt;
  if (reciprocal_fits(sv, n)) {
    rt.resize(period);
    for (int64_t j = 0; j < n; ++j) rt[j] = 1.0f / sv[j];
  }
  for (int64_t i = 0; i < period; i += n) {  // copies of one row: no i % n per value
    std::copy(mv, mv + n, mt.begin() + i);
    std::copy(sv, sv + n, st.begin() + i);
    if (!rt.empty() && i > 0) std::copy(rt.begin(), rt.begin() + n, rt.begin() + i);
  }
  // exp by the estimate where it may serve; on 16 lanes (column order) with AVX-512.
  const bool estimate = bf16 && !rt.empty() && exp_estimate_supported() && estimate_fits(sv, n);
  const bool wide = estimate && wide_estimate_supported();
  // bfloat16 x is read in paired order on 8 lanes: the period's whole blocks
  // of m, s and 1/s are paired to match.
  const int64_t paired = bf16 && !wide ? period / kPair * kPair : 0;
  for (std::vector<float>* v : {&mt, &st, &rt})
    if (!v->empty()) pair_values(v->data(), paired);
  const float* rv = rt.empty() ? nullptr : rt.data();
  // Periods per chunk: about kChunk elements, whose exps stay in L2 between
  // the steps (no f32 tensor of x's size is written), in few exp calls.
  constexpr int64_t kChunk = 1 << 15;
  const int64_t periods = (rows + k - 1) / k, chunk = std::max<int64_t>(1, kChunk / period);
  at::parallel_for(0, periods, chunk, [&](int64_t b, int64_t e) {
    // Not zeroed: every exp is written before it is read.
    std::unique_ptr<float[]> buf(new float[std::min(chunk, e - b) * period]);
    std::vector<int64_t> redo;
    for (int64_t p = b; p < e; p += chunk) {
      const int64_t first = p * period, count = std::min(std::min(chunk, e - p) * period, rows * n - first);
      if (wide)
        estimated_softmax_values_wide(static_cast<const uint16_t*>(in) + first, mt.data(), st.data(), rv, buf.get(),
                                      o + first, count, period, redo);
      else if (estimate)
        estimated_softmax_values(static_cast<const uint16_t*>(in) + first, mt.data(), st.data(), rv, buf.get(),
                                 o + first, count, period, paired, redo);
      else if (bf16)
        softmax_values(static_cast<const uint16_t*>(in) + first, mt.data(), st.data(), rv, buf.get(), o + first, count,
                       period, paired);
      else
        softmax_values(static_cast<const float*>(in) + first, mt.data(), st.data(), rv, buf.get(), o + first, count,
                       period);
    }
  });
}

bool df16_exp_estimate_array(const float* x, float* y, int64_t n) {
  if (!exp_estimate_supported()) return false;
  if (wide_estimate_supported())
    exp_estimate_loop_wide(x, y, n);
  else
    exp_estimate_loop(x, y, n);
  return true;
}

void df16_round_bf16_in_place(uint16_t* p, int64_t n) { round_bf16_in_place_loop(p, n); }

void df16_round_bf16_array(const uint32_t* src, uint16_t* dst, int64_t n) { round_bf16_loop(src, dst, n); }

void df16_round_array(const uint32_t* src, uint32_t* dst, int64_t n) { round_loop(src, dst, n); }

void df16_encode_array(const uint32_t* src, uint16_t* dst, int64_t n, Df16Rounding rounding, Df16Overflow overflow) {
  const bool away = rounding == Df16Rounding::kNearestAway;
  const bool nan_inf = overflow == Df16Overflow::kNanInf;
  if (away && nan_inf)
    encode_loop<Df16Rounding::kNearestAway, Df16Overflow::kNanInf>(src, dst, n);
  else if (away)
    encode_loop<Df16Rounding::kNearestAway, Df16Overflow::kSaturate>(src, dst, n);
  else if (nan_inf)
    encode_loop<Df16Rounding::kNearestEven, Df16Overflow::kNanInf>(src, dst, n);
  else
    encode_loop<Df16Rounding::kNearestEven, Df16Overflow::kSaturate>(src, dst, n);
}

void df16_decode_array(const uint16_t* src, uint32_t* dst, int64_t n) { decode_loop(src, dst, n); }

at::Tensor df16_encode(const at::Tensor& x, Df16Rounding rounding, Df16Overflow overflow) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), "df16_encode expects a floating-point tensor, got ",
                   x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "df16_encode expects a CPU tensor, got one on ", x.device());
  // The f32 values as their bits (a dtype view, no copy).
  const at::Tensor src = x.to(at::kFloat).contiguous().view(at::kInt);
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kShort));
  const auto* in = reinterpret_cast<const uint32_t*>(src.const_data_ptr<int32_t>());
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<int16_t>());
  at::parallel_for(0, src.numel(), kGrain, [&](int64_t begin, int64_t end) {
    df16_encode_array(in + begin, o + begin, end - begin, rounding, overflow);
  });
  return out;
}

at::Tensor df16_decode(const at::Tensor& bits) {
  TORCH_CHECK_TYPE(bits.scalar_type() == at::kShort, "df16_decode expects an int16 tensor of df16 bits, got ",
                   bits.scalar_type());
  TORCH_CHECK(bits.device().is_cpu(), "df16_decode expects a CPU tensor, got one on ", bits.device());
  const at::Tensor src = bits.contiguous();
  // Written as f32 bits into an int32 buffer, returned as its float32 view.
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kInt));
  const auto* in = reinterpret_cast<const uint16_t*>(src.const_data_ptr<int16_t>());
  auto* o = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<int32_t>());
  at::parallel_for(0, src.numel(), kGrain,
                   [&](int64_t begin, int64_t end) { df16_decode_array(in + begin, o + begin, end - begin); });
  return out.view(at::kFloat);
}

void df16_round_bf16_into(const at::Tensor& out, const at::Tensor& x) {
  const auto* in = reinterpret_cast<const uint32_t*>(x.const_data_ptr<float>());
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_bf16_array(in + b, o + b, e - b); });
}

at::Tensor df16_round_as(const at::Tensor& x, c10::ScalarType dtype) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), "df16_round expects a floating-point tensor, got ",
                   x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "df16_round expects a CPU tensor, got one on ", x.device());
  if (dtype == at::kBFloat16) {  // rounding and conversion in one pass
    const at::Tensor f32 = x.to(at::kFloat).contiguous();
    at::Tensor b16 = at::empty(f32.sizes(), f32.options().dtype(at::kBFloat16));
    df16_round_bf16_into(b16, f32);
    return b16;
  }
  const at::Tensor src = x.to(at::kFloat).contiguous().view(at::kInt);
  const auto* in = reinterpret_cast<const uint32_t*>(src.const_data_ptr<int32_t>());
  at::Tensor out = at::empty(src.sizes(), src.options());
  auto* o = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<int32_t>());
  at::parallel_for(0, src.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_array(in + b, o + b, e - b); });
  const at::Tensor r = out.view(at::kFloat);
  return dtype == at::kFloat ? r : r.to(dtype);
}

at::Tensor df16_round(const at::Tensor& x, Df16Rounding rounding, Df16Overflow overflow) {
  // The default modes: one 32-bit pass (the same values as encode + decode).
  if (rounding == Df16Rounding::kNearestAway && overflow == Df16Overflow::kNanInf)
    return df16_round_as(x, x.scalar_type());
  return df16_decode(df16_encode(x, rounding, overflow)).to(x.scalar_type());
}

void df16_round_(const at::Tensor& x) {
  if (x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.device().is_cpu()) {
    auto* p = reinterpret_cast<uint16_t*>(x.mutable_data_ptr<at::BFloat16>());
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_bf16_in_place(p + b, e - b); });
    return;
  }
  x.copy_(df16_round(x));
}

}  // namespace spyre
}  // namespace tpu_eager
