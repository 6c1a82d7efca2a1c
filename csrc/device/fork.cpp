// Fork safety (fork.h): a pthread_atfork child handler, as CUDA registers one.
#include "device/fork.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include <c10/util/Exception.h>

namespace tpu_eager {
namespace {

std::atomic<bool> g_used{false};
std::atomic<bool> g_bad_fork{false};

// Runs in the child right after fork(): only atomic stores (async-signal-safe).
void on_fork_child() {
  if (g_used.load(std::memory_order_relaxed)) g_bad_fork.store(true, std::memory_order_relaxed);
}

}  // namespace

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &on_fork_child); });
}

void note_device_used() {
  if (!g_used.load(std::memory_order_relaxed)) g_used.store(true, std::memory_order_relaxed);
}

bool in_bad_fork() { return g_bad_fork.load(std::memory_order_relaxed); }

bool device_initialized() { return g_used.load(std::memory_order_relaxed) && !in_bad_fork(); }

void check_not_in_bad_fork() {
  TORCH_CHECK(!in_bad_fork(),
              "Cannot re-initialize TPU in forked subprocess. To use TPU with multiprocessing, you must use the "
              "'spawn' start method");
}

}  // namespace tpu_eager

namespace tpu_eager {
namespace {
// At load: a fork before the first use needs no handler, but one after it does.
const bool g_fork_handler_installed = (install_fork_handler(), true);
}  // namespace
}  // namespace tpu_eager
