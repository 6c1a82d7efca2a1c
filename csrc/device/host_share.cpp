// Zero-copy device-to-host reads, copy-on-write on both sides (host_share.h).
#include "device/host_share.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "device/block_cache.h"
#include "device/device.h"
#include "lazy/queue.h"

namespace tpu_eager {

// A device buffer shared with CPU storages. `refs` counts its holders: the
// device storage while it still uses the buffer, plus one per CPU storage.
// The last holder frees the buffer (back to the device's block cache).
struct HostShare {
  void* data = nullptr;
  size_t nbytes = 0;  // bytes
  int device = 0;     // the chip whose block accounting the buffer belongs to
  std::atomic<int64_t> refs{1};
  // The device's StorageImpl, whose DataPtr must follow the DeferredStorage
  // when the device moves to a private copy (PyTorch's overlap checks and
  // Tensor.data_ptr() read it).
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> device_impl;
  // The CPU storage that owns `data` when the device had adopted a CPU
  // kernel's result (DeferredStorage::host_owner); else `data` is a block.
  c10::Storage owner;
};

namespace {

// Serializes the device side: sharing, unsharing, releasing.
std::mutex g_share_mu;

std::atomic<int64_t> g_reads{0}, g_bytes{0}, g_cow_copies{0}, g_cow_bytes{0};

void count_cow_copy(size_t nbytes) {
  g_cow_copies.fetch_add(1, std::memory_order_relaxed);
  g_cow_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
}

void release(HostShare* h) {
  if (h->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (!h->owner) block_free(h->data, h->nbytes, h->device);
    delete h;  // drops `owner`, which frees an adopted buffer
  }
}

void release_ctx(void* ctx) { release(static_cast<HostShare*>(ctx)); }

// The CPU side's materializer (c10/core/StorageMaterializer.h): runs before
// the first mutable access to a CPU storage that shares a device buffer.
void materialize_cpu_side(c10::StorageImpl* st) {
  // A CPU resize_ may have replaced the buffer already (the hook stays set then).
  if (st->data_ptr().get_deleter() != &release_ctx) return;
  auto* h = static_cast<HostShare*>(st->data_ptr().get_context());
  // The last holder: nobody else reads the buffer, and a new holder can only
  // come from the device, which no longer has it. Write in place.
  if (h->refs.load(std::memory_order_acquire) == 1) return;
  c10::DataPtr copy = c10::GetCPUAllocator()->allocate(st->nbytes());
  if (st->nbytes() > 0) std::memcpy(copy.get(), h->data, st->nbytes());
  count_cow_copy(st->nbytes());
  st->set_data_ptr_noswap(std::move(copy));  // drops this storage's hold
}

}  // namespace

bool can_share_with_host(const at::Tensor& self) {
  const size_t nbytes = self.storage().nbytes();
  if (!(nbytes >= kHostShareMinBytes && self.storage_offset() == 0 && !self.is_conj() && !self.is_neg() &&
        static_cast<size_t>(self.numel()) * self.itemsize() == nbytes && self.is_non_overlapping_and_dense()))
    return false;
  // A buffer whose address was handed out (DLPack, alias storages) must not
  // move, and a device write to a shared buffer moves the device side.
  if (is_alias_storage(self.storage())) return false;
  return !deferred_storage_of(self)->address_exported.load(std::memory_order_acquire);
}

at::Tensor share_with_host(const at::Tensor& self) {
  DeferredStorage* s = deferred_storage_of(self);
  HostShare* h = nullptr;
  // Installed while no queued node uses `s`, under the queue lock: a write
  // recorded by another thread is then either already pending (no share)
  // or recorded after, and unshares first (lazy/queue.cpp enqueue).
  const bool idle = run_if_idle(s, [&] {
    std::lock_guard<std::mutex> lock(g_share_mu);
    h = s->host_share.load(std::memory_order_acquire);
    if (h == nullptr) {
      h = new HostShare;
      h->data = s->data;
      h->nbytes = s->nbytes;
      h->device = s->device;
      h->owner = s->host_owner;
      h->device_impl = self.storage().getWeakStorageImpl();
      s->host_share.store(h, std::memory_order_release);
    }
    h->refs.fetch_add(1, std::memory_order_relaxed);
  });
  if (!idle) return at::Tensor();
  const size_t nbytes = self.storage().nbytes();
  g_reads.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  c10::DataPtr ptr(h->data, h, &release_ctx, c10::Device(c10::DeviceType::CPU));
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(ptr),
                                                    c10::GetCPUAllocator(), /*resizable=*/true);
  impl->set_materializer(&materialize_cpu_side);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(self.scalar_type()));
  t.set_(c10::Storage(std::move(impl)), 0, self.sizes(), self.strides());
  return t;
}

void unshare_for_write(DeferredStorage* s) {
  if (C10_LIKELY(s->host_share.load(std::memory_order_acquire) == nullptr)) return;
  // Declared before the lock: if this held the last reference to the device
  // StorageImpl, its release (~DeferredStorage -> release_host_share) must
  // run after g_share_mu is unlocked.
  c10::intrusive_ptr<c10::StorageImpl> impl;
  std::lock_guard<std::mutex> lock(g_share_mu);
  HostShare* h = s->host_share.load(std::memory_order_acquire);
  if (h == nullptr) return;
  if (h->refs.load(std::memory_order_acquire) == 1) {  // every CPU tensor is gone: the buffer is the device's again
    s->host_share.store(nullptr, std::memory_order_release);
    delete h;
    return;
  }
  // CPU tensors still read the buffer: the device writes a private copy.
  // Allocated first, so that running out of memory leaves the share intact.
  void* fresh = block_alloc(s->nbytes, s->device);
  TORCH_CHECK_WITH(OutOfMemoryError, fresh != nullptr, "tpu: failed to allocate ", s->nbytes,
                   " bytes of host memory for a copy-on-write of a buffer shared with the host");
  std::memcpy(fresh, s->data, s->nbytes);
  count_cow_copy(s->nbytes);
  s->data = fresh;
  s->host_owner = c10::Storage();  // the share keeps an adopted buffer (HostShare::owner)
  s->host_share.store(nullptr, std::memory_order_release);
  if (h->device_impl) impl = h->device_impl->lock();
  if (impl && impl->data_ptr().get_context() == s) {
    // Same context (it owns one reference to `s`), new data pointer.
    c10::DataPtr& old = impl->_mutable_data_ptr_no_checks();
    const c10::DeleterFnPtr deleter = old.get_deleter();
    const c10::Device device = old.device();
    old.release_context();
    impl->set_data_ptr_noswap(c10::DataPtr(fresh, s, deleter, device));
  }
  release(h);  // the CPU tensors own the old buffer now
}

void host_share_follow(DeferredStorage* s, const c10::Storage& storage) {
  std::lock_guard<std::mutex> lock(g_share_mu);
  HostShare* h = s->host_share.load(std::memory_order_acquire);
  if (h != nullptr) h->device_impl = storage.getWeakStorageImpl();
}

void prepare_address_export(const at::Tensor& self) {
  // A writable address leaves the device: a lazy clone gets its own bytes
  // first (recorded, so run by the flush below), as CPU's export does.
  c10::StorageImpl* impl = self.storage().unsafeGetStorageImpl();
  if (impl->has_materializer()) (void)impl->mutable_data_ptr();
  DeferredStorage* s = deferred_storage_of(self);
  // Its chip's queue alone: no queued op spans two chips (device_kernels.cpp copy_from).
  // Errors of other ops stay with their tensors.
  if (storage_has_pending(s)) (void)flush_device(s->device, FlushReason::kHostRead);
  raise_storage_error(s);
  s->address_exported.store(true, std::memory_order_release);
  unshare_for_write(s);
}

bool release_host_share(DeferredStorage* s) {
  // Called by ~DeferredStorage: no other thread holds `s`, so none can
  // install a share now (share_with_host holds a tensor of it), and an
  // unshared storage (nearly all: every dying intermediate of a flush) skips
  // the lock.
  if (C10_LIKELY(s->host_share.load(std::memory_order_acquire) == nullptr)) return false;
  HostShare* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_share_mu);
    h = s->host_share.exchange(nullptr, std::memory_order_acq_rel);
  }
  if (h == nullptr) return false;
  release(h);
  return true;
}

HostShareStats host_share_stats() { return {g_reads.load(), g_bytes.load(), g_cow_copies.load(), g_cow_bytes.load()}; }

void reset_host_share_stats() {
  g_reads = 0;
  g_bytes = 0;
  g_cow_copies = 0;
  g_cow_bytes = 0;
}

}  // namespace tpu_eager
