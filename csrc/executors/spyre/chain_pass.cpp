// The KTIR interpreter's fused elementwise chain pass (see chain_pass.h).
#include "executors/spyre/chain_pass.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "executors/aten_grain.h"
#include "executors/cpu_features.h"
#include "executors/spyre/blocked_loop.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/df16.h"
#include "lazy/debug_report.h"

namespace tpu_eager {
namespace spyre {
namespace {

// Values per block: every loop runs a fixed trip count (blocked_loop.h: what
// GCC's -O2 vectorizer takes); a chain of k ops keeps k + inputs blocks in L1.
constexpr int64_t kBlock = 512;

enum class Fn : uint8_t { kAdd, kMul, kDiv, kNeg, kAbs, kRelu, kSigmoid, kSilu };
enum class Round : uint8_t { kNone, kBf16, kHalf };

// One op: dst = fn(a, b) over slot arrays (a literal operand is a slot filled once).
struct Step {
  Fn fn = Fn::kAdd;
  int a = -1, b = -1, dst = -1;
  float alpha = 1.0f;  // kAdd: a + alpha * b (sub: -alpha)
};

struct Plan {
  c10::ScalarType dtype = c10::kFloat;
  int64_t numel = 0, row_elems = 0;
  int slots = 0;
  std::vector<Step> steps;
  std::vector<std::pair<int, float>> literals;     // (slot, value)
  std::vector<std::pair<int, int>> loads, stores;  // (view, slot)
  bool cpu_tails = false;                          // a sigmoid / silu: CPU's scalar tails are recomputed
  // Per step, for the register pass: its `a` is the previous step's value
  // (held in registers, not read back); its `b` is a literal (broadcast, not
  // read); its value is written to its slot (a later step reads it from
  // there, or it is stored).
  std::vector<char> a_held, b_literal, keep;
  std::vector<float> b_value;
};

inline uint32_t bits_of(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float float_of(uint32_t u) { return __builtin_bit_cast(float, u); }

// 2^e for integer e in the normal exponent range, built in the exponent field.
__attribute__((always_inline)) inline float pow2i(int32_t e) { return float_of(static_cast<uint32_t>(e + 127) << 23); }

// SLEEF's expf u10 (at::vec's Vectorized<float>::exp on AVX2 and AVX-512,
// what CPU's sigmoid and silu kernels call per vector), the same operations
// in the same order as its vector code, so each value is its bits (the
// operations are IEEE basic ones and fmaf: every build agrees):
// q = rint(x / ln 2); r = x - q ln 2 in two FMA steps; the degree-5
// polynomial by Horner's rule; 1 + (r + r^2 P(r)); times 2^(q >> 1), then
// 2^(q - (q >> 1)); 0 below -104, +inf above 100, x quieted for NaN. x
// outside [-110, 110] (and NaN) computes at 0 and is replaced by the selects.
__attribute__((always_inline)) inline float exp_sleef(float x) {
  // The range tests on the bits (integer compares: the loop takes them as
  // selects, where float compares that may trap on NaN keep a branch).
  const uint32_t bx = bits_of(x);
  const int32_t mag = static_cast<int32_t>(bx & 0x7FFFFFFFu);  // signed compares: AVX2 has no unsigned ones
  const bool neg = bx >> 31;
  const float d = mag <= 0x42DC0000 ? x : 0.0f;  // |x| <= 110
  const float qf = __builtin_rintf(d * 1.442695040888963407359924681001892137426645954152985934135449406931f);
  const int32_t q = static_cast<int32_t>(qf);
  float s = __builtin_fmaf(qf, -0.693145751953125f, d);
  s = __builtin_fmaf(qf, -1.428606765330187045e-06f, s);
  float u = 0.000198527617612853646278381f;
  u = __builtin_fmaf(u, s, 0.00139304355252534151077271f);
  u = __builtin_fmaf(u, s, 0.00833336077630519866943359f);
  u = __builtin_fmaf(u, s, 0.0416664853692054748535156f);
  u = __builtin_fmaf(u, s, 0.166666671633720397949219f);
  u = __builtin_fmaf(u, s, 0.5f);
  const float ss = s * s;
  u = 1.0f + __builtin_fmaf(ss, u, s);
  const int32_t q1 = q >> 1;
  u = (u * pow2i(q1)) * pow2i(q - q1);
  u = neg & (mag > 0x42D00000) ? 0.0f : u;               // x < -104 (NaN: below)
  u = !neg & (mag > 0x42C80000) ? __builtin_inff() : u;  // x > 100
  const float quiet = x + x;
  return mag > 0x7F800000 ? quiet : u;  // NaN: x quieted
}

// Op values over one block (fixed trip count; `a`, `b`, `d` distinct slots).
__attribute__((always_inline)) inline void add_block(const float* __restrict a, const float* __restrict b, float alpha,
                                                     float* __restrict d) {
  // CPU's add kernel: fmadd(b, alpha, a) (with alpha 1: a + b, rounded once either way).
  if (alpha == 1.0f) {
    for (int64_t j = 0; j < kBlock; ++j) d[j] = a[j] + b[j];
  } else {
    for (int64_t j = 0; j < kBlock; ++j) d[j] = __builtin_fmaf(b[j], alpha, a[j]);
  }
}

__attribute__((always_inline)) inline void unary_block(Fn fn, const float* __restrict a, float* __restrict d) {
  switch (fn) {
    case Fn::kNeg:
      for (int64_t j = 0; j < kBlock; ++j) d[j] = float_of(bits_of(a[j]) ^ 0x80000000u);
      break;
    case Fn::kAbs:
      for (int64_t j = 0; j < kBlock; ++j) d[j] = float_of(bits_of(a[j]) & 0x7FFFFFFFu);
      break;
    case Fn::kRelu:  // clamp_min(a, 0): NaN and -0 stay a
      for (int64_t j = 0; j < kBlock; ++j) d[j] = a[j] < 0.0f ? 0.0f : a[j];
      break;
    case Fn::kSigmoid:  // (1 + exp(0 - a)).reciprocal()
      for (int64_t j = 0; j < kBlock; ++j) d[j] = 1.0f / (exp_sleef(0.0f - a[j]) + 1.0f);
      break;
    case Fn::kSilu:  // a / (1 + exp(-a))
      for (int64_t j = 0; j < kBlock; ++j) d[j] = a[j] / (1.0f + exp_sleef(float_of(bits_of(a[j]) ^ 0x80000000u)));
      break;
    default:
      break;
  }
}

__attribute__((always_inline)) inline void binary_block(Fn fn, const float* __restrict a, const float* __restrict b,
                                                        float* __restrict d) {
  if (fn == Fn::kMul) {
    for (int64_t j = 0; j < kBlock; ++j) d[j] = a[j] * b[j];
  } else {
    for (int64_t j = 0; j < kBlock; ++j) d[j] = a[j] / b[j];
  }
}

// A value rounded once to df16 and held as bfloat16 / float16 (exact in
// float). float16: the df16 value to nearest even and back by convert16's
// array conversions (F16C in the vector builds, c10's arithmetic otherwise).
__attribute__((always_inline)) inline void round_block(Round r, float* __restrict d) {
  if (r == Round::kBf16) {
    for (int64_t j = 0; j < kBlock; ++j)
      d[j] = float_of(static_cast<uint32_t>(df16_round_bf16_bits(bits_of(d[j]))) << 16);
  } else if (r == Round::kHalf) {
    for (int64_t j = 0; j < kBlock; ++j) d[j] = float_of(df16_round_f32_bits(bits_of(d[j])));
    uint16_t h[kBlock];
    narrow_half(d, h, kBlock);
    widen16(c10::kHalf, h, d, kBlock);
  }
}

// ------------------------------------------------------- register chains
//
// All steps of a block run over a chunk of kChunk float vectors at a time:
// the chain's value stays in registers from op to op (each op's df16
// rounding applied there), and only values a later step reads from memory,
// or a store, are written to their slot. The vectors are GCC's generic
// vectors of the build's width (AVX-512: 16 floats; AVX2 and the baseline:
// 8, the baseline's as SSE2 pairs), and every operation is an IEEE basic
// operation or a fused multiply-add, the same per lane in every build: so
// each build's bits are the per-op loops' bits above.
enum class Isa : uint8_t { kBaseline, kAvx2, kAvx512 };

template <Isa I>
struct Lanes {
  static constexpr int kWidth = 8;
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t S __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
};

template <>
struct Lanes<Isa::kAvx512> {
  static constexpr int kWidth = 16;
  typedef float F __attribute__((vector_size(64)));
  typedef int32_t S __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
};

constexpr int kChunk = 4;  // vectors per chunk (a block is a whole number of chunks; the loops unroll 4)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // the helpers are inlined (flatten): no vector crosses a call

template <class V>
inline V load_v(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
inline void store_v(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// a * b + c rounded once, per lane (one fmaf each in the baseline build).
template <Isa I, class V = typename Lanes<I>::F>
inline V fma_v(V a, V b, V c) {
  V r;
  for (int l = 0; l < Lanes<I>::kWidth; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
  return r;
}

template <>
__attribute__((target("avx2,fma"))) inline Lanes<Isa::kAvx2>::F fma_v<Isa::kAvx2>(Lanes<Isa::kAvx2>::F a,
                                                                                  Lanes<Isa::kAvx2>::F b,
                                                                                  Lanes<Isa::kAvx2>::F c) {
  return _mm256_fmadd_ps(a, b, c);
}

template <>
__attribute__((target("avx512f"))) inline Lanes<Isa::kAvx512>::F fma_v<Isa::kAvx512>(Lanes<Isa::kAvx512>::F a,
                                                                                     Lanes<Isa::kAvx512>::F b,
                                                                                     Lanes<Isa::kAvx512>::F c) {
  return _mm512_fmadd_ps(a, b, c);
}

// exp_sleef (above) per lane, operation for operation: rint(y) for
// |y| <= 159 as (y + 1.5 * 2^23) - 1.5 * 2^23 (exact, ties to even; it gives
// +0 where rint gives -0, which changes no result: the two differ only for
// x = -0, whose s is then -0 instead of +0, and 1 + (s + s^2 P) is 1 either
// way). Each select's condition is one compare (a mask combined from two is
// not one vector instruction in every build); the quiet compares are false
// for NaN, which the last select takes.
template <Isa I>
inline typename Lanes<I>::F exp_sleef_v(typename Lanes<I>::F x) {
  using V = typename Lanes<I>::F;
  using S = typename Lanes<I>::S;
  const S mag = reinterpret_cast<S>(x) & 0x7FFFFFFF;
  const V zero = {};
  const V d = mag <= 0x42DC0000 ? x : zero;  // |x| <= 110
  const V y = d * 1.442695040888963407359924681001892137426645954152985934135449406931f;
  const V qf = (y + 12582912.0f) - 12582912.0f;
  const S q = __builtin_convertvector(qf, S);
  V s = fma_v<I>(qf, zero - 0.693145751953125f, d);
  s = fma_v<I>(qf, zero - 1.428606765330187045e-06f, s);
  V u = zero + 0.000198527617612853646278381f;
  u = fma_v<I>(u, s, zero + 0.00139304355252534151077271f);
  u = fma_v<I>(u, s, zero + 0.00833336077630519866943359f);
  u = fma_v<I>(u, s, zero + 0.0416664853692054748535156f);
  u = fma_v<I>(u, s, zero + 0.166666671633720397949219f);
  u = fma_v<I>(u, s, zero + 0.5f);
  const V ss = s * s;
  u = 1.0f + fma_v<I>(ss, u, s);
  const S q1 = q >> 1;
  u = (u * reinterpret_cast<V>((q1 + 127) << 23)) * reinterpret_cast<V>((q - q1 + 127) << 23);
  u = x < -104.0f ? zero : u;
  u = x > 100.0f ? zero + __builtin_inff() : u;
  return mag > 0x7F800000 ? x + x : u;  // NaN: x quieted
}

// float32 -> float16 -> float32 per lane (to nearest even, as F16C and c10::Half).
template <Isa I, class V = typename Lanes<I>::F>
inline V half_round_trip_v(V v) {
  for (int l = 0; l < Lanes<I>::kWidth; ++l)
    v[l] = c10::detail::fp16_ieee_to_fp32_value(c10::detail::fp16_ieee_from_fp32_value(v[l]));
  return v;
}

template <>
__attribute__((target("avx2,f16c"))) inline Lanes<Isa::kAvx2>::F half_round_trip_v<Isa::kAvx2>(Lanes<Isa::kAvx2>::F v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <>
__attribute__((target("avx512f"))) inline Lanes<Isa::kAvx512>::F half_round_trip_v<Isa::kAvx512>(
    Lanes<Isa::kAvx512>::F v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// round_block (above) per lane: df16_round_bf16_bits / df16_round_f32_bits
// with their conditions as selects.
template <Isa I, Round R>
inline typename Lanes<I>::F round_v(typename Lanes<I>::F v) {
  using V = typename Lanes<I>::F;
  using S = typename Lanes<I>::S;
  using U = typename Lanes<I>::U;
  if constexpr (R == Round::kNone) {
    return v;
  } else {
    const U u = reinterpret_cast<U>(v);
    const U sign = u & 0x80000000u;
    const S mag = reinterpret_cast<S>(u & 0x7FFFFFFFu);
    const U rounded = (reinterpret_cast<U>(mag) + detail::kHalf) & ~0x3FFFu;
    const U w = mag >= 0x30002000 ? sign | rounded : sign;  // df16 value, or +-0
    if constexpr (R == Round::kBf16) {
      const U b = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
      return reinterpret_cast<V>((mag >= 0x4FFFA000 ? U{} + 0xFFFFu : b) << 16);
    } else {
      return half_round_trip_v<I>(reinterpret_cast<V>(mag >= 0x4FFFA000 ? sign | 0x7FC00000u : w));
    }
  }
}

// One op per lane (add_block / binary_block / unary_block's formulas).
template <Isa I, Fn F>
inline typename Lanes<I>::F op_v(typename Lanes<I>::F a, typename Lanes<I>::F b, float alpha) {
  using V = typename Lanes<I>::F;
  using U = typename Lanes<I>::U;
  if constexpr (F == Fn::kAdd) return fma_v<I>(b, V{} + alpha, a);  // alpha != 1 (alpha 1: a + b)
  if constexpr (F == Fn::kMul) return a * b;
  if constexpr (F == Fn::kDiv) return a / b;
  if constexpr (F == Fn::kNeg) return reinterpret_cast<V>(reinterpret_cast<U>(a) ^ 0x80000000u);
  if constexpr (F == Fn::kAbs) return reinterpret_cast<V>(reinterpret_cast<U>(a) & 0x7FFFFFFFu);
  if constexpr (F == Fn::kRelu) return a < 0.0f ? V{} : a;
  if constexpr (F == Fn::kSigmoid) return 1.0f / (exp_sleef_v<I>(0.0f - a) + 1.0f);
  if constexpr (F == Fn::kSilu)
    return a / (1.0f + exp_sleef_v<I>(reinterpret_cast<V>(reinterpret_cast<U>(a) ^ 0x80000000u)));
  return a;
}

// v[c] = round(F(v[c], b[c])) over a chunk.
template <Isa I, Round R, Fn F, class V>
inline void op_chunk(V* v, const V* b, float alpha) {
#pragma GCC unroll 4
  for (int c = 0; c < kChunk; ++c) v[c] = round_v<I, R>(op_v<I, F>(v[c], b[c], alpha));
}

// Every step of the plan over one block, chunk by chunk.
template <Isa I, Round R>
inline void fused_body(const Plan& P, float* const* slot) {
  using V = typename Lanes<I>::F;
  constexpr int kW = Lanes<I>::kWidth;
  static_assert(kBlock % (kChunk * kW) == 0);
  const size_t n = P.steps.size();
  for (int64_t j = 0; j < kBlock; j += kChunk * kW) {
    V v[kChunk], b[kChunk] = {};
    for (size_t k = 0; k < n; ++k) {
      const Step& s = P.steps[k];
      if (P.b_literal[k]) {
#pragma GCC unroll 4
        for (int c = 0; c < kChunk; ++c) b[c] = V{} + P.b_value[k];
      } else if (s.b >= 0) {
#pragma GCC unroll 4
        for (int c = 0; c < kChunk; ++c) b[c] = load_v<V>(slot[s.b] + j + c * kW);
      }
      if (!P.a_held[k]) {
#pragma GCC unroll 4
        for (int c = 0; c < kChunk; ++c) v[c] = load_v<V>(slot[s.a] + j + c * kW);
      }
      switch (s.fn) {
        case Fn::kAdd:
          if (s.alpha == 1.0f) {
#pragma GCC unroll 4
            for (int c = 0; c < kChunk; ++c) v[c] = round_v<I, R>(v[c] + b[c]);
          } else {
            op_chunk<I, R, Fn::kAdd>(v, b, s.alpha);
          }
          break;
        case Fn::kMul:
          op_chunk<I, R, Fn::kMul>(v, b, s.alpha);
          break;
        case Fn::kDiv:
          op_chunk<I, R, Fn::kDiv>(v, b, s.alpha);
          break;
        case Fn::kNeg:
          op_chunk<I, R, Fn::kNeg>(v, b, s.alpha);
          break;
        case Fn::kAbs:
          op_chunk<I, R, Fn::kAbs>(v, b, s.alpha);
          break;
        case Fn::kRelu:
          op_chunk<I, R, Fn::kRelu>(v, b, s.alpha);
          break;
        case Fn::kSigmoid:
          op_chunk<I, R, Fn::kSigmoid>(v, b, s.alpha);
          break;
        case Fn::kSilu:
          op_chunk<I, R, Fn::kSilu>(v, b, s.alpha);
          break;
      }
      if (P.keep[k]) {
#pragma GCC unroll 4
        for (int c = 0; c < kChunk; ++c) store_v(slot[s.dst] + j + c * kW, v[c]);
      }
    }
  }
}

#pragma GCC diagnostic pop

// Steps [first, last) of the plan over one block.
__attribute__((always_inline)) inline void run_steps_body(const Plan& P, Round r, float* const* slot, size_t first,
                                                          size_t last) {
  for (size_t k = first; k < last; ++k) {
    const Step& s = P.steps[k];
    float* d = slot[s.dst];
    const float* a = slot[s.a];
    if (s.fn == Fn::kAdd)
      add_block(a, slot[s.b], s.alpha, d);
    else if (s.fn == Fn::kMul || s.fn == Fn::kDiv)
      binary_block(s.fn, a, slot[s.b], d);
    else
      unary_block(s.fn, a, d);
    round_block(r, d);
  }
}

// Loads `n` elements of a view at element `first` into a slot (exact widening).
__attribute__((always_inline)) inline void load_body(c10::ScalarType t, const void* base, int64_t first, int64_t n,
                                                     float* dst) {
  if (t == c10::kFloat) {
    std::memcpy(dst, static_cast<const float*>(base) + first, n * sizeof(float));
  } else if (t == c10::kBFloat16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + first;
    blocked(n, [&](int64_t j) { dst[j] = float_of(static_cast<uint32_t>(src[j]) << 16); });  // vectorized
  } else {
    widen16(c10::kHalf, static_cast<const uint16_t*>(base) + first, dst, n);
  }
}

// Stores `n` values (already the dtype's values) of a slot to a view at element `first`.
__attribute__((always_inline)) inline void store_body(c10::ScalarType t, void* base, int64_t first, int64_t n,
                                                      const float* src) {
  if (t == c10::kFloat) {
    std::memcpy(static_cast<float*>(base) + first, src, n * sizeof(float));
  } else if (t == c10::kBFloat16) {
    uint16_t* dst = static_cast<uint16_t*>(base) + first;
    blocked(n, [&](int64_t j) { dst[j] = static_cast<uint16_t>(bits_of(src[j]) >> 16); });  // vectorized
  } else {
    narrow_half(src, static_cast<uint16_t*>(base) + first, n);
  }
}

// One build per instruction set: the same bodies, so the same bits.
struct Build {
  void (*steps)(const Plan&, Round, float* const*, size_t, size_t);
  void (*fused[3])(const Plan&, float* const*);  // by Round
  void (*load)(c10::ScalarType, const void*, int64_t, int64_t, float*);
  void (*store)(c10::ScalarType, void*, int64_t, int64_t, const float*);
};

#define TPU_EAGER_CHAIN_BUILD(NAME, TARGET, ISA)                                                        \
  TARGET void NAME##_steps(const Plan& P, Round r, float* const* slot, size_t first, size_t last) {     \
    run_steps_body(P, r, slot, first, last);                                                            \
  }                                                                                                     \
  TARGET __attribute__((flatten)) void NAME##_fused_f32(const Plan& P, float* const* slot) {            \
    fused_body<ISA, Round::kNone>(P, slot);                                                             \
  }                                                                                                     \
  TARGET __attribute__((flatten)) void NAME##_fused_bf16(const Plan& P, float* const* slot) {           \
    fused_body<ISA, Round::kBf16>(P, slot);                                                             \
  }                                                                                                     \
  TARGET __attribute__((flatten)) void NAME##_fused_f16(const Plan& P, float* const* slot) {            \
    fused_body<ISA, Round::kHalf>(P, slot);                                                             \
  }                                                                                                     \
  TARGET void NAME##_load(c10::ScalarType t, const void* base, int64_t first, int64_t n, float* dst) {  \
    load_body(t, base, first, n, dst);                                                                  \
  }                                                                                                     \
  TARGET void NAME##_store(c10::ScalarType t, void* base, int64_t first, int64_t n, const float* src) { \
    store_body(t, base, first, n, src);                                                                 \
  }                                                                                                     \
  constexpr Build NAME{                                                                                 \
      &NAME##_steps, {&NAME##_fused_f32, &NAME##_fused_bf16, &NAME##_fused_f16}, &NAME##_load, &NAME##_store};
TPU_EAGER_CHAIN_BUILD(baseline, , Isa::kBaseline)
TPU_EAGER_CHAIN_BUILD(avx2, __attribute__((target("avx2,fma,f16c"))), Isa::kAvx2)
TPU_EAGER_CHAIN_BUILD(avx512, __attribute__((target("avx512f,avx2,fma,f16c"))), Isa::kAvx512)
#undef TPU_EAGER_CHAIN_BUILD

// The build cpu::has allows (asked per launch: tests switch features off).
const Build& build_for_cpu() {
  if (!cpu::has(cpu::Feature::kAvx2) || !cpu::has(cpu::Feature::kFma) || !cpu::has(cpu::Feature::kF16c))
    return baseline;
  return cpu::has(cpu::Feature::kAvx512f) ? avx512 : avx2;
}

// ---------------------------------------------------------------- planning

bool contiguous_view(const KtirView& v) {
  int64_t want = 1;
  for (size_t d = v.sizes.size(); d-- > 0;) {
    if (v.sizes[d] != 1 && v.strides[d] != want) return false;
    want *= v.sizes[d];
  }
  return true;
}

int storage_of(const KtirView& w) { return w.lx ? -1 - w.buf : w.arg; }

// The op's function and whether its operand count fits (self, other[, alpha]).
bool op_fn(const std::string& op, Fn* fn, bool* binary, bool* negate_alpha) {
  static const std::map<std::string, std::pair<Fn, int>> kOps = {
      {"add.Tensor", {Fn::kAdd, 1}}, {"add.Scalar", {Fn::kAdd, 1}}, {"sub.Tensor", {Fn::kAdd, 2}},
      {"sub.Scalar", {Fn::kAdd, 2}}, {"mul.Tensor", {Fn::kMul, 1}}, {"mul.Scalar", {Fn::kMul, 1}},
      {"div.Tensor", {Fn::kDiv, 1}}, {"div.Scalar", {Fn::kDiv, 1}}, {"neg", {Fn::kNeg, 0}},
      {"abs", {Fn::kAbs, 0}},        {"relu", {Fn::kRelu, 0}},      {"sigmoid", {Fn::kSigmoid, 0}},
      {"silu", {Fn::kSilu, 0}},
  };
  const auto it = kOps.find(op);
  if (it == kOps.end()) return false;
  *fn = it->second.first;
  *binary = it->second.second > 0;
  *negate_alpha = it->second.second == 2;
  return true;
}

// A literal operand as CPU's float32 kernel takes it (false: not a number, or past float's range).
bool literal_float(const KtirValue& v, float* out) {
  double x;
  if (v.kind == KtirValue::kFloat)
    x = v.f;
  else if (v.kind == KtirValue::kInt)
    x = static_cast<double>(v.i);
  else
    return false;
  if (std::isfinite(x) && std::fabs(x) > FLT_MAX) return false;
  *out = static_cast<float>(x);
  return true;
}

int64_t aten_vector_floats();

// The register pass's per-step facts (Plan::a_held, b_literal, keep).
void plan_registers(Plan* P) {
  const size_t n = P->steps.size();
  std::vector<char> literal(P->slots, 0), read(P->slots, 0);
  std::vector<float> value(P->slots, 0.0f);
  for (const auto& [s, f] : P->literals) literal[s] = 1, value[s] = f;
  P->a_held.assign(n, 0);
  P->b_literal.assign(n, 0);
  P->b_value.assign(n, 0.0f);
  for (size_t k = 0; k < n; ++k) {
    const Step& s = P->steps[k];
    P->a_held[k] = k > 0 && s.a == P->steps[k - 1].dst;
    if (!P->a_held[k]) read[s.a] = 1;
    if (s.b >= 0 && literal[s.b]) P->b_literal[k] = 1, P->b_value[k] = value[s.b];
    if (s.b >= 0) read[s.b] = 1;
  }
  for (const auto& [v, s] : P->stores) read[s] = 1;
  P->keep.assign(n, 0);
  for (size_t k = 0; k < n; ++k) P->keep[k] = read[P->steps[k].dst];
}

bool plan_chain(const KtirProgram& p, const KtirTilePlan* plan, Plan* P) {
  if (p.ops.empty() || p.views.empty()) return false;
  if (plan && plan->tiled && plan->ring_op >= 0) return false;
  const c10::ScalarType t = p.views[0].dtype;
  if (t != c10::kFloat && t != c10::kBFloat16 && t != c10::kHalf) return false;
  const std::vector<int64_t>& sizes = p.views[0].sizes;
  if (sizes.empty()) return false;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel <= 0) return false;
  std::map<int, int> view_of_storage;  // storage -> its (one) view
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    if (w.dtype != t || w.sizes != sizes || !contiguous_view(w)) return false;
    const auto [it, fresh] = view_of_storage.emplace(storage_of(w), static_cast<int>(v));
    if (!fresh) {
      const KtirView& o = p.views[it->second];
      if (o.offset != w.offset || o.strides != w.strides) return false;
    }
  }
  P->dtype = t;
  P->numel = numel;
  P->row_elems = numel / sizes[0];
  std::map<int, int> latest;  // storage -> the slot holding its current value
  auto operand = [&](const KtirValue& v, int* slot) {
    if (v.kind == KtirValue::kView) {
      if (v.i < 0 || v.i >= static_cast<int64_t>(p.views.size())) return false;
      const KtirView& w = p.views[v.i];
      const auto it = latest.find(storage_of(w));
      if (it != latest.end()) {
        *slot = it->second;
        return true;
      }
      if (w.lx || w.arg < 0 || w.arg >= static_cast<int>(p.args.size()) || p.args[w.arg].kind == KtirArg::kOut)
        return false;
      *slot = P->slots++;
      P->loads.emplace_back(static_cast<int>(v.i), *slot);
      latest[storage_of(w)] = *slot;
      return true;
    }
    float f;
    if (!literal_float(v, &f)) return false;
    *slot = P->slots++;
    P->literals.emplace_back(*slot, f);
    return true;
  };
  std::map<int, int> stored;  // HBM storage -> (view, slot) index in P->stores
  for (const KtirOp& o : p.ops) {
    Fn fn;
    bool binary, negate;
    if (!op_fn(o.op, &fn, &binary, &negate)) return false;
    if (o.results.size() != 1 || o.results[0] < 0 || o.results[0] >= static_cast<int>(p.views.size())) return false;
    const size_t max_args = binary ? (fn == Fn::kAdd ? 3 : 2) : 1;
    if (o.args.size() < (binary ? 2u : 1u) || o.args.size() > max_args) return false;
    if (o.args[0].kind != KtirValue::kView) return false;
    Step s;
    s.fn = fn;
    if (!operand(o.args[0], &s.a)) return false;
    if (binary && !operand(o.args[1], &s.b)) return false;
    if (o.args.size() == 3 && !literal_float(o.args[2], &s.alpha)) return false;
    if (negate) s.alpha = -s.alpha;
    s.dst = P->slots++;
    if (fn == Fn::kSigmoid || fn == Fn::kSilu) P->cpu_tails = true;
    P->steps.push_back(s);
    const KtirView& w = p.views[o.results[0]];
    latest[storage_of(w)] = s.dst;
    if (!w.lx) {
      const auto [it, fresh] = stored.emplace(storage_of(w), static_cast<int>(P->stores.size()));
      if (fresh)
        P->stores.emplace_back(o.results[0], s.dst);
      else
        P->stores[it->second].second = s.dst;  // the storage's last value is the one stored
    }
  }
  // CPU's sigmoid / silu vector formula is SLEEF's expf only in its AVX2 and AVX-512 kernels.
  if (P->cpu_tails && aten_vector_floats() == 0) return false;
  if (P->stores.empty()) return false;
  plan_registers(P);
  return true;
}

// Floats per vector of ATen's CPU kernels (its capability: AVX512 16, AVX2
// 8), 0 for another capability (whose exp is not SLEEF's). Read once.
int64_t aten_vector_floats() {
  static const int64_t floats = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX512" ? int64_t{16} : cap == "AVX2" ? int64_t{8} : int64_t{0};
  }();
  return floats;
}

// The element ranges CPU's float32 kernel of a unary op over `numel`
// contiguous elements computes with its scalar function: TensorIterator
// splits numel >= the grain over the intra-op threads (at::parallel_for's
// chunks of ceil(numel / threads)); each chunk runs its vector loop in steps
// of two vectors and leaves the rest to the scalar loop.
std::vector<std::pair<int64_t, int64_t>> cpu_scalar_tails(int64_t numel) {
  const int64_t step = 2 * aten_vector_floats();
  int64_t threads = 1;
  if (numel >= kAtenGrainSize && at::get_num_threads() > 1)
    threads = std::min<int64_t>(at::get_num_threads(), (numel + kAtenGrainSize - 1) / kAtenGrainSize);
  const int64_t chunk = (numel + threads - 1) / threads;
  std::vector<std::pair<int64_t, int64_t>> tails;
  for (int64_t b = 0; b < numel; b += chunk) {
    const int64_t e = std::min(numel, b + chunk);
    if ((e - b) % step) tails.emplace_back(e - (e - b) % step, e);
  }
  return tails;
}

// CPU's scalar formula of a sigmoid / silu step on elements [lo, hi) of the
// block starting at element `base` (before the step's rounding).
void scalar_tail(const Step& s, Round r, float* const* slot, int64_t base, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t j = i - base;
    const float a = slot[s.a][j];
    float v = s.fn == Fn::kSigmoid ? 1.0f / (1.0f + std::exp(-a)) : a / (1.0f + std::exp(-a));
    if (r == Round::kBf16)
      v = float_of(static_cast<uint32_t>(df16_round_bf16_bits(bits_of(v))) << 16);
    else if (r == Round::kHalf)
      v = c10::detail::fp16_ieee_to_fp32_value(
          c10::detail::fp16_ieee_from_fp32_value(float_of(df16_round_f32_bits(bits_of(v)))));
    slot[s.dst][j] = v;
  }
}

}  // namespace

bool ktir_chain_pass(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks,
                     const KtirTilePlan* plan, KtirWalk* walk) {
  Plan P;
  if (!plan_chain(p, plan, &P)) return false;
  try {
    for (size_t k = 0; k < p.ops.size(); ++k) hooks.before_op(k);
  } catch (...) {
    return false;  // the op by op path reports the operand's error where it belongs
  }
  const size_t esize = c10::elementSize(P.dtype);
  auto base_of = [&](int v) {
    const KtirView& w = p.views[v];
    return static_cast<char*>(arg_bytes.at(w.arg).data_ptr()) + w.offset * esize;
  };
  std::vector<const void*> in_base;
  for (const auto& [v, s] : P.loads) in_base.push_back(base_of(v));
  std::vector<void*> out_base;
  for (const auto& [v, s] : P.stores) out_base.push_back(base_of(v));

  std::vector<float> storage(static_cast<size_t>(P.slots) * kBlock, 0.0f);
  std::vector<float*> slot(P.slots);
  for (int s = 0; s < P.slots; ++s) slot[s] = storage.data() + static_cast<size_t>(s) * kBlock;
  for (const auto& [s, f] : P.literals) std::fill(slot[s], slot[s] + kBlock, f);
  const Round r = P.dtype == c10::kBFloat16 ? Round::kBf16 : P.dtype == c10::kHalf ? Round::kHalf : Round::kNone;
  const Build& B = build_for_cpu();
  const std::vector<std::pair<int64_t, int64_t>> tails =
      P.cpu_tails ? cpu_scalar_tails(P.numel) : std::vector<std::pair<int64_t, int64_t>>{};

  // Elements [lo, hi) in blocks: load, the ops (in registers, or one loop
  // per op where CPU's scalar tails are recomputed), store.
  // float32 blocks of kBlock elements are read and written in place: a
  // load's slot points at the input, a stored value's at the output (unless
  // the output's storage is also loaded).
  const bool in_place = P.dtype == c10::kFloat;
  std::vector<char> direct(P.stores.size(), 0);
  for (size_t i = 0; i < P.stores.size(); ++i) {
    direct[i] = in_place;
    for (const auto& [v, s] : P.loads)
      if (storage_of(p.views[v]) == storage_of(p.views[P.stores[i].first])) direct[i] = 0;
  }
  const std::vector<float*> scratch = slot;
  auto pass = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t n = std::min(kBlock, hi - b);
      const bool whole = in_place && n == kBlock;
      for (size_t i = 0; i < P.loads.size(); ++i) {
        const int s = P.loads[i].second;
        if (whole)
          slot[s] = const_cast<float*>(static_cast<const float*>(in_base[i]) + b);  // read only
        else
          B.load(P.dtype, in_base[i], b, n, slot[s] = scratch[s]);
      }
      for (size_t i = 0; i < P.stores.size(); ++i) {
        const int s = P.stores[i].second;
        slot[s] = whole && direct[i] ? static_cast<float*>(out_base[i]) + b : scratch[s];
      }
      // A block holding elements of CPU's scalar tails runs step by step, each
      // sigmoid / silu's tail values replaced before the later steps read them.
      int64_t a = 0, e = 0;
      for (const auto& [tlo, thi] : tails)
        if (std::max(tlo, b) < std::min(thi, b + n)) a = std::max(tlo, b), e = std::min(thi, b + n);
      if (a >= e) {
        B.fused[static_cast<int>(r)](P, slot.data());
      } else {
        for (size_t k = 0; k < P.steps.size(); ++k) {
          B.steps(P, r, slot.data(), k, k + 1);
          const Step& s = P.steps[k];
          if (s.fn == Fn::kSigmoid || s.fn == Fn::kSilu) scalar_tail(s, r, slot.data(), b, a, e);
        }
      }
      for (size_t i = 0; i < P.stores.size(); ++i)
        if (!(whole && direct[i])) B.store(P.dtype, out_base[i], b, n, slot[P.stores[i].second]);
    }
  };
  if (plan && plan->tiled) {
    if (walk) walk->tiled = true;
    for (const auto& cores : plan->steps) {
      bool any = false;
      for (const auto& [b, e] : cores)
        if (e > b) {
          pass(b * P.row_elems, e * P.row_elems);
          any = true;
        }
      if (any && walk) walk->tile_steps++;
    }
  } else {
    pass(0, P.numel);
  }
  for (size_t k = 0; k < p.ops.size(); ++k) {
    const int v = p.ops[k].results[0];
    at::Tensor view;
    if (!p.views[v].lx) {
      const KtirView& w = p.views[v];
      view = arg_bytes.at(w.arg)
                 .narrow(0, 0, arg_bytes.at(w.arg).numel() / static_cast<int64_t>(esize) * static_cast<int64_t>(esize))
                 .view(w.dtype)
                 .as_strided(w.sizes, w.strides, w.offset);
    }
    hooks.after_op(k, view.defined() ? std::vector<at::Tensor>{view} : std::vector<at::Tensor>{}, {});
  }
  debug::count_op("spyre_chain_pass", p.name);
  return true;
}

}  // namespace spyre
}  // namespace tpu_eager
