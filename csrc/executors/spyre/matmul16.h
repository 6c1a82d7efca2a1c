// The Spyre target's 16-bit matmul (mm, bmm of float16 / bfloat16 operands)
// as a direct kernel: the MXU's f32 accumulation in a defined order, not the
// host BLAS's (docs/ktir.md, "Numerics (the interpreter)").
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tpu_eager {
namespace spyre {

// c[i, j] = the dot product of row i of a and column j of b in f32, k in
// order: acc = 0, then acc = fma(a[i, k], b[k, j], acc) for k = 0 .. K - 1
// (one rounding per step; for df16 or float16 operands each product is exact
// in f32, so each step is the f32 sum of acc and the exact product).
// a: M x K floats (row stride lda), b: K x N floats (row stride ldb), c: M x N
// floats (row stride ldc), all row-major with unit column stride. The AVX-512,
// AVX2 + FMA and baseline builds (cpu::has at each call) give the same bits.
void matmul_in_k_order(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t M,
                       int64_t N, int64_t K);

// When `op` lowers to an MXU mm or bmm (jit/lowering.h; the functional
// overload of two operands) and `stack` holds two
// float16 (or two bfloat16) CPU operands of matching sizes whose result is
// recorded in their dtype (result_dtypes[0]), runs the op: the product of the
// operands' f32 values by matmul_in_k_order, rounded once to df16 and stored
// in the dtype, replaces the stack; returns true. Otherwise leaves the stack
// alone and returns false (the caller runs ATen's kernel, which raises its
// own errors for bad sizes).
bool matmul16_call(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                   const std::vector<c10::ScalarType>& result_dtypes);

}  // namespace spyre
}  // namespace tpu_eager
