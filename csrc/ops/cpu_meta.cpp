// Finds the C++ Meta kernel behind a Python meta registration (cpu_meta.h).
#include "ops/cpu_meta.h"

#include <ATen/core/dispatch/OperatorEntry.h>

namespace tpu_eager {
namespace {

// Reads a private member without naming its (private) type: explicit template
// instantiation may name private members (C++17 [temp.explicit]/12); the
// friend defined here hands out the member pointer. Compiled against the
// pinned torch headers, so the layout is the one torch was built with.
template <class Tag, auto Member>
struct MemberAccess {
  friend auto member_of(Tag) { return Member; }
};

struct OperatorDefTag {
  friend auto member_of(OperatorDefTag);
};
template struct MemberAccess<OperatorDefTag, &c10::OperatorHandle::operatorDef_>;

struct KernelsTag {
  friend auto member_of(KernelsTag);
};
template struct MemberAccess<KernelsTag, &c10::impl::OperatorEntry::kernels_>;

// ATen's generated Meta registrations (structured kernels' meta functions and
// the few hand-written C++ Meta kernels) say where they come from.
bool is_aten_cpp_meta(const c10::impl::AnnotatedKernel& k) { return k.debug.find("RegisterMeta") != std::string::npos; }

}  // namespace

std::optional<c10::KernelFunction> shadowed_cpp_meta_kernel(const c10::OperatorHandle& op) {
  const auto* def = op.*member_of(OperatorDefTag{});
  const c10::impl::OperatorEntry& entry = def->op;
  const auto& kernels = entry.*member_of(KernelsTag{});
  auto it = kernels.find(c10::DispatchKey::Meta);
  if (it == kernels.end() || it->second.empty()) return std::nullopt;
  const auto& list = it->second;
  if (is_aten_cpp_meta(list.front())) return std::nullopt;  // active already: the dispatcher calls it
  for (const auto& k : list)
    if (is_aten_cpp_meta(k)) return k.kernel;
  return std::nullopt;
}

}  // namespace tpu_eager
