// Regions and kernels: what the JIT hands to an executor (DESIGN §5, §6).
//
// partition() cuts a flush into Regions; an executor compiles a Region into
// a Kernel (all planning: fused loop programs, tiling, cost, KTIR); the JIT
// caches Kernels by structural key and runs them with each flush's buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jit/ir.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace host {
class HostMemory;
}  // namespace host

// A fused region: consecutive live ops of one flush, in program order.
// anchor kLibrary: the region's ops run op by op, each through its library
// (CPU ATen) kernel: a library op alone, or lowered ops the target cannot fuse.
struct Region {
  std::vector<int> nodes;                    // indices into the flushed graph
  PrimKind anchor = PrimKind::kElementwise;  // reduction / matmul / library anchor, if any
  // materialize[k][j]: output j of nodes[k] is written to its device storage
  // (it is observed outside the region); otherwise it lives in a temporary.
  std::vector<std::vector<char>> materialize;
  // The fused loop each op runs in, decided by partition (one entry per
  // node; empty when the target asks for none, FusionRules::loops_of_one_shape,
  // and in kLibrary and kMatmul regions). Loops are numbered from 0 in order
  // of their first op; two loops share no value made or written in the
  // region, each iterates over one shape (a reduction's: its input's), and a
  // reduction is the last op of its loop. A region with several loops is a
  // multi-tensor loop (an optimizer step over parameters of several shapes).
  std::vector<int> loop;
  // The flush's storage numbers (lazy/queue.h FlushStorages) of the region's
  // tensor references: per node in order, its inputs, then its outputs. Set
  // by the JIT for the regions of a flush plan (every flush of the plan's
  // structure numbers its storages alike), so a kernel binds its buffers
  // through this array and the flush's storages by number
  // (HostMemory::numbered), without reading the nodes' references. Empty in
  // a region made otherwise (a part of one): read the nodes.
  std::vector<int32_t> storage_numbers;
};

// What identifies a compiled region: its key, kinds and name (also what the
// on-disk cache stores).
struct CompiledRegion {
  uint64_t key = 0;
  std::vector<PrimKind> kinds;  // lowered primitive of each op
  std::string name;             // e.g. "fused_add_mul_sum"
  int64_t num_ops = 0;
};

// Counters of one region run, summed into Metrics by the JIT.
struct RegionStats {
  int64_t bytes_read = 0;       // bytes read from device storages (logical, unpadded)
  int64_t bytes_written = 0;    // bytes written to device storages (logical, unpadded)
  int64_t padding_bytes = 0;    // extra HBM bytes moved for the tiled layouts of those reads and writes
  double flops = 0;             // useful operations (MXU: 2*M*N*K; others one per element)
  double mxu_flops = 0;         // FLOPs the MXUs spend on padded shapes, times precision passes
  double compute_s = 0;         // simulated compute time, seconds
  double memory_s = 0;          // simulated HBM time, seconds
  double sim_time_s = 0;        // simulated kernel time: max(compute_s, memory_s) + launch, seconds
  double schedule_time_s = 0;   // the target's pipelined-schedule time of the kernel, seconds (0: none; Spyre)
  int64_t extra_hbm_bytes = 0;  // HBM bytes a kernel's own cost adds (a Pallas grid's re-fetched blocks)
  int64_t library_calls = 0;
  int64_t output_copies = 0;   // materialized outputs copied into their device storage (not written in place)
  int64_t plans_built = 0;     // plans the kernel built in this run (0 on a warm run)
  int failed_at = -1;          // position in the region of the (first) op that failed
  bool errors_marked = false;  // the runner set each failed op's storage errors itself
};

// A compiled region. Built once by Executor::compile from a region's
// structure (ops, argument structure, dtypes, layouts); run many times.
// run() binds this flush's buffers (the device storages of the region's
// TensorRefs), runtime scalars (Python floats, 0-dim tensors) and sizes,
// then runs the plan. A kernel plans again (stats.plans_built) only when a
// run's exact layout differs from the one it planned for (sizes inside one
// dynamic-shape bucket, offsets, strides, aliasing of inputs).
class Kernel {
 public:
  explicit Kernel(CompiledRegion info) : info_(std::move(info)) {}
  virtual ~Kernel() = default;
  const CompiledRegion& info() const { return info_; }
  // Runs `region` (same structural key as the one compiled) of `graph`.
  // Inputs are read from `mem`; outputs marked for materialization are
  // written into their device storages, the rest bound as temporaries in
  // `mem`. Throws on a data error (stats.failed_at, errors_marked as in run_ops).
  virtual void run(const Region& region, std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats) = 0;
  // The same, given `layout` == layout_signature(region, graph) (the JIT's
  // flush cache holds it): a kernel that picks its plan by layout need not
  // compute it, and may keep the pointer: one signature object is held by the
  // flush plan that runs this region every step, so a kernel that kept it
  // from an earlier run compares pointers, not the signature's words (up to
  // a few KiB a region). The default ignores it.
  virtual void run_with_layout(const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                               RegionStats& stats, const std::shared_ptr<const std::vector<int64_t>>& layout) {
    run(region, graph, mem, stats);
  }

 private:
  CompiledRegion info_;
};

// How a target runs one op inside a region (FusionRules::op_fusion).
enum class OpFusion : uint8_t {
  kFuses,     // joins a fused loop with its producers and consumers
  kEndsLoop,  // a row reduction that ends a fused loop: its consumers start a new region
  kAnchor,    // anchors a region of its own kind that takes an elementwise epilogue (MXU ops)
  kOpByOp,    // runs through its library kernel: cut out of fused regions
  // A row reduction to one value per row (sum / mean over the last dim) that
  // ends its loop; on a target of one-shape loops its consumers, of its
  // shape or of its input's, join the region in later loops (RMSNorm's
  // mean, eps + rsqrt, x * rstd * weight: one region). Else as kEndsLoop.
  kRowValue,
};

// What the target can fuse, asked by partition() once per op per flush: fusion is decided there
// only, and the executor runs the regions it is given (DESIGN §5). Implemented by each Executor.
class FusionRules {
 public:
  virtual ~FusionRules() = default;
  // How graph[i] (a live op of a lowered kind: elementwise, reduction, matmul, data, random)
  // runs on this target. Must be cheap (called per op per flush) and depend only on the op,
  // its dtypes and layouts and the kinds of its scalar arguments (it shapes the structural key).
  // The default keeps every lowered op in fused regions (reductions anchor, matmuls anchor).
  virtual OpFusion op_fusion(const std::vector<Node>& graph, int i) const {
    const auto k = static_cast<PrimKind>(graph[i].kind);
    return k == PrimKind::kMatmul ? OpFusion::kAnchor : OpFusion::kFuses;
  }
  // Whether the target runs a fused region as loops each over one shape
  // (TPU): partition then assigns each op its loop (Region::loop) and cuts
  // a region where an op would join a loop of another shape (a value made
  // in the region read as a broadcast operand, an attention mask of another
  // shape than the scores it masks). False: regions carry no loops (Spyre).
  virtual bool loops_of_one_shape() const { return false; }
  // With loops of one shape: the kind of values graph[i] computes in a loop.
  // Partition puts ops of different kinds (other than 2) in different loops
  // (one reading another's value as a materialized input): 0 float (the
  // default), 1 integer, 2 either (bool logic). Cheap; from dtypes only.
  virtual int loop_domain(const std::vector<Node>& graph, int i) const { return 0; }
};

// The exact layout of a region's tensors: per input and output, in order,
// which region-local storage it views (aliasing), dtype, offset, sizes,
// strides and flags. Two runs with equal signatures can share one plan.
std::vector<int64_t> layout_signature(const Region& region, const std::vector<Node>& graph);

}  // namespace tpu_eager
