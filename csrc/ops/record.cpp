// The generic record kernel: meta inference, one Node, fresh outputs.
#include "ops/record.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/result_type_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/irange.h>

#include "device/device.h"
#include "device/fork.h"
#include "device/host_share.h"
#include "executors/host_runtime.h"
#include "executors/executor.h"
#include "jit/disk_cache.h"
#include "lazy/debug_report.h"
#include "lazy/queue.h"
#include "ops/cpu_meta.h"
#include "ops/cpu_probe.h"
#include "ops/layout_kernels.h"
#include "ops/memory_format.h"
#include "ops/shape_rules.h"
#include "ops/meta_outcome.h"
#include "ops/lazy_clone.h"
#include "ops/out_geometry.h"
#include "ops/scalar_checks.h"
#include "ops/stack_tensors.h"

namespace tpu_eager {
namespace {

const c10::DispatchKeySet kAutograd = c10::autograd_dispatch_keyset_with_ADInplaceOrView;

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// Calls f(tensor) for each tensor among the written arguments (bit i of
// `writes`: argument i, i < 64) of the op's arguments at stack[first, first + n).
template <typename F>
void for_each_written_tensor(uint64_t writes, torch::jit::Stack& stack, size_t first, size_t n, F&& f) {
  for (uint64_t w = writes; w != 0; w &= w - 1) {
    const auto i = static_cast<size_t>(__builtin_ctzll(w));
    if (i >= n) break;
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      f(v.toTensor());
    } else if (v.isList() && v.isTensorList()) {  // isList inline, isTensorList a call
      const auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) f(list.get(j));
    }
  }
}

// Whether the op writes a "tpu" argument that is a lazy clone (ops/lazy_clone.h).
bool writes_lazy_clone(uint64_t writes, torch::jit::Stack& stack, size_t first, size_t n) {
  bool any = false;
  for_each_written_tensor(writes, stack, first, n,
                          [&](const at::Tensor& t) { any = any || (is_tpu(t) && needs_prepare_write(t)); });
  return any;
}

// The arguments an op writes on this call (plan.writes): batch norm in eval
// mode (training, argument 5, false) leaves its running statistics
// (arguments 3 and 4) as they are, so CPU does not make lazy clones of them
// copy (kEvalEmptySaveStats marks the ops).
uint64_t writes_of_call(const OpPlan& plan, torch::jit::Stack& stack, size_t first) {
  if ((plan.traits & kEvalEmptySaveStats) && stack[first + 5].isBool() && !stack[first + 5].toBool())
    return plan.writes & ~((uint64_t{1} << 3) | (uint64_t{1} << 4));
  return plan.writes;
}

// Gives every lazy clone the op writes its own bytes (a copy recorded before the op).
void prepare_writes(uint64_t writes, torch::jit::Stack& stack, size_t first, size_t n) {
  for_each_written_tensor(writes, stack, first, n, [&](const at::Tensor& t) {
    if (is_tpu(t)) prepare_write(t);
  });
}

// Batch norm's out= forms in eval mode: save_mean and save_invstd (arguments 9 and 10,
// returns 1 and 2) keep the geometry they were given, as CPU's eval path neither resizes
// nor restrides them; it reads them through a 1-D accessor, whose error a tensor of
// another rank gets here at the call.
void keep_given_save_stats(const torch::jit::Stack& stack, size_t first, MetaOutcome& outcome) {
  for (auto& [arg, g] : outcome.written) {
    if (arg != 9 && arg != 10) continue;
    const size_t i = first + static_cast<size_t>(arg);
    if (i >= stack.size() || !stack[i].isTensor() || !g.defined) continue;
    const at::Tensor& t = stack[i].toTensor();
    TORCH_CHECK(t.dim() == 1, "TensorAccessor expected 1 dims but tensor has ", t.dim());
    g.sizes = t.sizes().vec();
    g.strides = t.strides().vec();
    g.offset = t.storage_offset();
    const size_t k = static_cast<size_t>(arg) - 8;
    if (k < outcome.returns.size())
      for (auto& r : outcome.returns[k]) r = g;
  }
}

// Arguments the schema marks as written (Tensor(a!)), as a bit mask.
uint64_t written_args(const c10::FunctionSchema& s) {
  uint64_t mask = 0;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* a = s.arguments()[i].alias_info();
    if (a && a->isWrite()) mask |= uint64_t(1) << i;
  }
  return mask;
}

// For a return with alias info, the argument it aliases (or -1).
int aliased_arg(const c10::FunctionSchema& s, size_t ret) {
  const auto* ra = s.returns()[ret].alias_info();
  if (!ra) return -1;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* a = s.arguments()[i].alias_info();
    if (a && a->beforeSets() == ra->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// A tensor of `t`'s dtype and geometry (sizes, strides, offset) over
// `storage`, dispatched to `key`: `t`'s twin on another device.
at::Tensor twin_over(const at::Tensor& t, const c10::Storage& storage, c10::DispatchKey key) {
  at::Tensor twin =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), t.dtype());
  twin.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return twin;
}

at::Tensor make_meta(const at::Tensor& t, std::unordered_map<const void*, c10::Storage>& storages) {
  auto key = t.storage().unsafeGetStorageImpl();
  auto it = storages.find(key);
  if (it == storages.end()) {
    c10::Storage st(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                    c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)), c10::GetAllocator(c10::DeviceType::Meta),
                    /*resizable=*/true);
    it = storages.emplace(key, std::move(st)).first;
  }
  at::Tensor m = twin_over(t, it->second, c10::DispatchKey::Meta);
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

// A fresh result of a recorded op (sizes and strides from a meta kernel:
// valid, non-negative). Built directly, as at::empty_strided would for the
// device without its checks and dispatch (~300 instructions an op). Its
// storage remembers its StorageImpl, so a flush may make the CPU kernel's
// result its memory (adopt_host_buffer).
at::Tensor fresh_tpu(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype) {
  const caffe2::TypeMeta meta = c10::scalarTypeToTypeMeta(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, meta.itemsize());
  c10::Allocator* alloc = device_allocator();
  c10::DataPtr data = alloc->allocate(nbytes);
  auto* ds = static_cast<DeferredStorage*>(data.get_context());
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), alloc,
                                                    /*resizable=*/true);
  ds->impl.emplace(impl);
  static const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(impl)), keys, meta);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

// Gives a tpu tensor the geometry the meta kernel gave its meta twin (out=
// arguments resized by the op), growing its storage when needed. Returns
// whether anything changed (an in-place op's tensor keeps its geometry).
bool adopt_geometry(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  if (t.sizes().equals(sizes) && t.strides().equals(strides) && t.storage_offset() == offset) return false;
  const size_t need = at::detail::computeStorageNbytes(sizes, strides, t.dtype().itemsize(), offset);
  if (need > t.storage().nbytes()) resize_device_storage(t.storage(), need);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return true;
}

bool has_meta_kernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::Meta) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

// True when a tensor of `all` whose argument `writes` marks has internal
// overlap or overlaps another tensor of `all` (the same tensor again only when
// `same_tensor_overlaps`).
using ArgTensors = c10::ArrayRef<std::pair<int, c10::TensorImpl*>>;

// True when get_overlap_status(a, b) of two different tensors can only say No or
// TooHard (neither counts as an overlap here): other StorageImpls, whose bytes
// alias only when their DataPtrs have one deleter and one context
// (c10::isSharedStorageAlias). Inline: a foreach op checks every pair of each
// index, and get_overlap_status is a call (docs/performance.md, fe20).
bool storages_apart(const c10::TensorImpl* a, const c10::TensorImpl* b) {
  c10::StorageImpl* sa = a->unsafe_storage().unsafeGetStorageImpl();
  c10::StorageImpl* sb = b->unsafe_storage().unsafeGetStorageImpl();
  if (sa == nullptr || sb == nullptr) return true;
  if (sa == sb) return false;
  const c10::DataPtr& da = sa->_mutable_data_ptr_no_checks();  // no access check: only compared
  const c10::DataPtr& db = sb->_mutable_data_ptr_no_checks();
  return da.get_deleter() != db.get_deleter() || da.get_context() != db.get_context();
}

bool written_overlaps(uint64_t writes, ArgTensors all, bool same_tensor_overlaps) {
  for (const auto& [warg, w] : all) {
    if (!((writes >> warg) & 1)) continue;
    // A non-overlapping and dense tensor is has_internal_overlap's first "No": inline, no call.
    if (!w->is_non_overlapping_and_dense() && at::has_internal_overlap(w) == at::MemOverlap::Yes) return true;
    for (const auto& [rarg, r] : all) {
      if (r == w) {
        if (same_tensor_overlaps && rarg != warg) return true;
        continue;
      }
      if (storages_apart(w, r)) continue;
      const auto st = at::get_overlap_status(w, r);
      if (st == at::MemOverlapStatus::Partial || st == at::MemOverlapStatus::Full) return true;
    }
  }
  return false;
}

// True when a written tensor has internal overlap (expand) or overlaps another
// argument. CPU kernels differ in what they allow there (fill_ and index_put_
// accept it, add_ and copy_ raise), so such calls run eagerly through the CPU
// kernel, which raises or computes exactly as CPU does. They are rare.
// The same tensor passed again (ind.index_fill_(0, ind, 0), ind.put_(ind, v))
// counts too for data-movement ops, whose CPU kernels reject it
// (assert_no_overlap); TensorIterator's elementwise kernels accept it (x.mul_(x)).
bool writes_overlapping_memory(size_t nargs, uint64_t writes, torch::jit::Stack& stack, size_t first,
                               bool same_tensor_overlaps) {
  if (writes == 0) return false;
  // Inline: every in-place / out= op is checked, and two heap vectors were ~4 allocations of each call.
  // TensorImpl pointers, not tensors (the stack's entries and lists hold them):
  // a reference taken on an unboxed kernel's borrowed `self` costs a GIL round trip.
  c10::SmallVector<std::pair<int, c10::TensorImpl*>, 6> all;
  for_each_tensor(stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (is_tpu(t)) all.emplace_back(arg, t.unsafeGetTensorImpl());
  });
  return written_overlaps(writes, all, same_tensor_overlaps);
}

// writes_overlapping_memory for a foreach op that the flush expands per tensor
// (kExpandsPerTensor): the tensors of each index, with the op's tensor (not list)
// arguments, are checked as the per-tensor op at that index checks its own; tensors of
// different indices meet in CPU's order in the expansion, as in CPU's loop. True too for
// what CPU's loop must decide (run_eager then runs it): lists of different lengths, a
// tensor that is not on the device (a host scalar, another device's tensor).
bool foreach_writes_overlap(size_t nargs, uint64_t writes, torch::jit::Stack& stack, size_t first) {
  c10::SmallVector<c10::IValue*, 4> lists;
  c10::SmallVector<std::pair<int, c10::TensorImpl*>, 2> single;
  for (size_t a = 0; a < nargs; ++a) {
    c10::IValue& v = stack[first + a];
    if (v.isTensor()) {
      if (!is_tpu(v.toTensor())) return true;
      single.emplace_back(static_cast<int>(a), v.toTensor().unsafeGetTensorImpl());
    } else if (v.isList() && v.isTensorList()) {
      lists.push_back(&v);
    }
  }
  if (lists.empty()) return false;
  const size_t n = lists[0]->toListRef().size();
  for (const c10::IValue* l : lists)
    if (l->toListRef().size() != n) return true;
  c10::SmallVector<std::pair<int, c10::TensorImpl*>, 6> all;
  for (size_t i = 0; i < n; ++i) {
    all.assign(single.begin(), single.end());
    for (const c10::IValue* l : lists) {
      const at::Tensor& t = l->toListRef()[i].toTensor();
      if (!is_tpu(t)) return true;  // CPU's loop decides (a scalar on the host, another device)
      all.emplace_back(static_cast<int>(l - &stack[first]), t.unsafeGetTensorImpl());
    }
    if (written_overlaps(writes, all, /*same_tensor_overlaps=*/false)) return true;
  }
  return false;
}

// Whether an in-place binary op's result type (CPU's type promotion of self
// and other) cannot be cast to self's dtype.
bool in_place_result_cannot_cast(const c10::IValue& self, const c10::IValue& other) {
  if (!self.isTensor() || !self.toTensor().defined()) return false;
  const at::Tensor& s = self.toTensor();
  at::ScalarType result;
  if (other.isTensor() && other.toTensor().defined()) {
    result = at::native::result_type(s, other.toTensor());
  } else if (other.isScalar()) {
    result = at::native::result_type(s, other.toScalar());
  } else {
    return false;
  }
  return !c10::canCast(result, s.scalar_type());
}

// Whether CPU's index_put_ (self[indices] = values) must decide this call:
// the checks its kernel makes before it writes, which the meta kernel skips
// (too many indices, index dtypes, values of another dtype than self — "Index
// put requires the source and destination dtypes match" — values that do not
// broadcast to the indexed shape, "shape mismatch: value tensor of shape ...",
// a 0-dim self indexed by nothing), plus uint8 masks (CPU's deprecation
// warning). CPU raises there, or (masked_fill for a one-element value with
// another dtype) computes. A bool mask makes the indexed shape depend on the
// mask's values: then only a one-element value (it broadcasts to any shape)
// is recorded.
bool index_put_needs_cpu(const c10::IValue& self_v, const c10::IValue& indices_v, const c10::IValue& values_v) {
  if (!self_v.isTensor() || !values_v.isTensor() || !indices_v.isList()) return false;
  const at::Tensor& self = self_v.toTensor();
  const at::Tensor& values = values_v.toTensor();
  if (values.scalar_type() != self.scalar_type()) return true;
  const auto list = indices_v.toList();
  if (static_cast<int64_t>(list.size()) > self.dim()) return true;
  std::vector<int64_t> indexed;  // broadcast shape of the index tensors
  int64_t first_dim = -1, last_dim = -1, dims_used = 0;
  bool adjacent = true, mask = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue e = list.get(i);
    if (!e.isTensor() || !e.toTensor().defined()) {
      ++dims_used;
      continue;
    }
    const at::Tensor& ix = e.toTensor();
    const auto dt = ix.scalar_type();
    if (dt == at::kByte) return true;
    if (dt == at::kBool) {
      mask = true;
      dims_used += ix.dim();
      continue;
    }
    if (dt != at::kLong && dt != at::kInt) return true;
    if (last_dim >= 0 && last_dim != dims_used - 1) adjacent = false;
    if (first_dim < 0) first_dim = dims_used;
    last_dim = dims_used;
    ++dims_used;
    auto b = at::infer_size_dimvector(indexed, ix.sizes());  // throws for shapes that do not broadcast
    indexed.assign(b.begin(), b.end());
  }
  if (dims_used > self.dim()) return true;
  if (mask) return values.numel() != 1;
  // The indexed shape: the index shape in place of the indexed dims when they
  // are adjacent, else in front of the dims left.
  std::vector<int64_t> shape;
  if (first_dim < 0) {
    shape = self.sizes().vec();
  } else if (adjacent) {
    shape.assign(self.sizes().begin(), self.sizes().begin() + first_dim);
    shape.insert(shape.end(), indexed.begin(), indexed.end());
    shape.insert(shape.end(), self.sizes().begin() + last_dim + 1, self.sizes().end());
  } else {
    shape = indexed;
    for (size_t i = 0; i < static_cast<size_t>(self.dim()); ++i) {
      const bool is_indexed = i < list.size() && list.get(i).isTensor() && list.get(i).toTensor().defined();
      if (!is_indexed) shape.push_back(self.size(static_cast<int64_t>(i)));
    }
  }
  return !at::is_expandable_to(values.sizes(), shape);
}

// The values of `t` when the host already holds them (no queued op reads or
// writes its storage, no failed op left an error): CPU tensors, and device
// tensors written from the host (`torch.tensor([...], device="tpu")`).
// Undefined otherwise: reading them would need a flush.
at::Tensor values_on_host(const at::Tensor& t) {
  if (!is_tpu(t)) return t;
  DeferredStorage* s = deferred_storage_of(t);
  if (s->error || storage_has_pending(s)) return at::Tensor();
  return host::view_over(host::wrap_device_buffer(s), make_ref(t));
}

// Whether a value of the host-held integer tensor `v` (non-empty) lies outside [lo, hi),
// read by a min/max loop over its elements (aminmax for the unsigned types wider than a
// byte). The index checks below run on every embedding lookup and advanced-indexing call
// with host-held indices, where aminmax and its two item() calls were dispatched ops, a
// reduction's TensorIterator and three fresh tensors. Call with autograd excluded.
bool host_values_outside(const at::Tensor& v, int64_t lo, int64_t hi) {
  const at::ScalarType t = v.scalar_type();
  if (t != at::kLong && t != at::kInt && t != at::kShort && t != at::kChar && t != at::kByte) {
    const auto mm = at::aminmax(v);
    return std::get<0>(mm).item<int64_t>() < lo || std::get<1>(mm).item<int64_t>() >= hi;
  }
  const at::Tensor c = v.is_contiguous() ? v : v.contiguous();
  int64_t mn = std::numeric_limits<int64_t>::max();
  int64_t mx = std::numeric_limits<int64_t>::min();
  AT_DISPATCH_INTEGRAL_TYPES(t, "host_values_outside", [&] {
    const scalar_t* p = c.const_data_ptr<scalar_t>();
    for (int64_t i = 0, n = c.numel(); i < n; ++i) {
      const auto x = static_cast<int64_t>(p[i]);
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
  });
  return mn < lo || mx >= hi;
}

// Advanced indexing's bounds check (self[indices], self[indices] = v), made
// at the call when the integer index tensors' values are already on the host
// (indices built from Python lists or copied from the host): CPU's kernel
// checks every index before it reads or writes, and raises IndexError "index
// 7 is out of bounds for dimension 0 with size 6" — for the first element in
// the indices' broadcast order, the dimension counted among the indexed ones.
// Indices computed on the device are checked by CPU's kernel at the flush.
void check_index_bounds(const at::Tensor& self, const c10::IValue& indices_v) {
  if (!indices_v.isList()) return;
  const auto list = indices_v.toList();
  std::vector<at::Tensor> idx;
  std::vector<int64_t> sizes;
  int64_t dim = 0;
  for (size_t i = 0; i < list.size(); ++i, ++dim) {
    const c10::IValue e = list.get(i);
    if (!e.isTensor() || !e.toTensor().defined()) continue;
    const at::Tensor& t = e.toTensor();
    if (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt) return;  // masks: their expansion needs data
    if (dim >= self.dim()) return;
    at::Tensor v = values_on_host(t);
    if (!v.defined()) return;
    idx.push_back(v);
    sizes.push_back(self.size(dim));
  }
  if (idx.empty()) return;
  at::DimVector shape;
  for (const auto& v : idx) shape = at::infer_size_dimvector(shape, v.sizes());
  c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
  at::Tensor bad_any;
  std::vector<at::Tensor> bad(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j].numel() == 0) continue;
    if (!host_values_outside(idx[j], -sizes[j], sizes[j])) continue;
    bad[j] = idx[j].lt(-sizes[j]).logical_or_(idx[j].ge(sizes[j])).expand(shape).reshape(-1);
    bad_any = bad_any.defined() ? bad_any.logical_or(bad[j]) : bad[j];
  }
  if (!bad_any.defined()) return;
  const int64_t pos = bad_any.nonzero().min().item<int64_t>();
  for (size_t j = 0; j < idx.size(); ++j) {
    if (!bad[j].defined() || !bad[j][pos].item<bool>()) continue;
    const int64_t value = idx[j].expand(shape).reshape(-1)[pos].item<int64_t>();
    TORCH_CHECK_INDEX(false, "index ", value, " is out of bounds for dimension ", j, " with size ", sizes[j]);
  }
}

// index_select / index_add_ / index_copy_ / index_fill_ / index_reduce_ / scatter* /
// gather / put_ / take with an `index` whose values the host holds: CPU's kernel checks
// every index at the call (IndexError or RuntimeError, each op its own message; put_ and
// take, index_fill_ wrap negative ones), where a queued op would raise at the flush and a
// write into an empty tensor would not run at all. True when an index lies outside
// [0, size of self along dim) (self's numel without a dim): the call then runs CPU's kernel,
// which raises or computes exactly as CPU does. Indices computed on the device are checked
// by CPU's kernel at the flush.
bool index_values_need_cpu(const OpPlan& plan, const torch::jit::Stack& stack, size_t first) {
  const c10::IValue& self_v = stack[first];
  const c10::IValue& index_v = stack[first + plan.index_arg];
  if (!self_v.isTensor() || !index_v.isTensor()) return false;
  const at::Tensor& self = self_v.toTensor();
  const at::Tensor& index = index_v.toTensor();
  if (!index.defined() || index.numel() == 0 || !c10::isIntegralType(index.scalar_type(), /*includeBool=*/false))
    return false;
  int64_t bound = self.numel();
  if (plan.dim_arg >= 0) {
    const c10::IValue& dim = stack[first + plan.dim_arg];
    if (!dim.isInt()) return false;  // a named dim: the meta kernel resolves it
    const int64_t d = dim.toInt();
    const int64_t nd = std::max<int64_t>(self.dim(), 1);
    if (d < -nd || d >= nd) return true;  // CPU's own "Dimension out of range"
    bound = self.dim() == 0 ? 1 : self.size(d < 0 ? d + nd : d);
  }
  const at::Tensor v = values_on_host(index);
  if (!v.defined()) return false;
  c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
  return host_values_outside(v, 0, bound);
}

// nll_loss(2d)_forward / _backward / multi_margin_loss with a class `target` whose values the
// host holds (labels copied from the host, the usual training loop): CPU's kernel checks every
// target that is not ignore_index against the class count at the call ("Target 5 is out of
// bounds.", IndexError; multi_margin_loss: "target out of range"), where a queued op would
// raise at the flush. True when such a target lies outside [0, classes): the call then runs
// CPU's kernel, which raises there. Targets computed on the device are checked at the flush.
bool target_values_need_cpu(const OpPlan& plan, const torch::jit::Stack& stack, size_t first) {
  const c10::IValue& self_v = stack[first + plan.self_arg];
  const c10::IValue& target_v = stack[first + plan.target_arg];
  if (!self_v.isTensor() || !target_v.isTensor()) return false;
  const at::Tensor& self = self_v.toTensor();
  const at::Tensor& target = target_v.toTensor();
  if (!self.defined() || !target.defined() || target.numel() == 0 ||
      !c10::isIntegralType(target.scalar_type(), /*includeBool=*/false))
    return false;
  const int64_t classes = self.dim() == 0 ? 1 : self.size(self.dim() == 1 ? 0 : 1);
  at::Tensor v = values_on_host(target);
  if (!v.defined()) return false;
  const c10::IValue& ignore_v = plan.ignore_index_arg >= 0 ? stack[first + plan.ignore_index_arg] : c10::IValue();
  const bool has_ignore = ignore_v.isInt();
  const int64_t ignore = has_ignore ? ignore_v.toInt() : 0;
  c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
  v = v.contiguous();
  bool bad = false;
  // A loop over the host's values, not aminmax: this runs on every training step's loss.
  AT_DISPATCH_INTEGRAL_TYPES(v.scalar_type(), "target_values_need_cpu", [&] {
    const scalar_t* p = v.const_data_ptr<scalar_t>();
    for (int64_t i = 0, n = v.numel(); i < n && !bad; ++i) {
      const auto t = static_cast<int64_t>(p[i]);
      bad = (t < 0 || t >= classes) && !(has_ignore && t == ignore);
    }
  });
  return bad;
}

// fmod / remainder / floor_divide / div(rounding_mode=...) (kCheckIntegerDivisor): CPU's
// kernel raises "ZeroDivisionError" for a zero divisor (argument 1) when its operands promote
// to an integer dtype (bool: "not implemented", raised by the dtype probe). kZeroAtCall: the
// divisor is a Scalar zero, or a tensor whose values the host holds and which holds a zero:
// CPU's kernel runs at the call and raises there. kDeferred: the divisor's values are still
// being computed on the device: the node checks them when it runs (Node::checks_values).
enum class DivisorCheck { kNone, kZeroAtCall, kDeferred };

// Type promotion's categories, ordered: bool < integer < floating (complex counts as floating
// here); -1 for an argument that is neither a tensor nor a number.
constexpr int kIntegerCategory = 1;
int promotion_category(const c10::IValue& v) {
  if (v.isTensor()) {
    if (!v.toTensor().defined()) return -1;
    const at::ScalarType t = v.toTensor().scalar_type();
    return t == at::kBool ? 0 : c10::isIntegralType(t, /*includeBool=*/false) ? kIntegerCategory : 2;
  }
  if (v.isBool()) return 0;
  if (v.isInt()) return kIntegerCategory;
  return v.isDouble() || v.isComplexDouble() ? 2 : -1;
}

DivisorCheck integer_divisor_check(const torch::jit::Stack& stack, size_t first, size_t nargs) {
  const c10::IValue& a = stack[first];
  const c10::IValue& b = stack[first + 1];
  // div's rounding_mode (argument 2; the others have no None there): None divides in floating point.
  if (nargs > 2 && stack[first + 2].isNone()) return DivisorCheck::kNone;
  // The operands promote to an integer dtype when the higher of their type categories is
  // integer (a floating or complex operand of any dim, wrapped numbers too, makes it floating;
  // two bools stay bool). Read from the dtypes: at::result_type wraps a Scalar in a tensor.
  if (std::max(promotion_category(a), promotion_category(b)) != kIntegerCategory) return DivisorCheck::kNone;
  if (b.isScalar()) {
    const c10::Scalar d = b.toScalar();
    const bool zero = d.isBoolean() ? !d.toBool() : d.equal(0);  // Scalar::equal: a bool equals no number
    return zero ? DivisorCheck::kZeroAtCall : DivisorCheck::kNone;
  }
  const at::Tensor& divisor = b.toTensor();
  if (divisor.numel() == 0) return DivisorCheck::kNone;
  const at::Tensor v = values_on_host(divisor);
  if (!v.defined()) return DivisorCheck::kDeferred;
  c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
  return v.eq(0).any().item<bool>() ? DivisorCheck::kZeroAtCall : DivisorCheck::kNone;
}

// normal(mean, std) with a tensor std: CPU's and CUDA's kernels check every
// element of std before they draw (CUDA reads the minimum back: a sync), and
// raise "normal expects all elements of std >= 0.0" at the call. The meta
// kernels check only std's dtype (complex) and shapes. When std's values are not
// on the host, its minimum is computed on the device and read, as CUDA does.
void check_normal_std(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() != "std" || !stack[first + i].isTensor()) continue;
    const at::Tensor& std = stack[first + i].toTensor();
    if (!std.defined() || std.numel() == 0 || std.is_complex()) return;  // complex: the meta kernel's error
    c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
    at::Tensor v = values_on_host(std);
    const bool ok = (v.defined() ? v : std).min().ge(0).item<bool>();
    TORCH_CHECK(ok, "normal expects all elements of std >= 0.0");
  }
}

// Advanced indexing (aten::index) with index tensors on another device than
// self: CUDA's (and CPU's) meta function accepts only indices on the CPU or on
// self's device, with its own message ("indices should be either on cpu or on
// the same device as the indexed tensor (cpu)"), also when self is a CPU tensor
// and the dispatcher chose this kernel for a tpu index.
void check_index_devices(torch::jit::Stack& stack, size_t first) {
  if (!stack[first].isTensor() || !stack[first + 1].isList()) return;
  const c10::Device dev = stack[first].toTensor().device();
  const auto list = stack[first + 1].toList();
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue e = list.get(i);
    if (!e.isTensor() || !e.toTensor().defined()) continue;
    const c10::Device d = e.toTensor().device();
    TORCH_CHECK(d.is_cpu() || d == dev, "indices should be either on ", c10::kCPU,
                " or on the same device as the indexed tensor (", dev, ")");
  }
}

// Checks CPU kernels make at call time that the meta kernels do not. Such
// calls run eagerly, so CPU's own kernel raises its error at the call.
// (Only checks that need no data belong here.)
// var / std (self, dim, correction, ...): whether correction >= the number of elements each
// result reduces (CPU's kernel warns then). False when dim is not an int list or None (names).
bool degrees_of_freedom_not_positive(const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& self = stack[first].toTensor();
  const c10::IValue& dim = stack[first + 1];
  const c10::IValue& correction = stack[first + 2];
  int64_t n = 1;
  if (dim.isNone() || (dim.isIntList() && dim.toDimVector().empty())) {
    n = self.numel();
  } else if (dim.isIntList()) {
    for (int64_t d : dim.toDimVector()) {
      if (d < -std::max<int64_t>(self.dim(), 1) || d >= std::max<int64_t>(self.dim(), 1)) return true;  // CPU raises
      if (self.dim() > 0) n *= self.size(d < 0 ? d + self.dim() : d);
    }
  } else {
    return false;
  }
  const double c = correction.isScalar() ? correction.toScalar().toDouble() : 1.0;
  return static_cast<double>(n) - c <= 0;
}

// gelu / gelu_ / gelu.out / gelu_backward (kCheckGeluApproximate): CPU's kernel parses its
// one string argument, `approximate`, when it runs ("approximate argument must be either none
// or tanh."); the structured meta function never reads it.
bool gelu_approximate_known(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    if (!stack[i].isString()) continue;
    const std::string& a = stack[i].toStringRef();
    return a == "none" || a == "tanh";
  }
  return true;
}

// multinomial(self, num_samples, replacement, *, generator, out) (kCheckMultinomial): the
// checks CPU's kernel makes before it draws, on metadata only. The meta kernel checks the
// rank alone, so these calls run CPU's kernel, which raises its own error. (Probabilities
// that are negative, infinite or sum to zero are values: CPU's kernel checks them when the
// node runs, OpTrait kChecksValues.)
bool multinomial_args_rejected(const torch::jit::Stack& stack, size_t first) {
  const at::Tensor& self = stack[first].toTensor();
  if (self.dim() < 1 || self.dim() > 2 || !at::isFloatingType(self.scalar_type())) return true;
  const int64_t samples = stack[first + 1].toInt();
  const int64_t categories = self.size(-1);
  constexpr int64_t kFloatExactIntegers = int64_t{1} << 24;  // CPU: FLOAT32_MAX_CONSECUTIVE_INT
  if (samples <= 0 || (!stack[first + 2].toBool() && samples > categories) || categories > kFloatExactIntegers)
    return true;
  const size_t out = first + 4;
  return out < stack.size() && stack[out].isTensor() && stack[out].toTensor().scalar_type() != at::kLong;
}

// `divisor`: the integer divisor check's verdict (kCheckIntegerDivisor), made first so that
// the node (when the call records one) takes it from here instead of checking again.
bool cpu_checks_at_call_time(const OpPlan& plan, torch::jit::Stack& stack, size_t first, DivisorCheck* divisor) {
  const uint64_t check = plan.traits;
  if (check & kCheckIntegerDivisor) {
    *divisor = integer_divisor_check(stack, first, stack.size() - first);
    if (*divisor == DivisorCheck::kZeroAtCall) return true;
  }
  // pow(int tensor, negative int scalar): "Integers to negative integer powers are not allowed."
  if (check & kCheckPowTensorScalar) {
    const c10::IValue& base = stack[first];
    const c10::IValue& exp = stack[first + 1];
    return base.isTensor() && c10::isIntegralType(base.toTensor().scalar_type(), /*includeBool=*/true) &&
           exp.isScalar() && exp.toScalar().isIntegral(false) && exp.toScalar().toLong() < 0;
  }
  if (check & kCheckPowScalarInPlace) {
    const c10::IValue& base = stack[first];
    const c10::IValue& exp = stack[first + 1];
    return c10::isIntegralType(base.toTensor().scalar_type(), true) && exp.toScalar().isIntegral(false) &&
           exp.toScalar().toLong() < 0;
  }
  // sub/rsub with a bool operand: CPU's sub_check rejects it at the call, but
  // the meta kernel lets a Python bool through (a Scalar there, not a bool tensor).
  if (check & kCheckSubBool) {
    auto is_bool = [](const c10::IValue& v) {
      return v.isBool() || (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kBool);
    };
    if (is_bool(stack[first]) || is_bool(stack[first + 1])) return true;
  }
  // add_ / sub_ / mul_ whose result type cannot be cast to self's dtype
  // (int32.mul_(0.5), float16.add_(1j)): CPU's TensorIterator raises at the
  // call ("result type Float can't be cast to the desired output type Int");
  // the meta kernels of torch 2.13 let mul_ and a complex add_ / sub_ through.
  if ((check & kCheckInPlaceCast) && in_place_result_cannot_cast(stack[first], stack[first + 1])) return true;
  // nansum: CPU's make_reduction reads an empty dim list as every dim and refuses more than
  // 64 dims; torch 2.13's Python meta kernel reads it as no dim and has no limit.
  if ((check & kCheckReductionDims) && stack[first].isTensor()) {
    const c10::IValue& dim = stack[first + 1];
    if (stack[first].toTensor().dim() > 64 || (dim.isIntList() && dim.toDimVector().empty())) return true;
  }
  // bucketize: CPU requires 1-D boundaries ("boundaries tensor must be 1 dimension").
  if ((check & kCheckBoundaries1d) && stack[first + 1].isTensor() && stack[first + 1].toTensor().dim() != 1)
    return true;
  // searchsorted(sorted_sequence, self, out_int32, right, side, ...): side "left" or "right".
  if ((check & kCheckSearchSide) && stack.size() > first + 4 && stack[first + 4].isString()) {
    const std::string& side = stack[first + 4].toStringRef();
    if (side != "left" && side != "right") return true;
  }
  // var / std (_mean)(self, dim, correction, ...): CPU warns "degrees of freedom is <= 0" when
  // its kernel runs; the meta kernels do not, so a queued call would warn at the flush.
  if ((check & kCheckDegreesOfFreedom) && stack[first].isTensor() && degrees_of_freedom_not_positive(stack, first))
    return true;
  if ((check & kCheckIndexValues) && plan.index_arg >= 0 && index_values_need_cpu(plan, stack, first)) return true;
  if ((check & kCheckTargetValues) && plan.self_arg >= 0 && plan.target_arg >= 0 &&
      target_values_need_cpu(plan, stack, first))
    return true;
  if ((check & kCheckGeluApproximate) && !gelu_approximate_known(stack, first)) return true;
  if ((check & kCheckMultinomial) && multinomial_args_rejected(stack, first)) return true;
  if ((check & kCheckSameDtypePair) && stack[first].isTensor() && stack[first + 1].isTensor() &&
      stack[first].toTensor().scalar_type() != stack[first + 1].toTensor().scalar_type())
    return true;
  if (check & kCheckIndexPut) {
    try {
      if (index_put_needs_cpu(stack[first], stack[first + 1], stack[first + 2])) return true;
    } catch (const c10::Error&) {
      return true;  // index shapes that do not broadcast: CPU's kernel raises its own error
    }
  }
  // masked_scatter(_): CPU checks that the mask broadcasts to self and that
  // the source holds an element per set mask element. The second needs the
  // mask's values, unless the source has as many elements as self.
  if (check & kCheckMaskedScatter) {
    const at::Tensor& self = stack[first].toTensor();
    const at::Tensor& mask = stack[first + 1].toTensor();
    const at::Tensor& source = stack[first + 2].toTensor();
    if (source.numel() < self.numel() || mask.scalar_type() != at::kBool ||
        source.scalar_type() != self.scalar_type() || !at::is_expandable_to(mask.sizes(), self.sizes()))
      return true;
  }
  // Argument positions the two checks below read (OpPlan, found once per op).
  struct Positions {
    int alpha, values, indices;
  };
  const Positions p{plan.alpha_arg, plan.values_arg, plan.indices_arg};
  const c10::IValue& self = stack[first];
  // A floating-point alpha with an integer self (add_, sub_, ...): CPU's
  // alpha_check rejects it at the call ("For integral input tensors, argument
  // alpha must not be a floating point number."); the in-place meta kernels do
  // not. (With a floating `other` CPU accepts it; running eagerly computes that.)
  if (p.alpha >= 0 && self.isTensor()) {
    const c10::IValue& alpha = stack[first + p.alpha];
    if ((alpha.isDouble() || alpha.isComplexDouble()) &&
        c10::isIntegralType(self.toTensor().scalar_type(), /*includeBool=*/true))
      return true;
  }
  // (values, indices) out= of the sorts and order statistics (sort, mode,
  // kthvalue, median, ...): CPU's kernels require int64 indices and values of
  // the input's dtype; some meta kernels cast instead, so the error would come
  // at the flush. Such calls run eagerly and raise (or compute) as CPU does.
  if (p.values >= 0 && p.indices >= 0 && self.isTensor()) {
    const c10::IValue& v = stack[first + p.values];
    const c10::IValue& ix = stack[first + p.indices];
    return (ix.isTensor() && ix.toTensor().scalar_type() != at::kLong) ||
           (v.isTensor() && v.toTensor().scalar_type() != self.toTensor().scalar_type());
  }
  return false;
}

// A reduction over an input with no elements. CPU's kernels check such inputs
// at their start (max()/min() without a dim, median/mode over an empty dim)
// where several meta kernels return the reduction's identity; the CPU kernel
// costs nothing on no data and raises, or computes, exactly as CPU does.
// (out= arguments are not inputs: an empty out= is common.)
bool reduces_empty_input(PrimKind kind, uint64_t writes, torch::jit::Stack& stack, size_t first, size_t nargs) {
  if (kind != PrimKind::kReduction) return false;
  bool empty = false;
  for_each_tensor(stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (is_tpu(t) && t.numel() == 0 && !((writes >> arg) & 1)) empty = true;
  });
  return empty;
}

// RNG ops' argument checks (random_'s range for self's dtype, uniform_'s
// from <= to, normal_'s std >= 0, bernoulli_'s p in [0, 1], ...): CPU's
// kernels make them before they draw, for no elements too, and most meta
// kernels skip them. For an in-place RNG op whose only tensor is self, CPU's
// kernel runs at the call on an empty CPU stand-in of self: it raises CPU's
// error, and warns as CPU warns (random_ past float's exact integers).
void check_random_args(const c10::OperatorHandle& op, const OpPlan& plan, torch::jit::Stack& stack, size_t first,
                       size_t nargs) {
  if ((plan.writes & 1) == 0 || !plan.aliased.empty() && plan.aliased[0] != 0) return;
  torch::jit::Stack probe(stack.begin() + first, stack.end());
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = probe[i];
    if (v.isTensor() && v.toTensor().defined()) {
      if (i != 0) return;  // other tensors (bernoulli_'s p tensor): their shapes matter; the meta kernel checks
      v = at::detail::empty_cpu({0}, v.toTensor().scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt);
    } else if (v.isGenerator()) {
      v = c10::IValue();  // no numbers are drawn; a tpu generator would not fit CPU's kernel
    } else if (v.isTensorList() || v.isList()) {
      return;
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &probe);
}

// Whether the meta kernel resized a tensor the op also reads: an in-place
// self, or an out= that is also an input. CPU's kernels never do (TensorIterator:
// "output with shape [3] doesn't match the broadcast shape [2, 3]"); the Python
// meta kernels of non-structured ops (logical_and_, where's out=) do. CPU's
// kernel then decides at the call.
bool resizes_read_write_arg(const c10::FunctionSchema& schema, const MetaOutcome& meta, torch::jit::Stack& stack,
                            size_t first, size_t nargs) {
  for (const auto& w : meta.written) {
    const c10::IValue& v = stack[first + w.first];
    if (!v.isTensor() || !w.second.defined || v.toTensor().sizes().equals(w.second.sizes)) continue;
    bool read = !schema.arguments()[w.first].is_out();
    const c10::TensorImpl* impl = v.toTensor().unsafeGetTensorImpl();
    for_each_tensor(stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
      if (arg != w.first && t.unsafeGetTensorImpl() == impl) read = true;
    });
    if (read) return true;
  }
  return false;
}

// ---- meta cache -----------------------------------------------------------
// Shape/dtype inference depends only on the op and its arguments' metadata
// (and on scalar values for a few ops, e.g. arange), so its outcome is cached
// per (op, argument metadata): PyTorch's Python meta kernels cost ~50 us a call.

Geometry geometry_of(const at::Tensor& t) {
  Geometry g;
  if (!t.defined()) return g;
  g.defined = true;
  g.sizes = t.sizes().vec();
  g.strides = t.strides().vec();
  g.offset = t.storage_offset();
  g.dtype = t.scalar_type();
  return g;
}

// The on-disk form of a meta key: the op's qualified name and overload
// instead of its schema's address, and the default dtype (factories read it).
std::string meta_disk_key(const c10::FunctionSchema& schema, const std::vector<int64_t>& key) {
  std::string k = schema.name() + "." + schema.overload_name();
  k += '\0';
  const int64_t dflt = static_cast<int64_t>(c10::get_default_dtype_as_scalartype());
  k.append(reinterpret_cast<const char*>(&dflt), sizeof(dflt));
  k.append(reinterpret_cast<const char*>(key.data() + 1), (key.size() - 1) * sizeof(int64_t));
  return k;
}

// In memory, backed by the optional on-disk cache (jit/disk_cache.h).
class MetaCache {
 public:
  // `memos`: the calling thread's (RecordThread::memo).
  const MetaOutcome* find(const c10::FunctionSchema& schema, const std::vector<int64_t>& key, bool disk,
                          RecordThread::MetaMemo* memos) {
    // The calling thread's last hit in this key's memo slot first: no lock, no
    // hash of the whole key. (Entries stay where they are until map_.clear(),
    // which bumps generation_.)
    RecordThread::MetaMemo& memo = memos[memo_slot(key)];
    if (memo.key != nullptr && memo.generation == generation_.load(std::memory_order_acquire) && *memo.key == key)
      return static_cast<const MetaOutcome*>(memo.outcome);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        memo = RecordThread::MetaMemo{&it->first, &it->second, generation_.load(std::memory_order_relaxed)};
        return &it->second;
      }
    }
    if (!disk || !disk_cache::enabled()) return nullptr;
    std::string bytes;
    MetaOutcome outcome;
    std::vector<int> aliased(schema.returns().size());
    for (size_t k = 0; k < aliased.size(); ++k) aliased[k] = aliased_arg(schema, k);
    const bool found = disk_cache::lookup(disk_cache::Table::kMeta, meta_disk_key(schema, key), &bytes);
    if (!found || !decode_outcome(bytes, schema.arguments().size(), aliased, &outcome)) {
      if (found) disk_cache::reject(disk_cache::Table::kMeta, "an outcome that does not decode for its op");
      count_disk_cache(0, 1, 0);
      return nullptr;
    }
    count_disk_cache(1, 0, 0);
    std::lock_guard<std::mutex> lock(mu_);
    return &emplace_locked(key, std::move(outcome));
  }
  // Caches `outcome` under `key`; returns the entry's id (MetaOutcome::id).
  uint64_t insert(const c10::FunctionSchema& schema, std::vector<int64_t> key, MetaOutcome outcome, bool disk = true) {
    if (disk && disk_cache::enabled() &&
        disk_cache::store(disk_cache::Table::kMeta, meta_disk_key(schema, key), encode_outcome(outcome)))
      count_disk_cache(0, 0, 1);
    std::lock_guard<std::mutex> lock(mu_);
    return emplace_locked(std::move(key), std::move(outcome)).id;
  }
  MetaCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {map_.size(), last_id_, limit_};
  }
  void set_limit(size_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = std::max<size_t>(1, limit);
    if (map_.size() > limit_) clear();
  }

 private:
  // A thread's memo of recent hits (RecordThread::memo): 256 slots, chosen by
  // the key's length and eight of its words spread over it (the op, sizes and
  // strides of each argument). A small model's step uses ~80 keys; 64 slots
  // chosen by three words made keys that differ elsewhere evict each other.
  static_assert(RecordThread::kMemoSlots == 256, "memo_slot takes the hash's top 8 bits");
  static size_t memo_slot(const std::vector<int64_t>& key) {
    constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
    const size_t n = key.size();
    uint64_t h = n;
    for (size_t i = 0; i < 8; ++i) h = ((h << 7) | (h >> 57)) ^ static_cast<uint64_t>(key[i * n / 8]);
    h = ((h << 7) | (h >> 57)) ^ static_cast<uint64_t>(key[n - 1]);
    return (h * kMul) >> 56;
  }
  // The entry of `key`, made with `outcome` and a new id when absent (a thread
  // that missed at the same time may have made it). Ids come from one counter
  // and are never reused, so an id names one key for the life of the process:
  // a key dropped by clear() and cached again gets a new id, and a flush
  // structure holding the old one no longer matches (a miss, never a wrong
  // hit). The map is bounded, so the ids in use are too. Caller holds mu_.
  MetaOutcome& emplace_locked(std::vector<int64_t> key, MetaOutcome outcome) {
    if (map_.size() >= limit_) clear();  // bounded: a shape storm must not grow it without end
    auto [it, made] = map_.emplace(std::move(key), std::move(outcome));
    if (made) it->second.id = ++last_id_;
    return it->second;
  }
  // Caller holds mu_. Every memo (of any thread) is stale from here on.
  void clear() {
    map_.clear();
    generation_.fetch_add(1, std::memory_order_release);
  }
  std::atomic<uint64_t> generation_{1};
  struct Hash {
    size_t operator()(const std::vector<int64_t>& v) const {
      uint64_t h = 1469598103934665603ULL;
      for (auto x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
      return static_cast<size_t>(h);
    }
  };
  std::mutex mu_;
  std::unordered_map<std::vector<int64_t>, MetaOutcome, Hash> map_;
  uint64_t last_id_ = 0;            // under mu_
  size_t limit_ = size_t{1} << 16;  // under mu_
};

MetaCache& meta_cache() {
  static MetaCache* c = new MetaCache();
  return *c;
}

}  // namespace

MetaCacheStats meta_cache_stats() { return meta_cache().stats(); }
void set_meta_cache_limit(size_t limit) { meta_cache().set_limit(limit); }

namespace {

thread_local RecordThread t_record;  // plain data: no guard (see RecordThread)

// Frees the thread's RecordThread heap parts at its exit.
struct RecordThreadReaper {
  ~RecordThreadReaper() {
    RecordThread& r = t_record;
    delete[] r.stacks;
    delete r.key;
    r.stacks = nullptr;
    r.key = nullptr;  // armed stays set: nothing is made again on this thread
  }
};

__attribute__((noinline)) void arm_record_thread(RecordThread& r) {
  thread_local RecordThreadReaper reaper;
  (void)reaper;
  r.armed = true;
  r.key = new std::vector<int64_t>();
  r.stacks = new torch::jit::Stack[RecordThread::kStackDepth];
}

// A wrapped-number tensor `t` (a Python number passed for a Tensor argument)
// as the Scalar IValue it was made from, into `*slot`; false for a dtype
// PyTorch's scalar_to_tensor does not make (the tensor is then kept).
bool wrapped_to_scalar(const at::Tensor& t, c10::IValue* slot) {
  if (t.dim() != 0 || !t.device().is_cpu()) return false;
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      *slot = *t.const_data_ptr<double>();
      return true;
    case c10::ScalarType::Long:
      *slot = *t.const_data_ptr<int64_t>();
      return true;
    case c10::ScalarType::Bool:
      *slot = *t.const_data_ptr<bool>();
      return true;
    case c10::ScalarType::ComplexDouble:
      *slot = *t.const_data_ptr<c10::complex<double>>();
      return true;
    default:
      return false;
  }
}

// Writes a meta key into a reused std::vector through a cursor: words are
// plain stores into room checked inline, first into an uninitialized buffer
// on the stack (kOpen words; a binary op on rank-4 tensors keys 25), spilled
// into the vector when a key is longer; close() (or the destructor) leaves
// the vector holding the words written. A resize or push_back per tensor or
// word was an out-of-line call each (~60 and ~23 instructions), and opening
// the vector at kOpen words value-initialized them (~80 an op).
class KeyWriter {
 public:
  static constexpr size_t kOpen = 48;
  explicit KeyWriter(std::vector<int64_t>& v) : v_(v), p_(buf_), end_(buf_ + kOpen) {}
  ~KeyWriter() { close(); }
  KeyWriter(const KeyWriter&) = delete;
  KeyWriter& operator=(const KeyWriter&) = delete;
  // Room for `n` more words, returned for plain stores. Inlined where it is
  // used (a call per Scalar or tensor word before); only growing is a call.
  __attribute__((always_inline)) int64_t* room(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) grow(n);
    int64_t* r = p_;
    p_ += n;
    return r;
  }
  void put(int64_t w) { *room(1) = w; }
  void discard() { p_ = begin(); }  // an uncacheable call: the empty key
  void close() {
    if (p_ == nullptr) return;
    if (spilled_) {
      v_.resize(static_cast<size_t>(p_ - v_.data()));
    } else {
      v_.assign(buf_, p_);
    }
    p_ = end_ = nullptr;
  }

 private:
  int64_t* begin() { return spilled_ ? v_.data() : buf_; }
  __attribute__((noinline)) void grow(size_t n) {
    const size_t used = static_cast<size_t>(p_ - begin());
    if (!spilled_) {
      v_.assign(buf_, p_);
      spilled_ = true;
    }
    v_.resize(std::max(2 * std::max(v_.size(), kOpen), used + n));
    p_ = v_.data() + used;
    end_ = v_.data() + v_.size();
  }
  std::vector<int64_t>& v_;
  int64_t buf_[kOpen];  // not initialized: only the words written are read
  bool spilled_ = false;
  int64_t* p_;
  int64_t* end_;
};

// A host (CPU) bool or uint8 tensor in a list of indices is a mask: the meta
// kernels read its values (nonzero), so the result's shape and the checks against
// it (index_put's values) are its values', which enter the key, 8 bytes a word. A
// mask of more than kMaxKeyedMask elements makes the call uncacheable. (A mask
// outside an index list, masked_select's, makes the op run eagerly: SYNC.)
constexpr int64_t kMaxKeyedMask = 1024;

void key_host_mask_values(KeyWriter& k, const at::Tensor& t) {
  const c10::ScalarType st = t.scalar_type();
  if ((st != c10::ScalarType::Bool && st != c10::ScalarType::Byte) || !t.device().is_cpu()) return;
  const int64_t n = t.numel();
  if (n > kMaxKeyedMask || !t.has_storage()) throw std::invalid_argument("a host mask not keyed by value");
  const at::Tensor c = t.contiguous();
  const auto* bytes = static_cast<const char*>(c.const_data_ptr());
  int64_t* p = k.room(1 + static_cast<size_t>((n + 7) / 8));
  p[0] = -33;
  for (int64_t i = 0; i < n; i += 8) {
    int64_t w = 0;
    std::memcpy(&w, bytes + i, static_cast<size_t>(std::min<int64_t>(8, n - i)));
    p[1 + i / 8] = w;
  }
}

void key_tensor(KeyWriter& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.put(-7);
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::IntArrayRef sizes = impl->sizes();
  const c10::IntArrayRef strides = impl->strides();
  const size_t rank = sizes.size();
  int64_t* p = k.room(3 + 2 * rank);
  // A wrapped Python number promotes like a Scalar, a 0-dim tensor like a
  // tensor (t * 0.01 stays float32; t * tensor(0.01, float64) does not).
  p[0] = static_cast<int64_t>(t.scalar_type()) | (is_tpu(t) ? 1 << 8 : 0) | (t.is_conj() ? 1 << 9 : 0) |
         (t.is_neg() ? 1 << 10 : 0) | (impl->is_wrapped_number() ? 1 << 11 : 0) | (static_cast<int64_t>(rank) << 12);
  for (size_t d = 0; d < rank; ++d) {
    p[1 + d] = sizes[d];
    p[1 + rank + d] = strides[d];
  }
  // The storage size bounds views and out= resizes; the offset shapes nothing else.
  p[1 + 2 * rank] = static_cast<int64_t>(impl->storage().nbytes());
  p[2 + 2 * rank] = impl->storage_offset();
}

// An element of a tensor list (index, index_put's Tensor?[] indices): a host mask's values.
void key_list_element_values(KeyWriter& k, const at::Tensor& t) {
  if (t.defined() && !is_tpu(t)) key_host_mask_values(k, t);
}

// Sign and finiteness of a float Scalar keyed by type: meta kernels check
// these (renorm's maxnorm >= 0, softshrink's lambd >= 0, vector_norm's ord < 0
// or inf on an empty tensor), and they stay the same across optimizer steps.
// A finite value beyond float's range has classes of its own: the flush
// structure (the fused loops' acceptance of the op) tells it apart.
int64_t value_class(double d) {
  if (std::isnan(d)) return 0;
  if (std::isinf(d)) return d > 0 ? 1 : 2;
  if (d == 0) return 3;
  if (std::isinf(static_cast<float>(d))) return d > 0 ? 6 : 7;
  return d > 0 ? 4 : 5;
}

// An int argument, by value (add's alpha: scalars_fit relies on it).
inline void key_int(KeyWriter& k, const c10::IValue& v) {
  int64_t* p = k.room(2);  // one room check for both words
  p[0] = -3;
  p[1] = v.toInt();
}

// `float_values`: key floating-point values by value. Otherwise (Scalar
// arguments) only their type (and value_class) enters the key: a Scalar's value never shapes a result except for the
// range factories, and keying it made every step of an optimizer whose
// scalars change (Adam's bias corrections, a learning-rate schedule) rerun
// the Python meta kernels (~50 us an op).
void key_ivalue(KeyWriter& k, const c10::IValue& v, bool float_values) {
  if (v.isTensor()) {
    key_tensor(k, v.toTensor());
  } else if (v.isList() && v.isTensorList()) {  // isList inline, isTensorList a call
    k.put(-1);
    // The elements in place: vec() copied the list (a reference count per tensor).
    for (const c10::IValue& e : v.toListRef()) {
      const at::Tensor& t = e.toTensor();
      key_tensor(k, t);
      if (t.defined() && t.device().type() != c10::DeviceType::PrivateUse1) key_host_mask_values(k, t);
    }
  } else if (v.isList()) {
    k.put(-2);
    for (const c10::IValue& e : v.toList().vec()) {
      key_ivalue(k, e, float_values);
      if (e.isTensor()) key_list_element_values(k, e.toTensor());
    }
  } else if (v.isInt()) {
    key_int(k, v);
  } else if (v.isDouble() && !float_values) {
    k.put(-28);
    k.put(value_class(v.toDouble()));
  } else if (v.isDouble()) {
    k.put(-4);
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    k.put(bits);
  } else if (v.isBool()) {
    k.put(v.toBool() ? -5 : -6);
  } else if (v.isNone()) {
    k.put(-8);
  } else if (v.isScalar()) {
    const at::Scalar sc = v.toScalar();
    k.put(-9 - static_cast<int64_t>(sc.type()));
    if (sc.isIntegral(false)) {
      k.put(sc.toLong());
    } else if (sc.isFloatingPoint() && !float_values) {
      k.put(-29);
      k.put(value_class(sc.toDouble()));
    } else if (sc.isFloatingPoint()) {
      const double d = sc.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      k.put(bits);
    } else if (sc.isBoolean()) {
      k.put(sc.toBool());
    } else {
      throw std::invalid_argument("uncacheable scalar");
    }
  } else if (v.isString()) {
    // Exactly (its length, then its bytes): the key is the node's interned id, never a hash.
    const std::string& str = v.toStringRef();
    int64_t* p = k.room(2 + (str.size() + 7) / 8);
    p[0] = -30;
    p[1] = static_cast<int64_t>(str.size());
    for (size_t i = 0; i < str.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, str.data() + i, std::min<size_t>(8, str.size() - i));
      p[2 + i / 8] = w;
    }
  } else if (v.isGenerator()) {
    k.put(-31);
  } else if (v.isDevice()) {
    k.put(-32);
    k.put(static_cast<int64_t>(v.toDevice().type()) | static_cast<int64_t>(v.toDevice().index() + 1) << 8);
  } else {
    throw std::invalid_argument("uncacheable argument");  // e.g. dimension names: not cached
  }
}

// Whether a custom op's fake impl failed because it cannot give shapes from
// metadata alone (torch.library's messages: a fake impl that asks
// get_ctx().new_dynamic_size() when called with meta tensors, and a
// custom_op without a fake impl).
bool fake_impl_needs_data(const std::exception& e) {
  const std::string what = e.what();
  return what.find("data-dependent shape") != std::string::npos ||
         what.find("There was no fake impl registered") != std::string::npos;
}

// Replaces "tpu" device arguments of stack[first, first + n) by `type`.
template <class Stack>
void retarget_device_args(Stack& stack, size_t first, size_t n, c10::DeviceType type) {
  for (size_t i = first; i < first + n; ++i)
    if (stack[i].isDevice() && stack[i].toDevice().type() == c10::DeviceType::PrivateUse1) stack[i] = c10::Device(type);
}

// The index of `schema`'s argument called `name`, or -1.
int schema_arg_index(const c10::FunctionSchema& schema, const char* name) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == name) return static_cast<int>(i);
  return -1;
}

// Where a meta kernel's result shapes differ from CPU's kernel, CPU's win
// (the executor writes CPU results into the shapes recorded here).
// `traits`: the op's OpTrait bits, which name the corrections it needs.
void correct_meta_outcome(const c10::FunctionSchema& schema, uint64_t traits, torch::jit::Stack& stack, size_t first,
                          MetaOutcome& outcome) {
  // Norm statistics of 16-bit inputs: CPU's kernels keep them in the input
  // dtype unless a parameter (weight, bias, running stats) is float32 ("mixed
  // type"), then float32; the meta kernels say float32 (batch / layer norm) or
  // the input's dtype (group norm) whatever the parameters.
  const bool norm_ops = (traits & kNormStatsInInputDtype) != 0;
  const bool norm_backward = norm_ops && schema_arg_index(schema, "output_mask") >= 0;
  if (norm_ops && !norm_backward && stack[first].isTensor()) {
    const auto dt = stack[first].toTensor().scalar_type();
    bool mixed = false;
    for (size_t i = first + 1; i < stack.size(); ++i)
      if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().scalar_type() == at::kFloat)
        mixed = true;
    if (dt == at::kHalf || dt == at::kBFloat16)
      for (size_t k = 1; k < 3 && k < outcome.returns.size(); ++k)
        for (auto& g : outcome.returns[k]) g.dtype = mixed ? at::kFloat : dt;
  }
  // Their backward (group norm's): CPU allocates grad_input like the input and
  // grad_weight / grad_bias like the weight (mixed type: 16-bit and float32);
  // the meta kernel gives every gradient the weight's dtype.
  const int grad_of_input = norm_backward ? schema_arg_index(schema, "input") : -1;
  const int grad_of_weight = norm_backward ? schema_arg_index(schema, "weight") : -1;
  if (grad_of_input >= 0 && grad_of_weight >= 0) {
    const c10::IValue& in = stack[first + static_cast<size_t>(grad_of_input)];
    const c10::IValue& w = stack[first + static_cast<size_t>(grad_of_weight)];
    for (size_t k = 0; k < 3 && k < outcome.returns.size(); ++k) {
      const c10::IValue& like = k == 0 ? in : w;
      if (!like.isTensor() || !like.toTensor().defined()) continue;
      for (auto& g : outcome.returns[k])
        if (g.defined) g.dtype = like.toTensor().scalar_type();
    }
  }
  // bool tensor ** bool: CPU's type promotion keeps bool; the meta kernel says int64.
  if ((traits & kBoolPowKeepsBool) && stack[first].isTensor() && stack[first].toTensor().scalar_type() == at::kBool &&
      stack[first + 1].isBool() && !outcome.returns.empty())
    for (auto& g : outcome.returns[0]) g.dtype = at::kBool;
  // CPU's log_softmax backward returns a contiguous gradient; the meta kernel
  // copies grad_output's strides (softmax's backward agrees with CPU).
  if ((traits & kContiguousGradient) && !outcome.returns.empty()) {
    for (auto& g : outcome.returns[0]) {
      int64_t stride = 1;
      for (size_t d = g.sizes.size(); d-- > 0;) {
        g.strides[d] = stride;
        stride *= std::max<int64_t>(g.sizes[d], 1);
      }
    }
  }
  // Batch norm in eval mode: CPU returns empty save_mean / save_invstd; the meta kernels return [C].
  // The out= forms: CPU leaves the given save_mean / save_invstd (arguments 9, 10) as they are.
  if ((traits & kEvalEmptySaveStats) && stack[first + 5].isBool() && !stack[first + 5].toBool()) {
    if (outcome.written.empty()) {
      for (size_t k = 1; k < 3 && k < outcome.returns.size(); ++k) {
        for (auto& g : outcome.returns[k]) {
          g.sizes = {0};
          g.strides = {1};
        }
      }
    } else {
      keep_given_save_stats(stack, first, outcome);
    }
  }
  // sort's out=: the meta kernel restrides values/indices to the input's
  // layout even when they already have the right shape; CPU keeps the given
  // strides (it only restrides an out= tensor it has to resize).
  if (traits & kOutKeepsGivenStrides) {
    for (auto& w : outcome.written) {
      const size_t i = first + static_cast<size_t>(w.first);
      if (i >= stack.size() || !stack[i].isTensor() || !w.second.defined) continue;
      const at::Tensor& t = stack[i].toTensor();
      if (!t.sizes().equals(w.second.sizes)) continue;
      w.second.strides = t.strides().vec();
      w.second.offset = t.storage_offset();
    }
  }
  // Range factories' out= (record_op inferred on an empty twin): the given
  // geometry when its numel is the result's, else [n] contiguous at its offset.
  if (traits & kRangeFactory) {
    for (auto& w : outcome.written) {
      const size_t i = first + static_cast<size_t>(w.first);
      if (i >= stack.size() || !stack[i].isTensor() || !w.second.defined) continue;
      const at::Tensor& t = stack[i].toTensor();
      int64_t n = 1;
      for (auto s : w.second.sizes) n *= s;
      if (t.numel() == n) {
        w.second.sizes = t.sizes().vec();
        w.second.strides = t.strides().vec();
      }
      w.second.offset = t.storage_offset();
    }
  }
  // _native_multi_head_attention without need_weights: CPU returns no weights (an
  // undefined tensor, None in Python); the meta kernel returns an empty tensor.
  if ((traits & kNoUnrequestedWeights) && stack[first + 10].isBool() && !stack[first + 10].toBool() &&
      outcome.returns.size() == 2)
    for (auto& g : outcome.returns[1]) g = Geometry();
  // Channels-last results: convolution, and kernels that keep their input's format.
  apply_cpu_memory_format(traits, stack, first, outcome);
  // Non-structured kernels: CPU's TensorIterator or empty_like(self) lays out the result.
  apply_cpu_result_layout(schema, traits, stack, first, outcome);
  // Backward ops with an output_mask: CPU returns an undefined tensor for each
  // gradient that is off; native_batch_norm_backward's meta kernel still
  // returns a grad_input, so the flush would bind an undefined result.
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() != "output_mask" || first + i >= stack.size() || !stack[first + i].isBoolList()) continue;
    const auto mask = stack[first + i].toBoolList();
    for (size_t k = 0; k < mask.size() && k < outcome.returns.size(); ++k)
      if (!mask.get(k) && outcome.returns[k].size() == 1 &&
          schema.returns()[k].type()->kind() == c10::TypeKind::TensorType)
        outcome.returns[k][0] = Geometry();
  }
}

// Twins' storages of at most this many bytes in all for kInferOnCpu (running
// CPU's kernel costs its compute; past this size the meta kernel is cheaper).
constexpr size_t kInferOnCpuMaxBytes = size_t{16} << 20;

// One thread's memory for cpu_twins' storages, kept across calls: the twins of
// the first call of each foreach op over a model's parameters are megabytes, and
// fresh memory for them cost page faults on every such call (most of a first
// optimizer step's record; docs/performance.md, "thr22"). Busy while one call's
// twins live (a record nested in CPU's kernel takes fresh memory instead).
class TwinArena {
 public:
  // `bytes` (at most kInferOnCpuMaxBytes) zero-filled bytes, 64-byte aligned, or
  // nullptr while in use. The whole cap is reserved at once, so a larger call later
  // does not move the arena: only pages past the largest call so far are new.
  char* acquire(size_t bytes) {
    if (busy_ || bytes > kInferOnCpuMaxBytes) return nullptr;
    if (!memory_) memory_ = c10::GetCPUAllocator()->allocate(kInferOnCpuMaxBytes);
    busy_ = true;
    char* p = static_cast<char*>(memory_.get());
    if (bytes > 0) std::memset(p, 0, bytes);
    return p;
  }
  void release() { busy_ = false; }

 private:
  c10::DataPtr memory_;
  bool busy_ = false;
};

// Twins of storages this large take the arena: glibc maps memory of 128 KiB or more
// (its default M_MMAP_THRESHOLD) fresh from the kernel on each allocation, while smaller
// twins reuse heap memory that later allocations reuse too.
constexpr size_t kTwinArenaMinStorage = size_t{128} << 10;

// Ends a cpu_twins call's use of its thread's TwinArena; outlives the twins.
struct TwinLease {
  TwinArena* arena = nullptr;
  TwinLease() = default;
  TwinLease(const TwinLease&) = delete;
  TwinLease& operator=(const TwinLease&) = delete;
  ~TwinLease() {
    if (arena) arena->release();
  }
};

// stack[first, first + nargs) with zero-filled CPU twins of the tpu tensors
// (one twin storage per tpu storage, so aliasing is CPU's) and "tpu" device
// arguments made CPU, for shape inference by CPU's own kernel (OpTrait
// kInferOnCpu). Nothing when the twins would exceed kInferOnCpuMaxBytes or an
// argument has conjugate / negative bits: the meta kernel infers then. The
// storages are slices of the thread's TwinArena (when one is kTwinArenaMinStorage
// or larger), held by `lease`, which must outlive every twin.
std::optional<torch::jit::Stack> cpu_twins(const torch::jit::Stack& stack, size_t first, size_t nargs,
                                           TwinLease& lease) {
  constexpr size_t kAlign = 64;  // c10's CPU allocator's alignment, for every slice
  torch::jit::Stack twins(stack.begin() + first, stack.end());
  // First pass: each distinct storage's slice offset.
  std::unordered_map<const void*, size_t> offsets;
  size_t bytes = 0, largest = 0;
  bool ok = true;
  for_each_tensor(twins, 0, nargs, [&](int, int, const at::Tensor& t) {
    if (!ok || !is_tpu(t)) return;
    if (t.is_conj() || t.is_neg()) {
      ok = false;
      return;
    }
    if (offsets.emplace(t.storage().unsafeGetStorageImpl(), bytes).second) {
      largest = std::max(largest, t.storage().nbytes());
      bytes += (t.storage().nbytes() + kAlign - 1) / kAlign * kAlign;
      ok = bytes <= kInferOnCpuMaxBytes;
    }
  });
  if (!ok) return std::nullopt;
  thread_local TwinArena arena;
  char* base = largest >= kTwinArenaMinStorage ? arena.acquire(bytes) : nullptr;
  if (base) lease.arena = &arena;
  c10::Allocator* cpu = c10::GetCPUAllocator();
  std::unordered_map<const void*, c10::Storage> storages;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> twin_of;
  for_each_tensor(twins, 0, nargs, [&](int arg, int elem, const at::Tensor& t) {
    if (!is_tpu(t)) return;
    at::Tensor& c = twin_of[t.unsafeGetTensorImpl()];
    if (!c.defined()) {
      const void* key = t.storage().unsafeGetStorageImpl();
      auto it = storages.find(key);
      if (it == storages.end()) {
        const size_t n = t.storage().nbytes();
        // A slice of the arena (not owned: a resize by the kernel allocates anew), or
        // fresh memory when the arena is in use.
        c10::DataPtr data =
            base ? c10::DataPtr(base + offsets.at(key), c10::Device(c10::DeviceType::CPU)) : cpu->allocate(n);
        if (!base && n > 0) std::memset(data.get(), 0, n);
        c10::Storage st(c10::Storage::use_byte_size_t(), n, std::move(data), cpu, /*resizable=*/true);
        it = storages.emplace(key, std::move(st)).first;
      }
      c = twin_over(t, it->second, c10::DispatchKey::CPU);
    }
    host::set_tensor_slot(twins[arg], elem, c);
  });
  retarget_device_args(twins, 0, nargs, c10::DeviceType::CPU);
  return twins;
}

// Shape inference of an op whose CPU kernel refuses bool and returns clamp_min(self, 0)
// (OpTrait kInferAsClampMinZero: relu): `stack` holds the meta twin of `self` and, on
// return, the result of clamp_min's C++ meta function, the structured code CPU's call
// runs (its geometry, dtype and complex error). Raises on a bool `self`; the caller then
// runs CPU's kernel, which raises CPU's own error.
void infer_as_clamp_min_zero(torch::jit::Stack& stack) {
  static const c10::OperatorHandle clamp_min = c10::Dispatcher::singleton().findSchemaOrThrow("aten::clamp_min", "");
  static const std::optional<c10::KernelFunction> cpp_meta = shadowed_cpp_meta_kernel(clamp_min);
  TORCH_CHECK(stack.size() == 1 && stack[0].isTensor() && stack[0].toTensor().scalar_type() != at::kBool,
              "Boolean inputs not supported for relu");
  stack.emplace_back(c10::Scalar(int64_t{0}));
  if (cpp_meta) {
    cpp_meta->callBoxed(clamp_min, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } else {
    clamp_min.callBoxed(&stack);  // nothing shadows the C++ meta kernel: the dispatcher reaches it
  }
}

std::atomic<int64_t> n_twin_inferences{0};  // twin_inference_count()

// The results of the op's twin-free shape rule (OpTrait kShapeRules, shape_rules.h) for
// `args`, the call's arguments with meta twins; nothing when the rule declines the call.
std::optional<torch::jit::Stack> infer_by_shape_rule(const c10::OperatorHandle& op, uint64_t traits,
                                                     const torch::jit::Stack& args) {
  if (traits & kShapeRuleBatchNorm) return infer_batch_norm(args);
  if (traits & kShapeRuleBatchNormBackward) return infer_batch_norm_backward(args);
  if (traits & kShapeRuleForeach) return infer_foreach(op, args);
  return std::nullopt;
}

// Raises CPU's error where CPU's kernel would crash on `stack[first..]` (shape_rules.h).
void check_by_shape_rule(uint64_t traits, const torch::jit::Stack& stack, size_t first) {
  const c10::ArrayRef<c10::IValue> args(stack.data() + first, stack.size() - first);
  if (traits & kShapeRuleBatchNorm) check_batch_norm_args(args);
  if (traits & kShapeRuleBatchNormBackward) check_batch_norm_backward_args(args);
}

// The cache key of a call into `k`, or an empty key when some argument is not cacheable.
void meta_key(const c10::OperatorHandle& op, const OpPlan& plan, torch::jit::Stack& stack, size_t first, size_t n,
              std::vector<int64_t>& key) {
  KeyWriter k(key);
  k.put(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&op.schema())));
  if (plan.custom_id) k.put(plan.custom_id);
  // Type promotion of an integer tensor with a float scalar, and factories, read the default dtype.
  k.put(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  try {
    for (size_t i = 0; i < n; ++i) {
      // A Scalar argument (a float Scalar arrives as a double) keys by type,
      // except for the range factories; a `float` argument (eps, p, scale
      // factors) by value.
      const bool scalar_arg = i < 64 && ((plan.scalar_args >> i) & 1);
      const c10::IValue& v = stack[first + i];
      if (scalar_arg && v.isInt()) {  // add's alpha: no walk of key_ivalue's kinds
        key_int(k, v);
        continue;
      }
      key_ivalue(k, v, plan.float_values || !scalar_arg);
    }
  } catch (const std::invalid_argument&) {
    k.discard();
  }
}

at::Tensor fresh_tpu(const Geometry& g) { return fresh_tpu(g.sizes, g.strides, g.dtype); }

// CPU's arange.out warns, on every call, when it resizes a non-empty out
// tensor whose numel is not the result's (range, linspace, logspace do not).
// (The caller checks the op's kWarnsOnOutResize trait.)
void warn_arange_out_resize(const torch::jit::Stack& stack, size_t first, const MetaOutcome& meta) {
  for (const auto& w : meta.written) {
    const size_t i = first + static_cast<size_t>(w.first);
    if (i >= stack.size() || !stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    int64_t n = 1;
    for (auto s : w.second.sizes) n *= s;
    if (t.numel() > 0 && t.numel() != n)
      TORCH_WARN("The number of elements in the out tensor of shape ", t.sizes(), " is ", t.numel(),
                 " which does not match the computed number of elements ", n,
                 ". Note that this may occur as a result of rounding error. "
                 "The out tensor will be resized to a tensor of shape (",
                 n, ",).");
  }
}

// True when the call resizes a non-empty out= argument to another shape. CPU
// warns on every such call (resize_output's deprecation warning), so its
// outcome is not cached: a cache hit would skip the meta kernel and its warning.
bool resizes_nonempty_out(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                          const MetaOutcome& meta) {
  for (const auto& w : meta.written) {
    const size_t i = first + static_cast<size_t>(w.first);
    if (!schema.arguments()[w.first].is_out() || i >= stack.size() || !stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    if (t.numel() > 0 && !t.sizes().equals(w.second.sizes)) return true;
  }
  return false;
}

// The dtype of an op's first result (a written argument's for in-place and
// out= ops), or Undefined when it has none. The aliased argument is the
// plan's (a walk of the schema's alias sets per call before).
c10::ScalarType result_dtype(const OpPlan& plan, const MetaOutcome& meta) {
  if (plan.aliased.empty() || meta.returns.empty()) return c10::ScalarType::Undefined;
  const int a = plan.aliased[0];
  if (a < 0) return meta.returns[0].empty() ? c10::ScalarType::Undefined : meta.returns[0][0].dtype;
  for (const auto& w : meta.written)
    if (w.first == a) return w.second.dtype;
  for (const auto& w : meta.written_lists)
    if (w.first == a && !w.second.empty()) return w.second[0].dtype;
  return c10::ScalarType::Undefined;
}

// scalar_args_fit for this call's result dtype. At TORCH_TPU_DEBUG >= 1 each
// check counts as "scalar_check.<op>" (metrics_report): a cached key of int
// Scalars checks once, float Scalars every call.
bool scalars_fit_now(const c10::FunctionSchema& schema, const OpPlan& plan, const torch::jit::Stack& stack,
                     size_t first, const MetaOutcome& meta) {
  if (debug::level() >= 1) debug::count_op("scalar_check", schema.name());
  return scalar_args_fit(plan.scalar_conversions, stack, first, result_dtype(plan, meta));
}

}  // namespace

void BorrowedArgs::push(torch::jit::Stack* stack, const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(n_ < kMax && (stack_ == nullptr || stack_ == stack), "BorrowedArgs: too many entries");
  stack_ = stack;
  slots_[n_++] = stack->size();
  stack->emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
}

void BorrowedArgs::own() {
  for (int i = 0; i < n_; ++i) {
    c10::IValue& v = (*stack_)[slots_[i]];
    c10::IValue owned(v);                                  // takes a reference
    c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(v);  // the borrowed entry held none
    v = std::move(owned);
  }
  n_ = 0;
}

void BorrowedArgs::release() {
  for (int i = 0; i < n_; ++i) c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow((*stack_)[slots_[i]]);
  n_ = 0;
}

OpPlan* plan_op(const c10::OperatorHandle& op, const OpEntry& entry) {
  const auto& schema = op.schema();
  auto* plan = new OpPlan();
  plan->writes = written_args(schema) | entry.extra_writes;
  plan->traits = entry.traits;
  // Ops whose result size is computed from Scalar values.
  plan->float_values = (entry.traits & kRangeFactory) != 0;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    c10::TypePtr t = args[i].real_type();
    if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
    // A Scalar[] (a foreach op's per-tensor scalars, Adam's bias corrections) keys like a Scalar.
    if (t->kind() == c10::TypeKind::ListType) t = t->castRaw<c10::ListType>()->getElementType();
    if (t->kind() == c10::TypeKind::NumberType) plan->scalar_args |= uint64_t(1) << i;
  }
  plan->cpp_meta = shadowed_cpp_meta_kernel(op);
  plan->cpp_meta_only = plan->cpp_meta && (entry.traits & kCppMetaIsCpu);
  plan->scalar_conversions = scalar_conversions_of(schema);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "alpha") plan->alpha_arg = static_cast<int>(i);
    if (args[i].name() == "index") plan->index_arg = static_cast<int>(i);
    if (args[i].name() == "dim") plan->dim_arg = static_cast<int>(i);
    if (args[i].name() == "self" && plan->self_arg < 0) plan->self_arg = static_cast<int>(i);
    if (args[i].name() == "target") plan->target_arg = static_cast<int>(i);
    if (args[i].name() == "ignore_index") plan->ignore_index_arg = static_cast<int>(i);
    const auto* a = args[i].alias_info();
    if (!args[i].kwarg_only() || !a || !a->isWrite()) continue;
    if (args[i].name() == "values") plan->values_arg = static_cast<int>(i);
    if (args[i].name() == "indices") plan->indices_arg = static_cast<int>(i);
  }
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    plan->aliased.push_back(aliased_arg(schema, k));
    plan->list_return.push_back(schema.returns()[k].type()->kind() == c10::TypeKind::ListType);
  }
  return plan;
}

[[noreturn]] void raise_device_mismatch(int device, const c10::Device& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:", device,
              " and ", other, "!");
}

// The chip an op runs on: that of its first tpu tensor, else of a "tpu"
// device argument (factories), else -1 (the current chip). Raises CUDA's
// error for tpu tensors of two chips.
int op_device(torch::jit::Stack& stack, size_t first, size_t nargs) {
  int device = -1;
  for_each_tensor(stack, first, nargs, [&](int, int, const at::Tensor& t) {
    if (!is_tpu(t)) return;
    if (device < 0)
      device = t.device().index();
    else if (t.device().index() != device)
      raise_device_mismatch(device, t.device());
  });
  if (device >= 0) return device;
  for (size_t i = first; i < first + nargs; ++i)
    if (stack[i].isDevice() && stack[i].toDevice().type() == c10::DeviceType::PrivateUse1 &&
        stack[i].toDevice().has_index())
      return checked_device(stack[i].toDevice().index());
  return -1;
}

namespace {
// The chip of an op whose defined tensor arguments are "tpu" tensors of one
// chip (at least one) and CPU scalars it only reads: what op_device returns
// for it, and check_same_device accepts, in one walk over the arguments; -1
// for any other op (those two then decide, and raise). `ntensors`: the "tpu"
// tensors among them (the node's inputs: their room).
int single_chip_of(uint64_t writes, torch::jit::Stack& stack, size_t first, size_t nargs, size_t& ntensors) {
  int device = -1;
  bool one = true;
  size_t n = 0;
  for_each_tensor(stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (!t.defined()) return;
    const c10::Device d = t.device();
    n += d.type() == c10::DeviceType::PrivateUse1;
    if (d.type() == c10::DeviceType::CPU && t.dim() == 0 && !(arg < 64 && ((writes >> arg) & 1))) return;
    if (d.type() != c10::DeviceType::PrivateUse1 || (device >= 0 && d.index() != device))
      one = false;
    else
      device = d.index();
  });
  ntensors = n;
  return one ? device : -1;
}
}  // namespace

void check_same_device(const c10::FunctionSchema& schema, uint64_t writes, torch::jit::Stack& stack, size_t first) {
  const size_t nargs = schema.arguments().size();
  std::optional<c10::Device> common;  // the first tpu tensor's device (CUDA: the first non-CPU device)
  std::optional<c10::Device> other;   // the first device that may not be mixed with it
  for_each_tensor(stack, first, nargs, [&](int arg, int elem, const at::Tensor& t) {
    if (!t.defined()) return;
    if (is_tpu(t)) {
      if (!common)
        common = t.device();
      else if (t.device() != *common && !other)
        other = t.device();
      return;
    }
    const bool written = arg < 64 && ((writes >> arg) & 1);
    if (!written && t.device().is_cpu()) {
      if (t.dim() == 0) return;  // a CPU scalar, read only (TensorIterator's allow_cpu_scalars)
      if (elem >= 0 && schema.arguments()[arg].name() == "indices") return;  // `t[cpu_index]`
    }
    if (!other) other = t.device();
  });
  if (common && other)
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *common,
                " and ", *other, "!");
}

namespace {
// CPU's dtype checks that no meta kernel makes (ops/cpu_probe.h), on a meta-cache
// miss after the meta kernel accepted the call: when CPU's kernel rejects these
// dtypes, the call runs eagerly, where CPU's kernel raises its error at the call
// (or computes, when the probe's twins misled it). True when it ran eagerly. A random
// op is probed too (bernoulli of an integer tensor): its probe has a generator of its own.
bool ran_for_cpu_dtype_check(const c10::OperatorHandle& op, const OpEntry& entry, const OpPlan& plan,
                             torch::jit::Stack* stack, size_t first, size_t nargs) {
  if (plan.custom_id) return false;
  if ((plan.traits & kFloatLoops) && probe_needless(op.schema(), *stack, first, nargs)) return false;
  std::vector<int64_t> key;
  const ProbeTwins twins{(plan.traits & kProbeTwinsOfTwo) ? 2 : 1, (plan.traits & kProbeFull16Bit) != 0};
  if (!cpu_kernel_rejects_dtypes(op, *stack, first, nargs, twins, &key)) return false;
  run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
  cpu_probe_misled(key);  // reached only when CPU's kernel computed the call
  return true;
}

// The "record" timer of metrics_report(): every op at TORCH_TPU_DEBUG >= 1,
// else 1 op in 64, so the record path pays a thread-local increment per op.
class RecordTimer {
 public:
  explicit RecordTimer(RecordThread& rt) {
    if (debug::level() >= 1 || (++rt.ops & 63) == 0) start_ = std::chrono::steady_clock::now();
  }
  ~RecordTimer() {
    if (start_ != std::chrono::steady_clock::time_point{})
      debug::time("record", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  std::chrono::steady_clock::time_point start_{};
};
}  // namespace

__attribute__((noinline)) RecordThread& record_thread() {
  RecordThread& r = t_record;
  if (__builtin_expect(!r.armed, 0)) arm_record_thread(r);
  return r;
}

void record_op(const c10::OperatorHandle& op, const OpEntry& entry, const OpPlan& plan, torch::jit::Stack* stack,
               BorrowedArgs* borrowed, RecordThread* thread) {
  RecordThread& rt = thread != nullptr ? *thread : record_thread();
  RecordTimer timer(rt);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;

  // 1. Devices, before anything is recorded or written (a forked child raises
  //    before meta inference): tpu tensors of one chip, plus 0-dim CPU tensors
  //    (scalars), as CPU/CUDA allow. Fresh results and the generator are that chip's.
  check_not_in_bad_fork();
  if (plan.traits & kCheckIndexDevices) check_index_devices(*stack, first);
  size_t ntensors = 0;  // the tensors among the arguments (the node's inputs' room)
  int device = single_chip_of(plan.writes, *stack, first, nargs, ntensors);  // the common case: nothing to raise
  const bool one_chip = device >= 0;
  if (!one_chip) device = op_device(*stack, first, nargs);  // raises CUDA's error for two chips
  // Switched only when it differs (nearly always the current chip already):
  // each switch is a call and a TLS lookup, twice.
  std::optional<ChipGuard> chip;
  if (device >= 0 && device != current_device_index()) chip.emplace(device);
  if (!one_chip) check_same_device(schema, plan.writes, *stack, first);
  // Batch norm's arguments CPU's kernels read unchecked (shape_rules.h): before any path,
  // the eager one of an empty input too, runs CPU's kernel.
  if (plan.traits & kShapeRules) check_by_shape_rule(plan.traits, *stack, first);

  if (!plan.has_meta.load(std::memory_order_relaxed) && has_meta_kernel(op))
    plan.has_meta.store(true, std::memory_order_relaxed);
  DivisorCheck divisor = DivisorCheck::kNone;  // set by cpu_checks_at_call_time
  if (entry.kind == PrimKind::kSync || !plan.has_meta.load(std::memory_order_relaxed) ||
      ((plan.traits & kExpandsPerTensor)
           ? foreach_writes_overlap(nargs, plan.writes, *stack, first)
           : writes_overlapping_memory(nargs, plan.writes, *stack, first, entry.kind == PrimKind::kData)) ||
      reduces_empty_input(entry.kind, plan.writes, *stack, first, nargs) ||
      ((plan.traits & kReadsDeterministicMode) && at::globalContext().deterministicAlgorithms()) ||
      cpu_checks_at_call_time(plan, *stack, first, &divisor)) {
    if (borrowed) borrowed->own();
    run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
    return;
  }

  if (entry.kind == PrimKind::kRandom) check_random_args(op, plan, *stack, first, nargs);
  if (plan.traits & kCheckNormalStd) check_normal_std(schema, *stack, first);

  // 2. Shape/dtype inference and call-time checks with the meta kernel
  //    (cached per op and argument metadata).
  // The key's buffer is reused by the thread's next op (an allocation less per op).
  std::vector<int64_t> own_key;  // after the thread's exit released its buffer
  std::vector<int64_t>& key_buffer = rt.key != nullptr ? *rt.key : own_key;
  meta_key(op, plan, *stack, first, nargs, key_buffer);
  const bool disk = plan.custom_id == 0;
  const MetaOutcome* cached = key_buffer.empty() ? nullptr : meta_cache().find(schema, key_buffer, disk, rt.memo);
  // Made only on a miss (an empty MetaOutcome's construction and destruction
  // were ~40 instructions an op, twice with `held` below).
  std::optional<MetaOutcome> computed_store;
  bool warned = false;  // the meta inference warned (Node::warned_at_call)
  // A miss infers the call's outcome (the meta kernel, a shape rule or CPU's kernel on
  // twins); false when the op ran eagerly instead. Out of line: its inlined code took
  // record_op past GCC's growth limit, which then left the hit path's small calls out
  // of line (SmallVector's emplace_back, ~40 instructions an op; docs/performance.md, gpt25).
  if (cached == nullptr) {  // the closure is built on a miss only (~24 instructions)
    auto infer_miss = [&]() __attribute__((noinline))->bool {
      MetaOutcome& computed = computed_store.emplace();
      const std::vector<int64_t> key = key_buffer;  // the meta call below may record (and reuse the buffer)
      if (borrowed) borrowed->own();                // the meta call and run_eager copy and drop arguments
      // The arguments with meta twins of the tpu tensors (one twin storage per tpu storage).
      auto meta_twins = [&]() {
        torch::jit::Stack twins(stack->begin() + first, stack->end());
        std::unordered_map<const void*, c10::Storage> meta_storages;
        // One twin per tensor: an out= that is also an input (torch.maximum(a, b,
        // out=a)) is in place for TensorIterator, which then does not resize it.
        std::unordered_map<const c10::TensorImpl*, at::Tensor> twin_of;
        for_each_tensor(twins, 0, nargs, [&](int arg, int elem, const at::Tensor& t) {
          if (!is_tpu(t)) return;
          at::Tensor& m = twin_of[t.unsafeGetTensorImpl()];
          if (!m.defined()) m = make_meta(t, meta_storages);
          host::set_tensor_slot(twins[arg], elem, m);
        });
        // Factories (triu_indices, ...) name their device: infer on meta, or the
        // meta call would come back to this kernel.
        retarget_device_args(twins, 0, nargs, c10::DeviceType::Meta);
        return twins;
      };
      TwinLease twin_lease;  // before the twins: released after they die
      torch::jit::Stack meta_stack;
      // A twin-free shape rule's results (CPU's geometry, without CPU's kernel on twins).
      std::optional<torch::jit::Stack> ruled;
      if (plan.traits & kShapeRules) {
        meta_stack = meta_twins();
        ruled = infer_by_shape_rule(op, plan.traits, meta_stack);
      }
      std::optional<torch::jit::Stack> on_cpu;
      if (!ruled && (plan.traits & kInferOnCpu)) on_cpu = cpu_twins(*stack, first, nargs, twin_lease);
      const bool inferred_on_cpu = on_cpu.has_value();
      if (inferred_on_cpu) n_twin_inferences.fetch_add(1, std::memory_order_relaxed);
      // Results that are CPU's own: no dtype probe, no correction, None for an undefined one.
      const bool cpu_geometry = inferred_on_cpu || ruled.has_value();
      if (inferred_on_cpu) {
        meta_stack = std::move(*on_cpu);
      } else if (!(plan.traits & kShapeRules)) {
        meta_stack = meta_twins();
      }
      // Range factories (arange, range, linspace, logspace) with out=: CPU keeps
      // the out tensor's shape and strides when its numel is the result's and
      // otherwise resize_s it to [n] (no warning); the reference meta kernels
      // resize it to [n] whenever the shape differs (and warn). Infer on an
      // empty twin; correct_meta_outcome restores CPU's geometry.
      if (plan.float_values) {
        for (size_t i = 0; i < nargs; ++i) {
          if (!schema.arguments()[i].is_out() || !meta_stack[i].isTensor()) continue;
          const at::Tensor& o = meta_stack[i].toTensor();
          meta_stack[i] = at::empty_strided({0}, {1}, o.options());
        }
      }
      // Keep the meta twins of written arguments: the kernel may resize them.
      std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
      std::vector<c10::IValue> cpp_returns;  // the C++ meta kernel's results, when it ran
      // The meta kernels' warnings (a uint8 mask's deprecation, an out= resized) are
      // held until inference succeeds; when it fails, CPU's kernel runs instead and
      // gives its own, so each warning comes once, as on CPU.
      struct HeldWarnings : c10::WarningHandler {
        std::vector<c10::Warning> held;
        void process(const c10::Warning& w) override { held.push_back(w); }
      } held;
      try {
        c10::WarningUtils::WarningHandlerGuard hold(&held);
        c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
        // CPU's own call-time checks first: the C++ meta kernel a Python one
        // shadows (cpu_meta.h), on twins of its own (it may resize out= twins).
        // Then the dispatcher's (Python) meta kernel, whose result geometry is
        // recorded and which checks what hand-written C++ meta kernels skip
        // (masked_fill_'s mask broadcast).
        if (ruled) {
          meta_stack = std::move(*ruled);
        } else if (inferred_on_cpu) {
          op.callBoxed(meta_stack);  // CPU's kernel: its geometry and its errors
        } else if (plan.traits & kInferAsClampMinZero) {
          infer_as_clamp_min_zero(meta_stack);
        } else if (plan.cpp_meta_only) {
          // A structured kernel's meta function: CPU's own inference, and no Python
          // (the reference meta kernels import sympy on their first call).
          plan.cpp_meta->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
        } else {
          if (plan.cpp_meta) {
            // Its warnings (an out= resized) come again from the kernel below.
            struct DropWarnings : c10::WarningHandler {
              void process(const c10::Warning&) override {}
            } drop;
            c10::WarningUtils::WarningHandlerGuard quiet(&drop);
            torch::jit::Stack cpp_stack = meta_twins();
            plan.cpp_meta->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &cpp_stack);
            cpp_returns.assign(cpp_stack.begin(), cpp_stack.end());
          }
          DeviceMetaInference as_cpu;  // Python meta kernels reason as for CPU (device_hint)
          op.callBoxed(meta_stack);
        }
      } catch (const std::exception& e) {
        // A custom op's fake impl is its call-time check: its error is the
        // op's (there is no CPU kernel to ask), unless it cannot infer shapes
        // without data; then the op runs now, after a flush, as nonzero does.
        if (plan.custom_id && !fake_impl_needs_data(e)) throw;
        // The meta kernel rejected the call (or cannot infer a data-dependent
        // shape). Run CPU's own kernel on the current values: it raises exactly
        // the exception CPU raises (type and message), or computes the result.
        run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
        return false;
      } catch (...) {
        if (plan.custom_id) throw;
        run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
        return false;
      }
      if (!cpu_geometry && ran_for_cpu_dtype_check(op, entry, plan, stack, first, nargs)) return false;
      for (const c10::Warning& w : held.held) c10::warn(w);
      for (size_t k = 0; k < schema.returns().size(); ++k) {
        std::vector<Geometry> geoms;
        const c10::IValue& mv = meta_stack[k];
        const int a = plan.aliased[k];
        if (a >= 0 && meta_args[a].isTensor()) {
          computed.written.emplace_back(a, geometry_of(meta_args[a].toTensor()));
        } else if (a >= 0 && meta_args[a].isTensorList()) {
          std::vector<Geometry> lg;
          for (const at::Tensor& m : meta_args[a].toTensorList().vec()) lg.push_back(geometry_of(m));
          computed.written_lists.emplace_back(a, std::move(lg));
        } else if (mv.isTensor()) {
          // A fresh result of a structured elementwise kernel: its C++ meta
          // function builds CPU's TensorIterator, so its strides are CPU's (the
          // layout for mixed-layout operands and size-1 dims: copysign, clamp,
          // ...), where the Python reference may choose others. (Not for other
          // kinds: some CPU kernels restride their result after the meta function,
          // e.g. replication_pad2d keeps channels-last.)
          const at::Tensor& m = mv.toTensor();
          const bool cpp = entry.kind == PrimKind::kElementwise && k < cpp_returns.size() &&
                           cpp_returns[k].isTensor() && cpp_returns[k].toTensor().defined() &&
                           cpp_returns[k].toTensor().sizes().equals(m.sizes()) &&
                           cpp_returns[k].toTensor().scalar_type() == m.scalar_type();
          geoms.push_back(geometry_of(cpp ? cpp_returns[k].toTensor() : m));
        } else if (mv.isTensorList()) {
          for (const at::Tensor& m : mv.toTensorList().vec()) geoms.push_back(geometry_of(m));
        } else if (cpu_geometry && mv.isNone()) {
          geoms.push_back(Geometry());  // an undefined result (an output_mask entry that was off)
        } else {
          TORCH_INTERNAL_ASSERT(false, "record: unexpected return of ", schema.name());
        }
        computed.returns.push_back(std::move(geoms));
      }
      // A structured out= kernel restrides a resized out= as CPU's does; kOutResizedContiguous
      // kernels copy into a resized out, which comes back contiguous as the meta kernel says.
      if (!cpu_geometry && !plan.cpp_meta_only && !(plan.traits & kOutResizedContiguous)) {
        c10::impl::ExcludeDispatchKeyGuard no_autograd(kAutograd);
        DeviceMetaInference as_cpu;
        restride_resized_outs(op, *stack, first, meta_args, computed);
      }
      if (!cpu_geometry) correct_meta_outcome(schema, plan.traits, *stack, first, computed);  // CPU's are CPU's
      // A call whose inference warned is inferred again next time, so that it
      // warns on every call as CPU does (a uint8 mask's deprecation, an out= resized).
      const bool warns = !held.held.empty() || resizes_nonempty_out(schema, *stack, first, computed);
      warned = warns;
      computed.scalars_fit = !plan.scalar_conversions.args.empty() &&
                             scalars_keyed_by_value(plan.scalar_conversions, *stack, first) &&
                             scalars_fit_now(schema, plan, *stack, first, computed);
      if (!key.empty() && !warns) computed.id = meta_cache().insert(schema, key, computed, disk);
      cached = &computed;
      return true;
    };
    if (!infer_miss()) return;
  }
  // Written lazy clones get their bytes now, after CPU's call-time checks (as
  // CPU's kernels take a mutable pointer once their checks passed). The copy is
  // recorded first, and may evict the meta cache's entry: keep it.
  std::optional<MetaOutcome> held;
  if (plan.writes != 0) {
    const uint64_t writes = writes_of_call(plan, *stack, first);
    if (writes_lazy_clone(writes, *stack, first, nargs)) {
      if (!computed_store) cached = &held.emplace(*cached);
      prepare_writes(writes, *stack, first, nargs);
    }
  }
  const MetaOutcome& meta = *cached;
  if (plan.traits & kWarnsOnOutResize) warn_arange_out_resize(*stack, first, meta);
  if (!meta.written.empty() && resizes_read_write_arg(schema, meta, *stack, first, nargs)) {
    if (borrowed) borrowed->own();
    run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
    return;
  }
  // randperm(n) into a dtype that cannot hold n distinct integers exactly:
  // CPU's check, on an empty CPU tensor of the result dtype (same message).
  if ((plan.traits & kCheckRandperm) && (*stack)[first].isInt()) {
    const auto dtype = result_dtype(plan, meta);
    if (dtype != c10::ScalarType::Undefined)
      at::native::check_supported_max_int_with_precision(
          (*stack)[first].toInt(),
          at::detail::empty_cpu({0}, dtype, std::nullopt, std::nullopt, std::nullopt, std::nullopt));
  }
  // After the meta kernel's checks, as CPU checks index values after shapes.
  if ((plan.traits & kCheckIndexBounds) && (*stack)[first].isTensor())
    check_index_bounds((*stack)[first].toTensor(), (*stack)[first + 1]);
  // CPU's Scalar overflow checks, on this call's values (the cache keys float Scalars by class). A
  // Scalar that does not fit runs CPU's kernel now: it raises CPU's error at the call, or computes
  // the result where CPU skips the conversion (empty matmuls, a pad that only narrows). Int and
  // bool Scalars (add's alpha=1) were checked when their key was first inferred (scalars_fit).
  if (!plan.scalar_conversions.args.empty() && !meta.scalars_fit &&
      !scalars_fit_now(schema, plan, *stack, first, meta)) {
    if (borrowed) borrowed->own();
    run_eager(op, stack, entry.kind == PrimKind::kRandom, /*fallback=*/false, &plan);
    return;
  }
  auto written_geometry = [&](int a) -> const Geometry& {
    for (const auto& w : meta.written)
      if (w.first == a) return w.second;
    TORCH_INTERNAL_ASSERT(false, "record: no geometry for written argument ", a);
  };
  auto written_list_geometry = [&](int a) -> const std::vector<Geometry>& {
    for (const auto& w : meta.written_lists)
      if (w.first == a) return w.second;
    TORCH_INTERNAL_ASSERT(false, "record: no geometry for written list argument ", a);
  };

  // 3. The node: tensor arguments become TensorRefs.
  Node node(op);
  node.kind = static_cast<int>(entry.kind);
  // An integer divisor still computed on the device: its zeros raise when the node runs, so it
  // runs even when nothing reads its result (a zero divisor raises on CPU whether or not it is).
  node.checks_values = (plan.traits & kChecksValues) != 0 || divisor == DivisorCheck::kDeferred;
  node.meta_id = meta.id;
  node.expands = (plan.traits & kExpandsPerTensor) != 0;
  node.warned_at_call = warned;
  const uint64_t writes = plan.writes;
  // Tensor arguments are not copied: their slots are filled by `keep`, in the one walk
  // over the arguments below (three walks before: the copy, the device retarget and
  // for_each_tensor's, ~100 instructions an `a + b`; docs/performance.md, gpt25).
  node.args.reserve(nargs);
  node.inputs.reserve(ntensors);
  uint64_t fresh_lists = 0;  // bit i: argument i is a Tensor[] made here (below)
  // What the node keeps of tensor `t`, argument `arg` (element `elem` of a list, or -1),
  // into its slot node.args[arg], pushed before.
  auto keep = [&](int arg, int elem, const at::Tensor& t) {
    c10::IValue& slot = node.args[arg];
    if (!t.defined()) return;
    if (!is_tpu(t)) {
      // A CPU scalar tensor: snapshot its value now (the user may change it before the flush).
      // A wrapped number (a Python or C++ Scalar made a tensor for this call, as in
      // `t * 0.5`) has no other holder, so it is kept as is: no copy, and it stays a
      // wrapped number (a clone drops the flag; the CPU kernel would then promote
      // float32 * 0.1 to float64).
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        // A top-level one (all a Python call makes) is kept as its Scalar
        // (Node::wrapped): the tensor is freed at the call, as CPU eager frees it.
        if (elem < 0 && arg < 32 && wrapped_to_scalar(t, &slot)) {
          node.wrapped |= 1u << arg;
          return;
        }
        host::set_tensor_slot(slot, elem, t);
        return;
      }
      host::set_tensor_slot(slot, elem, t.clone());
      return;
    }
    InputSlot& in = node.inputs.emplace_back();  // built in place: no move of its dims
    in.arg = static_cast<int16_t>(arg);
    in.elem = elem;
    in.written = (writes >> arg) & 1;
    make_ref(t, in.ref);
    // No reference kept: a pending node must not keep the tensor alive (DCE).
    // A top-level tensor's slot, and a Tensor[]'s element, is already the undefined
    // tensor (below); a Tensor?[]'s element is the list copy's.
    if (elem >= 0 && !(arg < 64 && ((fresh_lists >> arg) & 1))) host::set_tensor_slot(slot, elem, at::Tensor());
  };
  // The arguments in order, each with its tensors (for_each_tensor's order: the inputs'
  // order is the flush structure's).
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    const int arg = static_cast<int>(i);
    if (v.isTensor()) {
      node.args.emplace_back(at::Tensor());  // the slot the recorded tensor leaves
      keep(arg, -1, v.toTensor());
    } else if (!v.isList()) {
      // The executor runs CPU kernels: a "tpu" device argument becomes CPU
      // (retarget_device_args).
      if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
        node.args.emplace_back(c10::Device(c10::DeviceType::CPU));
      } else {
        node.args.push_back(v);
      }
    } else if (v.isTensorList()) {
      // A list of as many undefined tensors, which `keep` fills with what it
      // keeps (host scalars): the caller's list, copied and emptied element by element,
      // cost a copy-on-write and a call a tensor (docs/performance.md, fe20).
      auto list = v.toTensorList();
      c10::List<at::Tensor> empty;
      empty.resize(list.size());
      node.args.emplace_back(std::move(empty));
      if (i < 64) fresh_lists |= uint64_t{1} << i;
      for (size_t j = 0; j < list.size(); ++j) keep(arg, static_cast<int>(j), list.get(j));
    } else {
      // Other lists are kept as they are; a Tensor?[]'s defined elements are its inputs.
      node.args.push_back(v);
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (e.isTensor()) keep(arg, static_cast<int>(j), e.toTensor());
      }
    }
  }

  if (entry.kind == PrimKind::kRandom) {
    node.rng = true;
    at::Generator user;
    for (size_t i = 0; i < nargs; ++i) {
      const c10::IValue& v = (*stack)[first + i];
      if (v.isGenerator()) {
        user = v.toGenerator();
        node.args[i] = c10::IValue();
      }
    }
    if (user.defined()) {
      TORCH_CHECK(user.device().type() == c10::DeviceType::PrivateUse1,
                  "Expected a 'tpu' device type for generator but found '", user.device().type(), "'");
      node.rng_seed = reserve_random_stream(user);
    } else {
      node.rng_seed = reserve_random_stream(default_device_generator(current_device_index()));
    }
  }

  // 4. Results: aliases of written arguments, or fresh tpu tensors.
  const size_t nret = schema.returns().size();
  c10::SmallVector<c10::IValue, 2> results;
  results.reserve(nret);
  node.returns.reserve(nret);
  node.list_lens.reserve(nret);
  node.outputs.reserve(nret);
  int64_t fresh_bytes = 0;
  for (size_t k = 0; k < nret; ++k) {
    const int a = plan.aliased[k];
    const auto& geoms = meta.returns[k];
    if (a >= 0) {
      // In-place / out=: return the argument itself, with the geometry the op gave it.
      c10::IValue& orig = (*stack)[first + a];
      if (orig.isTensor()) {
        const at::Tensor& t = orig.toTensor();  // no reference: see below
        const Geometry& g = written_geometry(a);
        // Unchanged (an in-place op): the snapshot taken above stands.
        const bool changed = adopt_geometry(t, g.sizes, g.strides, g.offset);
        int idx = -1;
        for (size_t s = 0; s < node.inputs.size(); ++s) {
          if (node.inputs[s].arg != a) continue;
          if (changed) make_ref(t, node.inputs[s].ref);
          idx = static_cast<int>(s);
        }
        node.returns.push_back(idx);
        // An unboxed caller (`borrowed`) returns its own argument: a reference
        // taken on its borrowed tensor would cost two GIL round trips
        // (BorrowedArgs); it gets None in the result's place.
        if (borrowed != nullptr)
          results.emplace_back();
        else
          results.emplace_back(t);
      } else {
        auto list = orig.toTensorList();
        const auto& lg = written_list_geometry(a);
        for (size_t j = 0; j < list.size(); ++j) {
          at::Tensor t = list.get(j);
          adopt_geometry(t, lg[j].sizes, lg[j].strides, lg[j].offset);
          for (auto& in : node.inputs)
            if (in.arg == a && in.elem == static_cast<int>(j)) make_ref(t, in.ref);
        }
        node.returns.push_back(-3);  // list alias: nothing to bind
        results.emplace_back(list);
      }
      node.list_lens.push_back(0);
    } else if (plan.list_return[k]) {
      c10::List<at::Tensor> out;
      for (const Geometry& g : geoms) {
        at::Tensor t = fresh_tpu(g);
        make_ref(t, node.outputs.emplace_back());
        fresh_bytes += static_cast<int64_t>(t.storage().nbytes());
        out.push_back(std::move(t));
      }
      node.returns.push_back(-2);
      node.list_lens.push_back(static_cast<int>(out.size()));
      results.emplace_back(std::move(out));
    } else if (!geoms.at(0).defined) {
      node.returns.push_back(-4);  // undefined result (e.g. an output_mask entry that was off)
      node.list_lens.push_back(0);
      results.emplace_back(at::Tensor());
    } else {
      at::Tensor t = fresh_tpu(geoms[0]);
      make_ref(t, node.outputs.emplace_back());
      fresh_bytes += static_cast<int64_t>(t.storage().nbytes());
      node.returns.push_back(-1);
      node.list_lens.push_back(0);
      results.emplace_back(std::move(t));
    }
  }
  // After adopt_geometry, written inputs snapshot the final geometry.
  node.where = current_location();
  if (borrowed) borrowed->release();
  // A foreach op: CPU's per-tensor in-place ops bump each written tensor's version
  // (ADInplaceOrView), once per element, where the foreach op's own kernels bump none.
  if (node.expands && !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) {
    for_each_written_tensor(writes, *stack, first, nargs, [](const at::Tensor& t) {
      if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
    });
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
  // Only matmul-class ops run at a float32 matmul precision (the MXU's passes).
  enqueue(std::move(node), fresh_bytes, entry.kind == PrimKind::kMatmul ? recording_precision() : kAnyPrecision);
}

namespace {

// The eager path's lazy clones that an op writes (run_eager): one host copy of
// the shared bytes per StorageImpl, which the CPU kernel reads and writes;
// commit() then gives the StorageImpl bytes of its own holding that copy.
class LazyCloneWrites {
 public:
  bool empty() const { return copies_.empty(); }
  // Makes a host copy of `t`'s storage (current: the caller flushed).
  void add(const at::Tensor& t) {
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    for (const auto& c : copies_)
      if (c.impl == impl) return;
    DeviceBytes b = device_bytes_of(t.storage());
    // A failed value whose error the user saw is copied as is: an out= that
    // overwrites it whole succeeds (run_eager raises it for other arguments).
    if (!b.storage->error_seen) raise_storage_error(b.storage);
    const auto nbytes = static_cast<int64_t>(t.storage().nbytes());
    at::Tensor host = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte));
    if (nbytes > 0) std::memcpy(host.data_ptr(), static_cast<const char*>(b.storage->data) + b.byte_offset, nbytes);
    copies_.push_back({impl, host.storage(), false});
  }
  // The CPU view of argument `t` (snapshot `r`): over the host copy when `t`
  // shares a copied StorageImpl, else over the device buffer.
  at::Tensor view(const at::Tensor& t, const TensorRef& r, host::HostMemory& mem) {
    for (const auto& c : copies_)
      if (c.impl == t.storage().unsafeGetStorageImpl()) return host::view_over(c.host, r);
    return mem.strided(r);
  }
  // The host copy's first byte for a tensor over a copied StorageImpl, else nullptr.
  const void* host_bytes(const at::Tensor& t) const {
    for (const auto& c : copies_)
      if (c.impl == t.storage().unsafeGetStorageImpl()) return c.host.data();
    return nullptr;
  }
  // After the kernel wrote the host copy of `t`'s StorageImpl: the StorageImpl
  // gets bytes of its own (prepare_write) and they take the host copy's value.
  void commit(const at::Tensor& t) {
    for (auto& c : copies_) {
      if (c.impl != t.storage().unsafeGetStorageImpl() || c.done) continue;
      c.done = true;
      prepare_write(t);
      DeferredStorage* now = device_bytes_of(t.storage()).storage;
      if (storage_has_pending(now)) (void)flush_all(FlushReason::kDataDependent);  // the copy prepare_write recorded
      unshare_for_write(now);
      const size_t n = std::min(c.host.nbytes(), now->nbytes);
      if (n > 0) std::memcpy(now->data, c.host.data(), n);
    }
  }

 private:
  struct Copy {
    const c10::StorageImpl* impl;
    c10::Storage host;  // CPU bytes, the StorageImpl's whole size (a kernel may grow them)
    bool done;
  };
  std::vector<Copy> copies_;
};

}  // namespace

void run_eager(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool random, bool fallback,
               const OpPlan* plan) {
  // A foreach op recorded whole otherwise (kExpandsPerTensor): CPU's loop over its tensors,
  // whose per-tensor ops record as any call does (or run here), raising where CPU raises
  // after writing the tensors before, and bumping their versions as CPU's do.
  if (plan != nullptr && (plan->traits & kExpandsPerTensor)) {
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd, *stack);
    return;
  }
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  const uint64_t writes = plan ? plan->writes : written_args(schema);
  if (plan == nullptr) check_same_device(schema, writes, *stack, first);  // record_op checked the others
  ChipGuard chip(op_device(*stack, first, nargs));                        // results on the op's chip
  (void)flush_all(fallback ? FlushReason::kCpuFallback : FlushReason::kDataDependent);
  count_eager_op(fallback);

  // Lazy clones the op writes (ops/lazy_clone.h): the CPU kernel runs on a host
  // copy of their shared bytes, for every argument over the same StorageImpl,
  // and they get bytes of their own only once it succeeded (as CPU's kernels
  // raise their call-time errors before taking a mutable pointer).
  LazyCloneWrites cow;
  if (writes != 0 && writes_lazy_clone(writes, *stack, first, nargs)) {
    for_each_written_tensor(writes, *stack, first, nargs, [&](const at::Tensor& t) {
      if (is_tpu(t) && needs_prepare_write(t)) cow.add(t);
    });
  }

  // Storages this op writes and that CPU tensors share (zero-copy host reads)
  // get their own buffer first, before any argument's CPU view is built: a
  // view built earlier (another argument on the same storage) would keep the
  // shared buffer.
  for_each_tensor(*stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (is_tpu(t) && arg < 64 && (writes >> arg & 1)) unshare_for_write(deferred_storage_of(t));
  });

  // CPU views over the device buffers: one CPU storage per device storage.
  host::HostMemory mem(/*resizable=*/true);  // CPU kernels may grow out= arguments
  torch::jit::Stack cpu(stack->begin() + first, stack->end());
  // An out= argument is written, not read: a value a failed op left in it,
  // once the user has seen its error, does not stop the call (it is cleared
  // below if the op overwrites it whole).
  auto is_out = [&](int arg) { return schema.arguments()[arg].is_out(); };
  // One CPU view per tensor: an out= that is also an input (torch.add(a, b,
  // out=a)) must be the same tensor for the CPU kernel too (in place: not resized).
  std::unordered_map<const c10::TensorImpl*, at::Tensor> view_of;
  std::vector<std::pair<at::Tensor, at::Tensor>> written_views;  // (tpu tensor, its CPU view)
  for_each_tensor(cpu, 0, nargs, [&](int arg, int elem, const at::Tensor& t) {
    if (!is_tpu(t)) return;
    TensorRef r = make_ref(t);
    if (!is_out(arg) || !r.storage->error_seen) raise_storage_error(r.storage.get());
    at::Tensor& v = view_of[t.unsafeGetTensorImpl()];
    if (!v.defined()) v = cow.empty() ? mem.strided(r) : cow.view(t, r, mem);
    host::set_tensor_slot(cpu[arg], elem, v);
  });
  // Written tensors, also when the same tensor came first as an input
  // (torch.cat([b, b], out=b)): one entry per tensor.
  for_each_tensor(*stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (!is_tpu(t) || arg >= 64 || !(writes >> arg & 1)) return;
    for (const auto& w : written_views)
      if (w.first.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return;
    written_views.emplace_back(t, view_of[t.unsafeGetTensorImpl()]);
  });
  // A factory's "tpu" device argument (triu_indices(3, 3, dtype=torch.float32,
  // device="tpu")): CPU's kernel makes its result on the host (copied to a tpu
  // tensor below); left as "tpu", the call would come back to this kernel.
  retarget_device_args(cpu, 0, nargs, c10::DeviceType::CPU);
  at::Generator user_gen;
  for (size_t i = 0; i < nargs; ++i)
    if (cpu[i].isGenerator()) user_gen = (*stack)[first + i].toGenerator();
  Node pseudo(op);
  if (random) {
    pseudo.rng = true;
    pseudo.rng_seed =
        reserve_random_stream(user_gen.defined() ? user_gen : default_device_generator(current_device_index()));
    for (size_t i = 0; i < nargs; ++i)
      if (cpu[i].isGenerator()) cpu[i] = at::make_generator<at::CPUGeneratorImpl>(pseudo.rng_seed);
  }
  try {
    host::call_cpu(pseudo, cpu);
  } catch (...) {
    // CPU's kernels may resize an out= before a later check fails (cat's
    // overlap check): the tensor keeps the new geometry, as on CPU.
    for (auto& [t, v] : written_views) {
      if (v.sizes().equals(t.sizes()) && v.strides().equals(t.strides()) && v.storage_offset() == t.storage_offset())
        continue;
      cow.commit(t);  // a lazy clone resized: new memory of its own, as CPU's resize_ gives it
      at::Tensor orig = t;
      const bool moved = v.storage().data() != deferred_storage_of(orig)->data;
      adopt_geometry(orig, v.sizes(), v.strides(), v.storage_offset());
      if (moved) host::view_over(host::wrap_device_buffer(deferred_storage_of(orig)), make_ref(orig)).copy_(v);
    }
    throw;
  }
  for (auto& [t, v] : written_views) cow.commit(t);
  if (Executor& ex = active_executor(); ex.has_eager_numerics()) {  // e.g. Spyre's storage numerics
    std::vector<c10::IValue> returns(cpu.begin(), cpu.begin() + schema.returns().size());
    const std::string name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    ex.after_eager_op(returns, name + " (run eagerly at " + current_location().str() + ")");
  }

  std::vector<c10::IValue> results;
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    c10::IValue& v = cpu[k];
    const int a = aliased_arg(schema, k);
    const auto* ra = schema.returns()[k].alias_info();
    if (a >= 0 && v.isTensor() && (*stack)[first + a].isTensor()) {
      at::Tensor orig = (*stack)[first + a].toTensor();
      at::Tensor res = v.toTensor();
      // CPU views are over the whole device buffer; an alias storage (see
      // device_bytes_of) starts `bytes.byte_offset` bytes into it.
      const DeviceBytes bytes = device_bytes_of(orig.storage());
      if (ra->isWrite()) {
        // Written in place on the host buffer, unless the CPU kernel grew it
        // into new CPU memory (then the value is copied back).
        const bool moved = res.storage().data() != bytes.storage->data;
        const int64_t shift = moved ? 0 : bytes.byte_offset / static_cast<int64_t>(orig.itemsize());
        if (moved || !res.sizes().equals(orig.sizes()) || !res.strides().equals(orig.strides()) ||
            res.storage_offset() - shift != orig.storage_offset()) {
          adopt_geometry(orig, res.sizes(), res.strides(), res.storage_offset() - shift);
          if (moved) host::view_over(host::wrap_device_buffer(deferred_storage_of(orig)), make_ref(orig)).copy_(res);
        }
        results.emplace_back(orig);
      } else {
        // A view of a tpu argument: same storage, geometry from the CPU result.
        const void* host = cow.host_bytes(orig);
        auto* base =
            host ? static_cast<const char*>(host) : static_cast<const char*>(bytes.storage->data) + bytes.byte_offset;
        const int64_t off = (static_cast<const char*>(res.data_ptr()) - base) / static_cast<int64_t>(res.itemsize());
        at::Tensor alias =
            at::detail::make_tensor<c10::TensorImpl>(c10::Storage(orig.storage()), orig.key_set(), res.dtype());
        alias.unsafeGetTensorImpl()->set_sizes_and_strides(res.sizes(), res.strides(), off);
        results.emplace_back(alias);
      }
    } else if (v.isTensor()) {
      at::Tensor res = v.toTensor();
      if (!res.defined() || !res.device().is_cpu()) {
        results.emplace_back(res);
        continue;
      }
      if (res.layout() != at::kStrided || res.is_quantized()) {  // e.g. a sparse gradient
        results.emplace_back(layout_result_to_tpu(res));
        continue;
      }
      at::Tensor t =
          at::detail::empty_strided_generic(res.sizes(), res.strides(), device_allocator(),
                                            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), res.scalar_type());
      host::view_over(host::wrap_device_buffer(deferred_storage_of(t)), make_ref(t)).copy_(res);
      results.emplace_back(std::move(t));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& res : v.toTensorList().vec()) {
        at::Tensor t =
            at::detail::empty_strided_generic(res.sizes(), res.strides(), device_allocator(),
                                              c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), res.scalar_type());
        host::view_over(host::wrap_device_buffer(deferred_storage_of(t)), make_ref(t)).copy_(res);
        out.push_back(std::move(t));
      }
      results.emplace_back(std::move(out));
    } else {
      results.emplace_back(v);  // int, float, bool, Scalar results
    }
  }
  // out= arguments now hold the op's value, in their final geometry.
  for_each_tensor(*stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (is_tpu(t) && is_out(arg) && make_ref(t).covers_storage()) deferred_storage_of(t)->set_error(nullptr);
  });
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

int64_t twin_inference_count() { return n_twin_inferences.load(std::memory_order_relaxed); }

}  // namespace tpu_eager
