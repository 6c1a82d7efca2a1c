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
  // Last reader of each planned register (instrs.size() for extra_use).
  int planned = 0;
  for (const Instr& in : instrs)
    if (in.out < 0) planned = std::max(planned, in.dst + 1);
  std::vector<int> last_use(planned, -1);
  const int n = static_cast<int>(instrs.size());
  for (int i = 0; i < n; ++i)
    for (const Operand* o : {&instrs[i].a, &instrs[i].b, &instrs[i].c})
      if (o->kind == Operand::kReg) last_use[o->index] = i;
  if (extra_use && extra_use->kind == Operand::kReg) last_use[extra_use->index] = n;

  std::vector<int> phys(planned, -1), free_regs;
  int count = 0;
  for (int i = 0; i < n; ++i) {
    Instr& in = instrs[i];
    for (Operand* o : {&in.a, &in.b, &in.c}) {
      if (o->kind != Operand::kReg) continue;
      const int v = o->index;
      o->index = phys[v];
      // Freed before the destination is chosen: an elementwise pass may write
      // the register it reads (each element is read before it is written).
      if (last_use[v] == i && phys[v] >= 0) {
        free_regs.push_back(phys[v]);
        phys[v] = -1 - phys[v];  // keep it resolvable for the second operand (a * a)
      }
    }
    for (Operand* o : {&in.a, &in.b, &in.c})
      if (o->kind == Operand::kReg && o->index < 0) o->index = -1 - o->index;
    if (in.out >= 0) continue;
    const int v = in.dst;
    if (free_regs.empty()) {
      in.dst = count++;
    } else {
      in.dst = free_regs.back();
      free_regs.pop_back();
    }
    phys[v] = in.dst;
    if (last_use[v] < 0) {  // never read: its register is free again at once
      free_regs.push_back(in.dst);
      phys[v] = -1 - in.dst;
    }
  }
  if (extra_use && extra_use->kind == Operand::kReg) {
    const int p = phys[extra_use->index];
    extra_use->index = p >= 0 ? p : -1 - p;
  }
  return count;
}

}  // namespace fused
}  // namespace tpu
}  // namespace tpu_eager
