#include "executors/cpu_features.h"

#include <atomic>

namespace tpu_eager {
namespace cpu {
namespace {

uint32_t probe() {
  __builtin_cpu_init();
  uint32_t m = 0;
  if (__builtin_cpu_supports("avx2")) m |= bit(Feature::kAvx2);
  if (__builtin_cpu_supports("fma")) m |= bit(Feature::kFma);
  if (__builtin_cpu_supports("f16c")) m |= bit(Feature::kF16c);
  if (__builtin_cpu_supports("avx512f")) m |= bit(Feature::kAvx512f);
  return m;
}

// Probed at first use (also from other files' static initializers).
uint32_t present() {
  static const uint32_t m = probe();
  return m;
}

std::atomic<uint32_t> g_disabled{0};

}  // namespace

bool has(Feature f) { return (present() & ~g_disabled.load(std::memory_order_relaxed) & bit(f)) != 0; }

uint32_t set_disabled(uint32_t mask) { return g_disabled.exchange(mask, std::memory_order_relaxed); }

const char* name(Feature f) {
  switch (f) {
    case Feature::kAvx2:
      return "avx2";
    case Feature::kFma:
      return "fma";
    case Feature::kF16c:
      return "f16c";
    case Feature::kAvx512f:
      return "avx512f";
  }
  return "?";
}

}  // namespace cpu
}  // namespace tpu_eager
