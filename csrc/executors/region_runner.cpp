// The op-by-op host loop shared by the executors (see region_runner.h).
#include "executors/region_runner.h"

#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <stdexcept>
#include <typeinfo>
#include <unordered_set>

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

// Identity of a view for counting HBM traffic once per region.
using ViewKey = std::tuple<const DeferredStorage*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;
ViewKey view_key(const TensorRef& r) {
  return {r.storage.get(), r.offset, r.sizes, r.strides, static_cast<int>(r.dtype)};
}

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
      result.sizes().equals(ref.sizes) && result.strides().equals(ref.strides) && ref.covers_storage() && !ref.conj &&
      !ref.neg && !result.is_conj() && !result.is_neg() && result.storage().nbytes() >= s->nbytes &&
      result.storage().use_count() == 1 && result.device().is_cpu() && !result._is_zerotensor() &&
      mem.adopt_output(s, result.storage()))
    return;
  if (materialize) {
    stats.output_copies++;
    if (debug::level() >= 1) debug::count_op("output_copy", op_display_name(n).substr(6));
    // Store through the inverse of the output's view chain.
    TensorRef flat_ref;
    flat_ref.dtype = ref.dtype;
    flat_ref.sizes = {static_cast<int64_t>(s->nbytes / c10::elementSize(ref.dtype))};
    flat_ref.strides = {1};
    at::Tensor flat = view_over(mem.device_buffer(s), flat_ref);
    views::scatter(flat, views::decompose(flat.numel(), ref.sizes, ref.strides, ref.offset), ref.sizes, ref.strides,
                   ref.offset, result);
    s->error = nullptr;
    return;
  }
  // A temporary: keep the CPU result's storage when it has the recorded layout.
  if (result.scalar_type() == ref.dtype && result.storage_offset() == ref.offset && result.sizes().equals(ref.sizes) &&
      result.strides().equals(ref.strides) && result.storage().nbytes() >= s->nbytes) {
    mem.bind_temp(s, result.storage());
    return;
  }
  c10::Storage buf = scratch_storage(s->nbytes);
  view_over(buf, ref).copy_(result);
  mem.bind_temp(s, std::move(buf));
}

// Out= tensors for op `n` when its CPU kernel can write its results in place:
// each materialized output is its device buffer, each other output a
// temporary with the recorded layout. Empty when the op has no out= overload or the
// target computes it its own way.
std::vector<at::Tensor> direct_outputs(const Node& n, const Region& region, size_t p, HostMemory& mem,
                                       HostRunHooks& hooks, const c10::OperatorHandle** out_op) {
  *out_op = nullptr;
  if (n.rng || n.outputs.empty() || !hooks.direct_outputs_ok(n)) return {};
  if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary && custom_host_kernel(n.op))
    return {};  // its author's kernel runs
  for (int r : n.returns)
    if (r != -1) return {};
  // Dense operands only, unless the op's out= kernel is its functional one
  // (takes_strided_inputs): CPU's other out= kernels are less exercised than
  // the functional ones and some mis-handle strided tensors (torch 2.13:
  // _log_softmax_backward_data.out with a strided out, native_batch_norm.out
  // with a strided input give wrong values).
  for (const auto& in : n.inputs) {
    if (in.ref.is_dense()) continue;
    if (!takes_strided_inputs(n)) return {};
    break;
  }
  bool plus_copy = false;
  const c10::OperatorHandle* op = out_variant(n.op, &plus_copy);
  if (!op) return {};
  // An out= overload that is the functional op plus a copy gains nothing: the
  // functional result is copied into a materialized output all the same, and a
  // temporary keeps it without the copy (bind_output).
  if (plus_copy && !has_direct_kernel(n)) return {};
  std::vector<at::Tensor> outs;
  outs.reserve(n.outputs.size());
  for (size_t j = 0; j < n.outputs.size(); ++j) {
    const TensorRef& ref = n.outputs[j];
    if (ref.conj || ref.neg) return {};
    DeferredStorage* s = ref.storage.get();
    if (ref.offset != 0 || !ref.is_dense()) return {};
    if (region.materialize[p][j]) {
      outs.push_back(view_over(mem.device_buffer(s), ref));
    } else {
      outs.push_back(view_over(scratch_storage(s->nbytes), ref));
    }
  }
  *out_op = op;
  return outs;
}

// Runs `n`'s CPU kernel with outputs `outs` (direct_kernels.h), else its
// out= overload `out_op` on the functional stack plus `outs`; false (and nothing
// bound) when the out= kernel rejects the call, so the functional kernel runs
// and raises CPU's own error if there is one.
bool call_direct(const Node& n, const c10::OperatorHandle& out_op, const torch::jit::Stack& functional,
                 const std::vector<at::Tensor>& outs) {
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  try {
    if (run_direct_kernel(n, functional, outs)) return true;
    torch::jit::Stack stack(functional);
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

void run_ops(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph, HostMemory& mem,
             RegionStats& stats, HostRunHooks& hooks) {
  std::unordered_set<const DeferredStorage*> produced;
  std::set<ViewKey> reads, writes;
  // Device traffic of one view, once per region: logical bytes plus its layout padding.
  auto traffic = [&](const TensorRef& r, std::set<ViewKey>& seen, int64_t& logical) {
    if (!seen.insert(view_key(r)).second) return;
    logical += hooks.logical_bytes(r);
    stats.padding_bytes += hooks.padding_bytes(r);
  };
  // Position of the last op of the region that uses each storage: a
  // temporary is freed right after it, as eager frees a dead intermediate
  // (keeps the working set, and the allocator's reuse, like eager's).
  std::unordered_map<DeferredStorage*, size_t> last_use;
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    for (const auto& in : n.inputs) last_use[in.ref.storage.get()] = p;
    for (const auto& out : n.outputs) last_use.emplace(out.storage.get(), p);
  }
  // One op: its inputs' traffic, the CPU kernel (or out= overload writing the
  // device buffer), its outputs bound, dead temporaries freed.
  auto run_one = [&](size_t p, Node& n) {
    for (const auto& in : n.inputs) {
      DeferredStorage* s = in.ref.storage.get();
      if (produced.count(s) || mem.is_temp(s) || (in.written && !reads_written_value(n, in))) continue;
      traffic(in.ref, reads, stats.bytes_read);
    }
    // A storage this op overwrites whole loses an earlier op's error once the
    // user has seen it (if this op fails, the caller marks it with the new one).
    for (const auto& in : n.inputs)
      if (in.ref.storage->error && in.ref.storage->error_seen && overwrites_storage(n, in))
        in.ref.storage->set_error(nullptr);
    torch::jit::Stack stack = build_stack(n, mem);  // re-raises an input's earlier error as is
    std::vector<at::Tensor> results;
    const c10::OperatorHandle* out_op = nullptr;
    std::vector<at::Tensor> direct = direct_outputs(n, region, p, mem, hooks, &out_op);
    try {
      if (out_op && call_direct(n, *out_op, stack, direct)) {
        results = direct;
      } else {
        direct.clear();
        hooks.call(n, stack);
        mem.finish_writes();
        results = fresh_results(n, stack);
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
      if (materialize) traffic(n.outputs[j], writes, stats.bytes_written);
      produced.insert(n.outputs[j].storage.get());
    }
    for (const auto& in : n.inputs)
      if (in.written && !mem.is_temp(in.ref.storage.get())) traffic(in.ref, writes, stats.bytes_written);
    for (const auto& in : n.inputs)
      if (last_use[in.ref.storage.get()] == p) mem.release_temp(in.ref.storage.get());
    for (const auto& out : n.outputs)
      if (last_use[out.storage.get()] == p) mem.release_temp(out.storage.get());
    hooks.add_op_cost(n, stats);
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
      const std::exception_ptr err = std::current_exception();
      for_each_written_storage(n, [&](DeferredStorage* s) { s->set_error(err); });
      if (!first_error) {
        first_error = err;
        stats.failed_at = static_cast<int>(p);
      }
    }
  }
  if (first_error) {
    stats.errors_marked = true;
    std::rethrow_exception(first_error);
  }
  stats.failed_at = -1;
}

}  // namespace host
}  // namespace tpu_eager
