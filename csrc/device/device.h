// PrivateUse1 device plumbing shared by the device/ stage: the allocator that
// backs every "tpu" storage with host memory, memory statistics and the
// per-device generator.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/util/FunctionRef.h>

#include "lazy/deferred_storage.h"

namespace tpu_eager {

// Chips a process can have (the per-chip tables' size).
constexpr int kMaxDevices = 16;

// Number of simulated chips: TORCH_TPU_NUM_DEVICES (1..kMaxDevices), default
// kDefaultNumDevices; fixed at the first call (set_device_count may change it
// before that).
constexpr int kDefaultNumDevices = 2;  // also the registry default of TORCH_TPU_NUM_DEVICES (device/env.cpp)
int device_count();
// Sets the number of chips; raises RuntimeError once any chip was used
// (device_count() was called) with a different count, ValueError outside 1..kMaxDevices.
void set_device_count(int n);
// Raises as CUDA does for an invalid ordinal ("Invalid device ordinal"?) -
// here torch's own message for device indices: a ValueError-free
// c10::Error naming the index and the count. Returns `device`, or the
// current device for -1.
int checked_device(int device);
// The current device of this thread (the device guard's).
c10::DeviceIndex current_device_index();
void set_current_device_unchecked(c10::DeviceIndex d);
// This thread's current stream of chip `device` (0: the default stream).
int64_t current_stream_id(int device);

// ---- float32 matmul precision (torch.tpu.precision) ----
// Values are at::Float32MatmulPrecision's as int (HIGHEST 0, HIGH 1, MEDIUM 2),
// keeping ATen/Context.h out of this header.
// This thread's scoped precision (torch.tpu.precision), or none: -1.
int thread_precision();
void set_thread_precision(int p);
// The precision an op recorded now by this thread runs at: the thread's scope,
// else torch.set_float32_matmul_precision's process-wide setting.
int recording_precision();
// The precision the running flush's ops were recorded at (executors read it;
// outside a flush: recording_precision()).
int run_precision();
// Sets run_precision() for the scope of one flush.
struct RunPrecision {
  explicit RunPrecision(int p);
  ~RunPrecision();
  RunPrecision(const RunPrecision&) = delete;
  RunPrecision& operator=(const RunPrecision&) = delete;

 private:
  int prev_;
};

// Makes chip `device` current for a scope (allocations of that scope are
// accounted to it and their tensors live on it); -1 leaves it unchanged.
struct ChipGuard {
  explicit ChipGuard(int device) : prev_(current_device_index()) {
    if (device >= 0) set_current_device_unchecked(static_cast<c10::DeviceIndex>(device));
  }
  ~ChipGuard() { set_current_device_unchecked(prev_); }
  ChipGuard(const ChipGuard&) = delete;
  ChipGuard& operator=(const ChipGuard&) = delete;

 private:
  c10::DeviceIndex prev_;
};

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
// True for an alias storage (see DeviceBytes), and for the shared storage of
// lazy clones (is_copy_on_write below): neither may move its bytes.
bool is_alias_storage(const c10::Storage& storage);

// ---- Lazy clones (torch._lazy_clone; PyTorch's c10/core/impl/COW.h) ----
// A lazy clone and its source are distinct StorageImpls over one
// DeferredStorage, through PyTorch's own copy-on-write context
// (c10::impl::cow::COWDeleterContext, deleter cow::cow_deleter), so
// torch._C._is_cow_tensor, data addresses and device_bytes_of answer as for
// CPU's lazy clones. The first write through any of them gives that one its
// own bytes (ops/lazy_clone.h); the last one keeps the shared storage.
//
// Whether `dp` is such a shared (copy-on-write) DataPtr.
bool is_copy_on_write(const c10::DataPtr& dp);
// Makes `impl` copy-on-write (if it is a plain device storage) and returns one
// more reference to its bytes, for the StorageImpl of a new lazy clone.
// Raises CPU's RuntimeError for an alias storage (a DLPack import, an
// UntypedStorage slice), whose memory CPU's lazy clone refuses too.
c10::DataPtr share_copy_on_write(c10::StorageImpl& impl);
// Ends `impl`'s share of copy-on-write bytes. When other StorageImpls still
// share them, calls fill_copy() (which records the copy of the shared bytes
// into `copy`, a fresh device storage of the same size) and moves `copy`'s
// bytes into `impl` (`copy` keeps none), and returns false. When `impl` was
// the last holder it takes the shared DeferredStorage back, returns true,
// and `copy` is left as it was. Requires is_copy_on_write(impl.data_ptr()).
bool end_copy_on_write(c10::StorageImpl& impl, const c10::Storage& copy, c10::function_ref<void()> fill_copy);

// The DeferredStorage behind a "tpu" tensor's storage (see device_bytes_of).
DeferredStorage* deferred_storage_of(const c10::Storage& storage);
inline DeferredStorage* deferred_storage_of(const at::Tensor& t) { return deferred_storage_of(t.storage()); }

// Makes `buffer` the device memory of `s` in place of its block, which goes
// back to the block cache: a flush then keeps a CPU kernel's fresh result as
// the device value instead of copying it (the device is simulated in host
// memory). `buffer`: a CPU storage of exactly s->nbytes bytes, 64-byte
// aligned, holding s's value in s's layout, that nothing else writes (a CPU
// kernel's fresh result); `s` keeps a reference to it. The owning "tpu"
// StorageImpl's DataPtr follows. Returns false, changing nothing, when the
// buffer must stay where it is: `s` has no recorded owner (not an op's fresh
// result), its address was handed out (DLPack, alias storages), CPU tensors
// share it (host_share.h), or it was resized away.
bool adopt_host_buffer(DeferredStorage* s, const c10::Storage& buffer);

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
int64_t memory_reserved(int device);
int64_t max_memory_reserved(int device);
void reset_peak_memory_stats(int device);
void account_free(size_t nbytes, int device);

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
