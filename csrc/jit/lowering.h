// Lowering rules of the primitive IR: per recorded op, what it lowers to
// beyond its PrimKind (Node::kind, from the op table). One table keyed by op
// (lowering.cpp), looked up once per operator schema, so executors switch on
// these values instead of comparing op names.
#pragma once

#include <cstdint>

#include <ATen/core/dispatch/Dispatcher.h>

#include "jit/ir.h"

namespace tpu_eager {

// The MXU product a kMatmul op lowers to (C = A @ B with these operands).
enum class MxuOp : uint8_t {
  kNone = 0,
  kMm,       // (M,K) @ (K,N)
  kAddmm,    // beta * self + alpha * mm
  kBmm,      // (B,M,K) @ (B,K,N)
  kBaddbmm,  // beta * self + alpha * bmm
  kAddbmm,   // beta * self + alpha * sum over the batch of bmm
  kMv,       // (M,K) @ (K,)
  kAddmv,    // beta * self + alpha * mv
  kDot,      // (K,) . (K,)
  kVdot,     // conj(a) . b
  kAddr,     // beta * self + alpha * outer(a, b): K = 1
  kConvolution,
  kConvolutionBackward,
};

// The host runtime's own kernel for an op (executors/direct_kernels.cpp):
// writes a dense device output directly instead of CPU's kernel plus a copy.
enum class DirectImpl : uint8_t {
  kNone = 0,
  kMaskedFill,
  kLayerNorm,
  kLayerNormBackward,
  kClone,
  kMaxPool2dWithIndices,
  kBatchNormTrain,
  kMaxPool2dBackward,
  kColumnSum,    // sum.dim_IntList over leading dims (direct_kernels.cpp, column_sum)
  kVectorNorm,   // linalg_vector_norm's 2-norm of a whole tensor (direct_kernels.cpp, vector_norm)
  kForeachNorm,  // _foreach_norm.Scalar: vector_norm per tensor (direct_kernels.cpp, foreach_norm)
  kMm,  // mm and addmm: CPU's structured out= kernels called unboxed (direct_kernels.cpp, mm_into / addmm_into)
  kAddmm,
};

// The row-wise reduction or normalization a functional op computes over the
// last dim (kLayerNorm: the trailing normalized_shape dims flattened), which a
// fused loop can end with: _softmax, _log_softmax, logsumexp, sum.dim_IntList,
// mean.dim, native_layer_norm. Whether a given call qualifies (its dim
// arguments, dtypes, sizes) is the executor's to check.
enum class RowReduce : uint8_t { kNone = 0, kSoftmax, kLogSoftmax, kLogSumExp, kSum, kMean, kLayerNorm };

// The ops of cross-entropy a fused row loop runs with their neighbour
// (F.cross_entropy records _log_softmax + nll_loss_forward, and its backward
// nll_loss_backward + _log_softmax_backward_data): kNllLoss joins the loop of
// the _log_softmax whose result it reads; kNllLossBackward starts a loop that
// takes only the kLogSoftmaxBackward reading its gradient (partition.cpp,
// cross_entropy_pair). Whether a call qualifies is the executor's to check.
enum class LossRow : uint8_t { kNone = 0, kNllLoss, kNllLossBackward, kLogSoftmaxBackward };

// Whether an op returns a fresh result, writes its self in place, or writes out= arguments.
enum class OpForm : uint8_t { kFunctional = 0, kInPlace, kOut };

struct Lowering {
  MxuOp mxu = MxuOp::kNone;
  OpForm form = OpForm::kFunctional;
  // kMxu ops: the argument positions of the product's operands A and B
  // (after self for the add* forms); -1 when not an MXU product.
  int8_t a_arg = -1, b_arg = -1;
  DirectImpl host = DirectImpl::kNone;
  bool strided_inputs = false;   // its CPU kernel takes strided inputs as they are (no dense copy first)
  bool overwrites_self = false;  // an in-place op that replaces all of self without reading it (fill_, normal_, copy_)
  RowReduce row = RowReduce::kNone;
  LossRow loss = LossRow::kNone;
  // cat (default overload): a fused loop runs it over its inputs' shape (all
  // equal, empty 1-D inputs skipped as CPU skips them), writing each input at
  // its offset along the cat dim of the output; partition's loop shape is then
  // its first non-empty input's.
  bool concat = false;
  bool has_bias() const { return a_arg == 1; }  // beta * self + alpha * product
};

// The lowering of `op` (any operator; ops without a rule get the defaults).
// Thread-safe; one hash lookup after the first call per operator.
const Lowering& lowering_of(const c10::OperatorHandle& op);

}  // namespace tpu_eager
