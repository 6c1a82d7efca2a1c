// Spyre's per-op numerics for 16-bit floats (the one place they are
// computed): an op whose operands or results are float16/bfloat16 is
// evaluated in float32 from its operands' exact f32 values (device values are
// df16, which f32 holds exactly), and each result is rounded once to df16,
// then stored in its tensor's dtype. Matmuls accumulate in f32, reductions
// accumulate in f32; either rounds once on store. No 16-bit CPU kernel runs,
// so no value is rounded to float16 first and to df16 after (double rounding).
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "lazy/queue.h"

namespace tpu_eager {
namespace spyre {

// True when `n` reads or produces float16/bfloat16 values and is not an RNG
// op (RNG ops keep CPU's 16-bit draws so streams match CPU; their results are
// rounded through df16 afterwards).
bool computes_in_f32(const Node& n);

// Runs `n` on its CPU argument stack (built by host::build_stack) in f32:
// 16-bit tensor arguments are widened to f32 copies, 16-bit dtype arguments
// become float32, the op's CPU kernel runs, each 16-bit result on the stack
// is df16(f32 result) in its recorded dtype, and each written 16-bit argument
// receives df16 of the value the op wrote. Throws what the kernel throws.
void call_in_f32(const Node& n, torch::jit::Stack& stack);

// The same for any op: `stack` holds its CPU arguments; 16-bit tensors (and
// tensors in lists) are widened, arguments the schema marks written receive
// df16 of what the op wrote, 16-bit dtype arguments become float32, `call`
// runs the op, and the op's fresh (non-aliasing) tensor results, in order, are
// stored as df16 in `result_dtypes` (a result past its end keeps its dtype).
void call_op_in_f32(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                    const std::vector<c10::ScalarType>& result_dtypes,
                    const std::function<void(torch::jit::Stack&)>& call);

// df16 of `x` (any floating dtype) in dtype `dtype` (one rounding to df16;
// then the exact, or storage-range, conversion to `dtype`).
at::Tensor df16_store(const at::Tensor& x, c10::ScalarType dtype);

// out.copy_(df16_store(x, out's dtype)) in one pass, without temporaries,
// when out is a contiguous bfloat16 tensor and x a contiguous float32 one of
// its size (returns true); otherwise does nothing and returns false.
bool df16_store_into(const at::Tensor& out, const at::Tensor& x);

}  // namespace spyre
}  // namespace tpu_eager
