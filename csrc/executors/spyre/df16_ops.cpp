// Spyre's per-op 16-bit numerics (see df16_ops.h).
#include "executors/spyre/df16_ops.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "executors/host_runtime.h"
#include "executors/spyre/df16.h"

namespace tpu_eager {
namespace spyre {
namespace {

bool is16(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

bool is_dtype_arg(const c10::Argument& a) {
  const c10::TypePtr& t = a.real_type();  // type() says int for ScalarType
  if (t->kind() == c10::TypeKind::ScalarTypeType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::ScalarTypeType;
  return false;
}

at::Tensor slot_tensor(const c10::IValue& slot, int elem) {
  if (elem < 0) return slot.toTensor();
  if (slot.isTensorList()) return slot.toTensorList().get(elem);
  const c10::IValue v = slot.toList().get(elem);
  return v.isNone() ? at::Tensor() : v.toTensor();
}

}  // namespace

bool computes_in_f32(const Node& n) {
  if (n.rng) return false;
  for (const auto& in : n.inputs)
    if (is16(in.ref.dtype)) return true;
  for (const auto& out : n.outputs)
    if (is16(out.dtype)) return true;
  const auto& args = n.op.schema().arguments();
  for (size_t i = 0; i < args.size() && i < n.args.size(); ++i)
    if (is_dtype_arg(args[i]) && n.args[i].isInt() && is16(static_cast<c10::ScalarType>(n.args[i].toInt())))
      return true;
  return false;
}

at::Tensor df16_store(const at::Tensor& x, c10::ScalarType dtype) {
  // df16_decode(df16_encode(.)) is float32 holding df16 values exactly.
  at::Tensor r = df16_decode(df16_encode(x));
  return dtype == c10::kFloat ? r : r.to(dtype);
}

void call_in_f32(const Node& n, torch::jit::Stack& stack) {
  // Written 16-bit arguments: the tensor the op should write (an alias of the
  // device value, or a copy that finish_writes scatters) and its f32 stand-in.
  std::vector<std::pair<at::Tensor, at::Tensor>> writes;
  for (const auto& in : n.inputs) {
    if (!is16(in.ref.dtype)) continue;
    c10::IValue& slot = stack[in.arg];
    at::Tensor orig = slot_tensor(slot, in.elem);
    if (!orig.defined()) continue;
    at::Tensor wide = orig.to(c10::kFloat);  // a copy with orig's strides
    // The same tensor can fill several slots (a list repeating it): one stand-in.
    for (const auto& w : writes)
      if (w.first.is_same(orig)) wide = w.second;
    host::set_tensor_slot(slot, in.elem, wide);
    if (in.written) {
      bool seen = false;
      for (const auto& w : writes) seen = seen || w.first.is_same(orig);
      if (!seen) writes.emplace_back(orig, wide);
    }
  }
  const auto& args = n.op.schema().arguments();
  for (size_t i = 0; i < args.size() && i < stack.size(); ++i)
    if (is_dtype_arg(args[i]) && stack[i].isInt() && is16(static_cast<c10::ScalarType>(stack[i].toInt())))
      stack[i] = static_cast<int64_t>(c10::kFloat);
  host::call_cpu(n, stack);
  for (const auto& [orig, wide] : writes) {
    if (!orig.sizes().equals(wide.sizes())) orig.resize_(wide.sizes());  // an out= the kernel resized
    orig.copy_(df16_store(wide, orig.scalar_type()));
  }
  // Fresh results, in Node::outputs order, get their recorded dtypes.
  size_t j = 0;
  auto fix = [&](const at::Tensor& t) -> at::Tensor {
    const c10::ScalarType want = n.outputs.at(j++).dtype;
    if (!t.defined()) return t;
    if (is16(want)) return df16_store(t, want);
    return t.scalar_type() == want ? t : t.to(want);
  };
  for (size_t k = 0; k < n.returns.size() && k < stack.size(); ++k) {
    if (n.returns[k] == -1) {
      stack[k] = fix(stack[k].toTensor());
    } else if (n.returns[k] == -2) {
      std::vector<at::Tensor> list = stack[k].toTensorList().vec();
      for (auto& t : list) t = fix(t);
      stack[k] = c10::List<at::Tensor>(list);
    }
  }
}

}  // namespace spyre
}  // namespace tpu_eager
