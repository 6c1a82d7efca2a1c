// PrivateUse1 hooks: availability, generators, pointer ownership, storage resize.
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <cstring>

#include "device/device.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace {

// ---- pinned host memory ----
// Host buffers handed out by the pinned-memory allocator (t.pin_memory(),
// pin_memory=True, DataLoader(pin_memory=True)). Device memory is host memory
// here, so "pinned" changes nothing about copies; it is tracked so that
// is_pinned() answers True for these buffers and their views, as on CUDA.
struct PinnedBlocks {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // start -> bytes
};

PinnedBlocks& pinned() {
  static auto* p = new PinnedBlocks();  // never destroyed: pinned tensors may outlive static destructors
  return *p;
}

void free_pinned(void* ptr) {
  if (ptr == nullptr) return;
  {
    auto& p = pinned();
    std::lock_guard<std::mutex> lock(p.mu);
    p.blocks.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes > 0 ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      auto& p = pinned();
      std::lock_guard<std::mutex> lock(p.mu);
      p.blocks[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};

PinnedAllocator g_pinned_allocator;

bool is_pinned_ptr(const void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto& p = pinned();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.blocks.upper_bound(addr);
  if (it == p.blocks.begin()) return false;
  --it;
  return addr < it->first + it->second;
}

}  // namespace

void resize_device_storage(const c10::Storage& storage, size_t newsize) {
  // Resizing needs the storage's current value: flush when queued ops still
  // use it (out= into a fresh empty tensor needs none), then move the bytes
  // into a new host buffer. Queued nodes keep the old DeferredStorage.
  // As CPU's resize: storages over memory someone else owns (from_blob,
  // DLPack imports, UntypedStorage slices) are not resizable.
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  auto* old = deferred_storage_of(storage);
  if (storage_has_pending(old)) (void)flush_device(old->device, FlushReason::kStorageResize);  // its chip's uses
  // A value a failed op left (its error) moves with the bytes kept: the resize
  // succeeds, as on CPU, and reading the result raises unless an op first
  // overwrites it whole (torch.zeros(5, out=t) does).
  const std::exception_ptr error = old->error;
  const bool seen = old->error_seen;
  c10::DataPtr fresh;
  {
    // On the storage's chip, whichever is current (CUDA's resize_bytes_cuda guards its device).
    ChipGuard chip(storage.device().index());
    fresh = device_allocator()->allocate(newsize);
  }
  const size_t keep = std::min(newsize, old->nbytes);
  if (keep > 0) std::memcpy(fresh.get(), old->data, keep);
  auto& st = const_cast<c10::Storage&>(storage);
  st.set_data_ptr_noswap(std::move(fresh));
  st.set_nbytes(newsize);
  if (error && keep > 0) {
    DeferredStorage* now = deferred_storage_of(storage);
    now->set_error(error);
    now->error_seen = seen;
  }
}

namespace {

constexpr c10::DeviceType kDev = c10::DeviceType::PrivateUse1;

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override { return default_device_generator(i); }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override {
    return make_device_generator(static_cast<c10::DeviceIndex>(checked_device(i)));
  }
  at::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, current_device_index()}; }
  bool isPinnedPtr(const void* ptr) const override { return is_pinned_ptr(ptr); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device_index(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    c10::impl::getDeviceGuardImpl(kDev)->setDevice({kDev, d});
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return c10::impl::getDeviceGuardImpl(kDev)->exchangeDevice({kDev, d}).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_device_storage(storage, newsize);
  }
};

TpuHooks g_hooks;

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }
} g_register_hooks;

}  // namespace
}  // namespace tpu_eager
