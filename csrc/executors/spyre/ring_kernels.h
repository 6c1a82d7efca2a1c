// Loops of the interpreter's ring partials that replace several ATen calls
// with one pass, with the values of those calls (docs/ktir.md, "Ring
// reductions").
#pragma once

#include <ATen/core/Tensor.h>

namespace tpu_eager {
namespace spyre {

// Softmax's partial of G corelets at once, over dim 1 of `seg` ([G, rows,
// inner...] float32, each seg[g] one contiguous block): returns (m, e) with
// m = seg.amax(1, true) ([G, 1, inner...], NaN when a column holds one) and
// e = (seg - m).exp() ([G, rows, inner...], contiguous; CPU's float32 exp),
// element for element the values of those ATen calls (a max is exact in any
// order; the sign of a zero max may differ, which no exp(x - m) sees). The
// caller sums e. Requires fits_softmax_partial(seg).
bool fits_softmax_partial(const at::Tensor& seg);
std::pair<at::Tensor, at::Tensor> softmax_partial_exp(const at::Tensor& seg);

}  // namespace spyre
}  // namespace tpu_eager
