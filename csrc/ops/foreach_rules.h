// The per-tensor op of each foreach overload recorded whole (OpTrait kExpandsPerTensor):
// what CPU's foreach kernel calls for each tensor. The flush expands a foreach node into
// these ops (jit/foreach_expand.h); the record kernel infers a call's shapes with their
// C++ meta functions (ops/shape_rules.h, infer_foreach).
#pragma once

#include <ATen/core/function_schema.h>

#include <cstdint>
#include <string_view>

namespace tpu_eager {

// The per-tensor op CPU's foreach kernel (ATen's ForeachOpsKernels.cpp, the slow path)
// reaches the device's record kernel with per tensor, after the composite Scalar overloads
// it calls: `t.mul_(scalar)` is `mul.out(wrapped scalar, t, out=t)` (scalar first: CPU's
// 16-bit result differs from `t * scalar`'s), `t.add_(scalar)` is `add_.Tensor(t, wrapped
// scalar)`, `t.div_(scalar)` `div_.Tensor`. `args`: per argument of the per-tensor op, the
// foreach argument it takes (its element i for a list), or -1 for its default. A Scalar
// where the per-tensor op takes a Tensor is a wrapped number, as CPU makes it.
struct ForeachRule {
  std::string_view foreach_name, foreach_overload, name, overload;
  int8_t args[4];
  int8_t nargs;
};

// The rule of foreach overload `schema` ("aten::_foreach_mul_", "Scalar"), or null for an
// overload without one.
const ForeachRule* foreach_rule(const c10::FunctionSchema& schema);

}  // namespace tpu_eager
