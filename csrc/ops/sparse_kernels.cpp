// Sparse COO tensors on "tpu" (torch.sparse_coo_tensor(..., device="tpu"),
// Tensor.to_sparse(), sparse add/mul/div, coalesce, to_dense, ...).
//
// A sparse "tpu" tensor is PyTorch's own SparseTensorImpl (dispatch key
// SparsePrivateUse1) whose indices and values are ordinary dense "tpu" tensors,
// so _indices()/_values()/indices()/values() alias them as on CPU. Sparse
// kernels are data-dependent by nature (the number of non-zeros of a result
// depends on the values), so, like nonzero or unique, they run at the call on
// the host: the queue is flushed, the sparse operands are viewed as CPU sparse
// tensors, CPU's sparse kernel runs, and the results come back as "tpu" tensors
// (sparse results as sparse "tpu" tensors). This is the device's own kernel for
// every SparsePrivateUse1 op (a boxed kernel for the whole key), independent of
// TORCH_TPU_CPU_FALLBACK; the dense-to-sparse conversions (_to_sparse) are the
// PrivateUse1 kernels of this file.
#include <optional>

#include <ATen/SparseTensorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "executors/host_runtime.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace {

const c10::Device kTpu(c10::DeviceType::PrivateUse1, 0);

at::SparseTensorImpl* sparse_impl(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.layout() == at::kSparse, "expected a sparse COO tensor");
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// A sparse COO tensor with the given indices/values (already on the target device).
at::Tensor make_sparse(const at::Tensor& like, const at::Tensor& indices, const at::Tensor& values) {
  return at::_sparse_coo_tensor_with_dims_and_tensors(
      like.sparse_dim(), like.dense_dim(), like.sizes(), indices, values,
      at::TensorOptions().dtype(values.scalar_type()).layout(at::kSparse).device(values.device()),
      like.is_coalesced());
}

at::Tensor sparse_to_cpu(const at::Tensor& t) {
  auto* impl = sparse_impl(t);
  return make_sparse(t, impl->indices().cpu(), impl->values().cpu());
}

at::Tensor sparse_to_tpu(const at::Tensor& t, c10::Device device) {
  auto* impl = sparse_impl(t);
  return make_sparse(t, impl->indices().to(device), impl->values().to(device));
}

// A "tpu" argument as the CPU kernel takes it (dense: a host copy after the flush).
at::Tensor to_host(const at::Tensor& t) {
  if (!is_tpu(t)) return t;
  return t.layout() == at::kSparse ? sparse_to_cpu(t) : t.cpu();
}

// A CPU result as the caller gets it on `device`.
at::Tensor to_device(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || !t.device().is_cpu() || device.is_cpu()) return t;
  return t.layout() == at::kSparse ? sparse_to_tpu(t, device) : t.to(device);
}

c10::IValue ivalue_to_host(const c10::IValue& v) {
  if (v.isTensor()) return to_host(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(to_host(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& t : v.toOptionalTensorList().vec())
      out.push_back(t.has_value() ? std::optional<at::Tensor>(to_host(*t)) : std::nullopt);
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::DeviceType::CPU);
  return v;
}

// Gives the "tpu" tensor `dst` (written by the op) the CPU result `res`.
void write_back(const at::Tensor& dst, const at::Tensor& res) {
  if (dst.layout() == at::kSparse) {
    const at::Tensor moved = sparse_to_tpu(res, dst.device());
    auto* impl = sparse_impl(dst);
    impl->resize_(res.sparse_dim(), res.dense_dim(), res.sizes());
    impl->set_indices_and_values_unsafe(sparse_impl(moved)->indices(),
                                        sparse_impl(moved)->values());
    impl->set_coalesced(res.is_coalesced());
    return;
  }
  if (!dst.sizes().equals(res.sizes())) const_cast<at::Tensor&>(dst).resize_(res.sizes());
  const_cast<at::Tensor&>(dst).copy_(res);
}

// Runs `op` with CPU's kernels on host copies of its "tpu" arguments (see the
// file comment). Results go to the device the op names (a `device` argument),
// else to "tpu"; arguments the op writes get their new value.
void run_on_host(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  (void)flush_all(FlushReason::kDataDependent);
  c10::Device result_device = kTpu;
  torch::jit::Stack cpu;
  cpu.reserve(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isDevice()) result_device = v.toDevice();
    if (v.isTensor() && is_tpu(v.toTensor())) result_device = v.toTensor().device();
    cpu.push_back(ivalue_to_host(v));
  }
  if (result_device.type() == c10::DeviceType::PrivateUse1) result_device = kTpu;
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.callBoxed(cpu);
  }
  std::vector<c10::IValue> results;
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    const c10::IValue& r = cpu[k];
    const auto* alias = schema.returns()[k].alias_info();
    int written = -1;
    if (alias && alias->isWrite())
      for (size_t i = 0; i < nargs; ++i) {
        const auto* a = schema.arguments()[i].alias_info();
        if (a && a->isWrite() && a->beforeSets() == alias->beforeSets()) written = static_cast<int>(i);
      }
    if (written >= 0 && (*stack)[first + written].isTensor() && is_tpu((*stack)[first + written].toTensor())) {
      const at::Tensor dst = (*stack)[first + written].toTensor();
      write_back(dst, r.toTensor());
      results.emplace_back(dst);
    } else if (r.isTensor()) {
      results.emplace_back(to_device(r.toTensor(), result_device));
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : r.toTensorList().vec()) out.push_back(to_device(t, result_device));
      results.emplace_back(std::move(out));
    } else {
      results.push_back(r);
    }
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

// Sparse tensors with "tpu" indices and values (PyTorch's generic constructor:
// it checks the sizes of indices and values, as on CPU).
at::Tensor sparse_coo_with_dims_and_tensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
                                            const at::Tensor& indices, const at::Tensor& values,
                                            std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                            std::optional<at::Device> device, std::optional<bool> pin_memory,
                                            std::optional<bool> is_coalesced) {
  TORCH_CHECK(is_tpu(indices) && is_tpu(values), "sparse tpu tensor: indices and values must be on tpu, got ",
              indices.device(), " and ", values.device());
  return at::native::new_with_dims_and_tensor_sparse_symint(sparse_dim, dense_dim, size, indices, values, dtype,
                                                            layout, device, pin_memory, is_coalesced);
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(sparse_coo_with_dims_and_tensors));
  // Metadata and aliases of the indices/values: PyTorch's generic sparse kernels.
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_host>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Dense "tpu" to sparse: the number of non-zeros depends on the data.
  m.impl("_to_sparse", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  m.impl("_to_sparse.sparse_dim", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
}

}  // namespace
}  // namespace tpu_eager
