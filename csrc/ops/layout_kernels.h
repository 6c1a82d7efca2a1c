// Sparse COO, quantized and nested "tpu" tensors (layout_kernels.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace tpu_eager {

// A CPU result that is not a dense strided tensor (sparse COO or quantized) as a
// "tpu" tensor of the same layout: sparse with "tpu" indices/values, quantized
// over device memory. Used where a CPU kernel run on host buffers returns one
// (e.g. embedding_bag's backward with sparse=True).
at::Tensor layout_result_to_tpu(const at::Tensor& cpu_result);

// Registers CPU's quantized kernel, run on the host, as the QuantizedPrivateUse1
// kernel of every non-view op that has a QuantizedCPU kernel and a composite
// kernel (which would otherwise shadow the quantized fallback). Called once from
// register_device_kernels(); returns the number of overloads registered.
int64_t register_quantized_host_kernels();

// Registers nested_kernel (CPU's nested kernel run on the host; views and nested
// metadata as PyTorch's generic nested kernels) as the NestedTensorPrivateUse1
// kernel of every op that has a NestedTensorCPU kernel and a composite kernel
// (which would otherwise shadow the nested fallback). Called once from
// register_device_kernels(); returns the number of overloads registered.
int64_t register_nested_host_kernels();

}  // namespace tpu_eager
