// Host runtime: device values as CPU tensors, CPU kernels as library calls.
#include "executors/host_runtime.h"

#include <algorithm>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "device/block_cache.h"
#include "device/device.h"
#include "lazy/dense_order.h"
#include "jit/ir.h"
#include "ops/cpu_probe.h"
#include "ops/custom_ops.h"

namespace tpu_eager {
namespace host {

namespace {
// A device buffer's wrapper frees nothing: the DeferredStorage outlives the
// flush (nodes hold it). Named, so a kept wrapper is recognized by it.
void keep_device_buffer(void*) {}

c10::DataPtr device_buffer_ptr(DeferredStorage* s) {
  return c10::DataPtr(s->data, s->data, &keep_device_buffer, c10::Device(c10::DeviceType::CPU));
}

// True when only its holder holds `st`, a non-resizable storage whose data
// pointer still frees with `deleter` (no kernel replaced it): no other strong
// or weak reference, no Python object.
bool only_holder(const c10::Storage& st, c10::DeleterFnPtr deleter) {
  c10::StorageImpl* impl = st.unsafeGetStorageImpl();
  return st.use_count() == 1 && !impl->resizable() && impl->allocator() == nullptr &&
         impl->_mutable_data_ptr_no_checks().get_deleter() == deleter &&
         st.getWeakStorageImpl().weak_use_count() == 2 && impl->pyobj_slot()->load_pyobj() == nullptr;
}
}  // namespace

c10::Storage wrap_device_buffer(DeferredStorage* s, bool resizable) {
  return c10::Storage(c10::Storage::use_byte_size_t(), s->nbytes, device_buffer_ptr(s),
                      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
}

namespace {
// What a scratch block's DataPtr frees: its address and size (the cache's bucket).
struct ScratchBlock {
  void* ptr;
  size_t nbytes;
};
void free_scratch(void* ctx) {
  auto* b = static_cast<ScratchBlock*>(ctx);
  host_block_free(b->ptr, b->nbytes);
  delete b;
}
}  // namespace

namespace {
// A flush temporary's storage nothing else holds, below the block cache's small
// blocks' bound (device/block_cache.h): HostMemory keeps it for the next
// temporary of its size (HostMemory::scratch).
constexpr size_t kSpareScratchBytes = 64 * 1024;
bool spare_scratch(const c10::Storage& st) {
  return st.nbytes() < kSpareScratchBytes && only_holder(st, &free_scratch);
}
}  // namespace

c10::Storage scratch_storage(size_t nbytes) {
  void* p = host_block_alloc(std::max<size_t>(nbytes, 1));
  TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "tpu: out of host memory for a temporary of ", nbytes, " bytes");
  c10::DataPtr ptr(p, new ScratchBlock{p, std::max<size_t>(nbytes, 1)}, &free_scratch,
                   c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), nullptr, /*resizable=*/false);
}

at::Tensor view_over(const c10::Storage& storage, const TensorRef& r) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    c10::scalarTypeToTypeMeta(r.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), r.strides(), r.offset);
  return t;
}

namespace {
// Equal dims, compared inline (a view's few dims: IntArrayRef::equals called memcmp).
bool same_dims(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

// `kept` (a compiled region's kept tensor) as r's tensor over `storage`, its
// storage replaced, when only its holder holds it and it has r's dtype and
// geometry; with `storage_numel` >= 0, also only when r lies inside that many
// elements of the storage. False (kept unchanged) otherwise.
bool reuse_kept(at::Tensor& kept, const c10::Storage& storage, const TensorRef& r, int64_t storage_numel = -1) {
  if (!kept.defined() || kept.use_count() != 1 || kept.scalar_type() != r.dtype || kept.storage_offset() != r.offset ||
      !same_dims(kept.sizes(), r.sizes()) || !same_dims(kept.strides(), r.strides()) || kept.is_conj() || kept.is_neg())
    return false;
  if (storage_numel >= 0 && (r.offset < 0 || r.offset + kept.numel() > storage_numel)) return false;
  kept.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
  return true;
}
}  // namespace

at::Tensor view_over_kept(const c10::Storage& storage, const TensorRef& r, at::Tensor& kept) {
  if (!reuse_kept(kept, storage, r)) kept = view_over(storage, r);
  return kept;
}

size_t HostMemory::spare_bucket(size_t nbytes) {
  return static_cast<size_t>((static_cast<uint64_t>(nbytes >> 6) * 0x9E3779B97F4A7C15ULL) >> 59) % kSpareBuckets;
}

c10::Storage HostMemory::scratch(size_t nbytes) {
  std::vector<c10::Storage>& bucket = spare_scratch_[spare_bucket(nbytes)];
  for (size_t k = bucket.size(); k-- > 0;) {
    if (bucket[k].nbytes() != nbytes) continue;
    c10::Storage st = std::move(bucket[k]);
    if (k + 1 != bucket.size()) bucket[k] = std::move(bucket.back());
    bucket.pop_back();
    --n_spare_scratch_;
    return st;
  }
  return scratch_storage(nbytes);
}

void HostMemory::keep_spare(const c10::Storage& st) {
  if (resizable_ || n_spare_scratch_ >= kMaxSpareScratch || !st || !spare_scratch(st)) return;
  spare_scratch_[spare_bucket(st.nbytes())].push_back(st);
  ++n_spare_scratch_;
}

void HostMemory::release_bound(DeferredStorage* s) {
  if (Entry* e = map_.find(s)) {
    c10::Storage st = std::move(e->storage);
    (void)map_.erase(s);
    keep_spare(st);
  }
}

c10::Storage HostMemory::device_buffer(DeferredStorage* s) {
  if (const Entry* e = map_.find(s); e != nullptr && !e->temp) return e->storage;
  c10::Storage st = is_transient(s) ? scratch(s->nbytes) : wrap(s);
  map_[s] = Entry{st, false};
  return st;
}

c10::Storage HostMemory::wrap(DeferredStorage* s) {
  if (resizable_ || spare_wrappers_.empty()) return wrap_device_buffer(s, resizable_);
  c10::Storage st = std::move(spare_wrappers_.back());
  spare_wrappers_.pop_back();
  st.set_data_ptr_noswap(device_buffer_ptr(s));
  st.set_nbytes(s->nbytes);
  return st;
}

const void* HostMemory::data_for(DeferredStorage* s, size_t* nbytes) {
  if (const Entry* e = map_.find(s)) {
    *nbytes = e->storage.nbytes();
    return e->storage.data();
  }
  if (!is_transient(s)) {  // its device buffer, as wrap_device_buffer would wrap it
    *nbytes = s->nbytes;
    return s->data;
  }
  const c10::Storage st = device_buffer(s);
  *nbytes = st.nbytes();
  return st.data();
}

void* HostMemory::device_data(DeferredStorage* s, size_t* nbytes) {
  const Entry* e = map_.find(s);
  if (e != nullptr && !e->temp) {
    *nbytes = e->storage.nbytes();
    return e->storage.mutable_data();
  }
  if (e == nullptr && !is_transient(s)) {
    *nbytes = s->nbytes;
    return s->data;
  }
  c10::Storage st = device_buffer(s);
  *nbytes = st.nbytes();
  return st.mutable_data();
}

bool HostMemory::adopt_transient(DeferredStorage* s, c10::Storage storage) {
  if (!is_transient(s)) return false;
  map_[s] = Entry{std::move(storage), false};
  return true;
}

bool HostMemory::adopt_output(DeferredStorage* s, c10::Storage storage) {
  if (adopt_transient(s, storage)) return true;
  if (!adopt_host_buffer(s, storage)) return false;
  map_[s] = Entry{std::move(storage), false};  // the same bytes as s->data now
  return true;
}

void HostMemory::bind_temp(DeferredStorage* s, c10::Storage storage) { map_[s] = Entry{std::move(storage), true}; }

bool HostMemory::is_temp(DeferredStorage* s) const {
  const Entry* e = map_.find(s);
  return e != nullptr && e->temp;
}

void HostMemory::release_temp(DeferredStorage* s) {
  const Entry* e = map_.find(s);
  if (e != nullptr && e->temp) release(s);
}

c10::Storage HostMemory::storage_for(DeferredStorage* s) {
  if (const Entry* e = map_.find(s)) return e->storage;
  return device_buffer(s);
}

at::Tensor HostMemory::flat(const TensorRef& r) {
  c10::Storage st = storage_for(r.storage.get());
  TensorRef f;
  f.dtype = r.dtype;
  f.set_dims({static_cast<int64_t>(st.nbytes() / c10::elementSize(r.dtype))}, {1});
  return view_over(st, f);
}

namespace {
at::Tensor with_bits(at::Tensor t, const TensorRef& r) {
  if (r.conj) t._set_conj(true);
  if (r.neg) t._set_neg(true);
  return t;
}

// True when the view `r` is row-major contiguous and lies inside the
// `storage_numel` elements of its storage: its view chain is at most a
// narrow and a reshape (never padded, never a gather), so the strided view is
// the tensor without decomposing the chain (an allocation per step of it; the
// digits step ran ~200 such decompositions per step for plain operands).
// Also true for a permutation of such a view (a transposed weight, a
// channels-last activation): every element once, strides the sizes' products
// in some order of the dims. views::decompose gives it a narrow, a reshape and
// a permute (no pad: its block is the view's own elements, inside the storage),
// so it is the strided view too; decomposing it cost ~8 allocations an operand.
bool plain_in_bounds(const TensorRef& r, int64_t storage_numel) {
  if (r.offset < 0 || r.offset + r.numel() > storage_numel) return false;
  return r.is_dense() || (r.numel() > 0 && dense_in_some_order(r.sizes(), r.strides()));
}
}  // namespace

at::Tensor HostMemory::strided(const TensorRef& r) { return with_bits(view_over(storage_for(r.storage.get()), r), r); }

at::Tensor HostMemory::tensor(const TensorRef& r, bool strided_gather, at::Tensor* kept) {
  // Not read when no input may hold one: a storage already bound here is then
  // not touched at all (its fields are a cache miss between kernels).
  if (inputs_may_hold_errors()) {
    ++error_reads_;
    check_storage_error(r.storage.get());
  }
  c10::Storage st = storage_for(r.storage.get());
  const int64_t numel = static_cast<int64_t>(st.nbytes() / c10::elementSize(r.dtype));
  // A kept tensor is only made for a plain view (below), and whether a view is
  // dense in some order depends on its geometry alone: with r's geometry only
  // the bounds are checked again (a compiled region's operands, every run).
  const bool keep = kept != nullptr && !r.conj && !r.neg;
  if (keep && reuse_kept(*kept, st, r, numel)) return *kept;
  if (plain_in_bounds(r, numel)) {
    if (keep) return *kept = view_over(st, r);
    return with_bits(view_over(st, r), r);
  }
  const views::ViewChain chain = views::decompose(numel, r.sizes(), r.strides(), r.offset);
  // A chain of slices, reshapes, permutes and broadcasts aliases the storage:
  // on the host that is exactly the strided view, built in one step.
  if (!chain.padded && (!chain.gather || strided_gather)) return with_bits(view_over(st, r), r);
  return with_bits(views::apply(flat(r), chain, r.sizes(), r.strides(), r.offset), r);
}

at::Tensor HostMemory::written_tensor(const TensorRef& r) {
  if (inputs_may_hold_errors()) {
    ++error_reads_;
    check_storage_error(r.storage.get());
  }
  c10::Storage st = storage_for(r.storage.get());
  const int64_t numel = static_cast<int64_t>(st.nbytes() / c10::elementSize(r.dtype));
  if (plain_in_bounds(r, numel)) return with_bits(view_over(st, r), r);
  const views::ViewChain chain = views::decompose(numel, r.sizes(), r.strides(), r.offset);
  if (!chain.padded && !chain.gather) return with_bits(view_over(st, r), r);
  // Elements that share memory: the op's CPU kernel writes the strided view
  // itself, element by element in memory order as on CPU (a gathered copy
  // scattered back would let stale copies overwrite new values).
  if (chain.gather && views::overlaps_itself(r.sizes(), r.strides())) return with_bits(view_over(st, r), r);
  at::Tensor f = flat(r);
  at::Tensor v = views::apply(f, chain, r.sizes(), r.strides(), r.offset);
  {
    // The op writes a copy; finish_writes() scatters it back through the inverse chain.
    v = v.contiguous();
    pending_writes_.push_back(PendingWrite{f, r, chain, v});
  }
  return with_bits(v, r);
}

void HostMemory::clear(size_t expected) {
  pending_writes_.clear();
  set_transient(0, nullptr, 0);
  set_numbered(nullptr, 0);
  inputs_may_hold_errors_ = true;
  if (!resizable_) {
    constexpr size_t kMaxSpare = 256;  // a flush's device buffers, about
    map_.for_each([&](const DeferredStorage*, const Entry& e) {
      if (!e.temp && spare_wrappers_.size() < kMaxSpare && only_holder(e.storage, &keep_device_buffer))
        spare_wrappers_.push_back(e.storage);
      else
        keep_spare(e.storage);
    });
  }
  map_.clear(expected);
}

void HostMemory::finish_writes() {
  for (auto& w : pending_writes_)
    views::scatter(w.flat, w.chain, w.ref.sizes(), w.ref.strides(), w.ref.offset, w.value);
  pending_writes_.clear();
}

namespace {

int generator_arg(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (is_generator_arg(args[i])) return static_cast<int>(i);
  return -1;
}

}  // namespace

namespace {

// Writes the Scalar `v` into the 0-dim tensor `t` of its wrapped_number_dtype; returns `t`.
at::Tensor fill_wrapped(const at::Tensor& t, const c10::IValue& v) {
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      *t.mutable_data_ptr<double>() = v.toDouble();
      break;
    case c10::ScalarType::Long:
      *t.mutable_data_ptr<int64_t>() = v.toInt();
      break;
    case c10::ScalarType::Bool:
      *t.mutable_data_ptr<bool>() = v.toBool();
      break;
    default:
      *t.mutable_data_ptr<c10::complex<double>>() = v.toComplexDouble();
      break;
  }
  return t;
}

}  // namespace

void set_tensor_slot(c10::IValue& slot, int elem, at::Tensor t) {
  if (elem < 0) {
    slot = std::move(t);
  } else if (slot.isTensorList()) {
    // Copied only while another holder shares it (the caller's stack, a Node's
    // arguments): a copy per element made filling an N-tensor list cost O(N^2).
    auto list = std::move(slot).toTensorList();
    if (list.use_count() > 1) list = list.copy();
    list.set(elem, std::move(t));
    slot = std::move(list);
  } else {
    auto list = c10::impl::toTypedList<std::optional<at::Tensor>>(std::move(slot).toList());
    if (list.use_count() > 1) list = list.copy();
    list.set(elem, t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
    slot = std::move(list);
  }
}

at::Tensor wrapped_number(const c10::IValue& v) {
  // Per thread, a few wrapped numbers per dtype to reuse: one is free when
  // nothing but this pool holds it or its storage (a kernel's result never
  // aliases an input that is a wrapped number, but the check costs two loads).
  constexpr size_t kPool = 8;
  thread_local at::Tensor pool[kPool];
  const c10::ScalarType dtype = wrapped_number_dtype(v);
  at::Tensor* slot = nullptr;
  for (auto& t : pool) {
    if (!t.defined()) {
      if (!slot) slot = &t;
      continue;
    }
    if (t.scalar_type() == dtype && t.use_count() == 1 && t.storage().use_count() == 1) {
      slot = &t;
      break;
    }
  }
  if (!slot || !slot->defined()) {
    at::Tensor t = at::detail::empty_cpu({}, dtype, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    if (!slot) return fill_wrapped(t, v);
    *slot = std::move(t);
  }
  return fill_wrapped(*slot, v);
}

void build_stack(const Node& n, HostMemory& mem, torch::jit::Stack& stack) { build_stack(n, mem, stack, nullptr); }

void build_stack(const Node& n, HostMemory& mem, torch::jit::Stack& stack, at::Tensor* kept) {
  stack.assign(n.args.begin(), n.args.end());
  for (uint32_t w = n.wrapped; w != 0; w &= w - 1) {
    const int a = __builtin_ctz(w);
    stack[a] = wrapped_number(stack[a]);
  }
  // A storage written through a view whose elements share memory is written
  // in place (written_tensor); the op's reads of that storage (torch.add(v, 1,
  // out=v)) must see the same memory as on CPU, not a gathered copy.
  c10::SmallVector<const DeferredStorage*, 2> overlapped;
  for (const auto& in : n.inputs)
    if (in.written && views::overlaps_itself(in.ref.sizes(), in.ref.strides()))
      overlapped.push_back(in.ref.storage.get());
  auto in_place = [&](const TensorRef& r) {
    return std::find(overlapped.begin(), overlapped.end(), r.storage.get()) != overlapped.end();
  };
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const InputSlot& in = n.inputs[k];
    at::Tensor t;
    if (in.written) {
      t = mem.written_tensor(in.ref);
    } else if (!overlapped.empty() && in_place(in.ref)) {
      check_storage_error(in.ref.storage.get());
      t = mem.strided(in.ref);
    } else {
      t = mem.tensor(in.ref, /*strided_gather=*/true, kept ? &kept[k] : nullptr);  // CPU kernels read any strides
    }
    set_tensor_slot(stack[in.arg], in.elem, std::move(t));
  }
  if (n.rng) {
    int g = generator_arg(n.op.schema());
    if (g >= 0) stack[g] = at::make_generator<at::CPUGeneratorImpl>(n.rng_seed);
  }
}

namespace {
// Runs a custom op's kernel (custom_ops.h) on host tensors and checks its
// fresh results against what its fake impl said at the call.
void call_custom(const Node& n, HostKernel& kernel, torch::jit::Stack& stack) {
  const auto& schema = n.op.schema();
  const std::string name = op_short_name(schema);
  {
    HostCodeScope host_code(name.c_str());  // its tpu ops would re-enter the queue being flushed
    kernel.run(n.op, &stack, n.where);
  }
  if (n.outputs.empty()) return;  // run at the call (run_eager): nothing recorded to check against
  size_t j = 0;
  auto check = [&](const at::Tensor& t, size_t k) {
    TORCH_CHECK(j < n.outputs.size(), "tpu: the kernel of ", name, " returned more tensors than its fake impl");
    const TensorRef& ref = n.outputs[j++];
    TORCH_CHECK(t.defined() && t.sizes().equals(ref.sizes()) && t.scalar_type() == ref.dtype, "tpu: the kernel of ",
                name, " returned ", (t.defined() ? c10::toString(t.scalar_type()) : "None"), " ",
                (t.defined() ? t.sizes() : c10::IntArrayRef()), " for result ", k, " where its fake impl gave ",
                c10::toString(ref.dtype), " ", c10::IntArrayRef(ref.sizes()));
  };
  for (size_t k = 0; k < n.returns.size() && k < stack.size(); ++k) {
    if (n.returns[k] == -1) check(stack[k].isTensor() ? stack[k].toTensor() : at::Tensor(), k);
    if (n.returns[k] == -2)
      for (const auto& t : stack[k].toTensorList()) check(t, k);
  }
}
}  // namespace

void call_cpu(const Node& n, torch::jit::Stack& stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) {
    if (auto kernel = custom_host_kernel(n.op)) {
      call_custom(n, *kernel, stack);
      return;
    }
  }
  if (n.rng && generator_arg(n.op.schema()) < 0) {
    // The op draws from CPU's default generator: give it this node's stream,
    // then restore the user's CPU RNG state. The kernel locks the generator
    // itself, so the lock is not held across the call.
    auto gen = at::detail::getDefaultCPUGenerator();
    c10::intrusive_ptr<c10::TensorImpl> saved;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      saved = gen.unsafeGetGeneratorImpl()->get_state();
      gen.unsafeGetGeneratorImpl()->set_current_seed(n.rng_seed);
    }
    auto restore = [&] {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.unsafeGetGeneratorImpl()->set_state(*saved);
    };
    try {
      n.op.callBoxed(stack);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    return;
  }
  n.op.callBoxed(stack);
}

void fresh_results(const Node& n, torch::jit::Stack& stack, std::vector<at::Tensor>& out) {
  out.clear();
  out.reserve(n.outputs.size());
  for (size_t k = 0; k < n.returns.size(); ++k) {
    const c10::IValue& v = stack[k];
    if (n.returns[k] == -1) {
      out.push_back(v.toTensor());
    } else if (n.returns[k] == -2) {
      for (const auto& t : v.toTensorList()) out.push_back(t);
    }
  }
}

}  // namespace host
}  // namespace tpu_eager
