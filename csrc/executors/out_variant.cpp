// Finding an op's out= overload (see out_variant.h).
#include "executors/out_variant.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tpu_eager {
namespace host {
namespace {

bool same_argument(const c10::Argument& a, const c10::Argument& b) {
  return a.name() == b.name() && a.type()->str() == b.type()->str() && !b.is_out();
}

bool is_out_of(const c10::FunctionSchema& f, const c10::FunctionSchema& o) {
  const auto& fa = f.arguments();
  const auto& oa = o.arguments();
  const size_t nret = f.returns().size();
  if (o.is_mutable() == false || oa.size() != fa.size() + nret) return false;
  for (size_t i = 0; i < fa.size(); ++i)
    if (!same_argument(fa[i], oa[i])) return false;
  for (size_t i = fa.size(); i < oa.size(); ++i)
    if (!oa[i].is_out() || oa[i].type()->kind() != c10::TypeKind::TensorType) return false;
  return true;
}

// Op name -> its overloads, built once from the dispatcher's registry.
const std::unordered_map<std::string, std::vector<c10::OperatorName>>& overloads_by_name() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<c10::OperatorName>>();
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) (*t)[name.name].push_back(name);
    return t;
  }();
  return *table;
}

}  // namespace

const c10::OperatorHandle* out_variant(const c10::OperatorHandle& op, bool* functional_plus_copy) {
  struct Found {
    std::unique_ptr<c10::OperatorHandle> op;
    bool plus_copy = false;
  };
  static std::mutex mu;
  static std::unordered_map<c10::OperatorName, Found> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(op.operator_name());
  if (it == cache.end()) {
    Found found;
    const auto& f = op.schema();
    bool all_tensors = !f.returns().empty() && !f.is_mutable();
    for (const auto& r : f.returns())
      all_tensors = all_tensors && r.type()->kind() == c10::TypeKind::TensorType && !r.alias_info();
    auto names = overloads_by_name().find(f.name());
    if (all_tensors && names != overloads_by_name().end()) {
      for (const auto& name : names->second) {
        auto h = c10::Dispatcher::singleton().findOp(name);
        if (h && h->hasSchema() && is_out_of(f, h->schema())) {
          found.op = std::make_unique<c10::OperatorHandle>(*h);
          // torchgen's generated out= kernels (`autogen:` in native_functions.yaml)
          // are registered as CompositeExplicitAutograd only: the functional op,
          // then a copy into out.
          found.plus_copy = !h->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
                            h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
          break;
        }
      }
    }
    it = cache.emplace(op.operator_name(), std::move(found)).first;
  }
  if (functional_plus_copy) *functional_plus_copy = it->second.plus_copy;
  return it->second.op.get();
}

}  // namespace host
}  // namespace tpu_eager
