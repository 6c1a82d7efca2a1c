// Sums of float16 / bfloat16 rows and columns read in place (no f32 copy of
// the input), with the values of ATen's float32 sum kernel (SumKernel.cpp's
// cascade, 8-float vectors) on the inputs' exact f32 widening: the Spyre
// interpreter's sum(x, -1) of 16-bit rows and its ring partials of sum(x, 0)
// (float32 ring partials too, by the host's CPU-order column sums); and
// float32 rows in CPU's order (row_sums_f32).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tpu_eager {
namespace spyre {

// out[r] = the sum of the n values of row r (x + r * row_stride, unit stride),
// in the order of ATen's sum over an inner dim (vectorized_inner_sum for n >= 8,
// scalar_inner_sum below) added to 0 as its output is: the f32 value
// at::sum(rows.float(), -1) gives for n < at::internal::GRAIN_SIZE. x holds
// bfloat16 bits when `bf16`, else float16 bits. The AVX2 and baseline builds
// (cpu::has at each call) give the same bits.
void row_sums16(const uint16_t* x, bool bf16, int64_t rows, int64_t n, int64_t row_stride, float* out);

// out[j] = the sum over the `len` rows (row stride row_stride) of column j < n,
// in the order of ATen's sum over an outer dim (vectorized_outer_sum, or
// scalar_outer_sum for n < 8) added to 0: at::sum(rows.float(), 0)'s values.
void column_sums16(const uint16_t* x, bool bf16, int64_t len, int64_t n, int64_t row_stride, float* out);

// out[r] = CPU's float32 at::sum(rows, -1)[r] of the n floats of row r
// (x + r * row_stride, unit stride, n under ATen's grain size), bit for bit:
// SumKernel.cpp's vectorized_inner_sum (n >= 8) or scalar_inner_sum (n < 8)
// with its 8-float vectors, added to 0 as its output is. Serves CPU's AVX2
// sum kernel (host::cpu_sum_kernel_width() == 8; torch 2.13 has no AVX512
// one, so AVX512 CPUs run it too); returns false, having written nothing,
// for any other. The AVX2 and baseline builds (cpu::has at each call) give
// the same bits.
bool row_sums_f32(const float* x, int64_t rows, int64_t n, int64_t row_stride, float* out);

// The width n of the rows summed in place for this call: `op` is the row sum
// of the lowering table (RowReduce::kSum, jit/lowering.h: sum.dim_IntList)
// over the last dim only of a contiguous CPU tensor, float16 / bfloat16, or
// float32 when row_sums_f32 serves it (CPU's AVX2 sum kernel) (no dtype argument, result in the
// input's dtype, last dim under ATen's grain size): the size of the input's
// last dim; 0 otherwise. `stack` is only read.
int64_t sum_rows_width(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                       const std::vector<c10::ScalarType>& result_dtypes);

// When `op` is the row sum of the lowering table (RowReduce::kSum,
// jit/lowering.h: sum.dim_IntList) over the last dim only of a
// contiguous float16 / bfloat16 CPU tensor (no dtype argument, result in the
// input's dtype, last dim under ATen's grain size): the row sums by
// row_sums16, rounded once to df16 and stored in the dtype, replace the stack;
// returns true. Otherwise returns false and leaves the stack alone.
bool sum16_call(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                const std::vector<c10::ScalarType>& result_dtypes);

// sum_rows_width for a float16 / bfloat16 input (the rows sum16_call would
// sum), 0 for any other: 0 exactly when sum16_call would return false.
int64_t sum16_rows_width(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         const std::vector<c10::ScalarType>& result_dtypes);

// The corelet partials of a ring sum over dim 1 of X [G, rows, n...] (each
// block's rows contiguous): per block the column sums of each corelet's rows
// (`shares`, in order) added in f32, corelet 0 + corelet 1 + ... Returns
// [G, 1, n...] float32: what ring_partial and ring_merge give on X (16-bit:
// on its f32 widening; float32: each share by host::cpu_column_sums, CPU's
// at::sum(share, 0) bits). Requires sum_partials_fit(X, shares).
at::Tensor sum_partials(const at::Tensor& X, const std::vector<int64_t>& shares);

// sum_partials' values for X [G, rows, n...] written to acc (G * n floats,
// block g at acc + g * n), or, when `add`, added to it (acc + partial in f32:
// ring_merge's add of a core's step partial to its earlier ones). Requires
// sum_partials_fit(X, shares); X may be a strided view (its blocks apart).
void sum_partials_into(const at::Tensor& X, const std::vector<int64_t>& shares, float* acc, bool add);

// Whether sum_partials serves X [G, rows, ...] split in `shares`: float16 or
// bfloat16, or float32 when CPU's column-sum order is reproduced here
// (host::cpu_sum_kernel_width() > 0) and every share has 2 rows or more;
// rows >= 1, at least 2 values a row, each block contiguous.
bool sum_partials_fit(const at::Tensor& X, const std::vector<int64_t>& shares);

}  // namespace spyre
}  // namespace tpu_eager
