// The JIT: turns a flushed graph of recorded ops into fused regions and runs
// them on the active target's executor (DESIGN §5).
#pragma once

#include <exception>
#include <vector>

#include "lazy/queue.h"

namespace tpu_eager {
namespace jit {

// Runs a flushed graph in program order: dead-code elimination, partition
// into fused regions, cache lookup / compile, execution. Adds its counters to
// `m`. Returns the first error (with the failing op and the Python line that
// recorded it in its message) after running every region that does not
// depend on a failed one; storages a failed region should have written are
// marked with the error.
std::exception_ptr run_graph(std::vector<Node>& graph, Metrics& m);

// The kernel cache (least recently used kernels evicted past its limit).
// Drops every kernel (e.g. after a target switch).
void clear_cache();
// Kernels held; at most cache_limit().
size_t cache_size();
// The bound: TORCH_TPU_KERNEL_CACHE_SIZE, else 8192 kernels. Setting it
// (at least 1) evicts down to it at once.
size_t cache_limit();
void set_cache_limit(size_t limit);
// Kernels evicted since the process started.
int64_t cache_evictions();

// Work counts of the flush machinery since the process started (tests count
// them): the words of the last flush's structure (flush_cache.h), and the
// per-tensor nodes of foreach nodes written whole or only where flushes of one
// structure differ (foreach_expand.h, ExpandedGraph's `plan`).
struct FlushWorkCounts {
  int64_t structure_words = 0;
  int64_t per_tensor_nodes_written = 0;
  int64_t per_tensor_nodes_refreshed = 0;
  // Storages whose `error` field the regions' runs read looking for an earlier failure
  // (host::HostMemory::error_reads): none in a flush none of whose storages held one.
  int64_t storage_error_reads = 0;
};
FlushWorkCounts flush_work_counts();

}  // namespace jit
}  // namespace tpu_eager
