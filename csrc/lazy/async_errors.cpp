// Errors of failed ops that no read has reported yet (lazy/async_errors.h).
#include "lazy/async_errors.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "lazy/deferred_storage.h"

namespace tpu_eager {

std::atomic<int64_t> g_unreported_errors{0};
namespace {

// A failure no read has reported: its error and the storages that held it
// when its flush ended (so reporting it marks them seen). A dying storage
// leaves `storages` (forget_unreported_storage), so every pointer is alive.
struct Unreported {
  std::exception_ptr error;
  std::vector<DeferredStorage*> storages;
  bool truncated = false;  // more storages held it than `storages` lists

  // Adds `s` (once; up to AsyncErrors::kMaxStorages, then `truncated`).
  void add(DeferredStorage* s);
  // Whether a tensor still holds the failed value: a read of it will raise the
  // error. (An incomplete list counts as held.)
  bool held() const {
    if (truncated) return true;
    for (const DeferredStorage* s : storages)
      if (s->error == error && s->external_alive.load(std::memory_order_acquire)) return true;
    return false;
  }
};

struct AsyncErrors {
  // Bounds: failures kept per chip (a program that never synchronizes and
  // never reads its failed values keeps its first ones) and storages marked per failure.
  static constexpr size_t kMaxPerDevice = 16;
  static constexpr size_t kMaxStorages = 64;
  std::mutex mu;
  std::unordered_map<int, std::vector<Unreported>> by_device;  // oldest first
  // Entries over all chips: g_unreported_errors.
};

AsyncErrors& async_errors() {
  static AsyncErrors* a = new AsyncErrors();  // never destroyed: storages may die at exit
  return *a;
}

void Unreported::add(DeferredStorage* s) {
  if (std::find(storages.begin(), storages.end(), s) != storages.end()) return;
  if (storages.size() < AsyncErrors::kMaxStorages) {
    storages.push_back(s);
  } else {
    truncated = true;
  }
}

Unreported* find_entry(std::vector<Unreported>& list, const std::exception_ptr& e) {
  for (auto& u : list)
    if (u.error == e) return &u;
  return nullptr;
}

}  // namespace

void note_flush_errors(int device, const std::vector<Node>& nodes, const std::exception_ptr& first, bool reported) {
  if (!first) return;
  std::vector<Unreported> found;
  if (!reported && !error_was_seen(first)) found.push_back({first, {}});
  for (const auto& n : nodes)
    for_each_written_storage(n, [&](DeferredStorage* s) {
      if (!s->error || s->error_seen || (reported && s->error == first)) return;
      Unreported* u = find_entry(found, s->error);
      if (u == nullptr) {
        found.push_back({s->error, {}});
        u = &found.back();
      }
      u->add(s);
    });
  if (found.empty()) return;
  auto& a = async_errors();
  std::lock_guard<std::mutex> lock(a.mu);
  auto& list = a.by_device[device];
  for (auto& f : found) {
    // A value computed from an earlier unreported failure fails with its error again.
    if (Unreported* u = find_entry(list, f.error)) {
      for (DeferredStorage* s : f.storages) u->add(s);
      u->truncated = u->truncated || f.truncated;
      continue;
    }
    if (list.size() >= AsyncErrors::kMaxPerDevice) continue;
    list.push_back(std::move(f));
    g_unreported_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

std::exception_ptr take_unreported_error(int device, bool only_lost) {
  auto& a = async_errors();
  if (g_unreported_errors.load(std::memory_order_relaxed) == 0) return nullptr;
  std::exception_ptr e;
  // The storages' errors are read and marked under the chip's flush lock: a
  // flush of the chip on another thread may be writing them.
  with_chip_flush_lock(device, [&] {
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.by_device.find(device);
    if (it == a.by_device.end()) return;
    auto& list = it->second;
    auto u = list.begin();
    if (only_lost)
      while (u != list.end() && u->held()) ++u;
    if (u == list.end()) return;
    e = u->error;
    for (DeferredStorage* s : u->storages)
      if (s->error == e) s->error_seen = true;
    list.erase(u);
    g_unreported_errors.fetch_sub(1, std::memory_order_relaxed);
  });
  if (!e) return nullptr;
  note_error_seen(e);  // also drops it from other lists (forget_unreported_error), after the lock
  return e;
}

void raise_lost_error(int device) {
  if (g_unreported_errors.load(std::memory_order_relaxed) == 0) return;
  if (std::exception_ptr e = take_unreported_error(device, /*only_lost=*/true)) std::rethrow_exception(e);
}

std::exception_ptr synchronize_errors(int device, FlushReason reason) {
  (void)flush_device(device, reason);  // its errors join the device's unreported ones
  return take_unreported_error(device);
}

void forget_unreported_error(const std::exception_ptr& e) {
  auto& a = async_errors();
  if (!e || g_unreported_errors.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(a.mu);
  for (auto& [device, list] : a.by_device) {
    const size_t before = list.size();
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Unreported& u) { return u.error == e; }), list.end());
    g_unreported_errors.fetch_sub(static_cast<int64_t>(before - list.size()), std::memory_order_relaxed);
  }
}

void forget_unreported_storage_listed(const DeferredStorage* s) {
  auto& a = async_errors();
  std::lock_guard<std::mutex> lock(a.mu);
  for (auto& [device, list] : a.by_device)
    for (auto& u : list) u.storages.erase(std::remove(u.storages.begin(), u.storages.end(), s), u.storages.end());
}

}  // namespace tpu_eager
