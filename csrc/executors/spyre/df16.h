// DLFloat16 (df16), the native 16-bit format of IBM Spyre, and its codec
// from and to IEEE float32.
//
// Format (Agrawal et al., "DLFloat: A 16-b Floating Point Format Designed for
// Deep Learning Training and Inference", IEEE ARITH 2019; the same "NNP data
// type 1" is what IBM zDNN and onnx-mlir's NNPA stickify code convert to):
//   bit 15 sign s | bits 14..9 exponent E (6 bits, bias 31) | bits 8..0 fraction F
//   value = (-1)^s * 2^(E-31) * (1 + F/512) for every E in 0..63: there are no
//   subnormals and no exponent value is reserved. Two exceptions take one code
//   point each: low 15 bits all 0 is ±0 (so 2^-31 itself is not representable:
//   its code is zero), and low 15 bits all 1 (0x7FFF / 0xFFFF) is the single
//   NaN/Inf code. Largest finite: 0x7FFE = 2^32 * (1 + 510/512) = 8573157376;
//   smallest nonzero magnitude: 0x0001 = 2^-31 * (1 + 1/512).
//
// float32 -> df16 (the rule of the zDNN / onnx-mlir conversion, re-derived):
//   round the 23-bit fraction to 9 bits on the magnitude bits, so a carry out of
//   the fraction moves into the exponent; ties away from zero by default (add
//   1<<13, truncate 14 bits), ties to even as an option. Then
//   - rounded exponent below 0 (magnitude < 2^-31 after rounding) -> signed zero;
//     a value that rounds to exactly 2^-31 lands on code 0 and is zero too, and a
//     value that rounds up to 0x0001 becomes 0x0001 (no flush before rounding);
//   - rounded result at or beyond the NaN/Inf code (E > 63, or E == 63 with
//     F == 511), and ±Inf -> 0x7FFF with the sign (default), or the largest
//     finite 0x7FFE with the sign (saturate option);
//   - NaN -> 0x7FFF with the sign in both overflow modes (a NaN has no
//     magnitude to saturate to).
// df16 -> float32 is exact (9 fraction bits, exponents 2^-31..2^32 fit f32);
// the NaN/Inf code decodes to a quiet NaN carrying the sign, as zDNN does.
#pragma once

#include <cstdint>
#include <cstring>

#include <ATen/core/Tensor.h>

namespace tpu_eager {
namespace spyre {

enum class Df16Rounding : uint8_t { kNearestAway, kNearestEven };
enum class Df16Overflow : uint8_t { kNanInf, kSaturate };

constexpr uint16_t kDf16NanInf = 0x7FFF;
constexpr uint16_t kDf16MaxFinite = 0x7FFE;

namespace detail {
// f32 biased exponent 127 and df16 biased exponent 31 describe the same power,
// so df16 E = f32 exponent - 96; in units of the 9-bit fraction field:
constexpr int32_t kExpShift = 96 << 9;
constexpr uint32_t kHalf = 1u << 13;  // half a df16 ulp in f32 fraction units
}  // namespace detail

// One float32, given as its IEEE bits, -> df16 bits. Branch-free (selects
// only) so loops over arrays vectorize.
inline uint16_t df16_from_f32_bits(uint32_t u, Df16Rounding rounding = Df16Rounding::kNearestAway,
                                   Df16Overflow overflow = Df16Overflow::kNanInf) {
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7FFFFFFFu;
  // Rounding on the whole magnitude lets the fraction's carry reach the exponent.
  const uint32_t bias = rounding == Df16Rounding::kNearestAway ? detail::kHalf : detail::kHalf - 1 + ((mag >> 14) & 1u);
  const int32_t t = static_cast<int32_t>((mag + bias) >> 14) - detail::kExpShift;
  const uint32_t ovf = overflow == Df16Overflow::kNanInf ? kDf16NanInf : kDf16MaxFinite;
  uint32_t code = t < 0 ? 0u : (t >= static_cast<int32_t>(kDf16NanInf) ? ovf : static_cast<uint32_t>(t));
  code = mag > 0x7F800000u ? kDf16NanInf : code;  // NaN
  return static_cast<uint16_t>(sign | code);
}

// One float32 -> df16 bits.
inline uint16_t df16_from_float(float x, Df16Rounding rounding = Df16Rounding::kNearestAway,
                                Df16Overflow overflow = Df16Overflow::kNanInf) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return df16_from_f32_bits(u, rounding, overflow);
}

// One df16 code -> float32 bits (exact).
inline uint32_t df16_to_f32_bits(uint16_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x8000u) << 16;
  const uint32_t m = c & 0x7FFFu;
  uint32_t bits = sign | ((m + detail::kExpShift) << 14);
  bits = m == 0 ? sign : bits;
  return m == kDf16NanInf ? (sign | 0x7FC00000u) : bits;  // quiet NaN
}

// df16 of one float32, given and returned as IEEE bits: the same value as
// df16_to_f32_bits(df16_from_f32_bits(u)) for the default modes (ties away
// from zero, NaN/Inf code) on every one of the 2^32 inputs (checked
// exhaustively), in 32-bit arithmetic only, so an array loop vectorizes
// without the 16-bit packing of the code. The rounded magnitude r (fraction
// rounded to 9 bits, carry into the exponent) is its own decoded value,
// except r <= 2^-31 (df16 code 0 or below: zero) and r >= the NaN/Inf code's
// f32 image 0x4FFFC000 (and f32 NaN/Inf): a quiet NaN with the sign.
inline uint32_t df16_round_f32_bits(uint32_t u) {
  // The two limits as conditions on the magnitude before rounding (signed
  // compares, one instruction each in a vector loop): r <= 2^-31 exactly
  // when mag < 0x30002000, r >= 0x4FFFC000 exactly when mag >= 0x4FFFA000.
  const uint32_t sign = u & 0x80000000u;
  const int32_t mag = static_cast<int32_t>(u & 0x7FFFFFFFu);
  const uint32_t r = (static_cast<uint32_t>(mag) + detail::kHalf) & ~0x3FFFu;
  const uint32_t keep = 0u - static_cast<uint32_t>(mag >= 0x30002000);
  const uint32_t nan = 0u - static_cast<uint32_t>(mag >= 0x4FFFA000);
  return sign | (r & keep & ~nan) | (0x7FC00000u & nan);
}

// bfloat16 bits of df16(u) (u: float32 bits): df16_round_f32_bits, then
// float32 -> bfloat16 as ATen converts it (round to nearest even; any NaN
// -> 0xFFFF, ATen's vectorized conversion; df16 values never overflow
// bfloat16). One pass instead of a rounding pass and a conversion pass.
inline uint16_t df16_round_bf16_bits(uint32_t u) {
  const uint32_t sign = u & 0x80000000u;
  const int32_t mag = static_cast<int32_t>(u & 0x7FFFFFFFu);
  const uint32_t r = (static_cast<uint32_t>(mag) + detail::kHalf) & ~0x3FFFu;
  const uint32_t v = sign | (r & (0u - static_cast<uint32_t>(mag >= 0x30002000)));  // df16 value, or +-0
  const uint32_t b = (v + 0x7FFFu + ((v >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(mag >= 0x4FFFA000 ? 0xFFFFu : b);
}

// df16_round_bf16_bits(b << 16) of bfloat16 bits b, in 16-bit arithmetic
// (16 values per AVX2 vector instead of 8): a bfloat16 value (7 fraction
// bits) is its own df16 rounding between the two limits, which on the 16
// magnitude bits are: below 0x3001 (f32 magnitude below 0x30002000) a zero
// with b's sign, from 0x5000 (f32 0x4FFFA000: the NaN/Inf code) 0xFFFF.
// Masks, not selects: GCC vectorizes this form into and/compare/or.
inline uint16_t df16_round_bf16_half(uint16_t b) {
  const int16_t mag = static_cast<int16_t>(b & 0x7FFF);
  const uint16_t keep = static_cast<uint16_t>(-static_cast<int16_t>(mag > 0x3000)) | 0x8000u;
  const uint16_t nan = static_cast<uint16_t>(-static_cast<int16_t>(mag > 0x4FFF));
  return static_cast<uint16_t>((b & keep) | nan);
}

// One df16 code -> float32 (exact).
inline float df16_to_float(uint16_t c) {
  const uint32_t bits = df16_to_f32_bits(c);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Contiguous arrays of n elements; single-threaded, vectorized. float32 data
// is passed as its IEEE bits (view a float tensor as int32), which keeps the
// loops free of type punning through pointers.
void df16_encode_array(const uint32_t* f32_bits, uint16_t* dst, int64_t n, Df16Rounding rounding,
                       Df16Overflow overflow);
void df16_decode_array(const uint16_t* src, uint32_t* f32_bits, int64_t n);
// dst[i] = df16_round_f32_bits(src[i]) (default modes); AVX2 when the CPU has it.
void df16_round_array(const uint32_t* f32_bits, uint32_t* dst, int64_t n);
// dst[i] = df16_round_bf16_bits(src[i]); AVX2 when the CPU has it.
void df16_round_bf16_array(const uint32_t* f32_bits, uint16_t* dst, int64_t n);
// bf16[i] = df16_round_bf16_bits(bf16[i] << 16): bfloat16 values (as bits)
// rounded through df16 in place (a bfloat16 widens to f32 exactly).
void df16_round_bf16_in_place(uint16_t* bf16, int64_t n);

// Tensor forms (CPU tensors; large ones are split with at::parallel_for).
// x: any floating dtype; float64 is first rounded to float32 (Spyre converts
// from f32). Returns an int16 tensor of x's shape holding the df16 bits.
at::Tensor df16_encode(const at::Tensor& x, Df16Rounding rounding = Df16Rounding::kNearestAway,
                       Df16Overflow overflow = Df16Overflow::kNanInf);
// bits: int16 tensor of df16 codes. Returns float32 of the same shape.
at::Tensor df16_decode(const at::Tensor& bits);
// df16_round in the default modes (nearest-away, NaN/Inf), returned as dtype:
// float32 holding the df16 values exactly, converted to dtype (float16 turns
// df16 values past its range into +-inf; bfloat16 is converted in the same
// pass as the rounding). Same shape as x. Throws c10::TypeError for a
// non-floating x and c10::Error for a non-CPU x.
at::Tensor df16_round_as(const at::Tensor& x, c10::ScalarType dtype);
// out = df16_round_as(x, bfloat16), written into out: x a contiguous float32
// CPU tensor, out a contiguous bfloat16 CPU tensor with x's number of
// elements (the caller checks; nothing here does).
void df16_round_bf16_into(const at::Tensor& out, const at::Tensor& x);
// Softmax's normalizing pass to bfloat16 in one pass over x:
// out = df16_round_as(x.sub(m).exp().div(s), bfloat16) with m and s
// broadcast over x's rows: x a contiguous float32 or bfloat16 CPU tensor of
// rows * s.numel() elements (bfloat16 read in place as its exact float32
// widening: no f32 copy of x is made), m and s contiguous float32 tensors of one row each,
// out a contiguous bfloat16 tensor of x's size (the caller checks; nothing
// here does). The difference and quotient are IEEE f32 and the exp is CPU's
// float32 exp, so the values equal those of the three ATen ops (the quotient
// is taken by 1/s where that provably rounds to the same df16 value, by the
// divide elsewhere). Requires
// df16_softmax_bf16_available() (torch built with MKL's VML, whose exp
// torch.exp calls on x86-64).
bool df16_softmax_bf16_available();
// y[i] = the exp estimate of softmax's bfloat16 normalizing pass (df16.cpp,
// kExpEstimateSteps) at x[i], for its exhaustive check against torch.exp: by
// the build the pass runs (its 16-lane AVX-512 build where cpu::has(kAvx512f),
// else its 8-lane AVX2 + FMA build); false (y untouched) without AVX2 and FMA,
// where the pass takes CPU's exp.
bool df16_exp_estimate_array(const float* x, float* y, int64_t n);
void df16_softmax_bf16_into(const at::Tensor& out, const at::Tensor& x, const at::Tensor& m, const at::Tensor& s);
// decode(encode(x)) cast back to x's dtype: what a tensor of x's dtype holds
// after a round trip through Spyre memory.
at::Tensor df16_round(const at::Tensor& x, Df16Rounding rounding = Df16Rounding::kNearestAway,
                      Df16Overflow overflow = Df16Overflow::kNanInf);
// x = df16_round(x) (default modes) without temporaries when x is a
// contiguous bfloat16 tensor; any floating x otherwise.
void df16_round_(const at::Tensor& x);

}  // namespace spyre
}  // namespace tpu_eager
