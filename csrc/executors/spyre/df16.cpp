// df16 codec over arrays and tensors (format and rounding rules in df16.h).
#include "executors/spyre/df16.h"

#include <algorithm>
#include <cstring>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace tpu_eager {
namespace spyre {

namespace {

// Below this many elements one thread is faster than waking the pool.
constexpr int64_t kGrain = 1 << 15;

// Elements per inner block: a fixed trip count is what lets GCC's -O2 (cheap)
// vectorizer take the loop; the tail runs scalar.
constexpr int64_t kBlock = 64;

// dst[i] = f(src[i]) in blocks of kBlock (src and dst may be the same array:
// each element is read before it is written). Inlined into each caller, so it
// takes the caller's target (the AVX2 clones below vectorize it).
template <typename In, typename Out, typename F>
inline void map_blocked(const In* src, Out* dst, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) dst[i + j] = f(src[i + j]);
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

// dst[r * n + j] = df16_round_bf16_bits(x[r * n + j] / d[j]): the quotient in
// f32 (IEEE division, as ATen's div), then rounded and converted as
// round_bf16_loop does, block by block (the quotients of a block go through
// a bits buffer, which keeps both loops vectorizable).
__attribute__((target_clones("avx2", "default"))) void div_round_bf16_loop(const float* __restrict x,
                                                                           const float* __restrict d,
                                                                           uint16_t* __restrict dst, int64_t rows,
                                                                           int64_t n) {
  alignas(64) float q[kBlock];
  alignas(64) uint32_t u[kBlock];
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    uint16_t* o = dst + r * n;
    int64_t j = 0;
    for (; j + kBlock <= n; j += kBlock) {
      for (int64_t k = 0; k < kBlock; ++k) q[k] = xr[j + k] / d[j + k];
      std::memcpy(u, q, sizeof q);
      for (int64_t k = 0; k < kBlock; ++k) o[j + k] = df16_round_bf16_bits(u[k]);
    }
    for (; j < n; ++j) {
      const float v = xr[j] / d[j];
      uint32_t b;
      std::memcpy(&b, &v, sizeof b);
      o[j] = df16_round_bf16_bits(b);
    }
  }
}

}  // namespace

void df16_div_round_bf16_into(const at::Tensor& out, const at::Tensor& x, const at::Tensor& d) {
  const int64_t n = d.numel();
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  const float* in = x.const_data_ptr<float>();
  const float* dv = d.const_data_ptr<float>();
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n)),
                   [&](int64_t b, int64_t e) { div_round_bf16_loop(in + b * n, dv, o + b * n, e - b, n); });
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
