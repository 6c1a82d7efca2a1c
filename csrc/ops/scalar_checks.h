// Call-time check that the Scalar arguments CPU's kernel converts with an overflow check fit their target type.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

namespace tpu_eager {

// What CPU's kernel converts one Scalar argument to for a floating or complex
// result dtype. float64 and complex128 hold every real Scalar; a complex Scalar
// into a real type raises.
enum class FloatTarget : uint8_t {
  kNone,           // wrapped into a 0-dim tensor, or converted to double: never overflows
  kResult,         // Scalar::to<result dtype>()
  kOpmath,         // Scalar::to<float>() for float16/bfloat16, else Scalar::to<result dtype>()
  kReducedResult,  // Scalar::to<result dtype>() for float16/bfloat16/complex32 only (others: double)
  kInt,            // Scalar::to<int>() for every floating result dtype
  kFloat32Result,  // Scalar::to<result dtype>() except for float16/bfloat16 (stored without a check)
};

struct ScalarConversion {
  int arg = -1;                               // position in the schema's arguments
  bool integral = false;                      // Scalar::to<result dtype>() for an integer result
  FloatTarget floating = FloatTarget::kNone;  // for a floating result
};

// The Scalar arguments of one op that CPU's kernel converts with an overflow
// check (OpPlan::scalar_conversions, built once per op). Empty for most ops:
// the check then costs one branch per call.
struct ScalarConversions {
  std::vector<ScalarConversion> args;
  bool tensor_value = false;      // a 0-dim CPU tensor `value` is read with item() (masked_fill, index_fill)
  bool complex_into_bool = true;  // a complex Scalar into a bool result is accepted (index_fill rejects it)
};

// The conversions of `schema`'s op, from the table found by sweeping CPU
// (tools/sweep_scalar_conversions.py; tests/record/test_scalar_overflow*.py keep
// every row honest against CPU).
ScalarConversions scalar_conversions_of(const c10::FunctionSchema& schema);

// False when some Scalar in stack[first + arg] does not survive the conversion
// CPU's kernel makes for a `result` dtype (Scalar::to<T>() would raise
// "value cannot be converted to type T without overflow"). The caller then
// runs CPU's own kernel at the call: it raises CPU's exception, or computes
// the result where CPU skips the conversion (an empty addmm, a pad that only
// narrows, linspace with one step). Reads the call's own values, never a
// cached meta outcome (which keys Scalars by type). inf and NaN fit every
// floating type (CPU accepts them). A complex value with a real input or
// result does not fit (CPU's kernels reject it, each in its own way). A value
// held by a device tensor is not known before the flush: not checked.
bool scalar_args_fit(const ScalarConversions& conv, const torch::jit::Stack& stack, size_t first,
                     c10::ScalarType result);

// Whether every Scalar of `conv` in stack[first + arg] is an int, a bool or
// None: values the meta key holds exactly (record.cpp key_ivalue), so
// scalar_args_fit's verdict is the same for every call under that key
// (MetaOutcome::scalars_fit). A float is keyed by its class only; a 0-dim
// tensor value not at all.
bool scalars_keyed_by_value(const ScalarConversions& conv, const torch::jit::Stack& stack, size_t first);

}  // namespace tpu_eager
