// bfloat16 / float16 conversions of the fused loops' tiles (see Elem in
// fused_program.h), compiled for AVX2 + F16C. fused_elementwise.cpp's
// fused_loops_available() checks the CPU has both.
#pragma GCC target("avx2,fma,f16c")
// The pragma enables the instructions; ATen's vector headers also look at the macros.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "executors/tpu/fused_program.h"

namespace tpu_eager {
namespace tpu {
namespace fused {

void widen_reduced(const uint16_t* src, float* dst, int64_t n, Elem t) {
  int64_t i = 0;
  if (t == Elem::kBFloat16) {
    for (; i + 8 <= n; i += 8) {
      const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::BFloat16(src[i], c10::BFloat16::from_bits()));
  } else {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
}

void narrow_reduced(const float* src, void* dst, int64_t n, Elem t) {
  if (t == Elem::kBFloat16) {
    at::vec::convert(src, static_cast<c10::BFloat16*>(dst), n);
  } else {
    at::vec::convert(src, static_cast<c10::Half*>(dst), n);
  }
}

void round_reduced(float* v, int64_t n, Elem t) {
  if (t != Elem::kBFloat16 && t != Elem::kHalf) return;
  uint16_t tmp[256];
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t len = std::min<int64_t>(256, n - i);
    narrow_reduced(v + i, tmp, len, t);
    widen_reduced(tmp, v + i, len, t);
  }
}

}  // namespace fused
}  // namespace tpu
}  // namespace tpu_eager
