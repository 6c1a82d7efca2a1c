// The op-by-op host loop shared by the executors (see region_runner.h).
#include "executors/region_runner.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "executors/direct_kernels.h"
#include "executors/out_variant.h"
#include "jit/lowering.h"
#include "lazy/debug_report.h"
#include "ops/custom_ops.h"
#include "views/view_chain.h"

namespace tpu_eager {
namespace host {

namespace {
// What a parked kept tensor holds: no memory (KeptTensors::park).
const c10::Storage& empty_storage() {
  thread_local const c10::Storage empty(c10::Storage::use_byte_size_t(), 0,
                                        c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)), nullptr, false);
  return empty;
}
}  // namespace

at::Tensor* KeptTensors::op(size_t p, size_t count) {
  if (per_op_.size() <= p) per_op_.resize(p + 1);
  std::vector<at::Tensor>& v = per_op_[p];
  if (v.size() < count) v.resize(count);
  return v.data();
}

void KeptTensors::park(size_t p) {
  if (p >= per_op_.size()) return;
  for (at::Tensor& t : per_op_[p]) {
    if (!t.defined()) continue;
    if (t.use_count() == 1)
      t.unsafeGetTensorImpl()->set_storage_keep_dtype(empty_storage());
    else
      t.reset();  // a kernel's result or a binding still holds it: leave it to them
  }
}
namespace {

// Order of views by identity (storage, offset, dtype, sizes, strides): the
// views one region counts HBM traffic for, each once.
bool view_less(const TensorRef* a, const TensorRef* b) {
  if (a->storage.get() != b->storage.get()) return a->storage.get() < b->storage.get();
  if (a->offset != b->offset) return a->offset < b->offset;
  if (a->dtype != b->dtype) return a->dtype < b->dtype;
  if (a->sizes().size() != b->sizes().size()) return a->sizes().size() < b->sizes().size();
  for (size_t d = 0; d < a->sizes().size(); ++d) {
    if (a->sizes()[d] != b->sizes()[d]) return a->sizes()[d] < b->sizes()[d];
    if (a->strides()[d] != b->strides()[d]) return a->strides()[d] < b->strides()[d];
  }
  return false;
}

// A set of views (TensorRefs of the region's nodes, which outlive it), kept
// sorted by view_less: inline for up to 16 views. A std::set of (storage,
// offset, sizes, strides, dtype) tuples cost three heap allocations per view
// an op-by-op op read or wrote.
class ViewSet {
 public:
  // Adds `r`; false when an equal view is in the set.
  bool insert(const TensorRef& r) {
    auto* it = std::lower_bound(views_.begin(), views_.end(), &r, view_less);
    if (it != views_.end() && !view_less(&r, *it)) return false;
    views_.insert(it, &r);
    return true;
  }

 private:
  c10::SmallVector<const TensorRef*, 16> views_;
};

// Per storage a region uses: the position of its last op that uses it, and
// whether an op of the region produced it so far. Sorted by storage (built
// once per region), inline for up to 32 storages: no allocation per storage,
// as a std::unordered_map and std::unordered_set had.
class RegionStorages {
 public:
  RegionStorages(const Region& region, const std::vector<Node>& graph) {
    for (size_t p = 0; p < region.nodes.size(); ++p) {
      const Node& n = graph[region.nodes[p]];
      for (const auto& in : n.inputs) entries_.push_back(Entry{in.ref.storage.get(), p, false});
      for (const auto& out : n.outputs) entries_.push_back(Entry{out.storage.get(), p, false});
    }
    // By storage, then position: the last of each run of one storage holds its last use.
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      return a.storage != b.storage ? a.storage < b.storage : a.last_use < b.last_use;
    });
    size_t kept = 0;
    for (size_t k = 0; k < entries_.size(); ++k) {
      if (kept > 0 && entries_[kept - 1].storage == entries_[k].storage)
        entries_[kept - 1] = entries_[k];
      else
        entries_[kept++] = entries_[k];
    }
    entries_.resize(kept);
  }
  size_t last_use(const DeferredStorage* s) const { return find(s).last_use; }
  bool produced(const DeferredStorage* s) const { return find(s).produced; }
  void set_produced(const DeferredStorage* s) { const_cast<Entry&>(find(s)).produced = true; }

 private:
  struct Entry {
    const DeferredStorage* storage;
    size_t last_use;
    bool produced;
  };
  // Every storage the region's nodes use has an entry.
  const Entry& find(const DeferredStorage* s) const {
    const Entry* it = std::lower_bound(entries_.begin(), entries_.end(), s,
                                       [](const Entry& e, const DeferredStorage* v) { return e.storage < v; });
    TORCH_INTERNAL_ASSERT(it != entries_.end() && it->storage == s, "run_ops: a storage outside the region's nodes");
    return *it;
  }
  c10::SmallVector<Entry, 32> entries_;
};

// Binds result `result` of op `n` to its output `ref`; counts a copy into device memory in `stats`.
void bind_output(const Node& n, const TensorRef& ref, const at::Tensor& result, bool materialize, HostMemory& mem,
                 const at::Tensor& written_directly, RegionStats& stats) {
  DeferredStorage* s = ref.storage.get();
  s->error = nullptr;
  if (materialize && written_directly.defined() && result.is_same(written_directly)) return;  // already in place
  // The CPU kernel's fresh result becomes the storage's memory, when it is the
  // whole storage in the recorded layout and nothing else holds it (not an
  // input's alias): flush-local memory for a value that lives only between this
  // flush's regions (transient), else its device memory (the device is
  // simulated in host memory; HostMemory::adopt_output).
  if (materialize && result.scalar_type() == ref.dtype && result.storage_offset() == 0 && ref.offset == 0 &&
      result.sizes().equals(ref.sizes()) && result.strides().equals(ref.strides()) && ref.covers_storage() &&
      !ref.conj && !ref.neg && !result.is_conj() && !result.is_neg() && result.storage().nbytes() >= s->nbytes &&
      result.storage().use_count() == 1 && result.device().is_cpu() && !result._is_zerotensor() &&
      mem.adopt_output(s, result.storage()))
    return;
  if (materialize) {
    stats.output_copies++;
    if (debug::level() >= 1) debug::count_op("output_copy", op_display_name(n).substr(6));
    // Store through the inverse of the output's view chain.
    TensorRef flat_ref;
    flat_ref.dtype = ref.dtype;
    flat_ref.set_dims({static_cast<int64_t>(s->nbytes / c10::elementSize(ref.dtype))}, {1});
    at::Tensor flat = view_over(mem.device_buffer(s), flat_ref);
    views::scatter(flat, views::decompose(flat.numel(), ref.sizes(), ref.strides(), ref.offset), ref.sizes(),
                   ref.strides(), ref.offset, result);
    s->error = nullptr;
    return;
  }
  // A temporary: keep the CPU result's storage when it has the recorded layout.
  if (result.scalar_type() == ref.dtype && result.storage_offset() == ref.offset &&
      result.sizes().equals(ref.sizes()) && result.strides().equals(ref.strides()) &&
      result.storage().nbytes() >= s->nbytes) {
    mem.bind_temp(s, result.storage());
    return;
  }
  c10::Storage buf = mem.scratch(s->nbytes);
  view_over(buf, ref).copy_(result);
  mem.bind_temp(s, std::move(buf));
}

// The out= overload op `n`'s CPU kernel can write its results in place with,
// by its op and layout alone (direct_outputs checks the rest each run), or
// null: no out= overload, an RNG op, a custom op (its author's kernel runs)...
const c10::OperatorHandle* direct_out_op(const Node& n) {
  if (n.rng || n.outputs.empty()) return nullptr;
  // Fresh tensors only, or lists a direct kernel writes whole (the foreach norm).
  const bool lists = writes_list_outputs(n);
  for (int r : n.returns)
    if (r != -1 && !(r == -2 && lists)) return nullptr;
  // Dense operands only, unless the op's out= kernel is its functional one
  // (takes_strided_inputs): CPU's other out= kernels are less exercised than
  // the functional ones and some mis-handle strided tensors (torch 2.13:
  // _log_softmax_backward_data.out with a strided out, native_batch_norm.out
  // with a strided input give wrong values).
  for (const auto& in : n.inputs) {
    if (in.ref.is_dense()) continue;
    if (!takes_strided_inputs(n)) return nullptr;
    break;
  }
  bool plus_copy = false;
  // A list kernel never declines: its op stands in for the out= overload
  // call_direct falls back to only after an error, and then the functional
  // kernel runs and raises it.
  const c10::OperatorHandle* op = lists ? &n.op : out_variant(n.op, &plus_copy);
  if (!op) return nullptr;
  // An out= overload that is the functional op plus a copy gains nothing: the
  // functional result is copied into a materialized output all the same, and a
  // temporary keeps it without the copy (bind_output).
  if (plus_copy && !has_direct_kernel(n)) return nullptr;
  for (const TensorRef& ref : n.outputs)
    if (ref.conj || ref.neg || ref.offset != 0 || !ref.is_dense()) return nullptr;
  return op;
}

// Out= tensors for op `n` when its CPU kernel can write its results in place
// (with `op`, its direct_out_op): each materialized output is its device
// buffer, each other output a temporary with the recorded layout. Empty when
// `op` is null or the target computes the op its own way. Into `outs`
// (cleared first, its capacity kept). `kept`: a kept tensor per output
// (KeptTensors), or null.
void direct_outputs(const Node& n, const Region& region, size_t p, HostMemory& mem, HostRunHooks& hooks,
                    const c10::OperatorHandle* op, const c10::OperatorHandle** out_op, std::vector<at::Tensor>& outs,
                    at::Tensor* kept) {
  *out_op = nullptr;
  outs.clear();
  if (!op || !hooks.direct_outputs_ok(n)) return;
  if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary && custom_host_kernel(n.op))
    return;  // its author's kernel runs
  outs.reserve(n.outputs.size());
  for (size_t j = 0; j < n.outputs.size(); ++j) {
    const TensorRef& ref = n.outputs[j];
    DeferredStorage* s = ref.storage.get();
    const c10::Storage st = region.materialize[p][j] ? mem.device_buffer(s) : mem.scratch(s->nbytes);
    outs.push_back(kept != nullptr ? view_over_kept(st, ref, kept[j]) : view_over(st, ref));
  }
  *out_op = op;
}

// Runs `n`'s CPU kernel with outputs `outs` (direct_kernels.h), else its
// out= overload `out_op` on the functional stack plus `outs`; false (and nothing
// bound) when the out= kernel rejects the call, so the functional kernel runs
// and raises CPU's own error if there is one. `stack`: room for the out=
// call's arguments (its elements replaced, its capacity kept).
bool call_direct(const Node& n, const c10::OperatorHandle& out_op, const torch::jit::Stack& functional,
                 const std::vector<at::Tensor>& outs, torch::jit::Stack& stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  try {
    if (run_direct_kernel(n, functional, outs)) return true;
    stack.assign(functional.begin(), functional.end());
    for (const auto& o : outs) stack.emplace_back(o);
    out_op.callBoxed(stack);
  } catch (const c10::Error&) {
    return false;
  }
  return true;
}

}  // namespace

// See region_runner.h: true when op `n` reads the current value of its written argument `in`:
// out= arguments and the self of ops that overwrite it entirely are only written.
bool reads_written_value(const Node& n, const InputSlot& in) {
  const auto& schema = n.op.schema();
  if (in.arg < static_cast<int>(schema.arguments().size()) && schema.arguments()[in.arg].is_out()) return false;
  return in.arg != 0 || !lowering_of(n.op).overwrites_self;
}

namespace {
// True when op `n` replaces every byte of the storage its written argument
// `in` views, and no other argument of `n` reads that storage: a value an
// earlier failed op left in it (DeferredStorage::error) is then gone, as on
// CPU, where the failed op raised at its call and wrote nothing.
bool overwrites_storage(const Node& n, const InputSlot& in) {
  const TensorRef& r = in.ref;
  if (!in.written || reads_written_value(n, in) || !r.covers_storage()) return false;
  for (const auto& other : n.inputs)
    if (&other != &in && other.ref.storage == r.storage && (!other.written || reads_written_value(n, other)))
      return false;
  return true;
}
}  // namespace

std::string op_display_name(const Node& n) {
  const auto& schema = n.op.schema();
  return schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
}

namespace {
// Takes the warnings of a kernel whose op warned at its record (Node::warned_at_call).
struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
} drop_warnings;

// True when `recorded` (KeptTensors::traffic) was recorded for the ops of `region`.
bool traffic_recorded_for(const std::vector<KeptTensors::OpTraffic>& recorded, const Region& region,
                          const std::vector<Node>& graph) {
  if (recorded.size() != region.nodes.size()) return false;
  for (size_t p = 0; p < recorded.size(); ++p)
    if (!(recorded[p].op == graph[region.nodes[p]].op)) return false;
  return true;
}
}  // namespace

void run_ops(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph, HostMemory& mem,
             RegionStats& stats, HostRunHooks& hooks, KeptTensors* kept) {
  ViewSet reads, writes;
  // The traffic of a compiled region's run in which every op runs is the
  // traffic its first such run counted (KeptTensors::traffic): `live` counts
  // view by view (recording it when `kept`), else each op adds its recorded
  // sums. After an op fails the rest counts live, from the views the ops
  // before it counted.
  std::vector<KeptTensors::OpTraffic>* recorded = kept ? &kept->traffic() : nullptr;
  bool live = true, recording = false;
  if (recorded != nullptr && traffic_recorded_for(*recorded, region, graph)) {
    live = false;
  } else if (recorded != nullptr) {
    recording = true;
    recorded->assign(region.nodes.size(), KeptTensors::OpTraffic{});
    for (size_t p = 0; p < region.nodes.size(); ++p) (*recorded)[p].op = graph[region.nodes[p]].op;
  }
  // Device traffic of one view (op `p`'s input or output `slot`), once per
  // region: logical bytes plus its layout padding.
  auto traffic = [&](size_t p, const TensorRef& r, bool write, bool output, size_t slot) {
    if (!(write ? writes : reads).insert(r)) return;
    const int64_t logical = hooks.logical_bytes(r), padding = hooks.padding_bytes(r);
    (write ? stats.bytes_written : stats.bytes_read) += logical;
    stats.padding_bytes += padding;
    if (!recording) return;
    KeptTensors::OpTraffic& t = (*recorded)[p];
    (write ? t.written : t.read) += logical;
    (write ? t.write_padding : t.read_padding) += padding;
    t.views.push_back(KeptTensors::CountedView{static_cast<uint32_t>(slot), output, write});
  };
  // Position of the last op of the region that uses each storage: a
  // temporary is freed right after it, as eager frees a dead intermediate
  // (keeps the working set, and the allocator's reuse, like eager's); and
  // which storages an op of the region produced so far (live counting). A run
  // adding recorded traffic has the last uses recorded with it, and makes
  // these only when an op fails (go_live).
  std::optional<RegionStorages> storages;
  if (live) storages.emplace(region, graph);
  size_t outputs_bound = 0;  // of the op being run, without `storages`
  // Op `p` failed in a run adding recorded traffic: what live counting would
  // have seen and added by then (the views of the ops before it, its reads,
  // the storages the ops before it and its bound outputs produced).
  auto go_live = [&](size_t p) {
    storages.emplace(region, graph);
    for (size_t q = 0; q <= p; ++q) {
      const Node& m = graph[region.nodes[q]];
      for (size_t j = 0; j < (q < p ? m.outputs.size() : outputs_bound); ++j)
        storages->set_produced(m.outputs[j].storage.get());
    }
    for (size_t q = 0; q <= p; ++q) {
      const Node& m = graph[region.nodes[q]];
      for (const KeptTensors::CountedView& v : (*recorded)[q].views)
        if (q < p || !v.write) (v.write ? writes : reads).insert(v.output ? m.outputs[v.slot] : m.inputs[v.slot].ref);
    }
    stats.bytes_read += (*recorded)[p].read;
    stats.padding_bytes += (*recorded)[p].read_padding;
    live = true;
  };
  if (recording) {
    for (size_t p = 0; p < region.nodes.size(); ++p) {
      const Node& n = graph[region.nodes[p]];
      c10::SmallVector<uint32_t, 4>& last = (*recorded)[p].last_uses;
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (storages->last_use(n.inputs[k].ref.storage.get()) == p) last.push_back(static_cast<uint32_t>(k));
      for (size_t j = 0; j < n.outputs.size(); ++j)
        if (storages->last_use(n.outputs[j].storage.get()) == p)
          last.push_back(KeptTensors::kOutputSlot | static_cast<uint32_t>(j));
    }
  }
  // The temporaries op `p` uses last, freed after it.
  auto release_last_uses = [&](size_t p, const Node& n) {
    if (!live || recording) {
      for (uint32_t slot : (*recorded)[p].last_uses)
        mem.release_temp(slot & KeptTensors::kOutputSlot ? n.outputs[slot & ~KeptTensors::kOutputSlot].storage.get()
                                                         : n.inputs[slot].ref.storage.get());
      return;
    }
    for (const auto& in : n.inputs)
      if (storages->last_use(in.ref.storage.get()) == p) mem.release_temp(in.ref.storage.get());
    for (const auto& out : n.outputs)
      if (storages->last_use(out.storage.get()) == p) mem.release_temp(out.storage.get());
  };
  // One op's argument stack, results and out= tensors: kept across ops (their
  // capacity; emptied after each op, which frees what they held), and across
  // runs with `kept`.
  KeptTensors::OpBuffers local;
  KeptTensors::OpBuffers& buffers = kept ? kept->buffers() : local;
  torch::jit::Stack &stack = buffers.stack, &out_stack = buffers.out_stack;
  std::vector<at::Tensor>&results = buffers.results, &direct = buffers.direct;
  auto clear_op_state = [&](size_t p) {
    stack.clear();
    out_stack.clear();
    results.clear();
    direct.clear();
    if (kept) kept->park(p);
  };
  // One op: its inputs' traffic, the CPU kernel (or out= overload writing the
  // device buffer), its outputs bound, dead temporaries freed.
  auto run_one = [&](size_t p, Node& n) {
    outputs_bound = 0;
    for (size_t k = 0; live && k < n.inputs.size(); ++k) {
      const InputSlot& in = n.inputs[k];
      DeferredStorage* s = in.ref.storage.get();
      if (storages->produced(s) || mem.is_temp(s) || (in.written && !reads_written_value(n, in))) continue;
      traffic(p, in.ref, false, false, k);
    }
    // A storage this op overwrites whole loses an earlier op's error once the
    // user has seen it (if this op fails, the caller marks it with the new one).
    // Only looked for when an input may hold one (no storage read otherwise).
    if (mem.inputs_may_hold_errors()) {
      mem.count_error_reads(static_cast<int64_t>(n.inputs.size()));
      for (const auto& in : n.inputs)
        if (in.ref.storage->error && in.ref.storage->error_seen && overwrites_storage(n, in))
          in.ref.storage->set_error(nullptr);
    }
    at::Tensor* op_kept = kept ? kept->op(p, n.inputs.size() + n.outputs.size()) : nullptr;
    build_stack(n, mem, stack, op_kept);  // re-raises an input's earlier error as is
    const c10::OperatorHandle* out_op = nullptr;
    const c10::OperatorHandle* direct_op = live ? direct_out_op(n) : (*recorded)[p].direct_op;
    if (recording) (*recorded)[p].direct_op = direct_op;
    direct_outputs(n, region, p, mem, hooks, direct_op, &out_op, direct, op_kept ? op_kept + n.inputs.size() : nullptr);
    // CPU's kernel warns at its call; the record gave those warnings then (Node::warned_at_call).
    std::optional<c10::WarningUtils::WarningHandlerGuard> quiet;
    if (n.warned_at_call) quiet.emplace(&drop_warnings);
    try {
      if (out_op && call_direct(n, *out_op, stack, direct, out_stack)) {
        results = direct;
      } else {
        direct.clear();
        hooks.call(n, stack);
        mem.finish_writes();
        fresh_results(n, stack, results);
      }
      hooks.after_op(n, results, mem);
    } catch (c10::Error& e) {
      e.add_context("while running " + op_display_name(n) + " recorded at " +
                    (n.where.empty() ? std::string("<unknown>") : n.where) + " (in " + compiled.name + ")");
      throw;
    } catch (const std::runtime_error& e) {
      // Some CPU kernels throw a plain std::runtime_error (c10::checked_convert's
      // "value cannot be converted ... without overflow"); it also gets the
      // location. Subclasses keep their own type (Python maps them differently).
      if (typeid(e) != typeid(std::runtime_error)) throw;
      throw std::runtime_error(std::string(e.what()) + " (while running " + op_display_name(n) + " recorded at " +
                               (n.where.empty() ? std::string("<unknown>") : n.where) + " (in " + compiled.name + "))");
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const bool materialize = region.materialize[p][j];
      bind_output(n, n.outputs[j], results.at(j), materialize, mem, direct.empty() ? at::Tensor() : direct[j], stats);
      if (materialize && live) traffic(p, n.outputs[j], true, true, j);
      if (storages) storages->set_produced(n.outputs[j].storage.get());
      outputs_bound = j + 1;
    }
    for (size_t k = 0; live && k < n.inputs.size(); ++k)
      if (n.inputs[k].written && !mem.is_temp(n.inputs[k].ref.storage.get()))
        traffic(p, n.inputs[k].ref, true, false, k);
    if (!live) {
      const KeptTensors::OpTraffic& t = (*recorded)[p];
      stats.bytes_read += t.read;
      stats.bytes_written += t.written;
      stats.padding_bytes += t.read_padding + t.write_padding;
    }
    hooks.add_op_cost_at(n, p, stats);
    // The op's stack and kept tensors let go of its temporaries first, so a
    // freed one is nothing else's and HostMemory keeps it for reuse (scratch).
    clear_op_state(p);
    release_last_uses(p, n);
  };
  // An op that fails marks its outputs and written inputs with its error and
  // the region goes on: ops that read them fail in turn (build_stack re-raises
  // the error), ops that do not still compute their values, so one bad op
  // loses nothing else. The first error is rethrown at the end.
  std::exception_ptr first_error;
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    Node& n = graph[region.nodes[p]];
    try {
      run_one(p, n);
    } catch (...) {
      clear_op_state(p);
      if (!live) go_live(p);
      const std::exception_ptr err = std::current_exception();
      for_each_written_storage(n, [&](DeferredStorage* s) { s->set_error(err); });
      if (!first_error) {
        first_error = err;
        stats.failed_at = static_cast<int>(p);
      }
    }
  }
  if (first_error && recording) recorded->clear();  // not every op ran: record at a later run
  if (first_error) {
    stats.errors_marked = true;
    std::rethrow_exception(first_error);
  }
  stats.failed_at = -1;
}

}  // namespace host
}  // namespace tpu_eager
