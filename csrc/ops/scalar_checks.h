// Call-time check that a Scalar argument fits the integer dtype CPU's kernel converts it to.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

namespace tpu_eager {

// CPU's kernels convert some Scalar arguments (fill values, alpha/beta, clamp
// bounds, thresholds, ...) with Scalar::to<T>() into the result dtype T and
// raise std::runtime_error ("value cannot be converted to type int8_t without
// overflow") at the call when the value does not fit. For an integer `result`
// dtype this raises that same error, from the same conversion, for the op's
// arguments of that kind (stack[first...] holds its arguments). It reads the
// values themselves, never a cached meta outcome (which keys Scalars by type).
// Float results are not checked: per kernel, CPU converts to the result dtype
// (fill_, clamp, add's alpha: 1e6 into float16 raises), to float (addmm,
// addcmul) or not at all (where, threshold's threshold) — tests/test_qa_findings.py.
void check_scalar_args_fit(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                           c10::ScalarType result);

}  // namespace tpu_eager
