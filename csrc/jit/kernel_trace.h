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

// The VMEM tiling an executor planned for one kernel (TPU target; see
// executors/tpu/tiling.h). Empty `kind`: no plan.
struct TilingRecord {
  struct Block {
    std::string role;            // "input", "output", "temporary", "lhs", "rhs", "out", "acc"
    std::string dtype;           // "Float", "BFloat16", ...
    std::vector<int64_t> shape;  // operand as 2-D (rows, cols)
    std::vector<int64_t> block;  // its VMEM block
    int buffers = 2;
    int64_t vmem_bytes = 0;
  };
  std::string kind;            // "vector" or "matmul"
  std::string order;           // matmul grid order ("mnk" / "nmk")
  std::vector<int64_t> grid;   // vector: (row blocks, col blocks); matmul: (batch, M/bm, N/bn, K/bk)
  std::vector<int64_t> block;  // vector: (br, bc); matmul: (bm, bk, bn)
  std::vector<Block> blocks;
  int64_t vmem_bytes = 0;         // footprint, bytes
  int64_t vmem_budget_bytes = 0;  // VMEM per TensorCore, bytes
  int64_t hbm_reread_bytes = 0;   // extra HBM reads the blocking implies, bytes
  double mxu_utilization = -1;    // useful / padded MACs; -1 without MXU work
};

// A collective charged to the timeline (distributed/collective.h): what the
// interconnect cost model chose.
struct CollectiveRecord {
  std::string algorithm;       // "ring", "bidirectional_ring", "torus", "direct", "point_to_point", "none"
  int64_t group_size = 0;      // chips in the group
  int64_t nbytes = 0;          // buffer size the cost is for, bytes
  std::vector<int64_t> shape;  // slice shape the group is laid out on (chips per axis)
  double bytes_per_link = 0;   // most bytes one link carries in one direction
  int64_t hops = 0;            // link hops on the critical path
  double latency_s = 0;        // hops x per-hop latency, seconds
  double bandwidth_s = 0;      // bytes_per_link / link bandwidth, seconds
};

struct KernelRecord {
  std::string kind = "kernel";                                   // "kernel" (a fused region) or "collective"
  std::string name;                                              // compiled region name, e.g. "fused_mul_add_sum"
  std::string target;                                            // chip it was costed on
  std::vector<std::string> ops;                                  // fused ATen ops, "add.Tensor"
  std::vector<std::vector<std::vector<int64_t>>> shapes;         // per op: tensor argument shapes
  std::vector<std::vector<std::vector<int64_t>>> output_shapes;  // per op: fresh result shapes
  RegionStats stats;
  double start_s = 0;  // start on the simulated timeline, seconds
  bool cache_hit = false;
  bool failed = false;          // an op of the region raised
  TilingRecord tiling;          // attached by the executor (trace_attach_tiling)
  CollectiveRecord collective;  // kind "collective" only
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
// Called by an executor while a profiler is active: attaches `t` to the next
// record appended on this thread (the region it is running).
void trace_attach_tiling(TilingRecord&& t);
// Records held (0 when no profiler is active).
size_t trace_size();

}  // namespace jit
}  // namespace tpu_eager
