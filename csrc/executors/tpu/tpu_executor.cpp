// The simulated TPU executor: runs fused regions on host memory with the TPU's
// numerics (MXU precision modes) and accounts, per region, HBM traffic with
// tiled-layout padding and simulated time on the active chip (cost_model.h).
#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <ATen/ops/sub.h>

#include "executors/executor.h"
#include "executors/region_runner.h"
#include "executors/tpu/chip.h"
#include "executors/tpu/cost_model.h"
#include "executors/tpu/fused_elementwise.h"
#include "executors/tpu/tiling.h"
#include "jit/kernel_trace.h"

namespace tpu_eager {
namespace {

at::Tensor round_bf16(const at::Tensor& x) { return x.to(at::kBFloat16).to(at::kFloat); }

// MXU numerics (DESIGN §6): float32 matmul inputs are rounded to bf16 unless
// the precision is "highest". "medium": one bf16 pass; "high": bf16x3 (the
// three largest partial products of the hi/lo split); both accumulate in f32.
bool run_mxu_emulated(const Node& n, torch::jit::Stack& stack, at::Float32MatmulPrecision prec) {
  if (prec == at::Float32MatmulPrecision::HIGHEST) return false;
  const auto& schema = n.op.schema();
  std::string base = schema.name().substr(6);
  const bool inplace = !base.empty() && base.back() == '_';
  if (inplace) base.pop_back();
  at::Tensor (*prod)(const at::Tensor&, const at::Tensor&) = nullptr;
  bool has_bias = false;
  if (base == "mm" || base == "addmm") prod = &at::mm;
  if (base == "bmm" || base == "baddbmm") prod = &at::bmm;
  if (base == "mv" || base == "addmv") prod = &at::mv;
  if (base == "dot") prod = &at::dot;
  if (!prod) return false;
  has_bias = base.rfind("add", 0) == 0;
  const int a_i = has_bias ? 1 : 0;
  const at::Tensor a = stack[a_i].toTensor(), b = stack[a_i + 1].toTensor();
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat) return false;
  at::Tensor p;
  const at::Tensor ah = round_bf16(a), bh = round_bf16(b);
  if (prec == at::Float32MatmulPrecision::MEDIUM) {
    p = prod(ah, bh);
  } else {
    const at::Tensor al = round_bf16(at::sub(a, ah)), bl = round_bf16(at::sub(b, bh));
    p = prod(ah, bh).add_(prod(ah, bl)).add_(prod(al, bh));
  }
  at::Tensor result = p;
  if (has_bias) {
    const at::Scalar beta = stack[3].toScalar(), alpha = stack[4].toScalar();
    const at::Tensor self = stack[0].toTensor();
    result = p.mul(alpha);
    if (!(beta.isFloatingPoint() ? beta.toDouble() == 0.0 : beta.toLong() == 0)) result = result.add(self.mul(beta));
  }
  at::Tensor ret = result;
  if (inplace) {
    ret = stack[0].toTensor();
    ret.copy_(result);
  } else if (schema.is_mutable()) {  // .out overload: the out argument is last
    ret = stack.back().toTensor();
    ret.copy_(result);
  }
  stack.clear();
  stack.emplace_back(ret);
  return true;
}

// The TPU's hooks into the shared host loop: MXU numerics, tiled-layout
// padding, roofline costs.
class TpuHooks final : public host::HostRunHooks {
 public:
  TpuHooks(const tpu::ChipParams& chip, at::Float32MatmulPrecision prec) : chip_(chip), prec_(prec) {}
  void call(const Node& n, torch::jit::Stack& stack) override {
    const bool mxu = static_cast<PrimKind>(n.kind) == PrimKind::kMatmul && run_mxu_emulated(n, stack, prec_);
    if (!mxu) host::call_cpu(n, stack);
  }
  bool direct_outputs_ok(const Node& n) override {
    return static_cast<PrimKind>(n.kind) != PrimKind::kMatmul || prec_ == at::Float32MatmulPrecision::HIGHEST;
  }
  int64_t padding_bytes(const TensorRef& r) override { return tpu::tiled_bytes(r.sizes, r.dtype, chip_) - r.nbytes(); }
  void add_op_cost(const Node& n, RegionStats& stats) override {
    const tpu::OpCost cost = tpu::op_cost(n, chip_, prec_);
    stats.flops += cost.flops;
    stats.mxu_flops += cost.mxu_flops;
    stats.compute_s += cost.seconds(chip_);
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) stats.library_calls++;
  }

 private:
  const tpu::ChipParams& chip_;
  const at::Float32MatmulPrecision prec_;
};

// Marks the outputs of `head` that ops of `tail` read as materialized: they
// cross from one part of a split region to the other.
void materialize_read_by(const Region& tail, Region& head, const std::vector<Node>& graph) {
  std::unordered_map<const DeferredStorage*, std::pair<size_t, size_t>> made;  // storage -> (node, output) in head
  for (size_t k = 0; k < head.nodes.size(); ++k) {
    const Node& n = graph[head.nodes[k]];
    for (size_t j = 0; j < n.outputs.size(); ++j) made[n.outputs[j].storage.get()] = {k, j};
  }
  for (int i : tail.nodes) {
    for (const auto& in : graph[i].inputs) {
      auto it = made.find(in.ref.storage.get());
      if (it != made.end()) head.materialize[it->second.first][it->second.second] = 1;
    }
  }
}

// Runs `part`, the ops at positions `pos` of a region: as fused loops when
// `may_fuse` and they fuse, else op by op; a failure's position is reported
// in the whole region.
void run_part(const CompiledRegion& compiled, const Region& part, const std::vector<size_t>& pos, bool may_fuse,
              std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats, host::HostRunHooks& hooks) {
  try {
    if (may_fuse && tpu::run_fused_elementwise(part, graph, mem, stats)) {
      for (int i : part.nodes) hooks.add_op_cost(graph[i], stats);
      return;
    }
    host::run_ops(compiled, part, graph, mem, stats, hooks);
  } catch (...) {
    if (stats.failed_at >= 0) stats.failed_at = static_cast<int>(pos[stats.failed_at]);
    throw;
  }
}

// A region whose row reduction (softmax, log_softmax, layer_norm, logsumexp)
// has elementwise consumers after it: the fused row loop ends at the
// reduction, so the region runs in two parts, the producers and the reduction
// in the fused row loop, then the consumers (fused, or op by op) reading its
// result from a device buffer, instead of every op one by one. Values the
// first part produces and the second reads are materialized. Returns false,
// having run nothing, when the region has no such reduction or its first part
// does not fuse.
bool run_split_at_row_reduction(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                                host::HostMemory& mem, RegionStats& stats, host::HostRunHooks& hooks) {
  if (region.anchor != PrimKind::kReduction) return false;
  size_t cut = 0;
  while (cut < region.nodes.size() && static_cast<PrimKind>(graph[region.nodes[cut]].kind) != PrimKind::kReduction)
    ++cut;
  if (cut + 1 >= region.nodes.size()) return false;  // nothing after the reduction
  Region head, tail;
  head.anchor = PrimKind::kReduction;
  head.nodes.assign(region.nodes.begin(), region.nodes.begin() + cut + 1);
  head.materialize.assign(region.materialize.begin(), region.materialize.begin() + cut + 1);
  tail.nodes.assign(region.nodes.begin() + cut + 1, region.nodes.end());
  tail.materialize.assign(region.materialize.begin() + cut + 1, region.materialize.end());
  materialize_read_by(tail, head, graph);
  if (!tpu::run_fused_elementwise(head, graph, mem, stats)) return false;
  for (int i : head.nodes) hooks.add_op_cost(graph[i], stats);
  std::vector<size_t> tail_pos(tail.nodes.size());
  for (size_t k = 0; k < tail_pos.size(); ++k) tail_pos[k] = cut + 1 + k;
  run_part(compiled, tail, tail_pos, true, graph, mem, stats, hooks);
  return true;
}

// A region whose fused loop is blocked by ops of another shape or dtype that
// depend on nothing the region makes (an attention mask `tril[..., :T, :T] == 0`
// among the scores' masked_fill and softmax): those ops run first, op by op,
// their results the rest reads materialized, then the rest runs fused (or op
// by op). Hoisting them is safe: they read only the region's inputs and write
// only their own fresh outputs. Returns false, having run nothing, when there
// is nothing to hoist or only hoisted ops would be left.
bool run_hoisting_other_shapes(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                               host::HostMemory& mem, RegionStats& stats, host::HostRunHooks& hooks) {
  const Node& last = graph[region.nodes.back()];
  if (last.outputs.empty()) return false;
  const Dims& shape = last.kind == static_cast<int>(PrimKind::kReduction) && !last.inputs.empty()
                          ? last.inputs[0].ref.sizes
                          : last.outputs[0].sizes;
  std::unordered_set<const DeferredStorage*> made_in_main;  // made or written by ops that stay
  std::vector<char> hoist(region.nodes.size(), 0);
  size_t hoisted = 0;
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    bool independent = !n.outputs.empty() && !n.rng;
    for (const auto& in : n.inputs)
      independent = independent && !in.written && !made_in_main.count(in.ref.storage.get());
    bool other = false;
    for (const auto& o : n.outputs) other = other || o.sizes != shape || o.dtype != at::kFloat;
    if (independent && other) {
      hoist[p] = 1;
      ++hoisted;
      continue;
    }
    for (const auto& o : n.outputs) made_in_main.insert(o.storage.get());
    for (const auto& in : n.inputs)
      if (in.written) made_in_main.insert(in.ref.storage.get());
  }
  if (hoisted == 0 || hoisted == region.nodes.size()) return false;
  Region head, tail;
  tail.anchor = region.anchor;
  std::vector<size_t> head_pos, tail_pos;  // positions in `region`
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    Region& r = hoist[p] ? head : tail;
    r.nodes.push_back(region.nodes[p]);
    r.materialize.push_back(region.materialize[p]);
    (hoist[p] ? head_pos : tail_pos).push_back(p);
  }
  materialize_read_by(tail, head, graph);
  // The hoisted ops run op by op, which marks a failing op's outputs with its
  // error; the rest then still runs (an op reading a failed value fails in
  // turn, as in run_ops), and the first error is rethrown.
  try {
    host::run_ops(compiled, head, graph, mem, stats, hooks);
  } catch (...) {
    const std::exception_ptr err = std::current_exception();
    const int at = stats.failed_at >= 0 ? static_cast<int>(head_pos[stats.failed_at]) : -1;
    try {
      host::run_ops(compiled, tail, graph, mem, stats, hooks);
    } catch (...) {
    }
    stats.failed_at = at;  // a position in the whole region
    stats.errors_marked = true;
    std::rethrow_exception(err);
  }
  run_part(compiled, tail, tail_pos, true, graph, mem, stats, hooks);
  return true;
}

// The ops of `region` that its fused loops left (`rest`), op by op.
void run_rest(const CompiledRegion& compiled, const Region& region, const Region& rest, std::vector<Node>& graph,
              host::HostMemory& mem, RegionStats& stats, host::HostRunHooks& hooks) {
  std::vector<size_t> pos;
  for (int node : rest.nodes)
    pos.push_back(static_cast<size_t>(std::find(region.nodes.begin(), region.nodes.end(), node) - region.nodes.begin()));
  run_part(compiled, rest, pos, false, graph, mem, stats, hooks);
}

class TpuExecutor final : public Executor {
 public:
  const char* name() const override { return "tpu"; }
  std::string target() const override { return tpu::active_chip().name; }

  void run_region(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                  host::HostMemory& mem, RegionStats& stats) override {
    const auto prec = at::globalContext().float32MatmulPrecision();
    const tpu::ChipParams chip = tpu::active_chip();
    // The VMEM tiling depends on shapes only: planned before the run, so a
    // failing region still reports it. Only matmul plans re-read HBM, so a
    // vector region is planned only for the profiler.
    const bool tracing = jit::trace_active();
    tpu::TilingPlan plan;
    const bool mxu = std::find(compiled.kinds.begin(), compiled.kinds.end(), PrimKind::kMatmul) != compiled.kinds.end();
    if (chip.valid() && (tracing || mxu)) plan = tpu::plan_region(region, graph, chip);
    if (tracing) jit::trace_attach_tiling(tpu::tiling_record(plan));
    // A torch.profiler range per region ("tpu::fused_mul_add"), its ops in the
    // range's keyword inputs; one thread-local check when no profiler runs.
    const std::string range = "tpu::" + compiled.name;
    at::RecordFunction guard(at::RecordScope::USER_SCOPE);
    if (guard.isActive()) {
      std::string ops;
      for (int i : region.nodes) ops += (ops.empty() ? "" : ",") + host::op_display_name(graph[i]).substr(6);
      const std::unordered_map<std::string, c10::IValue> kwargs = {{"ops", c10::IValue(ops)}};
      guard.before(std::string_view(range), &kwargs);
    }
    TpuHooks hooks(chip, prec);
    Region rest;  // ops of a multi-tensor region that no fused loop ran
    if (tpu::run_fused_elementwise(region, graph, mem, stats, &rest)) {
      const std::unordered_set<int> left(rest.nodes.begin(), rest.nodes.end());
      for (int i : region.nodes)
        if (!left.count(i)) hooks.add_op_cost(graph[i], stats);
      if (!rest.nodes.empty()) run_rest(compiled, region, rest, graph, mem, stats, hooks);
    } else if (!run_split_at_row_reduction(compiled, region, graph, mem, stats, hooks) &&
               !run_hoisting_other_shapes(compiled, region, graph, mem, stats, hooks)) {
      host::run_ops(compiled, region, graph, mem, stats, hooks);
    }
    finish(chip, plan, stats);
  }

 private:
  // Simulated time of the region: max(compute, HBM traffic incl. padding and
  // the re-reads its tiling implies) + launch.
  static void finish(const tpu::ChipParams& chip, const tpu::TilingPlan& plan, RegionStats& stats) {
    if (!chip.valid()) return;  // no target set: no simulated time
    const double hbm =
        static_cast<double>(stats.bytes_read + stats.bytes_written + stats.padding_bytes + plan.hbm_reread_bytes);
    stats.memory_s = hbm / chip.hbm_bandwidth;
    stats.sim_time_s = std::max(stats.compute_s, stats.memory_s) + chip.launch_s;
  }
};

}  // namespace

Executor& tpu_executor() {
  static TpuExecutor tpu;
  return tpu;
}

}  // namespace tpu_eager
