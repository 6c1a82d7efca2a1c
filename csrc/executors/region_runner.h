// The op-by-op host loop shared by the executors: each op of a region runs
// with its CPU ATen kernel on host buffers; a target customizes the kernel
// call, its device numerics after each op, and its cost accounting through
// HostRunHooks.
#pragma once

#include <optional>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include "executors/executor.h"
#include "executors/host_runtime.h"

namespace tpu_eager {
namespace host {

class HostRunHooks {
 public:
  virtual ~HostRunHooks() = default;
  // Runs op `n` on its CPU argument stack (default: the op's CPU kernel).
  virtual void call(const Node& n, torch::jit::Stack& stack) { call_cpu(n, stack); }
  // True when `n` may instead run as its CPU out= kernel writing straight into
  // device buffers (false when call() computes it differently, e.g. MXU numerics).
  virtual bool direct_outputs_ok(const Node& n) { return true; }
  // Device bytes of a view that reaches device memory: logical bytes and the
  // extra bytes its device layout moves.
  virtual int64_t logical_bytes(const TensorRef& r) { return r.nbytes(); }
  virtual int64_t padding_bytes(const TensorRef& r) = 0;
  // After `n` ran and its writes landed in `mem`, before its fresh `results`
  // are bound: applies the target's storage numerics (may replace results and
  // rewrite written arguments through mem).
  virtual void after_op(const Node& n, std::vector<at::Tensor>& results, HostMemory& mem) {}
  // Adds the work of `n` to `stats`.
  virtual void add_op_cost(const Node& n, RegionStats& stats) = 0;
  // The same for `n` at position `p` of the region run_ops runs (a target may
  // keep the cost of a compiled region's op across its runs).
  virtual void add_op_cost_at(const Node& n, size_t p, RegionStats& stats) { add_op_cost(n, stats); }
};

// The CPU tensors over device or scratch memory that a compiled region's ops
// take as arguments and out= outputs, kept across the region's runs: on a
// cache hit the same op at the same position has the same dtypes and
// geometry (the plan's layout signature), so a kept tensor only gets the run's
// storage set instead of a TensorImpl made and freed per operand per run.
// Between ops a kept tensor holds an empty storage (no memory kept alive, no
// stale value readable); one that something else still holds is dropped, not
// reused. Not thread-safe: the owner runs one region at a time.
class KeptTensors {
 public:
  // One op's argument stacks, results and out= tensors (run_ops): empty
  // between ops, their capacity kept across runs (a one-op region's run
  // allocated and freed them each time).
  struct OpBuffers {
    torch::jit::Stack stack, out_stack;
    std::vector<at::Tensor> results, direct;
  };
  OpBuffers& buffers() { return buffers_; }
  // The `count` kept tensors of op position `p` (inputs, then outputs);
  // undefined until first used.
  at::Tensor* op(size_t p, size_t count);
  // Gives every kept tensor of op `p` the empty storage, or drops it when
  // something besides this cache holds it.
  void park(size_t p);

  // One op's device traffic in a run of the region where every op ran: the
  // bytes it counted (reads: its inputs, before its kernel; writes: after)
  // and the views it counted first (Node::inputs index, or outputs index
  // with `output`), so run_ops adds the sums instead of counting views again.
  // The traffic of a run is fixed by the region's ops and the plan's layout
  // (which views, which storages alias, which outputs are materialized).
  struct CountedView {
    uint32_t slot;
    bool output, write;
  };
  // With it, what run_ops finds from the op and the plan's layout alone: the
  // slots whose storage the op uses last in the region (input k, or
  // kOutputSlot | j for output j: their temporaries are freed after it; the
  // layout fixes which slots share a storage) and the out= overload its
  // results can be written with (region_runner.cpp direct_out_op), or null.
  static constexpr uint32_t kOutputSlot = 1u << 31;
  struct OpTraffic {
    std::optional<c10::OperatorHandle> op;  // the op it was counted for
    int64_t read = 0, read_padding = 0, written = 0, write_padding = 0;
    std::vector<CountedView> views;
    c10::SmallVector<uint32_t, 4> last_uses;
    const c10::OperatorHandle* direct_op = nullptr;
  };
  // The recorded traffic (one per op of the region), or empty.
  std::vector<OpTraffic>& traffic() { return traffic_; }

 private:
  std::vector<std::vector<at::Tensor>> per_op_;
  OpBuffers buffers_;
  std::vector<OpTraffic> traffic_;
};

// Runs `region` op by op in program order. Outputs marked for
// materialization are written through their inverse view chains, the rest
// are bound as temporaries and freed after their last use in the region.
// Counts HBM traffic (each view once per region) into `stats`. c10 errors
// get the op, its Python line and the region name as context. An op that
// fails poisons only what depends on it: its outputs and written inputs get
// its error, later ops that read them fail in turn, the others run; then the
// first error is rethrown with stats.failed_at its position and
// stats.errors_marked set.
// `kept`: the compiled region's kept tensors (KeptTensors), or null.
void run_ops(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph, HostMemory& mem,
             RegionStats& stats, HostRunHooks& hooks, KeptTensors* kept = nullptr);

// True when op `n` reads the current value of its written argument `in`
// (false for out= arguments and the self of fill_, zero_, copy_, RNG fills).
bool reads_written_value(const Node& n, const InputSlot& in);

// "aten::add.Tensor" for messages.
std::string op_display_name(const Node& n);

}  // namespace host
}  // namespace tpu_eager
