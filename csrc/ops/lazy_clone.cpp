// torch._lazy_clone on "tpu" (lazy_clone.h).
#include "ops/lazy_clone.h"

#include <ATen/core/TensorBody.h>
#include <c10/util/ParallelGuard.h>

#include "device/device.h"
#include "ops/record.h"

namespace tpu_eager {
namespace {

const c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

// All `nbytes` bytes of `storage`, as a uint8 "tpu" tensor.
at::Tensor bytes_of(const c10::Storage& storage, int64_t nbytes) {
  at::Tensor t =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), kDeviceKeys, caffe2::TypeMeta::Make<uint8_t>());
  const int64_t one = 1;
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(nbytes), c10::IntArrayRef(one), 0);
  return t;
}

// The materializer of a lazy clone's StorageImpl: runs before its first write.
void materialize(c10::StorageImpl* st) {
  // CPU's rule (c10/core/impl/COW.cpp): a copy inside a parallel region's
  // loop would race with the other threads' reads.
  TORCH_INTERNAL_ASSERT(!c10::ParallelGuard::is_enabled(),
                        "Materializing a storage in the loop function of at::parallel_for is forbidden");
  // A resize_ (or set_data_ptr) gave it other bytes meanwhile: nothing is shared.
  if (!is_copy_on_write(st->data_ptr())) return;
  const auto nbytes = static_cast<int64_t>(st->nbytes());
  c10::Storage shared(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(st));
  // Allocated before the share ends (it may raise OutOfMemoryError), on the chip of the bytes.
  c10::DataPtr fresh;
  {
    ChipGuard chip(st->device().index());
    fresh = device_allocator()->allocate(static_cast<size_t>(nbytes));
  }
  c10::Storage copy(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(fresh),
                                                          device_allocator(), /*resizable=*/true));
  end_copy_on_write(*st, copy, [&] {
    // Recorded while the bytes are still shared: the copy reads every write
    // queued before it (before or after the lazy clone was made).
    if (nbytes > 0) record_copy(bytes_of(copy, nbytes), bytes_of(shared, nbytes), /*non_blocking=*/false);
  });
}

}  // namespace

at::Tensor lazy_clone(const at::Tensor& self) {
  c10::StorageImpl* impl = self.storage().unsafeGetStorageImpl();
  c10::DataPtr shared = share_copy_on_write(*impl);
  if (!impl->has_materializer()) impl->set_materializer(&materialize);
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->sym_nbytes(),
                                                       std::move(shared), impl->allocator(), impl->resizable());
  storage->set_materializer(&materialize);
  at::Tensor t =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)), self.key_set(), self.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(self.sym_sizes(), self.sym_strides(), self.sym_storage_offset());
  return t;
}

}  // namespace tpu_eager
