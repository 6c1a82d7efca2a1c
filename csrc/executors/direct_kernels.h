// CPU kernels called with given outputs, for ops whose out= overload is only
// the functional op plus a copy (PyTorch generates those out= overloads): here
// the kernel writes the device buffers itself; and out= kernels called
// unboxed where the boxed call's own cost counts (mm, addmm).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include "lazy/queue.h"

namespace tpu_eager {
namespace host {

// Runs `n` (its CPU argument stack `args`) writing its results into `outs`
// (contiguous, one per result, with the recorded geometry). Covers
// native_layer_norm and native_layer_norm_backward (all three grads) on
// float32, with the kernels CPU's layer_norm_cpu / layer_norm_backward_cpu
// call (the LayerNormKernel / LayerNormBackwardKernel dispatch stubs), clone
// (a copy into the output) and masked_fill.Scalar / .Tensor (a copy of self,
// then masked_fill_, as CPU's kernel), max_pool2d_with_indices on dense
// float32 with square windows and no padding or dilation (its own loop, the
// same comparisons as CPU's kernel: equal values and indices) and
// native_batch_norm in training mode on contiguous float32 with affine
// parameters and running statistics (CPU's statistics recomputed with the same
// double sums, channels interleaved; CPU's normalization stub) and
// sum.dim_IntList of contiguous float32 over leading dims (a bias gradient's
// column sum: CPU's cascade_sum order per column for the vector width of CPU's
// sum kernel, AVX2 or AVX512, and CPU's split of the columns between threads;
// DEFAULT capability declines), linalg_vector_norm's 2-norm of a whole
// contiguous float32 tensor (CPU's AVX2 norm kernel's order: clip_grad_norm_'s
// norms; _foreach_norm.Scalar of clip_grad_norm_'s foreach path runs it per tensor,
// CPU's linalg_vector_norm.out for the others), and mm / addmm through CPU's structured out= kernel called unboxed (the
// boxed out= call without its stack). Returns false, having written nothing, for any other op or case; a CPU error it
// raises leaves its outputs, which nothing else reads, partly written.
bool run_direct_kernel(const Node& n, const torch::jit::Stack& args, const std::vector<at::Tensor>& outs);

// Whether run_direct_kernel handles op `n` (for some dtypes and layouts).
bool has_direct_kernel(const Node& n);

// Whether run_direct_kernel runs op `n`, whose results are lists, for every
// call: it writes each list element's output (`outs` in return order), and
// raises CPU's error where CPU's kernel raises. _foreach_norm.Scalar.
bool writes_list_outputs(const Node& n);

// Whether `n` may write its outputs directly when its operands are strided
// (transposed, sliced): its out= overload is the same structured kernel as
// its functional op (mm, addmm, bmm, baddbmm, cat), or run_direct_kernel
// runs it (clone). Other out= kernels take dense operands only.
bool takes_strided_inputs(const Node& n);

// The float vector width of CPU's sum kernel on this machine as its dispatch
// stub chooses: 16 (AVX512), 8 (AVX2), or 0 (DEFAULT: its order is not
// reproduced here).
int64_t cpu_sum_kernel_width();

// out[c] = CPU's float32 at::sum(x, 0)[c] of the contiguous [rows, cols] x,
// bit for bit (cascade_sum's per-column order for the vector width above, and
// CPU's split of the columns between threads at the current thread count).
// Returns false, having written nothing, when cpu_sum_kernel_width() is 0 or
// rows < 2 or cols < 2 (CPU takes other paths there).
bool cpu_column_sums(const float* x, int64_t rows, int64_t cols, float* out);

// The capability ("AVX512", "AVX2" or "DEFAULT") of the LayerNormKernel that
// CPU's layer_norm calls on this machine, as its dispatch stub chooses (torch
// 2.13's x86 build has no AVX512 one, so AVX512 CPUs run the AVX2 kernel).
const char* layer_norm_kernel_capability();

}  // namespace host
}  // namespace tpu_eager
