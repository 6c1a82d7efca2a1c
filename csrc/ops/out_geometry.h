// Geometry CPU gives an out= argument that its kernel resizes.
#pragma once

#include <cstddef>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/meta_outcome.h"

namespace tpu_eager {

// The functional overload of out= op `op` (same name, same arguments without
// the trailing out= tensors, which become its returns), or nullptr.
const c10::OperatorHandle* functional_variant(const c10::OperatorHandle& op);

// CPU's structured out= kernels restride an out tensor they resize to the
// strides their meta function computes for the functional result (TensorIterator
// ops: the inputs' memory layout, e.g. channels_last or transposed); a tensor
// that keeps its shape keeps its strides. PyTorch's Python reference meta
// kernels (which the Meta key runs for most elementwise ops) resize it
// contiguous instead. For every out= argument of `op` whose shape the meta
// kernel changed, take the strides of the functional op's meta result.
// `stack[first...]` holds the call's (device) arguments before the call,
// `meta_args` their meta twins (inputs unchanged by the call). The record kernel
// skips ops with the kOutResizedContiguous trait (op_table.h): their out= kernel
// copies into a resized out, which comes back contiguous.
void restride_resized_outs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                           const std::vector<c10::IValue>& meta_args, MetaOutcome& outcome);

}  // namespace tpu_eager
