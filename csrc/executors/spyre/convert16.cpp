// The Spyre direct kernels' 16-bit array conversions (convert16.h).
#include "executors/spyre/convert16.h"

#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>

#include "executors/cpu_features.h"
#include "executors/spyre/df16.h"

namespace tpu_eager {
namespace spyre {
namespace {

// A bfloat16's float32 bits are its bits shifted up 16 (exact): zero-extend,
// shift, 16 or 8 lanes at a time; the rest one by one.
__attribute__((target("avx512f"))) int64_t widen_bf16_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t widen_bf16_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(w, 16));
  }
  return i;
}

// df16_round_bf16_bits (df16.h) on 16 lanes: the same integer steps, the
// limits as compares; the 32-bit results (at most 0xFFFF) narrowed to 16.
__attribute__((target("avx512f"))) int64_t round_bf16_avx512(const float* src, uint16_t* dst, int64_t n) {
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u)), abs = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i half = _mm512_set1_epi32(static_cast<int>(detail::kHalf)), low = _mm512_set1_epi32(~0x3FFF);
  const __m512i zero_below = _mm512_set1_epi32(0x30002000 - 1), nan_from = _mm512_set1_epi32(0x4FFFA000 - 1);
  const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), all = _mm512_set1_epi32(0xFFFF);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __m512i mag = _mm512_and_si512(u, abs);
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(mag, half), low);
    const __m512i v = _mm512_or_si512(_mm512_and_si512(u, sign_bit),
                                      _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(mag, zero_below), r));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(v, 16), one);
    __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(v, bias), lsb), 16);
    b = _mm512_mask_mov_epi32(b, _mm512_cmpgt_epi32_mask(mag, nan_from), all);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(b));
  }
  return i;
}

// The same on 8 lanes, two vectors per step packed to 16 values.
__attribute__((target("avx2"))) inline __m256i round_bf16_lanes_avx2(__m256i u) {
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i r = _mm256_and_si256(_mm256_add_epi32(mag, _mm256_set1_epi32(static_cast<int>(detail::kHalf))),
                                     _mm256_set1_epi32(~0x3FFF));
  const __m256i keep = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x30002000 - 1));
  const __m256i v =
      _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0x80000000u))), _mm256_and_si256(keep, r));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
  const __m256i b = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x4FFFA000 - 1));
  return _mm256_or_si256(b, _mm256_and_si256(nan, _mm256_set1_epi32(0xFFFF)));
}

__attribute__((target("avx2"))) int64_t round_bf16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i b0 = round_bf16_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b1 = round_bf16_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus interleaves the 128-bit halves: put them back in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(b0, b1), 0xD8));
  }
  return i;
}

// float16 -> float32 (exact): F16C's conversion 16 or 8 at a time, c10's bit
// arithmetic for the rest (the same values).
__attribute__((target("avx512f"))) int64_t widen_half_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  return i;
}

__attribute__((target("avx2,f16c"))) int64_t widen_half_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  return i;
}

// float32 -> float16 to nearest even: F16C 16 or 8 at a time; returns how many were converted.
__attribute__((target("avx512f"))) int64_t narrow_half_avx512(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

__attribute__((target("avx2,f16c"))) int64_t narrow_half_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

bool has_f16c() { return cpu::has(cpu::Feature::kAvx2) && cpu::has(cpu::Feature::kF16c); }

}  // namespace

void widen16(c10::ScalarType t, const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  if (t == c10::kBFloat16) {
    if (cpu::has(cpu::Feature::kAvx512f))
      i = widen_bf16_avx512(src, dst, n);
    else if (cpu::has(cpu::Feature::kAvx2))
      i = widen_bf16_avx2(src, dst, n);
    for (; i < n; ++i) dst[i] = __builtin_bit_cast(float, static_cast<uint32_t>(src[i]) << 16);
    return;
  }
  if (cpu::has(cpu::Feature::kAvx512f))
    i = widen_half_avx512(src, dst, n);
  else if (has_f16c())
    i = widen_half_f16c(src, dst, n);
  for (; i < n; ++i) dst[i] = c10::detail::fp16_ieee_to_fp32_value(src[i]);
}

void narrow_half(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  if (cpu::has(cpu::Feature::kAvx512f))
    i = narrow_half_avx512(src, dst, n);
  else if (has_f16c())
    i = narrow_half_f16c(src, dst, n);
  for (; i < n; ++i) dst[i] = c10::detail::fp16_ieee_from_fp32_value(src[i]);
}

void store16(c10::ScalarType t, const float* src, uint16_t* dst, int64_t n) {
  const auto* bits = reinterpret_cast<const uint32_t*>(src);
  if (t == c10::kBFloat16) {
    int64_t i = 0;
    if (cpu::has(cpu::Feature::kAvx512f))
      i = round_bf16_avx512(src, dst, n);
    else if (cpu::has(cpu::Feature::kAvx2))
      i = round_bf16_avx2(src, dst, n);
    if (i < n) df16_round_bf16_array(bits + i, dst + i, n - i);
    return;
  }
  // float16: df16 values (f32) a block at a time, then to nearest even.
  constexpr int64_t kBlock = 512;
  alignas(64) uint32_t r[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    df16_round_array(bits + b, r, m);
    narrow_half(reinterpret_cast<const float*>(r), dst + b, m);
  }
}

}  // namespace spyre
}  // namespace tpu_eager
