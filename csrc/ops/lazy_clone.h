// torch._lazy_clone on "tpu": copy-on-write clones with CPU's semantics.
//
// `y = x._lazy_clone()` gives `y` a StorageImpl of its own over x's bytes,
// shared copy-on-write (device/device.h, share_copy_on_write): both read the
// same DeferredStorage, including values that queued ops write into it before
// the clone. The first op that writes through either side (in place, out=, a
// copy into it, a DLPack export, Tensor.data_ptr()) first gives that side its
// own storage, filled by a device-to-device copy recorded into the queue
// before the op, so the copy reads every pending write made before it and
// none made after; the last side still sharing keeps the original bytes
// without a copy. Which side gets new bytes, data addresses and
// torch._C._is_cow_tensor are as for CPU's lazy clones (c10/core/impl/COW.cpp).
//
// The write hook is PyTorch's own: each such StorageImpl carries a
// materializer (c10/core/StorageMaterializer.h) that StorageImpl::mutable_data_ptr
// runs once; the record path calls it for the tensors an op writes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace tpu_eager {

// The "tpu" kernel of aten::_lazy_clone: a tensor with `self`'s sizes,
// strides, storage offset, dtype and dispatch keys over a new StorageImpl that
// shares `self`'s bytes copy-on-write. Raises CPU's RuntimeError for a tensor
// over an alias storage (a DLPack import, an UntypedStorage slice).
at::Tensor lazy_clone(const at::Tensor& self);

// Before an op writes `t` (a "tpu" tensor): runs its storage's materializer,
// which gives a lazy clone its own bytes (a no-op for every other storage;
// one flag test).
inline void prepare_write(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (C10_UNLIKELY(s->has_materializer())) (void)s->mutable_data_ptr();
}

// Whether `t`'s storage would do work in prepare_write.
inline bool needs_prepare_write(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl()->has_materializer();
}

}  // namespace tpu_eager
