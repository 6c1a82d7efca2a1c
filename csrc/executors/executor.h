// The executor interface between the JIT and a target (DESIGN §6).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executors/host_runtime.h"
#include "jit/ir.h"
#include "lazy/queue.h"

namespace tpu_eager {

// A fused region: consecutive live ops of one flush, in program order.
struct Region {
  std::vector<int> nodes;             // indices into the flushed graph
  PrimKind anchor = PrimKind::kElementwise;  // reduction / matmul / library anchor, if any
  // materialize[k][j]: output j of nodes[k] is written to its device storage
  // (it is observed outside the region); otherwise it lives in a temporary.
  std::vector<std::vector<char>> materialize;
};

// What compiling a region produced; cached by the region's structural key.
struct CompiledRegion {
  uint64_t key = 0;
  std::vector<PrimKind> kinds;        // lowered primitive of each op
  std::string name;                   // e.g. "fused_add_mul_sum"
  int64_t num_ops = 0;
};

// Counters of one region run, summed into Metrics by the JIT.
struct RegionStats {
  int64_t bytes_read = 0;             // bytes read from device storages
  int64_t bytes_written = 0;          // bytes written to device storages
  double flops = 0;                   // floating-point operations (MXU: 2*M*N*K)
  double sim_time_s = 0;              // simulated device time, seconds
  int64_t library_calls = 0;
  int failed_at = -1;                 // position in the region of the op that failed
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  // Runs `region` of `graph` with its compiled form. Inputs are read from
  // `mem`; outputs marked for materialization are written into their device
  // storages, the rest bound as temporaries in `mem`. Throws on a data error.
  virtual void run_region(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                          host::HostMemory& mem, RegionStats& stats) = 0;
};

// The executor of the active target.
Executor& active_executor();

}  // namespace tpu_eager
