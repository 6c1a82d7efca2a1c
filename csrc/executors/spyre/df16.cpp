// df16 codec over arrays and tensors (format and rounding rules in df16.h).
#include "executors/spyre/df16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "executors/cpu_vml.h"
#include "executors/spyre/blocked_loop.h"

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
  map_blocked(p, p, n, [](uint16_t b) { return df16_round_bf16_bits(static_cast<uint32_t>(b) << 16); });
}

// The IEEE bits of f (as memcpy gives them); unlike memcpy, the builtin
// keeps a loop over an array of floats vectorizable.
inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

// The float32 value of an element: bfloat16 bits widen exactly by a shift.
inline float widen(float v) { return v; }
inline float widen(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

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

// softmax_bf16_values of each input type, built for AVX2 and the baseline.
__attribute__((target_clones("avx2", "default"))) void softmax_values(const float* x, const float* m, const float* s,
                                                                      const float* rs, float* buf, uint16_t* dst,
                                                                      int64_t count, int64_t period) {
  softmax_bf16_values(x, m, s, rs, buf, dst, count, period);
}
__attribute__((target_clones("avx2", "default"))) void softmax_values(const uint16_t* x, const float* m, const float* s,
                                                                      const float* rs, float* buf, uint16_t* dst,
                                                                      int64_t count, int64_t period) {
  softmax_bf16_values(x, m, s, rs, buf, dst, count, period);
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
  const float* rv = rt.empty() ? nullptr : rt.data();
  // Periods per chunk: about kChunk elements, whose exps stay in L2 between
  // the steps (no f32 tensor of x's size is written), in few exp calls.
  constexpr int64_t kChunk = 1 << 15;
  const int64_t periods = (rows + k - 1) / k, chunk = std::max<int64_t>(1, kChunk / period);
  at::parallel_for(0, periods, chunk, [&](int64_t b, int64_t e) {
    // Not zeroed: every exp is written before it is read.
    std::unique_ptr<float[]> buf(new float[std::min(chunk, e - b) * period]);
    for (int64_t p = b; p < e; p += chunk) {
      const int64_t first = p * period, count = std::min(std::min(chunk, e - p) * period, rows * n - first);
      if (bf16)
        softmax_values(static_cast<const uint16_t*>(in) + first, mt.data(), st.data(), rv, buf.get(), o + first, count,
                       period);
      else
        softmax_values(static_cast<const float*>(in) + first, mt.data(), st.data(), rv, buf.get(), o + first, count,
                       period);
    }
  });
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
