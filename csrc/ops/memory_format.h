// Output memory formats of CPU's kernels where the meta kernels do not know them.
#pragma once

#include <cstdint>

#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

#include "ops/meta_outcome.h"

namespace tpu_eager {

// True while the record kernel runs an op's meta kernel (this thread). The
// Python meta kernels ask torch._meta_registrations.device_hint which device
// they stand in for and, for a bare meta tensor, assume CUDA; our results come
// from CPU's kernels, so torch_tpu_eager/meta_hints.py answers "cpu" meanwhile
// (reflection/replication pads and pixel_shuffle keep channels_last on CPU only).
bool in_device_meta_inference();

// Sets in_device_meta_inference() for its lifetime.
class DeviceMetaInference {
 public:
  DeviceMetaInference();
  ~DeviceMetaInference();
  DeviceMetaInference(const DeviceMetaInference&) = delete;
  DeviceMetaInference& operator=(const DeviceMetaInference&) = delete;

 private:
  bool prev_;
};

// Restrides the fresh results of ops whose CPU kernels pick the output memory
// format from their inputs while their meta kernels say contiguous:
// convolution and its backward (ATen's own backend choice decides, as in
// CPU's _convolution), and ops whose CPU kernel allocates in
// input.suggest_memory_format() (channel_shuffle, max_unpool2d, 3-d reflection/replication pads).
// `traits` are the op's OpTrait bits (op_table.h), which say which of these
// applies; `stack[first...]` holds the op's (device) arguments.
void apply_cpu_memory_format(uint64_t traits, const torch::jit::Stack& stack, size_t first, MetaOutcome& outcome);

// Result strides of CPU kernels that are not structured, where the Python
// reference meta kernels choose others for mixed layouts, expanded operands or
// size-1 dims. `traits` (op_table.h) say which rule CPU's kernel follows:
//  - kIteratorLayout: the kernel builds a TensorIterator whose inputs are the
//    op's tensor arguments in schema order (floor_divide, logical_and, complex,
//    hardtanh_backward, ...). The strides are those of a TensorIterator built
//    over meta tensors of the same geometry: the same code on the same
//    metadata (permutation from the first input whose strides decide, broadcast
//    and size-1 dims included).
//  - kEmptyLikeSelf: the kernel allocates empty_like(self) (MemoryFormat::
//    Preserve) and iterates into it (huber_loss, binary_cross_entropy and its
//    backward): a dense self's strides, else its inferred dense permutation.
// Applies to the fresh results (`outcome.returns`) and to out= tensors the
// kernel resizes (shape changed: CPU restrides them the same way); in-place
// self and out= tensors that keep their shape keep their strides.
void apply_cpu_result_layout(const c10::FunctionSchema& schema, uint64_t traits, const torch::jit::Stack& stack,
                             size_t first, MetaOutcome& outcome);

}  // namespace tpu_eager
