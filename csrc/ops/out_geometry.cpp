// Geometry CPU gives an out= argument that its kernel resizes (out_geometry.h).
#include "ops/out_geometry.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>

namespace tpu_eager {
namespace {

// Number of trailing out= tensors when `o` is the out= form of functional `f`, else 0.
size_t outs_of(const c10::FunctionSchema& f, const c10::FunctionSchema& o) {
  const auto& fa = f.arguments();
  const auto& oa = o.arguments();
  const size_t nret = f.returns().size();
  if (f.is_mutable() || nret == 0 || oa.size() != fa.size() + nret) return 0;
  for (size_t i = 0; i < fa.size(); ++i)
    if (fa[i].name() != oa[i].name() || fa[i].type()->str() != oa[i].type()->str() || oa[i].is_out()) return 0;
  for (size_t i = fa.size(); i < oa.size(); ++i)
    if (!oa[i].is_out() || oa[i].type()->kind() != c10::TypeKind::TensorType) return 0;
  for (const auto& r : f.returns())
    if (r.type()->kind() != c10::TypeKind::TensorType || r.alias_info()) return 0;
  return nret;
}

}  // namespace

const c10::OperatorHandle* functional_variant(const c10::OperatorHandle& op) {
  static std::mutex mu;
  // Never destroyed: a daemon thread's op may still look it up at exit.
  static auto& cache = *new std::unordered_map<c10::OperatorName, std::unique_ptr<c10::OperatorHandle>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(op.operator_name());
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<c10::OperatorHandle> found;
  const auto& o = op.schema();
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != o.name() || name.overload_name == o.overload_name()) continue;
    auto h = c10::Dispatcher::singleton().findOp(name);
    if (h && h->hasSchema() && outs_of(h->schema(), o) > 0) {
      found = std::make_unique<c10::OperatorHandle>(*h);
      break;
    }
  }
  return cache.emplace(op.operator_name(), std::move(found)).first->second.get();
}

void restride_resized_outs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                           const std::vector<c10::IValue>& meta_args, MetaOutcome& outcome) {
  const auto& args = op.schema().arguments();
  // Out= tensors the kernel resizes (CPU's resize_output: the shape changes).
  bool any = false;
  for (const auto& w : outcome.written) {
    const size_t i = first + static_cast<size_t>(w.first);
    if (!args[w.first].is_out() || i >= stack.size() || !stack[i].isTensor() || !w.second.defined) continue;
    if (!stack[i].toTensor().sizes().equals(w.second.sizes)) any = true;
  }
  if (!any) return;
  const c10::OperatorHandle* f = functional_variant(op);
  if (!f) return;
  const size_t nf = f->schema().arguments().size();
  torch::jit::Stack fs(meta_args.begin(), meta_args.begin() + static_cast<std::ptrdiff_t>(nf));
  try {
    f->callBoxed(fs);
  } catch (const std::exception&) {
    return;  // the out= form was accepted: keep its geometry
  }
  for (auto& w : outcome.written) {
    const size_t a = static_cast<size_t>(w.first);
    const size_t i = first + a;
    if (a < nf || !args[a].is_out() || !stack[i].isTensor() || !w.second.defined) continue;
    if (stack[i].toTensor().sizes().equals(w.second.sizes)) continue;
    const size_t k = a - nf;  // the k-th out= tensor is the k-th result
    if (k >= fs.size() || !fs[k].isTensor()) continue;
    const at::Tensor& r = fs[k].toTensor();
    if (r.defined() && r.sizes().equals(w.second.sizes)) w.second.strides = r.strides().vec();
  }
}

}  // namespace tpu_eager
