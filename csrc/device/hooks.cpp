// PrivateUse1 hooks: availability, generators, pointer ownership, storage resize.
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>

#include "device/device.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace {

}  // namespace

void resize_device_storage(const c10::Storage& storage, size_t newsize) {
  // Resizing needs the storage's current value: flush when queued ops still
  // use it (out= into a fresh empty tensor needs none), then move the bytes
  // into a new host buffer. Queued nodes keep the old DeferredStorage.
  // As CPU's resize: storages over memory someone else owns (from_blob,
  // DLPack imports, UntypedStorage slices) are not resizable.
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  auto* old = deferred_storage_of(storage);
  if (storage_has_pending(old)) (void)flush_all(FlushReason::kStorageResize);
  // A value a failed op left (its error) moves with the bytes kept: the resize
  // succeeds, as on CPU, and reading the result raises unless an op first
  // overwrites it whole (torch.zeros(5, out=t) does).
  const std::exception_ptr error = old->error;
  const bool seen = old->error_seen;
  c10::DataPtr fresh = device_allocator()->allocate(newsize);
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

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override { return default_device_generator(i); }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override { return make_device_generator(i < 0 ? 0 : i); }
  at::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, 0}; }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kNumDevices; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
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
