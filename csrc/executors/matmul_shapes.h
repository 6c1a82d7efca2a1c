// The products of a matmul-family op, shared by the targets' cost models.
#pragma once

#include <algorithm>
#include <vector>

#include <c10/core/ScalarType.h>

#include "jit/ir.h"
#include "lazy/queue.h"

namespace tpu_eager {

// One product (M,K)x(K,N) repeated `batch` times.
struct Gemm {
  double batch, m, k, n;
};

// The tensor argument at schema position `arg` (not a list element), or null.
const TensorRef* arg_ref(const Node& n, int arg);

// The products of node `n` when it is one of mm, addmm, bmm, baddbmm, addbmm,
// mv, addmv, dot, vdot, addr (and their in-place forms), with its operand
// dtypes in `ta`, `tb`. False for any other op (its cost is then a vector rule).
bool gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb);

// Schema positions of the two matrix operands of a matmul-family op (the ops
// of gemms_of, and convolution: input, weight). False for other ops.
bool gemm_operand_args(const Node& n, int& a, int& b);

// The implicit-GEMM products of aten::convolution and aten::convolution_backward
// (any number of spatial dims), with groups folded into K as one product:
//   forward:            M = N * prod(out spatial), K = Cin/groups * prod(kernel), N = Cout
//   transposed forward: M = N * prod(in spatial),  K = Cin/groups, N = Cout * prod(kernel)
// convolution_backward adds, per output_mask, grad_input (M = N * prod(out),
// K = Cout/groups, N = Cin * prod(kernel)) and grad_weight (M = Cout,
// K = N * prod(out), N = Cin/groups * prod(kernel)), with in/out swapped for a
// transposed convolution; each has the MACs of the direct convolution. Sets
// `ta`, `tb` to the input and weight dtypes. `bias_elems` gets the elements a
// grad_bias reduction reads (0 when not asked for). False for other ops or
// operand ranks below 3.
bool conv_gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb, double& bias_elems);

// Vector-unit work of a non-matmul op: `flops` useful operations (one per
// element) and `padded_elems` elements as the target lays them out (`padded`
// gives a value's element count in the target's layout). A reduction reads
// its largest input once; other ops write each fresh output (or, in place,
// each written argument) once.
struct VectorWork {
  double flops = 0;
  double padded_elems = 0;
};
template <typename Padded>
VectorWork vector_work(const Node& n, Padded padded) {
  VectorWork w;
  if (static_cast<PrimKind>(n.kind) == PrimKind::kReduction) {
    for (const auto& in : n.inputs) {
      w.flops = std::max(w.flops, static_cast<double>(in.ref.numel()));
      w.padded_elems = std::max(w.padded_elems, static_cast<double>(padded(in.ref)));
    }
    return w;
  }
  for (const auto& o : n.outputs) {
    w.flops += static_cast<double>(o.numel());
    w.padded_elems += static_cast<double>(padded(o));
  }
  if (n.outputs.empty())
    for (const auto& in : n.inputs)
      if (in.written) {
        w.flops += static_cast<double>(in.ref.numel());
        w.padded_elems += static_cast<double>(padded(in.ref));
      }
  return w;
}

}  // namespace tpu_eager
