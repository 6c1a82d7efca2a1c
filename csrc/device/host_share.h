// Zero-copy device-to-host reads. The device's memory is host memory, so
// `t.cpu()` can hand the CPU tensor the device buffer itself instead of a
// copy, copy-on-write on both sides: the first write through either side
// (a CPU kernel taking a mutable pointer, or a device op writing the storage)
// first moves that side to a private copy, or takes the buffer back when the
// other side is gone. PyTorch's lazy clones (c10/core/impl/COW.h) do the same
// between two CPU storages; here one side is a DeferredStorage that device
// ops write without going through the StorageImpl, hence our own hooks.
#pragma once

#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "lazy/deferred_storage.h"

namespace tpu_eager {

// Below this size the copy costs less than the bookkeeping and a later
// copy-on-write; it is also the smallest block the block cache keeps.
constexpr size_t kHostShareMinBytes = size_t{1} << 20;  // bytes

// True when `self` (a current "tpu" tensor) can be read to the host without
// a copy: dense, non-overlapping, covering its whole storage from offset 0,
// at least kHostShareMinBytes, without conjugate/negative bits.
bool can_share_with_host(const at::Tensor& self);

// A CPU tensor with `self`'s sizes, strides and dtype over `self`'s device
// buffer, copy-on-write. Requires can_share_with_host(self) and a current
// buffer. Returns an undefined tensor when queued ops (recorded meanwhile by
// another thread) use the storage: the caller copies instead.
at::Tensor share_with_host(const at::Tensor& self);

// Called before anything writes the buffer of `s`: if CPU tensors share it,
// the device moves to a private copy (or takes the buffer back when they are
// gone). Cheap when `s` is not shared (one atomic load).
void unshare_for_write(DeferredStorage* s);

// Makes `storage` the device StorageImpl whose DataPtr follows `s` when the
// device moves to a private copy (unshare_for_write): `s` passed from one
// StorageImpl to another (a lazy clone took the shared bytes back,
// end_copy_on_write). A no-op when `s` is not shared.
void host_share_follow(DeferredStorage* s, const c10::Storage& storage);

// Releases the device's share of `s`'s buffer (from ~DeferredStorage): the
// buffer is freed when the last CPU tensor sharing it is. Returns false when
// `s` was not shared (the caller frees the buffer itself).
bool release_host_share(DeferredStorage* s);

// Before a raw pointer to `self`'s device memory leaves the device (DLPack
// export): runs queued ops that use its storage (the bytes are current
// after), raises the error a failed op left there, gives the device a
// private buffer if CPU tensors share it, and pins the buffer's address
// (later host reads copy instead of sharing; DeferredStorage::address_exported).
void prepare_address_export(const at::Tensor& self);

// Counters for torch_tpu_eager.metrics(), since start or the last reset.
struct HostShareStats {
  int64_t reads = 0;       // host reads that shared the device buffer
  int64_t bytes = 0;       // bytes those reads did not copy
  int64_t cow_copies = 0;  // copies made later by a write to a shared buffer (either side)
  int64_t cow_bytes = 0;   // bytes of those copies
};
HostShareStats host_share_stats();
void reset_host_share_stats();

}  // namespace tpu_eager
