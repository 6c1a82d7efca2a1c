// The active simulated chip, set from Python (torch_tpu_eager.set_target).
#include "executors/tpu/chip.h"

#include <mutex>

namespace tpu_eager {
namespace tpu {
namespace {

std::mutex g_mu;
ChipParams& chip_slot() {
  static ChipParams* chip = new ChipParams();  // never destroyed: flushes may run during shutdown
  return *chip;
}

}  // namespace

ChipParams active_chip() {
  std::lock_guard<std::mutex> lock(g_mu);
  return chip_slot();
}

void set_active_chip(const ChipParams& chip) {
  std::lock_guard<std::mutex> lock(g_mu);
  chip_slot() = chip;
}

}  // namespace tpu
}  // namespace tpu_eager
