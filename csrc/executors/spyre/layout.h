// How a region is laid out on the simulated Spyre: its memory views (HBM or
// LX) in order of first use, and the grid that splits one dimension of rows
// over the cores. Shared by the KTIR printer (ktir.h) and the dataflow
// schedule (schedule.h) so both describe the same views and split.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

struct LayoutView {
  const TensorRef* ref = nullptr;
  bool lx = false;      // a region temporary kept in the scratchpads (never reaches HBM)
  bool loaded = false;  // read from device memory (HBM) by the region
  bool stored = false;  // written to device memory (HBM) by the region
  bool split = false;   // dim 0 is the grid's rows: split over the cores (else replicated)
};

struct RegionLayout {
  std::vector<LayoutView> views;  // numbered %0, %1, ... in order of first use by the ops
  // Grid: `rows` (dim 0 of the split tensor; 0 for a rank-0 anchor) split into
  // `rows_per_core` = ceil(rows / cores) rows on `cores_used` cores.
  int64_t cores = 1;
  int64_t rows = 0;
  int64_t rows_per_core = 1;
  int64_t cores_used = 1;
  // A reduction that reduces the split dim (e.g. x.sum(), x.sum(0)): each core
  // reduces its rows to a partial of `partial_sizes` (the reduced input with
  // its reduced dims set to 1) and the partials are combined over the ring.
  bool ring_reduce = false;
  std::vector<int64_t> partial_sizes;
  c10::ScalarType partial_dtype = c10::kFloat;

  // The view number of r (a ref of one of the region's nodes).
  int id(const TensorRef& r) const;

  using Key = std::tuple<const DeferredStorage*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;
  std::map<Key, int> ids;
};

// Grid rule: the last reduction node of the region whose reduced dims include
// dim 0 of its first input (with dim 0 > 1) anchors the split on that input's
// dim 0 and needs a ring reduction; otherwise the split is dim 0 of the last
// op's first result (or first written argument).
RegionLayout region_layout(const Region& region, const std::vector<Node>& graph, const CardParams& card);

// True for the reductions whose `dim` argument names the dim they keep, not
// the ones they reduce (renorm: the norm of each slice along dim reduces
// every other dim). `base`: the ATen name without its overload.
bool reduces_all_but_dim(const std::string& base);

// The device dtype a host dtype is held as: "f32", "df16" (float16 and
// bfloat16), "i32" (int64), else c10's name.
std::string device_dtype_name(c10::ScalarType t);

}  // namespace spyre
}  // namespace tpu_eager
