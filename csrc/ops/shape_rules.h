// Twin-free shape inference: small rules giving the results of CPU's kernel for
// ops that have no C++ meta function and whose Python meta kernel is a
// decomposition (OpTrait kShapeRule*). Each rule covers the calls it was checked
// on against CPU (tests/record/test_shape_rules.py) and declines the others,
// which the record kernel then infers with CPU's kernel on zero-filled twins
// (kInferOnCpu), so CPU's own errors are raised at the call.
#pragma once

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

}  // namespace tpu_eager
