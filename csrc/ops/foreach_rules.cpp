// The per-tensor ops of the foreach overloads recorded whole (foreach_rules.h).
#include "ops/foreach_rules.h"

namespace tpu_eager {
namespace {

// The op table's kExpandsPerTensor rows (tools/gen_op_table.py FOREACH_EXPANDED); an
// overload without a rule here fails the flush's expansion (an internal error).
constexpr ForeachRule kForeachRules[] = {
    {"_foreach_mul_", "Scalar", "mul", "out", {1, 0, 0}, 3},
    {"_foreach_mul_", "ScalarList", "mul", "out", {1, 0, 0}, 3},
    {"_foreach_mul_", "Tensor", "mul_", "Tensor", {0, 1}, 2},
    {"_foreach_mul_", "List", "mul_", "Tensor", {0, 1}, 2},
    {"_foreach_add_", "Scalar", "add_", "Tensor", {0, 1, -1}, 3},
    {"_foreach_add_", "ScalarList", "add_", "Tensor", {0, 1, -1}, 3},
    {"_foreach_add_", "List", "add_", "Tensor", {0, 1, 2}, 3},
    {"_foreach_div_", "Scalar", "div_", "Tensor", {0, 1}, 2},
    {"_foreach_div_", "ScalarList", "div_", "Tensor", {0, 1}, 2},
    {"_foreach_div_", "List", "div_", "Tensor", {0, 1}, 2},
    {"_foreach_lerp_", "Scalar", "lerp_", "Scalar", {0, 1, 2}, 3},
    {"_foreach_addcmul_", "Scalar", "addcmul_", "", {0, 1, 2, 3}, 4},
    {"_foreach_addcmul_", "ScalarList", "addcmul_", "", {0, 1, 2, 3}, 4},
    {"_foreach_addcdiv_", "Scalar", "addcdiv_", "", {0, 1, 2, 3}, 4},
    {"_foreach_addcdiv_", "ScalarList", "addcdiv_", "", {0, 1, 2, 3}, 4},
    {"_foreach_sqrt", "", "sqrt", "", {0}, 1},
    {"_foreach_add", "List", "add", "Tensor", {0, 1, 2}, 3},
    // CPU's kernel is clamp_min's (foreach_tensor_clamp_min_list_kernel_slow_).
    {"_foreach_maximum_", "List", "clamp_min_", "Tensor", {0, 1}, 2},
    {"_foreach_neg", "", "neg", "", {0}, 1},
};

}  // namespace

const ForeachRule* foreach_rule(const c10::FunctionSchema& schema) {
  const std::string_view name(schema.name());
  const std::string_view overload(schema.overload_name());
  constexpr std::string_view kNamespace = "aten::";
  if (name.substr(0, kNamespace.size()) != kNamespace) return nullptr;
  for (const ForeachRule& rule : kForeachRules)
    if (name.substr(kNamespace.size()) == rule.foreach_name && overload == rule.foreach_overload) return &rule;
  return nullptr;
}

}  // namespace tpu_eager
