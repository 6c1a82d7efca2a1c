// Device allocator: host memory per storage plus simulated-memory accounting,
// capped at the active chip's HBM capacity.
#include "device/device.h"

#include "device/block_cache.h"
#include "device/fork.h"
#include "device/host_share.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <c10/core/CPUAllocator.h>

namespace tpu_eager {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<uint64_t> g_next_id{1};
std::atomic<int64_t> g_capacity{0};  // simulated HBM bytes; 0: unlimited
std::mutex g_owner_mu;
std::string g_owner;                  // the chip whose HBM g_capacity is

std::string human(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

void delete_storage_ctx(void* ctx) {
  // In a bad fork the storage is the parent's: leak it rather than take locks
  // a parent thread may have held at the fork (device/fork.h).
  if (in_bad_fork()) return;
  // The StorageImpl died: its DeferredStorage lives on while queue nodes use it.
  auto* ds = static_cast<DeferredStorage*>(ctx);
  ds->external_alive.store(false, std::memory_order_release);
  c10::intrusive_ptr<DeferredStorage>::reclaim(ds);  // drops the StorageImpl's reference
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    check_not_in_bad_fork();
    note_device_used();
    const auto n = static_cast<int64_t>(nbytes);
    // Reserve first, so concurrent allocations cannot both pass the capacity check.
    const int64_t now = g_allocated.fetch_add(n) + n;
    const int64_t cap = g_capacity.load();
    if (cap > 0 && now > cap) {
      g_allocated.fetch_sub(n);
      std::string owner;
      {
        std::lock_guard<std::mutex> lock(g_owner_mu);
        owner = g_owner;
      }
      TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu: out of simulated HBM: tried to allocate ", human(n), " (",
                       nbytes, " bytes); the simulated ", owner, " has ", human(cap), " of HBM, of which ",
                       human(now - n), " are allocated. Free tensors or choose a target with more HBM "
                       "(torch_tpu_eager.set_target).");
    }
    void* data = nullptr;
    if (nbytes > 0) {
      // 64-byte alignment, like CPU's allocator, so vectorized kernels can read it.
      data = block_alloc(nbytes);
      if (data == nullptr) {
        g_allocated.fetch_sub(n);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu: failed to allocate ", nbytes, " bytes of host memory");
      }
    }
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    auto ds = c10::make_intrusive<DeferredStorage>(data, nbytes, g_next_id.fetch_add(1));
    DeferredStorage* raw = ds.release();
    return {data, raw, &delete_storage_ctx, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};

DeviceAllocator g_allocator;

}  // namespace

DeferredStorage::~DeferredStorage() {
  if (in_bad_fork()) return;  // the parent's buffer: leaked, no locks (device/fork.h)
  // A buffer that CPU tensors still share is freed by the last of them.
  if (!release_host_share(this)) block_free(data, nbytes);
  account_free(nbytes);
}

void account_free(size_t nbytes) { g_allocated.fetch_sub(static_cast<int64_t>(nbytes)); }

c10::Allocator* device_allocator() { return &g_allocator; }

DeferredStorage* deferred_storage_of(const c10::Storage& storage) {
  auto* ctx = storage.data_ptr().get_context();
  TORCH_INTERNAL_ASSERT(ctx != nullptr, "tpu storage without a DeferredStorage context");
  return static_cast<DeferredStorage*>(ctx);
}

void set_memory_capacity(int64_t bytes, const std::string& owner) {
  std::lock_guard<std::mutex> lock(g_owner_mu);
  g_owner = owner;
  g_capacity.store(bytes > 0 ? bytes : 0);
}

int64_t memory_capacity(int) { return g_capacity.load(); }

int64_t memory_allocated(int) { return g_allocated.load(); }
int64_t max_memory_allocated(int) { return g_peak.load(); }
void reset_peak_memory_stats(int) { g_peak.store(g_allocated.load()); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace tpu_eager
