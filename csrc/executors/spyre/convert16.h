// The Spyre direct kernels' 16-bit array conversions: the exact widening of
// float16 / bfloat16 values to float32, and the one df16 rounding of float32
// results held as float16 / bfloat16 (the values of df16_round_as, df16.h).
// Each picks its build by cpu::has at each call (AVX-512, AVX2 + F16C,
// baseline); every build gives the same bits (the conversions are exact or
// IEEE round to nearest even).
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

namespace tpu_eager {
namespace spyre {

// True for the dtypes below (kBFloat16, kHalf).
inline bool is_dtype16(c10::ScalarType t) { return t == c10::kBFloat16 || t == c10::kHalf; }

// dst[i] = the float32 value of src[i] (exact): `n` elements of dtype `t`
// (kBFloat16 or kHalf) given as their bits. src and dst must not overlap.
void widen16(c10::ScalarType t, const uint16_t* src, float* dst, int64_t n);

// dst[i] = the float16 bits of src[i] rounded to nearest even (IEEE, as
// c10::Half and F16C; values past float16's range +-inf, NaN stays NaN), no
// df16 step: for values already rounded (the chain pass's df16 values) and
// float16 round trips. src and dst must not overlap.
void narrow_half(const float* src, uint16_t* dst, int64_t n);

// dst[i] = df16(src[i]) held in dtype `t` (kBFloat16: df16_round_bf16_bits;
// kHalf: df16_round_f32_bits, then float16 to nearest even, values past
// float16's range +-inf), the bits of df16_round_as(src, t). src and dst must
// not overlap.
void store16(c10::ScalarType t, const float* src, uint16_t* dst, int64_t n);

}  // namespace spyre
}  // namespace tpu_eager
