// A deferred storage: the device-side state behind one "tpu" StorageImpl.
//
// Every StorageImpl of the device owns (through its DataPtr context) one
// DeferredStorage. It holds the host buffer that stands in for device memory
// and is shared by all aliases of the storage, so every view sees the latest
// write. Pending queue nodes hold their own references, so a storage whose
// tensors all died before a flush keeps its buffer until the flush is done,
// and the JIT can tell (external_alive == false) that nothing outside the
// queue can observe its value: such values are never materialized.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>

#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

namespace tpu_eager {

struct HostShare;  // device/host_share.cpp

// Errors of failed ops that reached the user (lazy/queue.cpp keeps the most
// recent ones). A value computed from a failed value fails with the same
// exception at a later flush (a copy of it, an op reading it); when the user
// already saw that exception, so did the storage that now holds it.
bool error_was_seen(const std::exception_ptr& e);
// Records that `e` reached the user.
void note_error_seen(const std::exception_ptr& e);

// How many times an error was set on any storage (DeferredStorage::set_error
// with an error), process-wide: a flush that found none of its storages failed
// at its start skips looking for failed inputs region by region while this
// count stays the same (jit::run_regions).
inline std::atomic<uint64_t> g_storage_errors_set{0};

struct DeferredStorage : c10::intrusive_ptr_target {
  DeferredStorage(void* data, size_t nbytes, uint64_t id) : data(data), nbytes(nbytes), id(id) {}
  ~DeferredStorage() override;
  // From a per-thread list of freed DeferredStorage blocks (device/allocator.cpp):
  // every recorded op's fresh result makes one and a flush frees its dying
  // intermediates', and the C library's malloc / free of each cost ~200
  // instructions (docs/performance.md, 2026-12-05 hit18b).
  static void* operator new(size_t size);
  static void operator delete(void* p, size_t size);

  void* data;      // host buffer of `nbytes` bytes (nullptr when nbytes == 0)
  size_t nbytes;   // bytes
  uint64_t id;     // unique per process, for cache keys and traces
  int device = 0;  // index of the simulated chip that holds it (its memory accounting)
  // False once the owning StorageImpl was destroyed and no alias storage
  // (below) remains: only queue nodes remain.
  std::atomic<bool> external_alive{true};
  // Holders outside the queue: the owning StorageImpl plus every alias
  // StorageImpl over these bytes (a DLPack import, a slice of an untyped
  // storage, PyTorch's from_blob over the buffer; device/allocator.cpp).
  std::atomic<int32_t> external_holders{1};
  // Set once a raw pointer into `data` was handed out (DLPack export, an
  // alias storage): the buffer must then stay where it is, so zero-copy host
  // reads (host_share.h), which move the device side on its next write, copy.
  std::atomic<bool> address_exported{false};
  // Links of the allocator's registry of storages with external holders,
  // which resolves a pointer into device memory to its storage. Guarded by
  // the registry's mutex (device/allocator.cpp).
  DeferredStorage* registry_prev = nullptr;
  DeferredStorage* registry_next = nullptr;
  // Number of queued (unflushed) nodes that read or write this storage.
  // Guarded by the queue mutex. Zero means the host buffer is current.
  int64_t pending_uses = 0;
  // Scratch of index_flush_storages (lazy/queue.h), which runs under the flush
  // lock: the storage's number in the flush being indexed and its uses there,
  // valid while `index_stamp` is that pass's stamp (numbering by a field of
  // the storage instead of a map of storages: no hashing, no allocation).
  uint64_t index_stamp = 0;
  int32_t index_number = 0;
  int32_t index_uses = 0;
  // Set when a flush failed to compute this storage's value; reading it
  // re-raises that error (same exception, naming the op and Python line).
  std::exception_ptr error;
  // Whether `error` has reached the user (raise_storage_error: a host read, or
  // a call on this tensor). Only then may an op that overwrites the storage
  // whole clear it; an error nobody saw still raises at the next read, as
  // CPU's failing call would have raised.
  // An error the user already saw (error_was_seen) counts as seen here too:
  // a lazy clone's copy of a failed value, or an op that read one, fails with
  // it again at a flush, and an op that then overwrites the storage whole
  // must succeed as it would on CPU (the failed call raised there, once).
  bool error_seen = false;
  // Set when the last holder outside the queue went while queue nodes still
  // held the storage: its bytes were counted as freed then (device/allocator.cpp
  // drop_external_holder), not again when the flush frees the buffer.
  bool freed_early = false;
  void set_error(std::exception_ptr e) {
    if (e) g_storage_errors_set.fetch_add(1, std::memory_order_relaxed);
    error = std::move(e);
    error_seen = error != nullptr && error_was_seen(error);
  }
  // The user saw `error` (a read or call raised it).
  void mark_error_seen() {
    error_seen = true;
    note_error_seen(error);
  }
  // Set while CPU tensors share `data` copy-on-write (zero-copy t.cpu(),
  // device/host_share.h): a write to this storage first calls unshare_for_write.
  std::atomic<HostShare*> host_share{nullptr};
  // Set while "tpu" StorageImpls share this storage as lazy clones
  // (torch._lazy_clone): PyTorch's copy-on-write context
  // (c10::impl::cow::COWDeleterContext) that owns the storage's reference for
  // them all. Written under the mutex of the allocator's lazy-clone table
  // (device/allocator.cpp); read without it only when the last holder outside
  // the queue releases the storage, when nothing can write it any more.
  void* cow_context = nullptr;
  // The "tpu" StorageImpl whose DataPtr points at `data`, for an op's fresh
  // result (set when the op is recorded): when a flush makes the CPU kernel's
  // result buffer the device memory (adopt_host_buffer, device/device.h), that
  // DataPtr follows (Tensor.data_ptr() and PyTorch's overlap checks read it).
  // Dropped when that DataPtr goes (the StorageImpl dies: it is then freed at
  // once, not kept by this weak reference until the flush frees the storage);
  // read and dropped under the allocator's registry mutex (device/allocator.cpp).
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> impl;
  // When set, `data` is this CPU storage's buffer (adopted from a CPU kernel's
  // result) instead of a block of the block cache; it is freed with it.
  c10::Storage host_owner;
};

using StoragePtr = c10::intrusive_ptr<DeferredStorage>;

}  // namespace tpu_eager
