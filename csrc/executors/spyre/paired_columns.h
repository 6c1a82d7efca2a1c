// 8-lane float32 vectors and bfloat16 data read 16 values at a time as its
// even and odd columns: the loop helpers shared by softmax's corelet partials
// (ring_softmax.cpp) and its normalizing pass (df16.cpp).
//
// The types are GCC vector types of 32 bytes: one AVX2 vector in a function
// built for AVX2, two SSE ones in the baseline build (target_clones), with
// operations written out where the -O2 vectorizer would not find them.
#pragma once

#include <cstdint>
#include <cstring>

namespace tpu_eager {
namespace spyre {

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));
constexpr int64_t kLanes = 8;

// A block of bfloat16 values in paired order: 16 consecutive values held as
// their 8 even ones, then their 8 odd ones. A 32-byte load splits into the
// two halves with one instruction each (each 32-bit word's high half is the
// odd value, its low half the even one), and paired results go back into
// column order as one 32-bit word per pair (pack_pairs), with no shuffle.
constexpr int64_t kPair = 2 * kLanes;

// The float32 value of an element: bfloat16 bits widen exactly by a shift.
inline float widen(float v) { return v; }
inline float widen(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

__attribute__((always_inline)) inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline F8 load8(const uint16_t* p) {
  H8 h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<F8>(__builtin_convertvector(h, U8) << 16);
}
__attribute__((always_inline)) inline void store8(float* p, F8 v) { std::memcpy(p, &v, sizeof v); }

// The float32 widening of 16 bfloat16 values at p: even (p[0], p[2], ...)
// and odd (p[1], p[3], ...).
__attribute__((always_inline)) inline void load16(const uint16_t* p, F8& even, F8& odd) {
  U8 w;
  std::memcpy(&w, p, sizeof w);
  even = reinterpret_cast<F8>(w << 16);
  odd = reinterpret_cast<F8>(w & 0xFFFF0000u);
}

// 16 uint16 values stored at p in column order from their paired halves:
// `even` holds its values in the low 16 bits of each lane (the rest zero),
// `odd` in the high 16 bits (the rest zero).
__attribute__((always_inline)) inline void store_pairs(uint16_t* p, U8 even, U8 odd) {
  const U8 w = even | odd;
  std::memcpy(p, &w, sizeof w);
}

// The paired index of column j of a row whose first `whole` columns (a
// multiple of kPair) are in paired order; j >= whole stays in place.
inline int64_t paired_index(int64_t j, int64_t whole) {
  return j >= whole ? j : (j & ~(kPair - 1)) + ((j & (kPair - 1)) >> 1) + ((j & 1) * kLanes);
}

}  // namespace spyre
}  // namespace tpu_eager
