// Sparse COO, quantized and nested tensors on "tpu".
//
// Sparse: torch.sparse_coo_tensor(..., device="tpu"), Tensor.to_sparse(),
// sparse add/mul/div, coalesce, to_dense, ...
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
//
// Quantized: torch.quantize_per_tensor / quantize_per_channel of a "tpu" tensor
// give a quantized "tpu" tensor: PyTorch's QTensorImpl (dispatch key
// QuantizedPrivateUse1) over device memory with CPU's quantizer. Its views
// (view, reshape, flatten, ravel, transpose, ...) are PyTorch's generic quantized
// view kernels on the same storage; every other quantized op (dequantize,
// int_repr, q_scale, ...) runs at the call on the host as above: CPU's quantized
// kernels are the reference, and quantized tensors are outside what the fused
// targets model.
//
// Nested (torch.nested, strided layout): a nested "tpu" tensor is PyTorch's own
// NestedTensorImpl (dispatch key NestedTensorPrivateUse1) over device memory; its
// nested sizes, strides and storage offsets are CPU tensors, as for every nested
// tensor. ATen registers its nested kernels for NestedTensorCPU/CUDA only, and
// several of them call CPU kernels (dispatch stubs) directly, so a nested op runs
// at the call on the host like the sparse ones: the storage is read after the
// flush, CPU's nested kernel runs, and nested results come back over device
// memory. Views (unbind, select, transpose, ...) and the metadata getters
// (_nested_tensor_size, ...) are PyTorch's generic nested kernels instead: views
// share the "tpu" storage, and the metadata stays a CPU tensor as on CUDA. The
// dense-to-nested constructors (_nested_from_padded, _nested_tensor_from_mask, the
// transformer fast path's inputs) and the jagged layout's padding conversions are
// PrivateUse1 kernels of this file.
#include <cstring>
#include <optional>

#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/quantized/QTensorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <string>
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

#include "ops/layout_kernels.h"

#include "device/device.h"
#include "executors/host_runtime.h"
#include "lazy/async_errors.h"
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
      at::TensorOptions().dtype(values.scalar_type()).layout(at::kSparse).device(values.device()), like.is_coalesced());
}

at::Tensor sparse_to_cpu(const at::Tensor& t) {
  auto* impl = sparse_impl(t);
  return make_sparse(t, impl->indices().cpu(), impl->values().cpu());
}

at::Tensor sparse_to_tpu(const at::Tensor& t, c10::Device device) {
  auto* impl = sparse_impl(t);
  return make_sparse(t, impl->indices().to(device), impl->values().to(device));
}

// A quantized tensor like `t` (sizes, strides, offset, quantizer) over `storage`.
at::Tensor make_quantized(const at::Tensor& t, c10::Storage storage, c10::DispatchKey key) {
  auto q =
      at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(key), t.dtype(),
                                               static_cast<at::QTensorImpl*>(t.unsafeGetTensorImpl())->quantizer());
  q.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return q;
}

// A quantized "tpu" tensor as a CPU one: its storage's bytes, read after the flush.
// Both copies' storages are resizable, as quantize_per_tensor's are on CPU
// (CPU's quantized resize_ grows the host copy; write_back moves it to "tpu").
at::Tensor quantized_to_cpu(const at::Tensor& t) {
  DeferredStorage* s = deferred_storage_of(t);
  if (storage_has_pending(s)) (void)flush_device(s->device, FlushReason::kHostRead);  // its chip's uses
  raise_storage_error(s);
  raise_lost_error(s->device);  // a host read synchronizes (lazy/async_errors.h)
  const size_t n = t.storage().nbytes();
  c10::Storage st(c10::Storage::use_byte_size_t(), n, c10::GetCPUAllocator()->allocate(n), c10::GetCPUAllocator(),
                  /*resizable=*/true);
  if (n) std::memcpy(st.mutable_data(), s->data, n);
  return make_quantized(t, std::move(st), c10::DispatchKey::QuantizedCPU);
}

// A quantized CPU tensor as a "tpu" one: device memory holding its storage's bytes.
at::Tensor quantized_to_tpu(const at::Tensor& t) {
  const size_t n = t.storage().nbytes();
  c10::Allocator* alloc = device_allocator();
  c10::Storage st(c10::Storage::use_byte_size_t(), n, alloc->allocate(n), alloc, /*resizable=*/true);
  at::Tensor q = make_quantized(t, std::move(st), c10::DispatchKey::QuantizedPrivateUse1);
  if (n) std::memcpy(deferred_storage_of(q)->data, t.storage().data(), n);
  return q;
}

// The whole storage of nested tensor `t` as a dense 1-D tensor on `device` (a copy
// unless `device` is t's own). Its nested sizes, strides and offsets index it.
at::Tensor nested_storage_on(const at::Tensor& t, c10::Device device) {
  return at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor().to(device);
}

// A nested tensor with t's nested sizes, strides and storage offsets over `storage`
// (a dense 1-D tensor of t's storage size, e.g. from nested_storage_on).
at::Tensor nested_over(const at::Tensor& t, const at::Tensor& storage) {
  auto* impl = at::native::get_nested_tensor_impl(t);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(storage, impl->get_nested_sizes().clone(),
                                                               impl->get_nested_strides().clone(),
                                                               impl->get_storage_offsets().clone());
}

// A "tpu" argument as the CPU kernel takes it (dense: a host copy after the flush).
at::Tensor to_host(const at::Tensor& t) {
  if (!is_tpu(t)) return t;
  if (t.is_quantized()) return quantized_to_cpu(t);
  if (t.is_nested()) return nested_over(t, nested_storage_on(t, c10::Device(c10::kCPU)));
  return t.layout() == at::kSparse ? sparse_to_cpu(t) : t.cpu();
}

// A CPU result as the caller gets it on `device`.
at::Tensor to_device(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || !t.device().is_cpu() || device.is_cpu()) return t;
  if (t.is_quantized()) return quantized_to_tpu(t);
  if (t.is_nested()) return nested_over(t, nested_storage_on(t, device));
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
  if (dst.is_quantized()) {
    const at::Tensor moved = quantized_to_tpu(res);
    dst.unsafeGetTensorImpl()->set_storage_keep_dtype(moved.storage());
    dst.unsafeGetTensorImpl()->set_sizes_and_strides(res.sizes(), res.strides(), res.storage_offset());
    static_cast<at::QTensorImpl*>(dst.unsafeGetTensorImpl())
        ->set_quantizer_(static_cast<at::QTensorImpl*>(res.unsafeGetTensorImpl())->quantizer());
    return;
  }
  if (dst.is_nested()) {
    // In-place nested kernels keep the nested geometry: the host copy of the
    // storage, written, goes back into the "tpu" storage.
    auto* dst_impl = at::native::get_nested_tensor_impl(dst);
    auto* res_impl = at::native::get_nested_tensor_impl(res);
    at::Tensor storage = dst_impl->get_unsafe_storage_as_tensor();
    const at::Tensor written = res_impl->get_unsafe_storage_as_tensor();
    TORCH_CHECK(
        storage.sizes().equals(written.sizes()) && dst_impl->get_nested_sizes().equal(res_impl->get_nested_sizes()),
        "nested tpu tensor: an in-place op changed the nested sizes");
    storage.copy_(written);
    return;
  }
  if (dst.layout() == at::kSparse) {
    const at::Tensor moved = sparse_to_tpu(res, dst.device());
    auto* impl = sparse_impl(dst);
    impl->resize_(res.sparse_dim(), res.dense_dim(), res.sizes());
    impl->set_indices_and_values_unsafe(sparse_impl(moved)->indices(), sparse_impl(moved)->values());
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
  return at::native::new_with_dims_and_tensor_sparse_symint(sparse_dim, dense_dim, size, indices, values, dtype, layout,
                                                            device, pin_memory, is_coalesced);
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
  // copy_ and clone have CompositeExplicitAutograd kernels, which the dispatcher
  // prefers to the fallback below; they end in _copy_from between layouts, which
  // has no sparse kernel. CPU's sparse kernels decide them instead (as for SparseCPU).
  m.impl("copy_", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  m.impl("clone", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_host>()); }

// An uninitialized quantized "tpu" tensor (contiguous in `memory_format`) with `quantizer`.
at::Tensor empty_quantized_tpu(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::MemoryFormat> memory_format, at::QuantizerPtr quantizer) {
  const at::ScalarType dt = dtype.value_or(at::kQUInt8);
  TORCH_CHECK(c10::isQIntType(dt), "ScalarType ", dt, " is not supported in new_qtensor.");
  const size_t n = static_cast<size_t>(c10::multiply_integers(size)) * c10::elementSize(dt);
  c10::Allocator* alloc = device_allocator();
  c10::Storage st(c10::Storage::use_byte_size_t(), n, alloc->allocate(n), alloc, /*resizable=*/true);
  auto q = at::detail::make_tensor<at::QTensorImpl>(std::move(st),
                                                    c10::DispatchKeySet(c10::DispatchKey::QuantizedPrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dt), std::move(quantizer));
  q.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  q.unsafeGetTensorImpl()->empty_tensor_restride(memory_format.value_or(at::MemoryFormat::Contiguous));
  return q;
}

at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                                  std::optional<at::Device>, std::optional<bool>, double scale, int64_t zero_point,
                                  std::optional<at::MemoryFormat> memory_format) {
  const at::ScalarType dt = dtype.value_or(at::kQUInt8);
  return empty_quantized_tpu(size, dt, memory_format, at::make_per_tensor_affine_quantizer(scale, zero_point, dt));
}

at::Tensor empty_per_channel_affine_quantized(c10::IntArrayRef size, const at::Tensor& scales,
                                              const at::Tensor& zero_points, int64_t axis,
                                              std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                                              std::optional<at::Device>, std::optional<bool>,
                                              std::optional<at::MemoryFormat> memory_format) {
  const at::ScalarType dt = dtype.value_or(at::kQUInt8);
  return empty_quantized_tpu(size, dt, memory_format,
                             at::make_per_channel_affine_quantizer(to_host(scales), to_host(zero_points), axis, dt));
}

// Tensor.to / .cpu() of a quantized tensor to or from "tpu": the bytes as they are
// (a dtype or layout change runs CPU's _to_copy on the host copy).
at::Tensor quantized_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin_memory, bool non_blocking,
                             std::optional<at::MemoryFormat> memory_format) {
  // (A quantized CPU tensor going to "tpu" arrives here too: the device argument selects this kernel.)
  const at::Tensor host = is_tpu(self) ? quantized_to_cpu(self) : self;
  const c10::Device target = device.value_or(self.device());
  at::Tensor r = at::_to_copy(host, dtype, layout, c10::Device(c10::kCPU), pin_memory, non_blocking, memory_format);
  return target.is_cpu() ? r : to_device(r, target);
}

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  // Factories: quantized tensors over device memory.
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(empty_per_channel_affine_quantized));
  m.impl("_to_copy", TORCH_FN(quantized_to_copy));
  // copy_ and clone have composite kernels, which the fallback below would not
  // override (the composite clone makes an empty_strided: no quantizer, and
  // contiguous() / reshape() of a non-contiguous quantized tensor clone).
  m.impl("copy_", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  m.impl("clone", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  // Views share the quantized storage (PyTorch's generic quantized view kernels).
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_qtensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
}

// True for a nested op that only makes metadata: a view of its argument (a return
// that aliases an argument without writing it) or a getter of the nested sizes,
// strides or offsets (CPU tensors for every device).
bool nested_metadata_op(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  for (const auto& r : schema.returns())
    if (r.alias_info() != nullptr && !r.alias_info()->isWrite()) return true;
  const std::string& name = schema.operator_name().name;
  return name == "aten::_nested_tensor_size" || name == "aten::_nested_tensor_strides" ||
         name == "aten::_nested_tensor_storage_offsets";
}

// Every NestedTensorPrivateUse1 op (see the file comment): metadata ops run
// PyTorch's generic nested kernel (the NestedTensorCPU one: it builds metadata over
// the argument's own storage, whatever its device), the others run on the host.
void nested_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (nested_metadata_op(op)) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
    return;
  }
  run_on_host(op, ks, stack);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_kernel>());
}

// _nested_view_from_buffer: a nested view of a dense "tpu" buffer (PyTorch's
// generic kernel, registered upstream for CPU and CUDA only).
void nested_view_from_buffer(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Dense "tpu" to nested (CPU's kernels, registered upstream for CPU and CUDA only):
  // the nested sizes of _nested_tensor_from_mask depend on the data.
  for (const char* op : {"_nested_from_padded", "_nested_tensor_from_mask", "_nested_tensor_from_mask_left_aligned"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  m.impl("_nested_view_from_buffer", torch::CppFunction::makeFromBoxedFunction<&nested_view_from_buffer>());
  // Jagged-layout nested tensors (torch.nested with layout=torch.jagged) are dense
  // "tpu" values and offsets; their padding conversions have CPU and CUDA kernels only.
  for (const char* op : {"_jagged_to_padded_dense_forward", "_padded_dense_to_jagged_forward"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  // Dense "tpu" to sparse: the number of non-zeros depends on the data.
  m.impl("_to_sparse", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  m.impl("_to_sparse.sparse_dim", torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
  // Dense "tpu" to quantized (CPU's quantizer and rounding).
  for (const char* op : {"quantize_per_tensor", "quantize_per_tensor.tensor_qparams", "quantize_per_tensor.tensors",
                         "quantize_per_channel", "quantize_per_tensor_dynamic"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
}

}  // namespace

int64_t register_quantized_host_kernels() {
  // An op with both a QuantizedCPU kernel and a composite one (clamp, sigmoid,
  // topk, cat, mean.dim, upsample_*, avg_pool2d, index, empty_like, ...): the
  // dispatcher prefers the composite kernel over the QuantizedPrivateUse1
  // fallback, and the composite kernel, written for dense tensors, fails or
  // calls an out= variant that has no quantized kernel. Such ops run CPU's
  // quantized kernel on the host, as the fallback would. Views (a return that
  // aliases an argument without writing it) keep their composite kernels: they
  // share the quantized storage.
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::QuantizedPrivateUse1, __FILE__, __LINE__);
  int64_t count = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedCPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedPrivateUse1))
      continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    bool view = false;
    for (const auto& r : op->schema().returns())
      view = view || (r.alias_info() != nullptr && !r.alias_info()->isWrite());
    if (view) continue;
    const std::string overload =
        name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
    lib.impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_on_host>());
    ++count;
  }
  return count;
}

int64_t register_nested_host_kernels() {
  // An op with a NestedTensorCPU kernel and a composite one (linear, matmul,
  // dropout, ...): NestedTensorPrivateUse1 would get the composite kernel, written
  // for dense tensors (it fails on the nested sizes), where CPU runs its nested
  // kernel. Each such op gets nested_kernel, as the fallback would give it.
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__,
                            __LINE__);
  int64_t count = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1))
      continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    const std::string overload =
        name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
    lib.impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_kernel>());
    ++count;
  }
  return count;
}

at::Tensor layout_result_to_tpu(const at::Tensor& cpu_result) { return to_device(cpu_result, kTpu); }

}  // namespace tpu_eager
