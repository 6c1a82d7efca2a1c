// The host CPU's instruction-set extensions, as the executors' vector kernels
// choose their builds by them: one probe for every caller, and a switch that
// turns a feature off so tests can run the narrower build of the same code on
// a CPU that has the wider one (its values must be the same bits).
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace cpu {

enum class Feature : uint8_t {
  kAvx2,     // 256-bit integer and float vectors
  kFma,      // fused multiply-add (rounds once)
  kF16c,     // float16 <-> float32 conversions
  kAvx512f,  // 512-bit vectors, 16 float lanes, mask registers
};
constexpr int kFeatureCount = 4;

// The feature's bit in the masks below.
constexpr uint32_t bit(Feature f) { return uint32_t{1} << static_cast<int>(f); }

// Whether the CPU has `f` (probed once, by cpuid) and it is not switched off.
// Cheap: one relaxed atomic load; callers ask at each choice, not once.
bool has(Feature f);

// Switches off the features in `mask` (bits of bit(f)) and on the others,
// process-wide; returns the previous mask. Only narrows: a feature the CPU
// lacks stays off. Kernels compiled before keep the build they chose.
uint32_t set_disabled(uint32_t mask);

// Name of `f` as GCC's __builtin_cpu_supports spells it ("avx2", "avx512f", ...).
const char* name(Feature f);

}  // namespace cpu
}  // namespace tpu_eager
