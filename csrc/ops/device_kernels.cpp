// Kernels every device needs regardless of ops (PRIVATEUSE1_NOTES), the
// registration of the op table, and the CPU fallback.
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_set>

#include <ATen/Context.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_ops.h>
#include <ATen/ops/as_strided_ops.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/view_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/safe_numerics.h>
#include <torch/library.h>

#include "device/env.h"
#include "lazy/debug_report.h"
#include "device/device.h"
#include "device/host_share.h"
#include "executors/host_runtime.h"
#include "executors/executor.h"
#include "lazy/async_errors.h"
#include "lazy/queue.h"
#include "ops/layout_kernels.h"
#include "ops/lazy_clone.h"
#include "ops/model_kernels.h"
#include "ops/op_table.h"
#include "ops/record.h"
#include "ops/rnn_cells.h"

namespace tpu_eager {

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
#include "ops/op_table.inc"
  };
  return table;
}

namespace {

const c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// ---- factories: allocate, record nothing (the memory is uninitialized) ----

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default): new
// memory holds NaN (floating and complex types) or the type's maximum
// (integers; True for bool), as CPU's empty, empty_strided and resize_
// fill it (ATen's fill_empty_deterministic_).
bool fill_uninitialized_memory() {
  const auto& ctx = at::globalContext();
  return C10_UNLIKELY(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory());
}

at::Tensor host_view(const at::Tensor& t);

// Writes the fill straight into the buffer: `t` is new memory (a fresh
// storage, or the part a resize just added), which no queued op uses. A
// recorded fill_ would leave it pending, and a host-to-device copy into a
// pending tensor stages its source in another new (pending) tensor, forever.
void fill_empty_deterministic(const at::Tensor& t) {
  if (t.numel() == 0) return;
  at::Tensor v = host_view(t);
  const at::ScalarType st = t.scalar_type();
  if (at::isFloatingType(st) || at::isComplexType(st)) {
    v.fill_(std::numeric_limits<double>::quiet_NaN());
  } else {
    at::Scalar x;
    AT_DISPATCH_V2(st, "fill_empty_deterministic_",
                   AT_WRAP([&] { x = at::Scalar(std::numeric_limits<scalar_t>::max()); }), at::kBool,
                   AT_EXPAND(AT_INTEGRAL_TYPES_V2));
    v.fill_(x);
  }
  active_executor().to_storage_format(v);  // e.g. Spyre stores 16-bit floats as df16
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  ChipGuard chip(device && device->has_index() ? checked_device(device->index()) : -1);
  at::Tensor t = at::detail::empty_generic(size, device_allocator(), kDeviceKeys,
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
  if (fill_uninitialized_memory()) fill_empty_deterministic(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  ChipGuard chip(device && device->has_index() ? checked_device(device->index()) : -1);
  at::Tensor t = at::detail::empty_strided_generic(size, stride, device_allocator(), kDeviceKeys,
                                                   dtype.value_or(c10::get_default_dtype_as_scalartype()));
  if (fill_uninitialized_memory()) fill_empty_deterministic(t);
  return t;
}

// torch._efficientzerotensor (forward-mode AD's tangent of an argument that has none): a
// ZeroTensor, as CPU's and CUDA's are. Its dispatch key sends every op on it to kernels
// that read it as zeros (and refuse to write it). CPU's has no buffer; this one views a
// zero-filled device buffer, so that no kernel of a fused region (which sees buffers, not
// dispatch keys) can read memory that is not there.
at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                                 std::optional<bool> pin_memory) {
  at::Tensor zeros = empty_memory_format(size, dtype, layout, device, pin_memory, std::nullopt).zero_();
  at::Tensor z = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(zeros.storage()), kDeviceKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor), zeros.dtype());
  z.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  return z;
}

// ---- copies between host and device, and device to device ----

at::Tensor host_view(const at::Tensor& t) {
  TensorRef r = make_ref(t);
  at::Tensor v = host::view_over(host::wrap_device_buffer(r.storage.get()), r);
  if (t.is_conj()) v._set_conj(true);
  if (t.is_neg()) v._set_neg(true);
  return v;
}

// Makes the host buffer of `t` current (flushes when queued ops touch it).
// A read to the host synchronizes with the chip, as on CUDA: after `t`'s own
// error, it raises the chip's oldest error that nothing has reported yet
// (lazy/async_errors.h); errors of other ops stay with their tensors.
void make_current(const at::Tensor& t, FlushReason reason) {
  auto* s = deferred_storage_of(t);
  // Its chip's queue alone: no queued op spans two chips (chip to chip copies go through the
  // host, copy_from), and a read of one chip does not wait for another's flush.
  if (storage_has_pending(s)) (void)flush_device(s->device, reason);
  raise_storage_error(s);
  raise_lost_error(s->device);
}

}  // namespace

at::Tensor record_copy(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  static const auto copy_op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  static const OpEntry entry{"copy_", PrimKind::kData, 0};
  static const OpPlan* plan = plan_op(copy_op, entry);
  torch::jit::Stack stack{dst, src, non_blocking};
  record_op(copy_op, entry, *plan, &stack);
  return dst;
}

namespace {

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // copy_(dst, self) reaches the device here: `self` is the source.
  // CPU's copy_ returns at once when both are views of the same elements
  // (before its overlap checks: `v.copy_(v.transpose(0, 0))` of an expanded v
  // does nothing); copy_ reaches _copy_from before that check for a device.
  if (dst.is_alias_of(self) && dst.storage_offset() == self.storage_offset() && dst.strides().equals(self.strides()) &&
      dst.sizes().equals(self.sizes()) && dst.scalar_type() == self.scalar_type() && dst.is_conj() == self.is_conj() &&
      dst.is_neg() == self.is_neg())
    return dst;
  if (is_tpu(dst)) {
    at::assert_no_internal_overlap(dst);
    if (is_tpu(self)) at::assert_no_partial_overlap(dst, self);
    auto shape = at::infer_size(dst.sizes(), self.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape).equals(dst.sizes()), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (dst.numel() == 0) return dst;
  if (is_tpu(self) && is_tpu(dst) && self.device() != dst.device()) {
    // Chip to chip: the source's current value, read on the host, is copied
    // to the destination's chip as a host-to-device copy (the branch below
    // writes it now or stages it), so no queued op spans two chips.
    make_current(self, FlushReason::kHostRead);
    return copy_from(host_view(self), dst, non_blocking);
  }
  if (!is_tpu(self) && is_tpu(dst)) {
    TORCH_CHECK(self.device().is_cpu(), "copy from ", self.device(), " to tpu is not supported");
    prepare_write(dst);  // a lazy clone gets its own bytes first (ops/lazy_clone.h)
    auto* s = deferred_storage_of(dst);
    // The source in the destination's dtype, converted on the host as copy_
    // converts: the target's storage rules (on Spyre, int64 held as int32 and
    // 16-bit floats as df16) then apply to the values the destination will
    // hold, and a rejected copy raises before anything is written or recorded.
    const at::Tensor src = self.to(dst.scalar_type());
    if (!storage_has_pending(s)) {
      // Host to device, nothing queued on the destination: write it now. A
      // copy over the whole storage replaces a failed op's value once the
      // user has seen its error, and only if the copy succeeds.
      const bool covers = make_ref(dst).covers_storage();
      if (!covers || !s->error_seen) raise_storage_error(s);
      Executor& ex = active_executor();
      ex.check_host_value(src, "copy to the device");
      unshare_for_write(s);
      at::Tensor v = host_view(dst);
      v.copy_(src);
      ex.to_storage_format(v);  // e.g. Spyre stores 16-bit floats as df16
      if (covers) s->set_error(nullptr);
      return dst;
    }
    // Queued ops still use the destination: stage the source in a fresh
    // device tensor (written now, through the branch above) and record a
    // device-to-device copy.
    return record_copy(dst, src.to(dst.device()), false);
  }
  if (is_tpu(self) && !is_tpu(dst)) {
    TORCH_CHECK(dst.device().is_cpu(), "copy from tpu to ", dst.device(), " is not supported");
    make_current(self, FlushReason::kHostRead);
    // No rounding on Spyre: a device buffer already holds each 16-bit value as
    // df16 read back to its dtype (rounding again would turn the float16 inf
    // of df16's 65536 into the NaN/Inf code).
    dst.copy_(host_view(self), non_blocking);
    return dst;
  }
  return record_copy(dst, self, non_blocking);
}

// Tensor.to / .cpu(): a read to the host of a whole, dense storage shares
// the device buffer copy-on-write instead of copying it (device/host_share.h);
// everything else is the composite kernel (empty + copy_).
at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                   std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  const bool to_cpu_as_is = device.has_value() && device->is_cpu() && (!dtype || *dtype == self.scalar_type()) &&
                            (!layout || *layout == at::kStrided) && !pin_memory.value_or(false) &&
                            memory_format.value_or(at::MemoryFormat::Preserve) == at::MemoryFormat::Preserve;
  if (to_cpu_as_is && can_share_with_host(self)) {
    make_current(self, FlushReason::kHostRead);
    at::Tensor shared = share_with_host(self);
    if (shared.defined()) return shared;
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) const_cast<at::Tensor&>(dst).resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  make_current(self, FlushReason::kItem);
  return at::_local_scalar_dense(host_view(self));
}

// ---- metadata ops ----

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> mf) {
  if (self.sizes().equals(size) && !mf.has_value()) return self;
  // A size with no element leaves the storage as it is, whatever the storage offset
  // (CPU's maybe_resize_storage_cpu returns early for it).
  const bool no_elements = c10::multiply_integers(size) == 0;
  const size_t itemsize = self.dtype().itemsize();
  const size_t need =
      no_elements ? 0 : at::detail::computeStorageNbytesContiguous(size, itemsize, self.storage_offset());
  const size_t old_nbytes = self.storage().nbytes();
  if (need > old_nbytes) resize_device_storage(self.storage(), need);
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  if (mf.has_value() && *mf != at::MemoryFormat::Preserve) self.unsafeGetTensorImpl()->empty_tensor_restride(*mf);
  if (need > old_nbytes && fill_uninitialized_memory()) {
    // Only the elements the storage gained, as CPU's fill_resize_deterministic_.
    const auto itemsize = static_cast<int64_t>(self.dtype().itemsize());
    const int64_t old_numel = static_cast<int64_t>(old_nbytes) / itemsize;
    const int64_t new_numel = static_cast<int64_t>(self.storage().nbytes()) / itemsize;
    if (new_numel > old_numel) {
      at::Tensor grown =
          at::detail::make_tensor<c10::TensorImpl>(c10::Storage(self.storage()), kDeviceKeys, self.dtype());
      const int64_t n = new_numel - old_numel, one = 1;
      grown.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(n), c10::IntArrayRef(one), old_numel);
      fill_empty_deterministic(grown);
    }
  }
  return self;
}

// CPU's set_storage_cpu_: ATen's checkSetStorage (stride length, offset, offset in bounds
// when sizes and strides stay, the same device, with CPU's messages; it then takes the
// storage), then sizes, strides and storage growth. The size checks run before anything
// but the storage changed, and an error puts the old storage back: the tensor stays valid.
at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride) {
  std::vector<int64_t> sizes, strides;
  for (const auto& x : size) sizes.push_back(x.expect_int());
  for (const auto& x : stride) strides.push_back(x.expect_int());
  const int64_t off = offset.expect_int();
  // An empty stride is CPU's "no stride": contiguous (its data() is null).
  const c10::IntArrayRef stride_arg = strides.empty() ? c10::IntArrayRef() : c10::IntArrayRef(strides);
  at::Storage old = self.storage();
  at::native::checkSetStorage(self, std::move(source), off, c10::IntArrayRef(sizes), stride_arg);
  try {
    uint64_t numel = 0;
    TORCH_CHECK(
        !c10::safe_multiplies_u64(sizes, &numel) && numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "numel: integer multiplication overflow");
    if (strides.empty()) {
      strides.resize(sizes.size());
      int64_t st = 1;
      for (size_t i = sizes.size(); i-- > 0;) {
        strides[i] = st;
        st *= std::max<int64_t>(sizes[i], 1);
      }
    }
    const size_t need = at::detail::computeStorageNbytes(sizes, strides, self.dtype().itemsize(), off);
    if (need > self.storage().nbytes()) resize_device_storage(self.storage(), need);
  } catch (...) {
    self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(old));
    throw;
  }
  self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, off);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  std::vector<c10::SymInt> size{c10::SymInt(n)};
  return set_storage_offset(self, std::move(source), c10::SymInt(0), size, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return self;
  TORCH_CHECK(self.dtype() == src.dtype(), "Could not set tensor of type ", self.dtype(), " to a tensor of type ",
              src.dtype());
  return set_storage_offset(self, src.storage(), src.sym_storage_offset(), src.sym_sizes(), src.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  // On self's chip: CPU's set_() keeps the tensor's device (a storage of another chip is refused).
  ChipGuard chip(self.device().index());
  at::Storage st(at::Storage::use_byte_size_t(), 0, device_allocator()->allocate(0), device_allocator(), true);
  std::vector<c10::SymInt> size{c10::SymInt(0)};
  return set_storage_offset(self, std::move(st), c10::SymInt(0), size, {});
}

// Module.to("tpu") keeps Parameter identity (and weight tying) only when CPU
// and tpu tensors are shallow-copy compatible (PRIVATEUSE1_NOTES pitfall 9).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return dense(self) && dense(from);
}

// Tensor.record_stream(s) (CUDA's caching-allocator contract: the memory of a tensor freed
// while work queued on stream s may still use it is not reused before that work ran).
// Every queued op holds a reference to the storages it reads and writes, and a chip's
// queue only holds ops of one stream at a time (recording on another stream runs the
// pending ones first), so a freed storage is never reused under pending work: the call
// only checks its stream, as CUDA's (RuntimeError for a stream of another device type).
void record_stream(at::Tensor& self, c10::Stream s) {
  (void)self;
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: expected a tpu stream, got a stream of device type ", s.device_type());
}

// ---- views: CPU's view kernels on the tpu tensor, same storage ----

// A view op's own CPU kernel, run on the tpu tensor: CPU's view kernels touch
// metadata only (ATen's alias_with_sizes_and_strides / as_strided_tensorimpl make
// the alias over `self`'s storage with `self`'s dispatch keys) and check the
// storage bounds themselves, so the view is CPU's, on the device storage, at
// CPU's cost. view_kernel's meta round trip (a meta tensor, the boxed meta call,
// the alias: ~6 K instructions a view; a transformer step makes hundreds, each
// transpose, expand or slice an as_strided) is left for a view op without a
// CPU kernel. view, as_strided and _reshape_alias, which other views call, are
// unboxed (boxing their size lists cost ~2 K instructions more).
constexpr c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};

at::Tensor view_on_cpu_kernel(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::_ops::view::redispatch(kCpuKeys, self, size);
}

at::Tensor as_strided_on_cpu_kernel(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                    std::optional<c10::SymInt> storage_offset) {
  return at::_ops::as_strided::redispatch(kCpuKeys, self, size, stride, std::move(storage_offset));
}

at::Tensor reshape_alias_on_cpu_kernel(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::_ops::_reshape_alias::redispatch(kCpuKeys, self, size, stride);
}

// The boxed form, for any view op; false when the op has no CPU kernel.
bool run_cpu_view_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) return false;
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

void view_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (run_cpu_view_kernel(op, stack)) return;
  const size_t nargs = op.schema().arguments().size();
  const size_t first = stack->size() - nargs;
  const at::Tensor self = (*stack)[first].toTensor();
  torch::jit::Stack meta(stack->begin() + first, stack->end());
  c10::Storage mst(c10::Storage::use_byte_size_t(), self.storage().nbytes(),
                   c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)), nullptr, false);
  auto m = at::detail::make_tensor<c10::TensorImpl>(std::move(mst), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                    self.dtype());
  m.unsafeGetTensorImpl()->set_sizes_and_strides(self.sizes(), self.strides(), self.storage_offset());
  meta[0] = m;
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.callBoxed(meta);
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : meta) {
    const at::Tensor mv = r.toTensor();
    // The meta kernel does not bound-check against a storage without data.
    const size_t need =
        at::detail::computeStorageNbytes(mv.sizes(), mv.strides(), mv.dtype().itemsize(), mv.storage_offset());
    TORCH_CHECK(mv.numel() == 0 || need <= self.storage().nbytes(), "setStorage: sizes ", mv.sizes(), ", strides ",
                mv.strides(), ", storage offset ", mv.storage_offset(), ", and itemsize ", mv.dtype().itemsize(),
                " requiring a storage size of ", need, " are out of bounds for storage of size ",
                self.storage().nbytes());
    auto alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(self.storage()), kDeviceKeys, mv.dtype());
    alias.unsafeGetTensorImpl()->set_sizes_and_strides(mv.sizes(), mv.strides(), mv.storage_offset());
    if (self.is_conj()) alias._set_conj(true);
    if (self.is_neg()) alias._set_neg(true);
    stack->push_back(std::move(alias));
  }
}

// ---- convolution ----
// ATen's _convolution hands convolutions of backends without their own
// kernels to convolution_overrideable (and its backward); they are recorded
// as aten::convolution / convolution_backward, which the executor runs with
// CPU's kernels and costs as MXU work.

void convolution_kernel(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  static const auto conv = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  static const OpEntry entry{"convolution", PrimKind::kMatmul, 0, kConvolutionFormat | kFloatLoops};
  static const OpPlan* plan = plan_op(conv, entry);
  record_op(conv, entry, *plan, stack);
}

void convolution_backward_kernel(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  static const auto bwd = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  static const OpEntry entry{"convolution_backward", PrimKind::kMatmul, 0, kConvolutionBackwardFormat | kFloatLoops};
  static const OpPlan* plan = plan_op(bwd, entry);
  // (grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask):
  // convolution_backward also takes the bias sizes (its output channels) after weight.
  const size_t first = stack->size() - 10;
  const at::Tensor weight = (*stack)[first + 2].toTensor();
  const bool transposed = (*stack)[first + 6].toBool();
  const int64_t groups = (*stack)[first + 8].toInt();
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3), c10::IValue(std::vector<int64_t>{channels}));
  record_op(bwd, entry, *plan, stack);
}

// ---- the record kernel, one functor per op-table row ----

struct RecordKernel final : c10::OperatorKernel {
  explicit RecordKernel(const OpEntry* e) : entry(e) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    // The plan needs the op's schema, which the kernel first sees here.
    record_op(op, *entry, plan.get(op, *entry), stack);
  }
  const OpEntry* entry;
  PlanOnce plan;
};

// The same, unboxed, for the most common signatures (elementwise ops): the
// caller's tensors are borrowed, not copied onto a boxed stack (BorrowedArgs
// in record.h says why that saves ~0.2 us an op).
inline void push_arg(torch::jit::Stack& stack, BorrowedArgs& borrowed, const at::Tensor& t) {
  borrowed.push(&stack, t);
}
// A plain int or float Scalar (add's alpha, clamp's bounds) as the IValue
// IValue(Scalar) makes of it, built inline: that constructor is out of line and
// tests the symbolic kinds and the sign of an int (a call to
// Scalar::toUInt64) first, and Scalar::toLong / toDouble are calls that test
// every kind again. A non-symbolic Scalar of type double or long holds a
// double or an int64 (data_ptr). Other Scalars (bool, complex, unsigned
// beyond int64, symbolic) go through IValue(Scalar).
inline void push_arg(torch::jit::Stack& stack, BorrowedArgs&, const at::Scalar& s) {
  if (!s.isSymbolic()) {
    const c10::ScalarType t = s.type();
    if (t == c10::ScalarType::Double) {
      stack.emplace_back(*static_cast<const double*>(s.data_ptr()));
      return;
    }
    if (t == c10::ScalarType::Long) {
      stack.emplace_back(*static_cast<const int64_t*>(s.data_ptr()));
      return;
    }
  }
  stack.emplace_back(s);
}

// The unboxed record kernels' argument stacks, kept per thread and nesting
// depth (recording an op may record another: a meta kernel, a lazy clone's
// copy) with their capacity: recording an op allocates no stack (a heap
// allocation an op before). They live in the thread's RecordThread (one TLS
// lookup an op, record.h), which its exit frees; a record after that (a
// thread_local destructor's) or deeper than kStackDepth uses a stack of its own.
class PooledStack {
 public:
  explicit PooledStack(RecordThread& rt) : rt_(rt) {
    stack_ = rt.stacks != nullptr && rt.depth < RecordThread::kStackDepth ? &rt.stacks[rt.depth] : &own_;
    ++rt.depth;
  }
  ~PooledStack() {
    stack_->clear();  // drops the op's arguments and results now, as a local stack did
    --rt_.depth;
  }
  PooledStack(const PooledStack&) = delete;
  PooledStack& operator=(const PooledStack&) = delete;
  torch::jit::Stack& get() { return *stack_; }

 private:
  RecordThread& rt_;  // plain thread data: valid until the thread ends, also after its exit released the stacks
  torch::jit::Stack* stack_;
  torch::jit::Stack own_;
};

struct UnboxedRecordState {
  UnboxedRecordState(const OpEntry* e, c10::OperatorHandle o) : entry(e), op(std::move(o)) {}
  template <class... Args>
  at::Tensor record(Args... args) {
    const OpPlan& p = plan.get(op, *entry);
    RecordThread& rt = record_thread();
    PooledStack pooled(rt);
    torch::jit::Stack& stack = pooled.get();
    stack.reserve(sizeof...(Args));
    BorrowedArgs borrowed;  // declared after the stack: clears its entries before the stack is cleared
    (push_arg(stack, borrowed, args), ...);
    record_op(op, *entry, p, &stack, &borrowed, &rt);
    return std::move(stack.back()).toTensor();
  }
  // An in-place op's record: `self` comes back as the caller's own reference
  // (record_op leaves None in the result's place).
  template <class... Rest>
  void record_inplace(const at::Tensor& self, Rest... rest) {
    const OpPlan& p = plan.get(op, *entry);
    RecordThread& rt = record_thread();
    PooledStack pooled(rt);
    torch::jit::Stack& stack = pooled.get();
    stack.reserve(1 + sizeof...(Rest));
    BorrowedArgs borrowed;  // declared after the stack: clears its entries before the stack is cleared
    push_arg(stack, borrowed, self);
    (push_arg(stack, borrowed, rest), ...);
    record_op(op, *entry, p, &stack, &borrowed, &rt);
  }
  const OpEntry* entry;
  c10::OperatorHandle op;
  PlanOnce plan;
};

template <class... Args>
torch::CppFunction unboxed_kernel(const OpEntry& e, const c10::OperatorHandle& op) {
  auto state = std::make_shared<UnboxedRecordState>(&e, op);
  return torch::CppFunction([state](Args... args) -> at::Tensor { return state->record<Args...>(args...); });
}

// The same for an in-place op (`Tensor(a!) self, ...) -> Tensor(a!)`): `self`
// is borrowed too and returned as the caller's reference. Boxed, the
// dispatcher's stack took a reference on it, which (Python holding it) was a
// GIL round trip to incref its PyObject and another to decref it, ~1.1 K
// instructions of a ~11 K-instruction `a.add_(b)`.
template <class... Rest>
torch::CppFunction unboxed_inplace_kernel(const OpEntry& e, const c10::OperatorHandle& op) {
  auto state = std::make_shared<UnboxedRecordState>(&e, op);
  return torch::CppFunction([state](at::Tensor& self, Rest... rest) -> at::Tensor& {
    state->record_inplace<Rest...>(self, rest...);
    return self;
  });
}

enum class ArgKind { kTensor, kScalar, kOther };

ArgKind arg_kind(const c10::Argument& a) {
  if (a.alias_info() != nullptr) return ArgKind::kOther;
  const auto kind = a.real_type()->kind();
  return kind == c10::TypeKind::TensorType   ? ArgKind::kTensor
         : kind == c10::TypeKind::NumberType ? ArgKind::kScalar
                                             : ArgKind::kOther;
}

// Whether `schema` is an in-place op's: `self` (its first argument, a
// Tensor) written and returned as its one result, no other argument written.
bool is_inplace_self_schema(const c10::FunctionSchema& schema) {
  if (schema.arguments().empty() || schema.returns().size() != 1) return false;
  const c10::Argument& self = schema.arguments()[0];
  const c10::AliasInfo* in = self.alias_info();
  const c10::AliasInfo* out = schema.returns()[0].alias_info();
  return in != nullptr && out != nullptr && in->isWrite() && out->isWrite() && in->beforeSets() == out->beforeSets() &&
         self.real_type()->kind() == c10::TypeKind::TensorType &&
         schema.returns()[0].real_type()->kind() == c10::TypeKind::TensorType;
}

// An unboxed record kernel for `e` when its schema is one of the common
// signatures (Tensor/Scalar arguments; one fresh Tensor result, or `self`
// written in place and returned), else an empty function (the boxed
// RecordKernel is registered instead).
std::optional<torch::CppFunction> unboxed_record_kernel(const OpEntry& e) {
  const std::string name = e.name;
  const size_t dot = name.find('.');
  const auto op = c10::Dispatcher::singleton().findSchema(
      {"aten::" + name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1)});
  if (!op) return std::nullopt;
  const auto& schema = op->schema();
  const bool inplace = is_inplace_self_schema(schema);
  if (schema.is_vararg() || schema.returns().size() != 1 || (schema.returns()[0].alias_info() != nullptr && !inplace) ||
      schema.returns()[0].real_type()->kind() != c10::TypeKind::TensorType)
    return std::nullopt;
  std::string sig;
  for (size_t i = inplace ? 1 : 0; i < schema.arguments().size(); ++i) {
    const ArgKind k = arg_kind(schema.arguments()[i]);
    if (k == ArgKind::kOther) return std::nullopt;
    sig += k == ArgKind::kTensor ? 'T' : 'S';
  }
  using T = const at::Tensor&;
  using S = const at::Scalar&;
  if (inplace) {
    if (sig.empty()) return unboxed_inplace_kernel<>(e, *op);
    if (sig == "T") return unboxed_inplace_kernel<T>(e, *op);
    if (sig == "TS") return unboxed_inplace_kernel<T, S>(e, *op);
    // addcmul_ / addcdiv_ (value) and lerp_.Tensor: the optimizers' per-tensor updates.
    if (sig == "TT") return unboxed_inplace_kernel<T, T>(e, *op);
    if (sig == "TTS") return unboxed_inplace_kernel<T, T, S>(e, *op);
    if (sig == "S") return unboxed_inplace_kernel<S>(e, *op);
    if (sig == "SS") return unboxed_inplace_kernel<S, S>(e, *op);
    return std::nullopt;
  }
  if (sig == "T") return unboxed_kernel<T>(e, *op);
  if (sig == "TT") return unboxed_kernel<T, T>(e, *op);
  if (sig == "TTS") return unboxed_kernel<T, T, S>(e, *op);
  if (sig == "TS") return unboxed_kernel<T, S>(e, *op);
  if (sig == "TSS") return unboxed_kernel<T, S, S>(e, *op);
  if (sig == "TTT") return unboxed_kernel<T, T, T>(e, *op);      // lerp.Tensor, where.self
  if (sig == "TTTS") return unboxed_kernel<T, T, T, S>(e, *op);  // addcmul, addcdiv
  return std::nullopt;
}

bool fallback_enabled() { return env::get_bool("TORCH_TPU_CPU_FALLBACK"); }

void cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  const std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  TORCH_CHECK_NOT_IMPLEMENTED(fallback_enabled(), "The operator '", full,
                              "' is not implemented for the tpu device (no kernel is registered for it). "
                              "Set TORCH_TPU_CPU_FALLBACK=1 to run unsupported ops on the host CPU.");
  static std::mutex mu;
  static auto& warned = *new std::unordered_set<std::string>();  // never destroyed: ops may run at exit
  {
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(full).second)
      TORCH_WARN("The operator '", full, "' has no tpu kernel; it runs on the host CPU (TORCH_TPU_CPU_FALLBACK=1). ",
                 "Each call flushes the queue.");
  }
  debug::count_op("cpu_fallback", full);
  bool random = false;
  for (const auto& a : op.schema().arguments())
    random = random || a.type()->str().find("Generator") != std::string::npos;
  run_eager(op, stack, random, /*fallback=*/true);
}

}  // namespace

static std::unordered_set<std::string>& hand_written_kernels_mut() {
  static std::unordered_set<std::string> names;
  return names;
}

const std::unordered_set<std::string>& hand_written_kernels() { return hand_written_kernels_mut(); }

int64_t register_device_kernels() {
  static std::once_flag once;
  static int64_t count = 0;
  std::call_once(once, [] {
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    // Overloads with a kernel of their own (not a record kernel of the op table);
    // tools/gen_op_table.py SPECIAL must list each of them that its filters keep
    // (tests/record/test_op_table.py checks it through _hand_written_kernels).
    auto& special = hand_written_kernels_mut();
    auto impl = [&](const char* name, torch::CppFunction fn) {
      lib.impl(name, std::move(fn));
      special.insert(name);
    };
    impl("empty.memory_format", torch::CppFunction(TORCH_FN(empty_memory_format)));
    impl("empty_strided", torch::CppFunction(TORCH_FN(empty_strided)));
    impl("_efficientzerotensor", torch::CppFunction(TORCH_FN(efficient_zero_tensor)));
    impl("_copy_from", torch::CppFunction(TORCH_FN(copy_from)));
    impl("_copy_from_and_resize", torch::CppFunction(TORCH_FN(copy_from_and_resize)));
    impl("_to_copy", torch::CppFunction(TORCH_FN(to_copy)));
    impl("_local_scalar_dense", torch::CppFunction(TORCH_FN(local_scalar_dense)));
    impl("resize_", torch::CppFunction(TORCH_FN(resize_)));
    impl("set_.source_Storage", torch::CppFunction(TORCH_FN(set_storage)));
    impl("set_.source_Storage_storage_offset", torch::CppFunction(TORCH_FN(set_storage_offset)));
    impl("set_.source_Tensor", torch::CppFunction(TORCH_FN(set_tensor)));
    impl("set_", torch::CppFunction(TORCH_FN(set_empty)));
    impl("_has_compatible_shallow_copy_type", torch::CppFunction(TORCH_FN(has_compatible_shallow_copy_type)));
    impl("_lazy_clone", torch::CppFunction(TORCH_FN(lazy_clone)));
    impl("record_stream", torch::CppFunction(TORCH_FN(record_stream)));
    impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution_kernel>());
    impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_kernel>());
    impl("_thnn_fused_lstm_cell", torch::CppFunction(TORCH_FN(fused_lstm_cell)));
    impl("_thnn_fused_lstm_cell_backward_impl", torch::CppFunction(TORCH_FN(fused_lstm_cell_backward)));
    impl("_thnn_fused_gru_cell", torch::CppFunction(TORCH_FN(fused_gru_cell)));
    impl("_thnn_fused_gru_cell_backward", torch::CppFunction(TORCH_FN(fused_gru_cell_backward)));
    impl("view", torch::CppFunction(TORCH_FN(view_on_cpu_kernel)));
    impl("as_strided", torch::CppFunction(TORCH_FN(as_strided_on_cpu_kernel)));
    impl("_reshape_alias", torch::CppFunction(TORCH_FN(reshape_alias_on_cpu_kernel)));
    for (const auto& name : register_model_kernels(lib)) special.insert(name);
    count = static_cast<int64_t>(special.size());
    for (const auto& e : op_table()) {
      if (special.count(e.name)) continue;
      if (register_model_row_kernel(lib, e)) {
        // integer histc: model_kernels.cpp
      } else if (e.kind == PrimKind::kView) {
        lib.impl(e.name, torch::CppFunction::makeFromBoxedFunction<&view_kernel>());
      } else if (auto unboxed = unboxed_record_kernel(e)) {
        lib.impl(e.name, std::move(*unboxed));
      } else {
        lib.impl(e.name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<RecordKernel>(&e)));
      }
      ++count;
    }
    register_cpu_branch_kernels();
    register_quantized_host_kernels();
    register_nested_host_kernels();
    static torch::Library fb(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    fb.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
    // Pitfall 4: _copy_from is not a Conjugate/Negative fallthrough upstream.
    static torch::Library conj(torch::Library::IMPL, "aten", c10::DispatchKey::Conjugate, __FILE__, __LINE__);
    conj.impl("_copy_from", torch::CppFunction::makeFallthrough());
    conj.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
    static torch::Library neg(torch::Library::IMPL, "aten", c10::DispatchKey::Negative, __FILE__, __LINE__);
    neg.impl("_copy_from", torch::CppFunction::makeFallthrough());
    neg.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  });
  return count;
}

}  // namespace tpu_eager
