// A lock for the short critical sections of the per-op allocation path.
#pragma once

#include <sched.h>

#include <atomic>

namespace tpu_eager {

// A test-and-test-and-set lock for critical sections of a few loads and
// stores taken on every op (the storage registry's link / unlink, the small
// block cache's take): uncontended it is one atomic exchange to lock and one
// release store to unlock, inline, where an uncontended std::mutex costs two
// calls into the C library (~60 instructions a lock / unlock pair, measured
// with callgrind on the record path, docs/performance.md). Contended, it
// spins briefly and then yields the CPU each round, so a holder that walks a
// long list (the registry's alias lookup) or frees many blocks
// (empty_cache) gets to finish. BasicLockable: use with std::lock_guard.
// Not fork-safe by itself: as with a std::mutex, a child process must not
// take a lock its parent's other threads may have held (device/fork.h).
class SpinLock {
 public:
  void lock() noexcept {
    if (!flag_.exchange(true, std::memory_order_acquire)) return;
    lock_contended();
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    int spins = 0;
    for (;;) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (spins < 64) {
          ++spins;
          __builtin_ia32_pause();
        } else {
          sched_yield();
        }
      }
      if (!flag_.exchange(true, std::memory_order_acquire)) return;
    }
  }
  std::atomic<bool> flag_{false};
};

// Adds `delta` to a counter that only one lock's holder writes (others read it
// without the lock): a load and a store, not a locked read-modify-write, which
// waits for every store before it to reach the cache, such as a new storage's
// writes into memory a flush ago touched (docs/performance.md, section llama23).
template <typename T>
inline void add_locked(std::atomic<T>& counter, typename std::atomic<T>::value_type delta) {
  counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}

}  // namespace tpu_eager
