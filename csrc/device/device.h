// PrivateUse1 device plumbing shared by the device/ stage: the allocator that
// backs every "tpu" storage with host memory, memory statistics and the
// per-device generator.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include "lazy/deferred_storage.h"

namespace tpu_eager {

constexpr int kNumDevices = 1;

// The device allocator. Each allocation is a DeferredStorage whose host buffer
// has the requested size, so distinct storages have distinct, non-overlapping
// data pointers and PyTorch's overlap checks behave as on CPU.
c10::Allocator* device_allocator();

// Where the bytes of a "tpu" StorageImpl live: a DeferredStorage and the byte
// offset of the StorageImpl's first byte in it. 0 for storages the device
// allocated; an alias storage (a StorageImpl PyTorch built over device
// memory itself: torch.from_dlpack of a tpu tensor, UntypedStorage slicing,
// from_blob over a device buffer) shares the bytes of the storage it was
// built over, at its offset. Raises RuntimeError for a storage over memory
// the device did not allocate.
struct DeviceBytes {
  DeferredStorage* storage;
  int64_t byte_offset;  // bytes
};
DeviceBytes device_bytes_of(const c10::Storage& storage);
// True for an alias storage (see DeviceBytes).
bool is_alias_storage(const c10::Storage& storage);

// The DeferredStorage behind a "tpu" tensor's storage (see device_bytes_of).
DeferredStorage* deferred_storage_of(const c10::Storage& storage);
inline DeferredStorage* deferred_storage_of(const at::Tensor& t) { return deferred_storage_of(t.storage()); }

// Grows or shrinks the storage to `nbytes` keeping its bytes (flushes first).
void resize_device_storage(const c10::Storage& storage, size_t nbytes);

// Simulated device memory statistics, in bytes.
// An allocation that would bring memory_allocated() past the capacity raises
// c10::OutOfMemoryError (torch.OutOfMemoryError) naming `owner` (the chip);
// 0 means unlimited. Set by torch_tpu_eager.set_target from the chip's HBM size.
void set_memory_capacity(int64_t bytes, const std::string& owner);
int64_t memory_capacity(int device);
int64_t memory_allocated(int device);
int64_t max_memory_allocated(int device);
void reset_peak_memory_stats(int device);
void account_free(size_t nbytes);

// The device generator: a (seed, offset) pair. RNG ops take one offset at
// record time, so their values do not depend on when the queue is flushed.
at::Generator make_device_generator(c10::DeviceIndex index);
const at::Generator& default_device_generator(c10::DeviceIndex index);
// Reserves the next random stream of `gen` (a device generator) and returns
// the 64-bit seed that the executor will use for it.
uint64_t reserve_random_stream(const at::Generator& gen);

// Mixes (seed, offset) into a well-spread 64-bit seed (splitmix64).
uint64_t mix_seed(uint64_t seed, uint64_t offset);

}  // namespace tpu_eager
