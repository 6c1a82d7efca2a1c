// The op-by-op host loop shared by the executors: each op of a region runs
// with its CPU ATen kernel on host buffers; a target customizes the kernel
// call, its device numerics after each op, and its cost accounting through
// HostRunHooks.
#pragma once

#include <vector>

#include <ATen/core/stack.h>

#include "executors/executor.h"

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
void run_ops(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph, HostMemory& mem,
             RegionStats& stats, HostRunHooks& hooks);

// True when op `n` reads the current value of its written argument `in`
// (false for out= arguments and the self of fill_, zero_, copy_, RNG fills).
bool reads_written_value(const Node& n, const InputSlot& in);

// "aten::add.Tensor" for messages.
std::string op_display_name(const Node& n);

}  // namespace host
}  // namespace tpu_eager
