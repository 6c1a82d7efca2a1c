// Twin-free shape inference rules (shape_rules.h).
#include "ops/shape_rules.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ops/cpu_meta.h"
#include "ops/foreach_rules.h"

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

// CPU's kernels index every per-channel tensor by channel without checking its size: one of
// fewer elements than input's channels is read (and a running statistic written) past its
// end, which can crash the process. Raise at::batch_norm's error for a 1-D one instead; a longer
// one keeps CPU's behaviour (its first C elements are used).
void check_channel_sizes(const c10::IValue& input,
                         std::initializer_list<std::pair<const c10::IValue*, const char*>> params) {
  if (!input.isTensor() || input.toTensor().dim() < 2) return;
  const int64_t channels = input.toTensor().size(1);
  for (const auto& [v, name] : params) {
    // Other ranks: CPU's accessors raise their own error ("TensorAccessor expected 1 dims").
    if (!v->isTensor() || !v->toTensor().defined() || v->toTensor().dim() != 1) continue;
    const int64_t n = v->toTensor().numel();
    TORCH_CHECK(n >= channels, name, " should contain ", channels, " elements not ", n);
  }
}

// CPU's native_batch_norm_backward reads grad_out as if it had input's elements, and
// divides by the elements per channel (torch 2.13 on CPU: SIGFPE for an empty input,
// measured): raise for both instead (at::batch_norm never calls it on an empty input).
void check_backward_elements(const c10::IValue& grad_out, const c10::IValue& input) {
  if (!input.isTensor() || !grad_out.isTensor()) return;
  const int64_t n = input.toTensor().numel();
  TORCH_CHECK(n > 0, "native_batch_norm_backward: input has no elements");
  const int64_t g = grad_out.toTensor().numel();
  TORCH_CHECK(g >= n, "native_batch_norm_backward: grad_out has ", g, " elements, fewer than input's ", n);
}

// What infer_foreach needs of a foreach rule's per-tensor op.
struct PerTensorMeta {
  c10::OperatorHandle op;
  c10::KernelFunction meta;           // its C++ meta kernel (shadowed by a Python one)
  std::vector<char> tensor_arg;       // per argument: a Tensor
  std::vector<c10::IValue> defaults;  // per argument: its default value (None without one)
};

// The per-tensor op of `rule`, looked up once; null when it has no C++ meta kernel that a
// Python one shadows (torch._meta_registrations shadows every op of the rules in torch 2.13).
const PerTensorMeta* per_tensor_meta(const ForeachRule& rule) {
  static std::mutex mu;
  static std::unordered_map<const ForeachRule*, std::optional<PerTensorMeta>> table;
  std::lock_guard<std::mutex> lock(mu);
  auto it = table.find(&rule);
  if (it == table.end()) {
    std::optional<PerTensorMeta> p;
    const std::string name = "aten::" + std::string(rule.name);
    const std::string overload(rule.overload);
    const auto handle = c10::Dispatcher::singleton().findSchema({name.c_str(), overload.c_str()});
    const auto meta = handle ? shadowed_cpp_meta_kernel(*handle) : std::nullopt;
    if (meta && handle->schema().arguments().size() == static_cast<size_t>(rule.nargs)) {
      p = PerTensorMeta{*handle, *meta, {}, {}};
      for (const auto& a : handle->schema().arguments()) {
        p->tensor_arg.push_back(a.type()->kind() == c10::TypeKind::TensorType);
        p->defaults.push_back(a.default_value().has_value() ? *a.default_value() : c10::IValue());
      }
    }
    it = table.emplace(&rule, std::move(p)).first;
  }
  return it->second ? &*it->second : nullptr;
}

// A tensor of the foreach rule's domain: a float32 / float64 meta tensor.
bool foreach_tensor(const c10::IValue& v) {
  if (!v.isTensor() || !is_meta(v.toTensor())) return false;
  const auto dtype = v.toTensor().scalar_type();
  return dtype == at::kFloat || dtype == at::kDouble;
}

// The number of tensors of a foreach call, its lists' common length; 0 when a list is
// empty or of another length, or a tensor is outside the domain (foreach_tensor, and a
// lone Tensor argument 0-dim, as CPU's `_foreach_mul_.Tensor` requires).
size_t foreach_count(const torch::jit::Stack& args) {
  size_t n = 0;
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      if (!foreach_tensor(v) || v.toTensor().dim() != 0) return 0;
      continue;
    }
    if (!v.isList()) continue;
    const auto list = v.toListRef();
    if (list.empty() || (n != 0 && list.size() != n)) return 0;
    n = list.size();
    if (v.isTensorList())
      for (const c10::IValue& t : list)
        if (!foreach_tensor(t)) return 0;
  }
  return n;
}

// Argument `a` of tensor i's per-tensor call: element i of a list, else the argument; a
// Scalar where the op takes a Tensor is a wrapped number, as CPU's `t.add_(scalar)` makes it.
c10::IValue per_tensor_arg(const PerTensorMeta& p, const ForeachRule& rule, const torch::jit::Stack& args, size_t a,
                           size_t i) {
  const int f = rule.args[a];
  if (f < 0) return p.defaults[a];
  const c10::IValue& v = args[static_cast<size_t>(f)];
  const c10::IValue& e = v.isList() ? v.toListRef()[i] : v;
  if (!p.tensor_arg[a] || !e.isScalar()) return e;
  const c10::Scalar s = e.toScalar();
  at::Tensor t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()).device(c10::DeviceType::CPU));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

}  // namespace

std::optional<torch::jit::Stack> infer_foreach(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  const ForeachRule* rule = foreach_rule(op.schema());
  const PerTensorMeta* p = rule ? per_tensor_meta(*rule) : nullptr;
  const size_t n = p ? foreach_count(args) : 0;
  if (n == 0) return std::nullopt;
  // A warning (CPU's kernel would give it) declines the call: the twins' run warns as CPU.
  struct AnyWarning : c10::WarningHandler {
    bool warned = false;
    void process(const c10::Warning&) override { warned = true; }
  } warnings;
  const bool returns_list = !op.schema().returns().empty();
  c10::List<at::Tensor> results;
  try {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    torch::jit::Stack stack;
    for (size_t i = 0; i < n; ++i) {
      stack.clear();
      for (size_t a = 0; a < p->tensor_arg.size(); ++a) stack.push_back(per_tensor_arg(*p, *rule, args, a, i));
      p->meta.callBoxed(p->op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
      if (returns_list) results.push_back(stack.at(0).toTensor());
    }
  } catch (const std::exception&) {
    return std::nullopt;  // CPU's kernel on twins raises its own error
  }
  if (warnings.warned) return std::nullopt;
  torch::jit::Stack out;
  if (returns_list) out.emplace_back(std::move(results));
  return out;
}

void check_batch_norm_args(c10::ArrayRef<c10::IValue> args) {
  // _native_batch_norm_legit.no_stats(_out): (input, weight?, bias?, training, ...), no
  // running statistics, so CPU's kernel has none to read in evaluation mode.
  if (args.size() >= 6 && args[3].isBool()) {
    if (!args[3].toBool()) check_statistic(c10::IValue(), "running_mean", false);
    check_channel_sizes(args[0], {{&args[1], "weight"}, {&args[2], "bias"}});
    return;
  }
  if (args.size() < 7) return;
  check_channel_sizes(
      args[0], {{&args[1], "weight"}, {&args[2], "bias"}, {&args[3], "running_mean"}, {&args[4], "running_var"}});
  // _batch_norm_with_update(.out): always training, its statistics are not optional.
  if (args[5].isBool() && !args[5].toBool()) {
    check_statistic(args[3], "running_mean", false);
    check_statistic(args[4], "running_var", false);
  }
}

std::optional<torch::jit::Stack> infer_batch_norm(const torch::jit::Stack& args) {
  // The out= overloads (their results are the out tensors) and _batch_norm_with_update decline.
  if (args.size() != 8 || !args[5].isBool()) return std::nullopt;
  const bool training = args[5].toBool();
  if (!batch_norm_input(args[0])) return std::nullopt;
  const at::Tensor& input = args[0].toTensor();
  const auto dtype = parameter_dtype(input, {&args[1], &args[2], &args[3], &args[4]});
  if (!dtype) return std::nullopt;
  const int64_t stats = training ? input.size(1) : 0;
  return torch::jit::Stack{like_input(input), channel_vector(stats, *dtype), channel_vector(stats, *dtype)};
}

void check_batch_norm_backward_args(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 10 || !args[7].isBool()) return;
  const bool train = args[7].toBool();
  check_statistic(args[train ? 5 : 3], train ? "save_mean" : "running_mean", train);
  check_statistic(args[train ? 6 : 4], train ? "save_invstd" : "running_var", train);
  // The statistics the mode reads (the others are empty in eval, unused in training).
  if (train)
    check_channel_sizes(args[1], {{&args[2], "weight"}, {&args[5], "save_mean"}, {&args[6], "save_invstd"}});
  else
    check_channel_sizes(args[1], {{&args[2], "weight"}, {&args[3], "running_mean"}, {&args[4], "running_var"}});
  check_backward_elements(args[0], args[1]);
}

std::optional<torch::jit::Stack> infer_batch_norm_backward(const torch::jit::Stack& args) {
  // The out= overload declines: its results are the out tensors.
  if (args.size() != 10 || !args[7].isBool() || !batch_norm_input(args[1]) || !args[0].isTensor() ||
      !args[9].isBoolList())
    return std::nullopt;
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
