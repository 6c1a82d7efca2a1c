// Kernel trace for torch_tpu_eager.profile(): one record per fused region run,
// on a simulated timeline. Costs one relaxed atomic load per region when no
// profiler is active.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "executors/executor.h"

namespace tpu_eager {
namespace jit {

struct KernelRecord {
  std::string name;                                   // compiled region name, e.g. "fused_mul_add_sum"
  std::string target;                                 // chip it was costed on
  std::vector<std::string> ops;                       // fused ATen ops, "add.Tensor"
  std::vector<std::vector<std::vector<int64_t>>> shapes;         // per op: tensor argument shapes
  std::vector<std::vector<std::vector<int64_t>>> output_shapes;  // per op: fresh result shapes
  RegionStats stats;
  double start_s = 0;                                 // start on the simulated timeline, seconds
  bool cache_hit = false;
  bool failed = false;                                // an op of the region raised
};

namespace detail {
extern std::atomic<int> g_trace_depth;
}
// True while at least one profiler is active.
inline bool trace_active() { return detail::g_trace_depth.load(std::memory_order_relaxed) > 0; }

// Starts a (possibly nested) profiler: returns the index its records start at
// and the simulated clock, seconds.
std::pair<size_t, double> trace_begin();
// Ends it: the records from `first` on. The buffer is cleared when the last
// profiler ends.
std::vector<KernelRecord> trace_end(size_t first);
// Appends `r` at the current simulated clock and advances the clock by its time.
void trace_record(KernelRecord&& r);
// Records held (0 when no profiler is active).
size_t trace_size();

}  // namespace jit
}  // namespace tpu_eager
