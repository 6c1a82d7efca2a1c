// Foreach ops recorded as one node (Node::expands), expanded per tensor at the flush.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "lazy/queue.h"

namespace tpu_eager {
namespace jit {

struct FlushPlan;  // jit/flush_cache.h

// Per-tensor nodes written whole and written only where flushes of one structure differ
// (ExpandedGraph's `plan`), since the process started.
int64_t per_tensor_nodes_written();
int64_t per_tensor_nodes_refreshed();

// Whether any node of `g` is a foreach node to expand.
bool has_foreach_nodes(const std::vector<Node>& g);

// The graph of `g` with each foreach node (Node::expands: the op table's kExpandsPerTensor
// rows, `_foreach_mul_.Scalar`, AdamW's `_foreach_addcdiv_.ScalarList`, ...) replaced by the
// per-tensor ops CPU's foreach kernel calls, in its order: for tensor i, the op of the
// foreach rule over element i of each Tensor[] and Scalar[] argument, the op's other
// arguments as they are, and the per-tensor op's defaults for arguments the foreach op
// lacks (`add_`'s alpha). A Scalar where the per-tensor op takes a Tensor is a wrapped
// number (Node::wrapped), as CPU's `t.mul_(scalar)` makes it. The nodes are those the record
// kernel makes for the per-tensor calls (without a meta-key id), so partition fuses each
// tensor's elementwise chain as it fuses them recorded one by one. `g`'s other nodes are
// moved into `nodes` (no copy) and moved back when this is destroyed: the queue's
// bookkeeping after the flush (pending uses, errors) is over the recorded nodes.
//
// `nodes` is the thread's vector of the previous expansion, kept: a training step's flushes
// recur, so a per-tensor node is written over the one of the same op at its index (its
// lists keep their room) instead of being built and destroyed each flush. When this is
// destroyed the kept nodes let go of their storages, so a storage lives as long as without
// the reuse. A flush nested in another's run on the same thread gets a vector of its own.
//
// `plan`: the flush plan found for `g`'s structure (jit/flush_cache.h; null when there is none).
// When the kept nodes were written last for that plan (set_plan), they already hold every
// field that follows from the structure (ops, argument kinds, reference geometry, slots), so
// only what differs between flushes of one structure is written: each reference's storage,
// the argument values (runtime scalars, host tensors), the Python location and sequence
// number. A training step's flush repeats its structure every step.
class ExpandedGraph {
 public:
  explicit ExpandedGraph(std::vector<Node>& g, std::shared_ptr<const FlushPlan> plan = nullptr);
  ~ExpandedGraph();
  ExpandedGraph(const ExpandedGraph&) = delete;
  ExpandedGraph& operator=(const ExpandedGraph&) = delete;

  // The plan whose structure the kept nodes now have (after this expansion, once the
  // flush's plan is built for it); the next expansion for that plan writes only what differs.
  void set_plan(std::shared_ptr<const FlushPlan> plan);

  struct Kept;  // the kept vector, whether an expansion uses it, and the plan it matches

 private:
  Kept* kept_;                 // the thread's kept vector, or own_'s
  std::unique_ptr<Kept> own_;  // a nested expansion's own
  std::vector<Node>& g_;
  std::vector<std::pair<size_t, size_t>> moved_;  // (index in g, index in nodes)
  // Moves g's nodes back and has the kept nodes let go of their storages.
  void restore();

 public:
  std::vector<Node>& nodes;
};

}  // namespace jit
}  // namespace tpu_eager
