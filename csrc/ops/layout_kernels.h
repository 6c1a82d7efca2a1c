// Sparse COO and quantized "tpu" tensors (layout_kernels.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace tpu_eager {

// A CPU result that is not a dense strided tensor (sparse COO or quantized) as a
// "tpu" tensor of the same layout: sparse with "tpu" indices/values, quantized
// over device memory. Used where a CPU kernel run on host buffers returns one
// (e.g. embedding_bag's backward with sparse=True).
at::Tensor layout_result_to_tpu(const at::Tensor& cpu_result);

}  // namespace tpu_eager
