// Selection of the active executor by target kind.
#include "executors/executor.h"

#include <atomic>

namespace tpu_eager {
namespace {
std::atomic<int> g_kind{static_cast<int>(TargetKind::kTpu)};
}  // namespace

TargetKind active_target_kind() { return static_cast<TargetKind>(g_kind.load(std::memory_order_acquire)); }

void set_active_target_kind(TargetKind kind) { g_kind.store(static_cast<int>(kind), std::memory_order_release); }

Executor& active_executor() { return active_target_kind() == TargetKind::kSpyre ? spyre_executor() : tpu_executor(); }

}  // namespace tpu_eager
