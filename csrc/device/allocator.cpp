// Device allocator: host memory per storage plus simulated-memory accounting.
#include "device/device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include <c10/core/CPUAllocator.h>

namespace tpu_eager {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<uint64_t> g_next_id{1};

void delete_storage_ctx(void* ctx) {
  // The StorageImpl died: its DeferredStorage lives on while queue nodes use it.
  auto* ds = static_cast<DeferredStorage*>(ctx);
  ds->external_alive.store(false, std::memory_order_release);
  c10::intrusive_ptr<DeferredStorage>::reclaim(ds);  // drops the StorageImpl's reference
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    if (nbytes > 0) {
      // 64-byte alignment, like CPU's allocator, so vectorized kernels can read it.
      data = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
      TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, "tpu: failed to allocate ", nbytes, " bytes of host memory");
    }
    int64_t now = g_allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
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
  std::free(data);
  account_free(nbytes);
}

void account_free(size_t nbytes) { g_allocated.fetch_sub(static_cast<int64_t>(nbytes)); }

c10::Allocator* device_allocator() { return &g_allocator; }

DeferredStorage* deferred_storage_of(const c10::Storage& storage) {
  auto* ctx = storage.data_ptr().get_context();
  TORCH_INTERNAL_ASSERT(ctx != nullptr, "tpu storage without a DeferredStorage context");
  return static_cast<DeferredStorage*>(ctx);
}

int64_t memory_allocated(int) { return g_allocated.load(); }
int64_t max_memory_allocated(int) { return g_peak.load(); }
void reset_peak_memory_stats(int) { g_peak.store(g_allocated.load()); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace tpu_eager
