// Ops whose CPU kernel raises on the values it reads (ops/value_checks.h).
#include "ops/value_checks.h"

#include <string>
#include <unordered_set>

namespace tpu_eager {

bool op_checks_values(const c10::OperatorHandle& op) {
  // Never destroyed: a flush on another thread may ask while the process exits.
  static const auto* schemas = [] {
    static const char* const kNames[] = {
#include "ops/value_checks.inc"
    };
    auto* out = new std::unordered_set<const c10::FunctionSchema*>();
    for (const char* full : kNames) {
      const std::string name(full);
      const size_t dot = name.find('.');
      const std::string base = "aten::" + name.substr(0, dot);
      const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
      auto h = c10::Dispatcher::singleton().findSchema({base, overload});
      if (h) out->insert(&h->schema());
    }
    return out;
  }();
  return schemas->count(&op.schema()) != 0;
}

}  // namespace tpu_eager
