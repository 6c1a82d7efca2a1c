// Host runtime shared by the executors: device values as CPU tensors over
// host buffers, and running one recorded op with its CPU ATen kernel.
#pragma once

#include <array>
#include <functional>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include "lazy/queue.h"
#include "views/view_chain.h"

namespace tpu_eager {
namespace host {

// Where each storage's value lives during one flush: its device (host) buffer
// or a temporary that never reaches device memory. One CPU Storage per
// DeferredStorage, so CPU kernels see aliasing between views exactly as on CPU.
class HostMemory {
 public:
  explicit HostMemory(bool resizable = false) : resizable_(resizable) {}
  // The CPU storage wrapping the device buffer of `s` (no copy, not resizable).
  c10::Storage device_buffer(DeferredStorage* s);
  // The address of the bytes that hold the current value of `s` and their
  // size (what storage_for(s) gives), for readers of raw memory (the fused
  // loops): a device buffer nothing has bound in this flush is read in place,
  // without making a CPU storage for it (a StorageImpl, a map entry, and
  // their destruction at the end of the flush).
  const void* data_for(DeferredStorage* s, size_t* nbytes);
  // The same for a writer of raw memory: the address device_buffer(s) holds
  // (a transient storage gets its flush-local memory bound).
  void* device_data(DeferredStorage* s, size_t* nbytes);
  // Binds `s` to a temporary CPU storage holding its value.
  void bind_temp(DeferredStorage* s, c10::Storage storage);
  bool is_temp(DeferredStorage* s) const;
  // Frees the temporary of `s` (its last use in the region has run).
  void release_temp(DeferredStorage* s);
  // The CPU storage that holds the current value of `s`.
  c10::Storage storage_for(DeferredStorage* s);
  // Storages made by this flush that nothing reads after it: their "device
  // buffer" is flush-local CPU memory, freed by release() after the last
  // region that uses them, so a flush reuses memory as eager does instead of
  // writing every intermediate to a buffer of its own. Given by the flush's
  // storage numbers (lazy/queue.h FlushStorages, pass `stamp`): storage
  // number k is transient when by_number[k] != 0 (`n` entries; jit::run_graph
  // sets them from its plan, the table outlives the flush's regions; none
  // after clear()).
  void set_transient(uint64_t stamp, const char* by_number, size_t n) {
    stamp_ = stamp;
    transient_ = by_number;
    n_transient_ = n;
  }
  // The flush's storages by number (FlushStorages::storages, `n` of them;
  // the array outlives the flush's regions; none after clear()): what
  // numbered() reads for a region's Region::storage_numbers.
  void set_numbered(DeferredStorage* const* by_number, size_t n) {
    numbered_ = by_number;
    n_numbered_ = n;
  }
  // Storage number `k` of this flush (k < the `n` set_numbered gave).
  DeferredStorage* numbered(int32_t k) const {
    TORCH_INTERNAL_ASSERT_DEBUG_ONLY(k >= 0 && static_cast<size_t>(k) < n_numbered_);
    return numbered_[k];
  }
  bool has_numbered() const { return numbered_ != nullptr; }
  bool is_transient(const DeferredStorage* s) const {
    return transient_ != nullptr && s->index_stamp == stamp_ && static_cast<size_t>(s->index_number) < n_transient_ &&
           transient_[s->index_number] != 0;
  }
  // Whether an input of the regions run with this memory may hold an earlier
  // failure (DeferredStorage::error): when false, none does, and an executor
  // need not look for one region by region (each input's storage read: a
  // cache miss apiece between the kernels of a flush). jit::run_regions sets
  // it per region from one check of the flush's storages; true otherwise.
  // An error set on any storage after that (an op of the region failed, a
  // nested flush) makes it true again until the next set: the ops after a
  // failed one must find its outputs' error (build_stack re-raises it).
  void set_inputs_may_hold_errors(bool may) {
    inputs_may_hold_errors_ = may;
    errors_set_at_ = g_storage_errors_set.load(std::memory_order_relaxed);
  }
  bool inputs_may_hold_errors() const {
    return inputs_may_hold_errors_ || g_storage_errors_set.load(std::memory_order_relaxed) != errors_set_at_;
  }
  // Storages whose `error` tensor(), written_tensor() and run_ops read (looking for an earlier
  // failure), since this memory was made: a test count (jit::flush_work_counts).
  int64_t error_reads() const { return error_reads_; }
  void count_error_reads(int64_t n) { error_reads_ += n; }
  // Frees what every storage's value was held in, as destruction does, and
  // keeps the maps' room for another flush (jit::run_graph reuses one
  // HostMemory per thread); `expected`: storages the next use will bind.
  void clear(size_t expected = 8);
  // For a transient storage: `storage` (a CPU kernel's fresh result covering all of
  // `s`) becomes what holds its value, instead of a copy into flush-local memory;
  // false (nothing bound) for any other storage.
  bool adopt_transient(DeferredStorage* s, c10::Storage storage);
  // The same for any output: a transient one as above; for a storage that
  // outlives the flush, `storage` (exactly s->nbytes, nothing else holding it)
  // becomes its device memory (adopt_host_buffer, device/device.h). False
  // (nothing bound) when neither applies: the caller copies.
  bool adopt_output(DeferredStorage* s, c10::Storage storage);
  // Frees whatever holds the value of `s` (a transient storage after its last
  // use). Nothing to look up while nothing is bound (a fused loop's
  // intermediates never are).
  void release(DeferredStorage* s) {
    if (map_.size() != 0) release_bound(s);
  }
  // A CPU storage of `nbytes` for a flush temporary (scratch_storage): one an
  // earlier temporary of that size held, when release, release_temp or clear
  // kept it (a small one nothing else held), instead of a StorageImpl, its
  // block from the cache and their frees per temporary per flush.
  c10::Storage scratch(size_t nbytes);
  // The value of r: a CPU tensor with r's dtype and geometry, read from the
  // storage's flat value through r's view chain (views/). It aliases the
  // storage unless the chain pads or gathers (then it is a copy).
  // `strided_gather`: a gathering chain (overlapping windows such as unfold,
  // an arbitrary as_strided) gives the strided view over the storage instead of
  // a copy of the view's whole logical size: for readers that take any strides
  // (CPU kernels), as CPU reads such a view. `kept`: where r is a plain view
  // of its storage (not conjugated or negated), the tensor is made by
  // view_over_kept on *kept (a compiled region's kept tensor), else null.
  at::Tensor tensor(const TensorRef& r, bool strided_gather = false, at::Tensor* kept = nullptr);
  // r as a strided CPU view of the storage (CPU semantics for the eager path).
  // Unlike tensor(), it does not raise the storage's error: the caller decides.
  at::Tensor strided(const TensorRef& r);
  // The same for an argument the op writes: always an alias of the storage,
  // or a copy registered to be scattered back by finish_writes().
  at::Tensor written_tensor(const TensorRef& r);
  // Writes back, through the inverse view chain, every written copy.
  void finish_writes();

 private:
  struct Entry {
    c10::Storage storage;
    bool temp = false;
  };
  struct PendingWrite {
    at::Tensor flat;
    TensorRef ref;
    views::ViewChain chain;  // of ref over flat, found when the copy was made
    at::Tensor value;
  };
  // Open addressing (lazy/storage_map.h): no allocation per storage of the flush.
  StorageMap<Entry> map_;
  bool inputs_may_hold_errors_ = true;
  uint64_t errors_set_at_ = 0;  // g_storage_errors_set when inputs_may_hold_errors_ was set
  int64_t error_reads_ = 0;
  const char* transient_ = nullptr;  // set_transient
  size_t n_transient_ = 0;
  uint64_t stamp_ = 0;
  DeferredStorage* const* numbered_ = nullptr;  // set_numbered
  size_t n_numbered_ = 0;
  std::vector<PendingWrite> pending_writes_;
  // CPU storages that wrapped a device buffer in an earlier flush and that
  // nothing else holds or watches (clear() keeps them): device_buffer points
  // one at the next buffer instead of making and freeing a StorageImpl per
  // device buffer per flush. Never for a resizable HostMemory.
  std::vector<c10::Storage> spare_wrappers_;
  // Flush temporaries' storages kept for reuse (scratch), bucketed by size:
  // at most kMaxSpareScratch, each below 64 KiB (at most 4 MiB held between
  // flushes, beside the block cache's small blocks). Never for a resizable HostMemory.
  static constexpr size_t kSpareBuckets = 32, kMaxSpareScratch = 64;
  std::array<std::vector<c10::Storage>, kSpareBuckets> spare_scratch_;
  size_t n_spare_scratch_ = 0;
  static size_t spare_bucket(size_t nbytes);
  void keep_spare(const c10::Storage& st);
  bool resizable_;
  at::Tensor flat(const TensorRef& r);
  c10::Storage wrap(DeferredStorage* s);
  void release_bound(DeferredStorage* s);
};

// Replaces the tensor at (`elem` of) an argument slot: a Tensor, Tensor[] or
// Tensor?[] argument (elem < 0 for a single Tensor). Lists are copied, never
// shared with the caller's. An undefined `t` in a Tensor?[] becomes None.
void set_tensor_slot(c10::IValue& slot, int elem, at::Tensor t);

// A CPU storage of `nbytes` for a flush's temporary (a value that never
// reaches device memory), from the block cache (device/block_cache.h,
// host_block_alloc): a training step's temporaries reuse last step's pages
// instead of the C library's, which trims and regrows its heap (page faults).
// Throws c10::OutOfMemoryError when the host has no memory.
c10::Storage scratch_storage(size_t nbytes);

// A CPU tensor with r's dtype and geometry over `storage`.
at::Tensor view_over(const c10::Storage& storage, const TensorRef& r);
// The same, reusing `kept` when only its holder holds it and it has r's dtype
// and geometry (its storage replaced), else making one and keeping it in
// `kept` (a compiled region's kept tensor, region_runner.h KeptTensors).
at::Tensor view_over_kept(const c10::Storage& storage, const TensorRef& r, at::Tensor& kept);
// A CPU storage wrapping the device buffer of `s` without owning it. A
// resizable one lets a CPU kernel grow an out= argument: it then moves to new
// CPU memory, which the caller copies back (the eager path does).
c10::Storage wrap_device_buffer(DeferredStorage* s, bool resizable = false);

// A wrapped-number CPU tensor (0-dim, the dtype wrapped_number_dtype gives)
// holding the Scalar argument `v` of a node (Node::wrapped), as the call
// passed it to CPU's kernel. Taken from a small per-thread pool: valid for
// one kernel call (the next call may reuse it once nothing else holds it).
at::Tensor wrapped_number(const c10::IValue& v);
// Builds the CPU argument stack of `n` (tensors from `mem`, generators seeded
// from the node's reserved stream) into `stack` (its elements replaced, its
// capacity kept: a loop over ops reuses one stack instead of allocating one per op).
// Wrapped numbers kept as Scalars become wrapped-number tensors again (wrapped_number).
void build_stack(const Node& n, HostMemory& mem, torch::jit::Stack& stack);
// The same with each read-only input's tensor made by HostMemory::tensor on
// `kept` (one per input of `n`, in Node::inputs order); `kept` may be null.
void build_stack(const Node& n, HostMemory& mem, torch::jit::Stack& stack, at::Tensor* kept);
// Calls the op's CPU kernel on `stack` (autograd excluded); for RNG ops
// without a generator argument, CPU's default generator is seeded with the
// node's stream and restored afterwards.
void call_cpu(const Node& n, torch::jit::Stack& stack);
// The fresh tensor results left on `stack` by call_cpu, in Node::outputs
// order, into `out` (cleared first, its capacity kept).
void fresh_results(const Node& n, torch::jit::Stack& stack, std::vector<at::Tensor>& out);

}  // namespace host
}  // namespace tpu_eager
