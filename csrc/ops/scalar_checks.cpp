// Scalars that CPU's kernels convert, with an overflow check, into an integer result dtype.
#include "ops/scalar_checks.h"

#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>

namespace tpu_eager {
namespace {

// Per op (name without "aten::" and without a trailing "_"), the arguments
// CPU's kernel converts with Scalar::to<result dtype>(). Found by sweeping
// CPU with int8 results and a Scalar of 300 (tests/test_scalar_overflow.py
// keeps every row honest): an operand Scalar that TensorIterator wraps into a
// 0-dim tensor (add's `other`, mul, eq, rsub's `other`, ...) wraps without a
// check and is not listed.
const std::unordered_map<std::string, std::vector<std::string>>& converted_args() {
  static const auto* m = new std::unordered_map<std::string, std::vector<std::string>>{
      {"fill", {"value"}},
      {"masked_fill", {"value"}},
      {"index_fill", {"value"}},
      {"scatter", {"value"}},
      {"constant_pad_nd", {"value"}},
      {"add", {"alpha"}},
      {"sub", {"alpha"}},
      {"rsub", {"alpha"}},
      {"_add_relu", {"alpha"}},
      {"addcmul", {"value"}},
      {"addcdiv", {"value"}},
      {"addmm", {"beta", "alpha"}},
      {"addmv", {"beta", "alpha"}},
      {"addr", {"beta", "alpha"}},
      {"baddbmm", {"beta", "alpha"}},
      {"addbmm", {"beta", "alpha"}},
      {"clamp", {"min", "max"}},
      {"clamp_min", {"min"}},
      {"clamp_max", {"max"}},
      {"threshold", {"threshold", "value"}},
      {"hardtanh", {"min_val", "max_val"}},
      {"linspace", {"start", "end"}},
      {"logspace", {"start", "end"}},
      {"pow", {"exponent"}},
  };
  return *m;
}

// The Scalar an argument holds: a Python number, or a 0-dim CPU tensor passed
// as a value (masked_fill.Tensor, index_fill.int_Tensor read it with item()).
// A device tensor's value is not known before the flush: no check.
bool scalar_of(const c10::IValue& v, bool tensor_value, at::Scalar* out) {
  if (v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) {
    *out = v.toScalar();
    return true;
  }
  if (tensor_value && v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.device().is_cpu() && t.dim() == 0) {
      *out = t.item();
      return true;
    }
  }
  return false;
}

}  // namespace

void check_scalar_args_fit(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                           c10::ScalarType result) {
  if (!c10::isIntegralType(result, /*includeBool=*/false)) return;
  // Which arguments to check, once per op (this runs on every recorded call).
  struct Plan {
    std::vector<size_t> args;
    bool tensor_value = false;
  };
  thread_local std::unordered_map<const c10::FunctionSchema*, Plan> plans;
  auto found = plans.find(&schema);
  if (found == plans.end()) {
    Plan plan;
    std::string name = schema.name().substr(schema.name().find("::") + 2);
    if (name.size() > 1 && name.back() == '_') name.pop_back();
    auto it = converted_args().find(name);
    if (it != converted_args().end()) {
      const auto& args = schema.arguments();
      for (size_t i = 0; i < args.size(); ++i)
        for (const auto& a : it->second)
          if (a == args[i].name()) plan.args.push_back(i);
      plan.tensor_value = name == "masked_fill" || name == "index_fill";
    }
    found = plans.emplace(&schema, std::move(plan)).first;
  }
  for (size_t i : found->second.args) {
    at::Scalar s;
    if (first + i >= stack.size() || !scalar_of(stack[first + i], found->second.tensor_value, &s)) continue;
    // The conversion CPU's kernels make; it throws CPU's own exception and message.
    AT_DISPATCH_INTEGRAL_TYPES(result, "check_scalar_args_fit", [&] { (void)s.to<scalar_t>(); });
  }
}

}  // namespace tpu_eager
