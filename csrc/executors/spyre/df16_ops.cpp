// Spyre's per-op 16-bit numerics (see df16_ops.h).
#include "executors/spyre/df16_ops.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_strided.h>

#include <cstring>

#include "executors/aten_grain.h"
#include "executors/host_runtime.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/df16.h"
#include "executors/spyre/matmul16.h"
#include "executors/spyre/reduce16.h"

namespace tpu_eager {
namespace spyre {
namespace {

bool is_dtype_arg(const c10::Argument& a) {
  const c10::TypePtr& t = a.real_type();  // type() says int for ScalarType
  if (t->kind() == c10::TypeKind::ScalarTypeType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::ScalarTypeType;
  return false;
}

bool is_written(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

// t's exact f32 values with t's sizes and strides: convert16's widening of a
// contiguous CPU tensor's elements in place of ATen's copy kernel (the same
// values in a third or less of its instructions); other layouts by ATen.
at::Tensor widen_f32(const at::Tensor& t) {
  if (!t.is_contiguous() || !t.device().is_cpu() || t.is_neg() || t.is_conj()) return t.to(c10::kFloat);
  at::Tensor f = at::empty_strided(t.sizes(), t.strides(), t.options().dtype(c10::kFloat));
  const auto* src = static_cast<const uint16_t*>(t.const_data_ptr());
  float* dst = f.mutable_data_ptr<float>();
  const c10::ScalarType dtype = t.scalar_type();
  at::parallel_for(0, t.numel(), kAtenGrainSize,
                   [&](int64_t b, int64_t e) { widen16(dtype, src + b, dst + b, e - b); });
  return f;
}

}  // namespace

bool computes_in_f32(const Node& n) {
  if (n.rng) return false;
  for (const auto& in : n.inputs)
    if (is_dtype16(in.ref.dtype)) return true;
  for (const auto& out : n.outputs)
    if (is_dtype16(out.dtype)) return true;
  const auto& args = n.op.schema().arguments();
  for (size_t i = 0; i < args.size() && i < n.args.size(); ++i)
    if (is_dtype_arg(args[i]) && n.args[i].isInt() && is_dtype16(static_cast<c10::ScalarType>(n.args[i].toInt())))
      return true;
  return false;
}

at::Tensor df16_store(const at::Tensor& x, c10::ScalarType dtype) {
  // A contiguous float32 result to a 16-bit dtype: convert16's store16 (the
  // bits of df16_round_as, AVX-512 / AVX2 lanes), with x's sizes and strides.
  if (is_dtype16(dtype) && x.scalar_type() == c10::kFloat && x.is_contiguous() && x.device().is_cpu() && !x.is_neg()) {
    at::Tensor out = at::empty_strided(x.sizes(), x.strides(), x.options().dtype(dtype));
    const float* src = x.const_data_ptr<float>();
    auto* dst = static_cast<uint16_t*>(out.mutable_data_ptr());
    at::parallel_for(0, x.numel(), kAtenGrainSize,
                     [&](int64_t b, int64_t e) { store16(dtype, src + b, dst + b, e - b); });
    return out;
  }
  // Otherwise float32 holding df16 values exactly (one pass), then the exact
  // (or storage-range) conversion to dtype.
  return df16_round_as(x, dtype);
}

bool df16_store_into(const at::Tensor& out, const at::Tensor& x) {
  if (out.scalar_type() != c10::kBFloat16 || x.scalar_type() != c10::kFloat || !out.is_contiguous() ||
      !x.is_contiguous() || out.numel() != x.numel() || !out.device().is_cpu() || !x.device().is_cpu())
    return false;
  df16_round_bf16_into(out, x);
  return true;
}

void call_op_in_f32(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                    const std::vector<c10::ScalarType>& result_dtypes,
                    const std::function<void(torch::jit::Stack&)>& call) {
  // A 16-bit mm / bmm: the direct kernel (f32 sums in k order), no f32 copies through ATen's.
  if (matmul16_call(op, stack, result_dtypes)) return;
  // A 16-bit sum over the last dim: the rows summed in place in ATen's order.
  if (sum16_call(op, stack, result_dtypes)) return;
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  // A written 16-bit view whose elements share memory (x.unfold(0, 3, 1).mul_(2))
  // must be written in place as CPU does (an element is updated once per alias):
  // an f32 copy would update it once. Such an op runs its 16-bit kernel and its
  // written values and results are rounded to df16 after it.
  for (size_t i = 0; i < args.size() && i < stack.size(); ++i) {
    if (!is_written(args[i]) || !stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    if (t.defined() && is_dtype16(t.scalar_type()) && at::has_internal_overlap(t) != at::MemOverlap::No) {
      call(stack);
      for (size_t k = 0; k < args.size() && k < stack.size(); ++k)
        if (is_written(args[k]) && stack[k].isTensor() && is_dtype16(stack[k].toTensor().scalar_type()))
          stack[k].toTensor().copy_(df16_store(stack[k].toTensor(), stack[k].toTensor().scalar_type()));
      size_t j = 0;
      const auto& rets = schema.returns();
      for (size_t k = 0; k < rets.size() && k < stack.size(); ++k) {
        if (rets[k].alias_info() || !stack[k].isTensor()) continue;
        const at::Tensor r = stack[k].toTensor();
        const c10::ScalarType want = j < result_dtypes.size() ? result_dtypes[j] : r.scalar_type();
        ++j;
        if (r.defined() && is_dtype16(want)) stack[k] = df16_store(r, want);
      }
      return;
    }
  }
  // Each 16-bit tensor gets one f32 stand-in (a tensor filling several slots
  // keeps one); written ones are copied back as df16 after the call.
  std::vector<std::pair<at::Tensor, at::Tensor>> wide;
  std::vector<std::pair<at::Tensor, at::Tensor>> writes;
  auto widen = [&](const at::Tensor& t, bool written) -> at::Tensor {
    if (!t.defined() || !is_dtype16(t.scalar_type())) return t;
    for (const auto& w : wide)
      if (w.first.is_same(t)) return w.second;
    at::Tensor f = widen_f32(t);  // a copy with t's strides
    wide.emplace_back(t, f);
    if (written) writes.emplace_back(t, f);
    return f;
  };
  for (size_t i = 0; i < args.size() && i < stack.size(); ++i) {
    c10::IValue& v = stack[i];
    const bool written = is_written(args[i]);
    if (v.isTensor()) {
      v = widen(v.toTensor(), written);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorList().vec();
      for (auto& t : list) t = widen(t, written);
      v = c10::List<at::Tensor>(list);
    } else if (v.isList() && args[i].real_type()->kind() == c10::TypeKind::ListType) {
      c10::List<c10::IValue> list = v.toList();
      c10::List<c10::IValue> out(list.elementType());
      for (size_t e = 0; e < list.size(); ++e) {
        const c10::IValue x = list.get(e);
        out.push_back(x.isTensor() ? c10::IValue(widen(x.toTensor(), written)) : x);
      }
      v = out;
    } else if (is_dtype_arg(args[i]) && v.isInt() && is_dtype16(static_cast<c10::ScalarType>(v.toInt()))) {
      v = static_cast<int64_t>(c10::kFloat);
    }
  }
  call(stack);
  for (const auto& [orig, f] : writes) {
    if (!orig.sizes().equals(f.sizes())) orig.resize_(f.sizes());  // an out= the kernel resized
    orig.copy_(df16_store(f, orig.scalar_type()));
  }
  // Fresh results, in order, get their dtypes.
  size_t j = 0;
  auto fix = [&](const at::Tensor& t) -> at::Tensor {
    if (j >= result_dtypes.size()) return t;
    const c10::ScalarType want = result_dtypes[j++];
    if (!t.defined()) return t;
    if (is_dtype16(want)) return df16_store(t, want);
    return t.scalar_type() == want ? t : t.to(want);
  };
  const auto& rets = schema.returns();
  for (size_t k = 0; k < rets.size() && k < stack.size(); ++k) {
    if (rets[k].alias_info()) continue;  // returns a written argument
    if (stack[k].isTensor()) {
      stack[k] = fix(stack[k].toTensor());
    } else if (stack[k].isTensorList()) {
      std::vector<at::Tensor> list = stack[k].toTensorList().vec();
      for (auto& t : list) t = fix(t);
      stack[k] = c10::List<at::Tensor>(list);
    }
  }
}

void call_in_f32(const Node& n, torch::jit::Stack& stack) {
  std::vector<c10::ScalarType> dtypes;
  for (const auto& o : n.outputs) dtypes.push_back(o.dtype);
  call_op_in_f32(n.op, stack, dtypes, [&](torch::jit::Stack& s) { host::call_cpu(n, s); });
}

}  // namespace spyre
}  // namespace tpu_eager
