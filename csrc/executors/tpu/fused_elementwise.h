// One fused loop for elementwise regions (DESIGN §5): the region's ops run
// tile by tile over cache-resident buffers, and only materialized outputs
// reach device memory.
#pragma once

#include <vector>

#include "executors/executor.h"

namespace tpu_eager {
namespace tpu {

// Runs `region` as a single tiled loop when every op is a supported float32
// elementwise op (add, sub, mul, div, neg, abs, relu, exp, log, sin, cos,
// tanh, sigmoid, sqrt, rsqrt, reciprocal, lerp with a scalar weight, addcmul,
// addcdiv; functional, in-place or out= overloads) over one contiguous
// shape, with 0-dim tensors and Python scalars as runtime parameters; the
// region may end with _softmax / _log_softmax / logsumexp over the last dim
// or native_layer_norm (float32 weight / bias or None; mean and rstd written
// only when materialized), then run as one loop over blocks of rows
// (producers and the row reduction in one pass over memory). An elementwise
// region over several shapes (multi-tensor ops such as an optimizer step
// over every parameter) runs as one such loop per set of ops that share
// tensors; the sets that cannot run as a loop are left in `rest` (ops in
// region order, to run op by op after the loops; they share no tensor with
// them) when `rest` is given. Returns false, having done nothing, when no
// loop runs (or, without `rest`, when not every op runs). Every op uses the
// vectorized routines (SLEEF) and reduction order of CPU's kernel of the
// same capability, so results equal CPU's.
bool run_fused_elementwise(const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                           RegionStats& stats, Region* rest = nullptr);

}  // namespace tpu
}  // namespace tpu_eager
