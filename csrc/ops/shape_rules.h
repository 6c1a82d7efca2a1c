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

// Raises a RuntimeError where CPU's batch norm kernels would read or write past a
// tensor or divide by zero (torch 2.13 on CPU: SIGSEGV / SIGFPE, measured) instead of
// computing, for every overload of native_batch_norm, _native_batch_norm_legit and
// _batch_norm_with_update (`args` the call's arguments, real or meta tensors): eval
// mode without a running statistic (also _native_batch_norm_legit.no_stats with
// training false), at::batch_norm's message "running_mean must be defined in
// evaluation mode"; a defined 1-D weight, bias or running statistic of fewer elements
// than input's channels (dim 1), at::batch_norm's "running_mean should contain 3
// elements not 2". A longer one is CPU's behaviour (its first C elements are read).
// Called before anything else looks at the call (an empty input runs CPU's kernel).
void check_batch_norm_args(c10::ArrayRef<c10::IValue> args);

// The same for native_batch_norm_backward(.out) (grad_out, input, weight?,
// running_mean?, running_var?, save_mean?, save_invstd?, train, eps, output_mask):
// a statistic the mode reads (save_mean / save_invstd in training, running_* in
// eval) is None or a 1-D one shorter than the channels, so is weight; an input
// without elements ("native_batch_norm_backward: input has no elements": CPU's
// kernel divides by the count, SIGFPE) or a grad_out of fewer elements than input.
void check_batch_norm_backward_args(c10::ArrayRef<c10::IValue> args);

// native_batch_norm / _native_batch_norm_legit, `args` the call's arguments with
// meta twins of its tensors (input [N, C, ...], weight?, bias?, running_mean?,
// running_var?, training, momentum, eps). Returns (output, save_mean, save_invstd)
// as CPU's batch_norm_cpu gives them: output empty_like(input,
// input.suggest_memory_format()), in input's dtype; the statistics [C] in training,
// [0] in eval, in the parameters' dtype (float32 for a 16-bit input with float32
// parameters), else input's. Nothing (a call for CPU's kernel) unless the input is
// float32 / float64 / bfloat16 / float16 with at least 2 dims and one element,
// every defined parameter is a contiguous 1-D meta tensor of C elements of one
// dtype (input's, or float32 for a 16-bit input), and only for these two
// functional overloads (out= ones decline). The call passed check_batch_norm_args.
std::optional<torch::jit::Stack> infer_batch_norm(const torch::jit::Stack& args);

// native_batch_norm_backward, `args` as above (grad_out, input, weight?,
// running_mean?, running_var?, save_mean?, save_invstd?, train, eps,
// output_mask[3]). Returns (grad_input?, grad_weight?, grad_bias?) as CPU's
// kernel gives them: grad_input empty_like(input, input.suggest_memory_format())
// whatever grad_out's layout; grad_weight and grad_bias [C] contiguous in the
// parameters' dtype; None where output_mask is false. Nothing unless the domain
// of infer_batch_norm holds and grad_out has input's sizes and dtype (the out=
// overload declines). The call passed check_batch_norm_backward_args.
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
