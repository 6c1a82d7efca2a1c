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
  int64_t bytes_read = 0;             // bytes read from device storages (logical, unpadded)
  int64_t bytes_written = 0;          // bytes written to device storages (logical, unpadded)
  int64_t padding_bytes = 0;          // extra HBM bytes moved for the tiled layouts of those reads and writes
  double flops = 0;                   // useful operations (MXU: 2*M*N*K; others one per element)
  double mxu_flops = 0;               // FLOPs the MXUs spend on padded shapes, times precision passes
  double compute_s = 0;               // simulated compute time, seconds
  double memory_s = 0;                // simulated HBM time, seconds
  double sim_time_s = 0;              // simulated kernel time: max(compute_s, memory_s) + launch, seconds
  int64_t library_calls = 0;
  int failed_at = -1;                 // position in the region of the (first) op that failed
  bool errors_marked = false;         // the runner set each failed op's storage errors itself
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  // The simulated chip regions are costed on (e.g. "tpu-v5e").
  virtual std::string target() const = 0;
  // Runs `region` of `graph` with its compiled form. Inputs are read from
  // `mem`; outputs marked for materialization are written into their device
  // storages, the rest bound as temporaries in `mem`. Throws on a data error.
  virtual void run_region(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                          host::HostMemory& mem, RegionStats& stats) = 0;
  // Called by the JIT before the regions of one flush run.
  virtual void begin_flush() {}
};

// Which executor runs regions: set with the target (torch_tpu_eager.set_target).
enum class TargetKind : int { kTpu = 0, kSpyre = 1 };
TargetKind active_target_kind();
void set_active_target_kind(TargetKind kind);

// The executors (singletons).
Executor& tpu_executor();    // executors/tpu/tpu_executor.cpp
Executor& spyre_executor();  // executors/spyre/spyre_executor.cpp

// The executor of the active target.
Executor& active_executor();

}  // namespace tpu_eager
