// Twin-free shape inference rules (shape_rules.h).
#include "ops/shape_rules.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <initializer_list>

namespace tpu_eager {
namespace {

bool is_meta(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::Meta; }

// The input of a batch norm call the rules cover: a meta tensor of a floating dtype
// CPU's kernels have loops for, with a channel dim and at least one element.
bool batch_norm_input(const c10::IValue& v) {
  if (!v.isTensor() || !is_meta(v.toTensor())) return false;
  const at::Tensor& t = v.toTensor();
  const auto dtype = t.scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf;
  return floating && t.dim() >= 2 && t.numel() > 0;
}

// The dtype of the statistics and parameter gradients: the defined parameters' one
// dtype (each a contiguous 1-D meta tensor of `channels` elements), else input's.
// Nothing for another parameter (wrong size, layout, device) or a dtype mix CPU
// refuses ("mixed dtype (CPU)"): only input's dtype, or float32 for a 16-bit input.
std::optional<at::ScalarType> parameter_dtype(const at::Tensor& input,
                                              std::initializer_list<const c10::IValue*> params) {
  const int64_t channels = input.size(1);
  std::optional<at::ScalarType> dtype;
  for (const c10::IValue* p : params) {
    if (p->isNone()) continue;
    if (!p->isTensor()) return std::nullopt;
    const at::Tensor& t = p->toTensor();
    if (!is_meta(t) || t.dim() != 1 || t.size(0) != channels || !t.is_contiguous()) return std::nullopt;
    if (dtype && *dtype != t.scalar_type()) return std::nullopt;
    dtype = t.scalar_type();
  }
  if (!dtype) return input.scalar_type();
  const bool reduced = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  if (*dtype == input.scalar_type() || (reduced && *dtype == at::kFloat)) return dtype;
  return std::nullopt;
}

// A meta tensor of input's sizes and dtype in the layout CPU's batch norm kernels
// allocate (empty_like with input's suggested memory format).
at::Tensor like_input(const at::Tensor& input) { return at::empty_like(input, input.suggest_memory_format()); }

at::Tensor channel_vector(int64_t n, at::ScalarType dtype) {
  return at::empty({n}, at::TensorOptions().dtype(dtype).device(c10::DeviceType::Meta));
}

// CPU's batch norm kernels read the statistics a mode uses without checking that they
// are defined (torch 2.13's native_batch_norm and native_batch_norm_backward crash the
// process on CPU when one is None): raise at::batch_norm's error for them instead.
void check_statistic(const c10::IValue& v, const char* name, bool training) {
  TORCH_CHECK(!v.isNone(), name, " must be defined in ", training ? "training" : "evaluation", " mode");
}

}  // namespace

std::optional<torch::jit::Stack> infer_batch_norm(const torch::jit::Stack& args) {
  if (args.size() < 8 || !args[5].isBool()) return std::nullopt;
  const bool training = args[5].toBool();
  if (!training) {
    check_statistic(args[3], "running_mean", training);
    check_statistic(args[4], "running_var", training);
  }
  if (!batch_norm_input(args[0])) return std::nullopt;
  const at::Tensor& input = args[0].toTensor();
  const auto dtype = parameter_dtype(input, {&args[1], &args[2], &args[3], &args[4]});
  if (!dtype) return std::nullopt;
  const int64_t stats = training ? input.size(1) : 0;
  return torch::jit::Stack{like_input(input), channel_vector(stats, *dtype), channel_vector(stats, *dtype)};
}

std::optional<torch::jit::Stack> infer_batch_norm_backward(const torch::jit::Stack& args) {
  if (args.size() < 10 || !args[7].isBool()) return std::nullopt;
  const bool train = args[7].toBool();
  check_statistic(args[train ? 5 : 3], train ? "save_mean" : "running_mean", train);
  check_statistic(args[train ? 6 : 4], train ? "save_invstd" : "running_var", train);
  if (!batch_norm_input(args[1]) || !args[0].isTensor() || !args[9].isBoolList()) return std::nullopt;
  const at::Tensor& grad_out = args[0].toTensor();
  const at::Tensor& input = args[1].toTensor();
  if (!is_meta(grad_out) || !grad_out.sizes().equals(input.sizes()) || grad_out.scalar_type() != input.scalar_type())
    return std::nullopt;
  const auto dtype = parameter_dtype(input, {&args[2], &args[3], &args[4], &args[5], &args[6]});
  const c10::List<bool> mask = args[9].toBoolList();
  if (!dtype || mask.size() != 3) return std::nullopt;
  const int64_t channels = input.size(1);
  torch::jit::Stack out;
  out.emplace_back(mask[0] ? c10::IValue(like_input(input)) : c10::IValue());
  out.emplace_back(mask[1] ? c10::IValue(channel_vector(channels, *dtype)) : c10::IValue());
  out.emplace_back(mask[2] ? c10::IValue(channel_vector(channels, *dtype)) : c10::IValue());
  return out;
}

}  // namespace tpu_eager
