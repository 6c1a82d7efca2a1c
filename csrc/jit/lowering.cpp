// The lowering table (see lowering.h).
#include "jit/lowering.h"

#include <mutex>
#include <string_view>
#include <unordered_map>

namespace tpu_eager {
namespace {

struct MxuRule {
  std::string_view base;  // aten name without a trailing '_'
  MxuOp op;
  int8_t a_arg, b_arg;
};

// The one place MXU ops are named. add* forms: (self, a, b, beta, alpha).
constexpr MxuRule kMxuRules[] = {
    {"mm", MxuOp::kMm, 0, 1},
    {"addmm", MxuOp::kAddmm, 1, 2},
    {"bmm", MxuOp::kBmm, 0, 1},
    {"baddbmm", MxuOp::kBaddbmm, 1, 2},
    {"addbmm", MxuOp::kAddbmm, 1, 2},
    {"mv", MxuOp::kMv, 0, 1},
    {"addmv", MxuOp::kAddmv, 1, 2},
    {"dot", MxuOp::kDot, 0, 1},
    {"vdot", MxuOp::kVdot, 0, 1},
    {"addr", MxuOp::kAddr, 1, 2},
    {"convolution", MxuOp::kConvolution, 0, 1},
    {"convolution_backward", MxuOp::kConvolutionBackward, 0, 1},
};

// Ops with a host kernel of their own, by name and overload.
struct HostRule {
  std::string_view name, overload;
  DirectImpl kernel;
};
constexpr HostRule kHostRules[] = {
    {"masked_fill", "Scalar", DirectImpl::kMaskedFill},
    {"masked_fill", "Tensor", DirectImpl::kMaskedFill},
    {"native_layer_norm", "", DirectImpl::kLayerNorm},
    {"native_layer_norm_backward", "", DirectImpl::kLayerNormBackward},
    {"clone", "", DirectImpl::kClone},
    {"max_pool2d_with_indices", "", DirectImpl::kMaxPool2dWithIndices},
    {"native_batch_norm", "", DirectImpl::kBatchNormTrain},
    {"max_pool2d_with_indices_backward", "", DirectImpl::kMaxPool2dBackward},
    {"sum", "dim_IntList", DirectImpl::kColumnSum},
    {"linalg_vector_norm", "", DirectImpl::kVectorNorm},
    {"_foreach_norm", "Scalar", DirectImpl::kForeachNorm},
    {"mm", "", DirectImpl::kMm},
    {"addmm", "", DirectImpl::kAddmm},
};
// Row reductions and normalizations (functional overloads), by name and overload.
struct RowRule {
  std::string_view name, overload;
  RowReduce row;
};
constexpr RowRule kRowRules[] = {
    {"_softmax", "", RowReduce::kSoftmax},    {"_log_softmax", "", RowReduce::kLogSoftmax},
    {"logsumexp", "", RowReduce::kLogSumExp}, {"sum", "dim_IntList", RowReduce::kSum},
    {"mean", "dim", RowReduce::kMean},        {"native_layer_norm", "", RowReduce::kLayerNorm},
};
// Cross-entropy's ops (functional overloads), by name.
struct LossRule {
  std::string_view name;
  LossRow loss;
};
constexpr LossRule kLossRules[] = {
    {"nll_loss_forward", LossRow::kNllLoss},
    {"nll_loss_backward", LossRow::kNllLossBackward},
    {"_log_softmax_backward_data", LossRow::kLogSoftmaxBackward},
};
// Default overloads whose CPU kernel takes strided inputs as they are.
constexpr std::string_view kStridedInputs[] = {"mm", "addmm", "bmm", "baddbmm", "cat", "clone"};
// In-place ops that replace all of self without reading it.
constexpr std::string_view kOverwriteSelf[] = {"fill_",       "zero_",        "normal_",    "uniform_",
                                               "random_",     "exponential_", "geometric_", "cauchy_",
                                               "log_normal_", "bernoulli_",   "copy_"};

Lowering lower(const c10::FunctionSchema& schema) {
  Lowering l;
  std::string_view name = schema.name();
  if (name.substr(0, 6) != "aten::") return l;
  name.remove_prefix(6);
  if (schema.is_mutable()) {
    bool out = false;
    for (const auto& a : schema.arguments()) out = out || a.is_out();
    l.form = out ? OpForm::kOut : OpForm::kInPlace;
  }
  const std::string_view overload = schema.overload_name();
  for (const HostRule& r : kHostRules)
    if (r.name == name && r.overload == overload) l.host = r.kernel;
  for (const RowRule& r : kRowRules)
    if (r.name == name && r.overload == overload) l.row = r.row;
  for (const LossRule& r : kLossRules)
    if (r.name == name && overload.empty()) l.loss = r.loss;
  for (std::string_view n : kStridedInputs) l.strided_inputs = l.strided_inputs || (overload.empty() && n == name);
  // clone is a cat of its one input, written through the output's strides (any memory format).
  l.concat = (name == "cat" || name == "clone") && overload.empty();
  for (std::string_view n : kOverwriteSelf) l.overwrites_self = l.overwrites_self || n == name;
  if (!name.empty() && name.back() == '_') name.remove_suffix(1);
  for (const MxuRule& r : kMxuRules) {
    if (r.base != name) continue;
    l.mxu = r.op;
    l.a_arg = r.a_arg;
    l.b_arg = r.b_arg;
  }
  return l;
}

}  // namespace

const Lowering& lowering_of(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  // Per thread, no lock: the executors ask per op per run.
  thread_local std::unordered_map<const c10::FunctionSchema*, const Lowering*> seen;
  auto hit = seen.find(key);
  if (hit != seen.end()) return *hit->second;
  static std::mutex mu;
  // Never destroyed: a daemon thread's flush may still read it (and `seen` points into it)
  // while the exiting thread runs the static destructors (docs/newcomer_review.md).
  static auto& table = *new std::unordered_map<const c10::FunctionSchema*, Lowering>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = table.find(key);
  if (it == table.end()) it = table.emplace(key, lower(*key)).first;
  seen.emplace(key, &it->second);  // unordered_map references stay valid across inserts
  return it->second;
}

}  // namespace tpu_eager
