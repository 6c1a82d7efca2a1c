// Register renaming of fused elementwise programs (see fused_program.h).
#include "executors/tpu/fused_program.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>
#include <vector>

namespace tpu_eager {
namespace tpu {
namespace fused {
namespace {
std::atomic<MathRoutines> g_math{MathRoutines::kSleef};

// The L3 size of CPU 0 in bytes from Linux's sysfs cache description, or 0.
// (glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) reports 320 MiB on this VM, whose
// L3 is 32 MiB per sysfs and lscpu.)
int64_t l3_bytes() {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    int64_t value = 0;
    char unit = 0;
    if (!(level >> lv) || lv != 3 || !(size >> value)) continue;
    size >> unit;  // "32768K"
    return value * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
  }
  return 0;
}

int64_t default_stream_threshold() {
  const int64_t l3 = l3_bytes();
  return l3 > 0 ? l3 / 4 * 3 : int64_t{24} << 20;
}
std::atomic<int64_t> g_stream_threshold{-1};  // -1: the default
}  // namespace

void set_math_routines(MathRoutines m) { g_math.store(m, std::memory_order_relaxed); }
MathRoutines math_routines() { return g_math.load(std::memory_order_relaxed); }

int64_t stream_store_threshold() {
  static const int64_t fallback = default_stream_threshold();
  const int64_t t = g_stream_threshold.load(std::memory_order_relaxed);
  return t < 0 ? fallback : t;
}
void set_stream_store_threshold(int64_t bytes) { g_stream_threshold.store(bytes < 0 ? -1 : bytes); }

int assign_registers(std::vector<Instr>& instrs, Operand* extra_use) {
  return rename_registers(instrs, extra_use, false);
}

}  // namespace fused
}  // namespace tpu
}  // namespace tpu_eager
