// Twin-free shape inference: small rules giving the results of CPU's kernel for
// ops that have no C++ meta function and whose Python meta kernel is a
// decomposition (OpTrait kShapeRule*). Each rule covers the calls it was checked
// on against CPU (tests/record/test_shape_rules.py) and declines the others,
// which the record kernel then infers with CPU's kernel on zero-filled twins
// (kInferOnCpu), so CPU's own errors are raised at the call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>

namespace tpu_eager {

// native_batch_norm / _native_batch_norm_legit, `args` the call's arguments with
// meta twins of its tensors (input [N, C, ...], weight?, bias?, running_mean?,
// running_var?, training, momentum, eps). Returns (output, save_mean, save_invstd)
// as CPU's batch_norm_cpu gives them: output empty_like(input,
// input.suggest_memory_format()), in input's dtype; the statistics [C] in training,
// [0] in eval, in the parameters' dtype (float32 for a 16-bit input with float32
// parameters), else input's. Nothing (a call for CPU's kernel) unless the input is
// float32 / float64 / bfloat16 / float16 with at least 2 dims and one element,
// every defined parameter is a contiguous 1-D meta tensor of C elements of one
// dtype (input's, or float32 for a 16-bit input). Raises RuntimeError
// ("running_mean must be defined in evaluation mode", at::batch_norm's message)
// when eval mode lacks a running statistic, whatever the input: CPU's kernel
// would crash the process there.
std::optional<torch::jit::Stack> infer_batch_norm(const torch::jit::Stack& args);

// native_batch_norm_backward, `args` as above (grad_out, input, weight?,
// running_mean?, running_var?, save_mean?, save_invstd?, train, eps,
// output_mask[3]). Returns (grad_input?, grad_weight?, grad_bias?) as CPU's
// kernel gives them: grad_input empty_like(input, input.suggest_memory_format())
// whatever grad_out's layout; grad_weight and grad_bias [C] contiguous in the
// parameters' dtype; None where output_mask is false. Nothing unless the domain
// of infer_batch_norm holds and grad_out has input's sizes and dtype. Raises
// RuntimeError, as infer_batch_norm, when a statistic the mode reads (save_mean /
// save_invstd in training, running_* in eval) is None.
std::optional<torch::jit::Stack> infer_batch_norm_backward(const torch::jit::Stack& args);

// A foreach op recorded whole (ops/foreach_rules.h: `_foreach_add_.Scalar`, Adam's
// `_foreach_addcdiv_.ScalarList`, `_foreach_sqrt`, ...), `args` the call's arguments with
// meta twins: CPU's foreach kernel checks its lists' lengths, then calls the per-tensor op
// for each tensor i; this runs that op's C++ meta function (the structured code CPU's
// per-tensor call runs first: broadcast, in-place cast and overlap checks, result
// geometry) on element i of each list. Returns nothing for an in-place op, else the list
// of the per-tensor results (CPU's geometry and dtype). Nothing (a call for CPU's kernel
// on twins, which raises CPU's own error) unless every list has the same nonzero length,
// every tensor is a float32 / float64 meta tensor (dtypes every per-tensor op has CPU
// loops for; a 0-dim scalar tensor argument included) and each per-tensor meta function
// succeeds without a warning. Raises nothing.
std::optional<torch::jit::Stack> infer_foreach(const c10::OperatorHandle& op, const torch::jit::Stack& args);

}  // namespace tpu_eager
