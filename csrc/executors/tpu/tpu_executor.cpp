// The simulated TPU executor: runs fused regions on host memory with the TPU's
// numerics (MXU precision modes) and accounts, per region, HBM traffic with
// tiled-layout padding and simulated time on the active chip (cost_model.h).
#include <algorithm>
#include <mutex>
#include <optional>
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
#include "device/device.h"
#include "executors/tpu/chip.h"
#include "executors/tpu/cost_model.h"
#include "executors/tpu/fused_elementwise.h"
#include "executors/tpu/tiling.h"
#include "jit/kernel_trace.h"
#include "jit/lowering.h"
#include "ops/custom_ops.h"
#include "lazy/debug_report.h"

namespace tpu_eager {
namespace {

at::Tensor round_bf16(const at::Tensor& x) { return x.to(at::kBFloat16).to(at::kFloat); }

// MXU numerics (DESIGN §6): float32 matmul inputs are rounded to bf16 unless
// the precision is "highest". "medium": one bf16 pass; "high": bf16x3 (the
// three largest partial products of the hi/lo split); both accumulate in f32.
bool run_mxu_emulated(const Node& n, torch::jit::Stack& stack, at::Float32MatmulPrecision prec) {
  if (prec == at::Float32MatmulPrecision::HIGHEST) return false;
  const Lowering& l = lowering_of(n.op);
  at::Tensor (*prod)(const at::Tensor&, const at::Tensor&) = nullptr;
  switch (l.mxu) {
    case MxuOp::kMm:
    case MxuOp::kAddmm:
      prod = &at::mm;
      break;
    case MxuOp::kBmm:
    case MxuOp::kBaddbmm:
      prod = &at::bmm;
      break;
    case MxuOp::kMv:
    case MxuOp::kAddmv:
      prod = &at::mv;
      break;
    case MxuOp::kDot:
      prod = &at::dot;
      break;
    default:
      return false;
  }
  const bool inplace = l.form == OpForm::kInPlace;
  const bool has_bias = l.has_bias();
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
  } else if (l.form == OpForm::kOut) {  // .out overload: the out argument is last
    ret = stack.back().toTensor();
    ret.copy_(result);
  }
  stack.clear();
  stack.emplace_back(ret);
  return true;
}

// One op's simulated cost as it adds to RegionStats: FLOPs, MXU FLOPs and
// compute seconds on the active chip (cost_model.h OpCost).
struct OpCostAdd {
  double flops = 0;
  double mxu_flops = 0;
  double compute_s = 0;
};

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
  int64_t padding_bytes(const TensorRef& r) override {
    return tpu::tiled_bytes(r.sizes(), r.dtype, chip_) - r.nbytes();
  }
  void add_op_cost(const Node& n, RegionStats& stats) override {
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) {
      if (auto custom = custom_cost(n.op)) {
        add_custom_cost(n, *custom, stats);
        return;
      }
    }
    add_cost(op_cost_of(n), stats);
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) stats.library_calls++;
  }
  // add_op_cost, with the cost of a compiled region's op at position `p` kept
  // in the costs given to keep_costs (computed at its first run there).
  void add_op_cost_at(const Node& n, size_t p, RegionStats& stats) override {
    const bool library = static_cast<PrimKind>(n.kind) == PrimKind::kLibrary;
    if (kept_costs_ == nullptr || (library && custom_cost(n.op))) {
      add_op_cost(n, stats);
      return;
    }
    if (kept_costs_->size() <= p) kept_costs_->resize(p + 1);
    std::optional<OpCostAdd>& c = (*kept_costs_)[p];
    if (!c) c = op_cost_of(n);
    add_cost(*c, stats);
    if (library) stats.library_calls++;
  }
  // Where add_op_cost_at keeps the costs of the ops run_ops runs next (per
  // position; null: computed per run). The caller clears them when the
  // precision changes.
  void keep_costs(std::vector<std::optional<OpCostAdd>>* costs) { kept_costs_ = costs; }
  // What add_op_cost adds for `n` when it is not a library call (cost_model.h
  // op_cost): fixed by the op, its operands' sizes and dtypes, the chip and
  // the precision, so a plan keeps it (TpuPlan::loop_costs).
  OpCostAdd op_cost_of(const Node& n) const {
    const tpu::OpCost cost = tpu::op_cost(n, chip_, prec_);
    return {cost.flops, cost.mxu_flops, cost.seconds(chip_)};
  }
  // Adds `c` to `stats` (the same sums in the same order as add_op_cost).
  static void add_cost(const OpCostAdd& c, RegionStats& stats) {
    stats.flops += c.flops;
    stats.mxu_flops += c.mxu_flops;
    stats.compute_s += c.compute_s;
  }

 private:
  // A custom op's own cost (custom_ops.h: a Pallas kernel's grid and
  // BlockSpecs): its FLOPs on the MXUs or the vector unit, and the HBM bytes
  // its grid moves beyond the tensors it reads and writes once.
  void add_custom_cost(const Node& n, const CustomCost& c, RegionStats& stats) {
    stats.library_calls++;
    if (c.flops >= 0) {
      stats.flops += c.flops;
      if (c.mxu) {
        stats.mxu_flops += c.flops;
        if (chip_.valid()) stats.compute_s += c.flops / chip_.peak_bf16_flops;
      } else if (chip_.valid()) {
        stats.compute_s += c.flops / chip_.vpu_elems_per_s;
      }
    } else {
      const tpu::OpCost cost = tpu::op_cost(n, chip_, prec_);
      stats.flops += cost.flops;
      stats.compute_s += cost.seconds(chip_);
    }
    if (c.hbm_bytes >= 0) {
      int64_t once = 0;
      for (const auto& in : n.inputs) once += in.ref.nbytes();
      for (const auto& out : n.outputs) once += out.nbytes();
      stats.extra_hbm_bytes += std::max<int64_t>(0, c.hbm_bytes - once);
    }
    if (!c.grid.empty() && jit::trace_active()) {
      jit::TilingRecord t;
      t.kind = "pallas";
      t.grid = c.grid;
      for (const auto& b : c.blocks)
        t.blocks.push_back(jit::TilingRecord::Block{b.role, b.dtype, b.shape, b.block, b.buffers, b.vmem_bytes});
      t.vmem_bytes = c.vmem_bytes;
      t.vmem_budget_bytes = chip_.vmem_bytes;
      t.hbm_reread_bytes = stats.extra_hbm_bytes;
      jit::trace_attach_tiling(std::move(t));
    }
  }

  const tpu::ChipParams& chip_;
  const at::Float32MatmulPrecision prec_;
  std::vector<std::optional<OpCostAdd>>* kept_costs_ = nullptr;
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

// Ops of a region at some of its positions, with their materialization:
// a part of a split region, as compiled (node indices are bound per run).
struct Part {
  std::vector<size_t> pos;
  std::vector<std::vector<char>> materialize;
  PrimKind anchor = PrimKind::kElementwise;
  // This run's region of the part: valid until the next bind of this part.
  // Only its node indices change from run to run, so the region is kept
  // with the part and they are rewritten in place (a copy of the
  // materialize flags was one allocation per op of the part, every run).
  const Region& bind(const Region& region) const {
    if (!ready_) {
      bound_.anchor = anchor;
      bound_.materialize = materialize;
      ready_ = true;
    }
    bound_.nodes.resize(pos.size());
    for (size_t k = 0; k < pos.size(); ++k) bound_.nodes[k] = region.nodes[pos[k]];
    return bound_;
  }
  // Set the materialize flags again (they changed after a bind).
  void forget_bound() { ready_ = false; }

 private:
  mutable Region bound_;  // kept with the part; its kernel runs one region at a time (TpuKernel::mu_)
  mutable bool ready_ = false;
};

Part make_part(const Region& region, const std::vector<size_t>& pos, PrimKind anchor) {
  Part part;
  part.pos = pos;
  part.anchor = anchor;
  for (size_t p : pos) part.materialize.push_back(region.materialize[p]);
  return part;
}

// How a region runs on the TPU. Partition decided the region (one
// executable unit) and its loops (Region::loop); compile only maps it:
// - kLoops: a fused region's loops (several: a multi-tensor loop) in their
//   order (a loop reading another's stored value comes after it), each
//   planned for this layout; a loop that does not plan for it (an operand's
//   layout, a broadcast the loop would write) runs op by op in its turn;
// - kMatmul: an MXU op (`head`) then its elementwise epilogue (`tail`) as one
//   fused loop over the product, read from where the MXU op wrote it;
// - kOps: every op op by op (anchor kLibrary, a single elementwise op).
struct TpuPlan {
  enum class Mode : uint8_t { kLoops, kMatmul, kOps } mode = Mode::kOps;
  // The layout it was planned for; the flush plan's object once a run gave it
  // (Kernel::run_with_layout: then compared by pointer).
  std::shared_ptr<const std::vector<int64_t>> signature;
  std::vector<tpu::LoopPlan> loops;       // kLoops: per loop of the region, its plan
  std::vector<char> planned;              // kLoops: per loop, whether it planned (else op by op)
  std::vector<tpu::LoopPlan> tail_loops;  // kMatmul: the epilogue's loop (empty: op by op)
  Part head, tail;
  bool has_tiling = false;
  tpu::TilingPlan tiling;
  bool mxu = false;
  // kMatmul: the MXU op's outputs the region does not materialize, handed to
  // the epilogue in flush-local memory: on the TPU the epilogue runs on the
  // MXU's result tiles in VMEM, so their HBM write and read are not counted.
  std::vector<size_t> handed_over;
  // Per loop that ran fused (kLoops: of `loops`; kMatmul: of `tail_loops`),
  // its ops' simulated costs in loop order, computed at its first fused run:
  // fixed by this plan's layout, the chip and the precision `cost_prec` (a
  // cache-hit run adds them instead of costing every op again). Empty: not
  // computed yet, or a loop holding a library call (costed per run).
  std::vector<std::vector<OpCostAdd>> loop_costs;
  int cost_prec = -1;
  // kOps: per op, its cost at `cost_prec`, computed at its first run;
  // kMatmul: the MXU op's (TpuHooks::keep_costs).
  std::vector<std::optional<OpCostAdd>> op_costs;
  // kOps: the ops' CPU argument and out= tensors; kMatmul: the MXU op's. Kept
  // across runs (host::KeptTensors).
  host::KeptTensors kept;
};

// Adds the simulated costs of the ops of loop `l` (`lp`, run fused on `r`)
// of `plan` to `stats`, from the plan's loop_costs (computed at the first run
// at precision `prec`).
void add_loop_costs(TpuPlan& plan, size_t l, const tpu::LoopPlan& lp, const Region& r, const std::vector<Node>& graph,
                    TpuHooks& hooks, int prec, RegionStats& stats) {
  if (plan.cost_prec != prec) {
    plan.loop_costs.clear();
    plan.op_costs.clear();
    plan.cost_prec = prec;
  }
  if (plan.loop_costs.size() <= l) plan.loop_costs.resize(l + 1);
  std::vector<OpCostAdd>& costs = plan.loop_costs[l];
  if (costs.size() != lp.pos.size()) {
    costs.clear();
    for (size_t p : lp.pos) {
      if (static_cast<PrimKind>(graph[r.nodes[p]].kind) == PrimKind::kLibrary) {  // costed per run
        costs.clear();
        for (size_t q : lp.pos) hooks.add_op_cost(graph[r.nodes[q]], stats);
        return;
      }
      costs.push_back(hooks.op_cost_of(graph[r.nodes[p]]));
    }
  }
  for (const OpCostAdd& c : costs) TpuHooks::add_cost(c, stats);
}

// Has `hooks` keep the costs of the ops of `plan` run op by op at precision `prec` in the plan.
void keep_op_costs(TpuPlan& plan, TpuHooks& hooks, int prec) {
  if (plan.cost_prec != prec) {
    plan.loop_costs.clear();
    plan.op_costs.clear();
    plan.cost_prec = prec;
  }
  hooks.keep_costs(&plan.op_costs);
}

// The positions of each loop of `region` (Region::loop; one loop of every
// op when partition assigned none).
std::vector<std::vector<size_t>> loop_sets(const Region& region) {
  std::vector<std::vector<size_t>> sets;
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const size_t l = region.loop.empty() ? 0 : static_cast<size_t>(region.loop[p]);
    if (l >= sets.size()) sets.resize(l + 1);
    sets[l].push_back(p);
  }
  return sets;
}

// A matmul region: the MXU op, then its epilogue as one loop reading the
// product (materialized in the part, so it outlives the MXU op's run).
void plan_matmul_epilogue(const Region& region, const std::vector<Node>& graph, TpuPlan* plan) {
  std::vector<size_t> tp(region.nodes.size() - 1);
  for (size_t k = 0; k < tp.size(); ++k) tp[k] = k + 1;
  Part head = make_part(region, {0}, PrimKind::kMatmul), tail = make_part(region, tp, PrimKind::kElementwise);
  Region h = head.bind(region);
  const Region t = tail.bind(region);
  materialize_read_by(t, h, graph);
  head.materialize = h.materialize;
  head.forget_bound();
  for (size_t j = 0; j < h.materialize[0].size(); ++j)
    if (h.materialize[0][j] && !region.materialize[0][j]) plan->handed_over.push_back(j);
  std::vector<size_t> all(tp.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  tpu::LoopPlan lp;
  if (tpu::fused_loops_available() && tpu::plan_loop(t, all, graph, &lp)) plan->tail_loops.push_back(std::move(lp));
  plan->mode = TpuPlan::Mode::kMatmul;
  plan->head = std::move(head);
  plan->tail = std::move(tail);
}

// Plans `region` for its current layout.
TpuPlan build_plan(const Region& region, const std::vector<Node>& graph, const tpu::ChipParams& chip) {
  TpuPlan plan;
  plan.signature = std::make_shared<const std::vector<int64_t>>(layout_signature(region, graph));
  for (int i : region.nodes) plan.mxu = plan.mxu || static_cast<PrimKind>(graph[i].kind) == PrimKind::kMatmul;
  // The VMEM tiling depends on shapes only. Only matmul plans re-read HBM,
  // so a vector region is planned only for the profiler (at run).
  if (chip.valid() && plan.mxu) {
    plan.tiling = tpu::plan_region(region, graph, chip);
    plan.has_tiling = true;
  }
  plan.mode = TpuPlan::Mode::kOps;
  if (region.anchor == PrimKind::kLibrary) return plan;  // cut out by partition: op by op
  if (region.anchor == PrimKind::kMatmul) {
    if (region.nodes.size() > 1) plan_matmul_epilogue(region, graph, &plan);
    return plan;
  }
  // A single elementwise op gains nothing from a loop (CPU's kernel writes
  // the device buffer directly); a single row reduction still runs in one.
  if (!tpu::fused_loops_available() ||
      (region.nodes.size() == 1 && static_cast<PrimKind>(graph[region.nodes[0]].kind) != PrimKind::kReduction))
    return plan;
  bool any = false;
  for (const auto& set : loop_sets(region)) {
    plan.loops.emplace_back();
    const bool ok = tpu::plan_loop(region, set, graph, &plan.loops.back());
    if (ok) tpu::number_slots(plan.loops.back(), region, graph);
    if (!ok) plan.loops.back().pos = set;
    plan.planned.push_back(ok);
    any = any || ok;
  }
  if (!any) {
    plan.loops.clear();
    plan.planned.clear();
    return plan;
  }
  plan.mode = TpuPlan::Mode::kLoops;
  return plan;
}

// TORCH_TPU_DEBUG >= 1: counts each op of a run by how it ran ("fused.<op>" in
// a fused loop, "op_by_op.<op>" through its CPU kernel), for metrics_report().
void count_ops(const char* how, const Region& region, const std::vector<size_t>& pos, const std::vector<Node>& graph) {
  if (debug::level() < 1) return;
  for (size_t p : pos) debug::count_op(how, host::op_display_name(graph[region.nodes[p]]).substr(6));
}
void count_ops(const char* how, const Region& part, const std::vector<Node>& graph) {
  if (debug::level() < 1) return;
  for (int i : part.nodes) debug::count_op(how, host::op_display_name(graph[i]).substr(6));
}

// Runs `part` of `region` op by op; a failure's position is reported in the
// whole region. `kept`: the part's kept tensors, or null.
void run_part_ops(const CompiledRegion& info, const Region& part, const std::vector<size_t>& pos,
                  std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats, host::HostRunHooks& hooks,
                  host::KeptTensors* kept = nullptr) {
  count_ops("op_by_op", part, graph);
  try {
    host::run_ops(info, part, graph, mem, stats, hooks, kept);
  } catch (...) {
    if (stats.failed_at >= 0) stats.failed_at = static_cast<int>(pos[stats.failed_at]);
    throw;
  }
}

// Binds every loop of `loops` (planned on `r`); false when one does not bind.
bool bind_all(std::vector<tpu::LoopPlan>& loops, const Region& r, std::vector<Node>& graph, host::HostMemory& mem) {
  if (loops.empty()) return false;
  for (auto& l : loops)
    if (!tpu::bind_loop(l, r, graph, mem)) return false;
  return true;
}

// Runs the bound tail loops of `plan` on `r` and adds their ops' costs.
void run_all(TpuPlan& plan, const Region& r, std::vector<Node>& graph, RegionStats& stats, TpuHooks& hooks, int prec) {
  for (size_t l = 0; l < plan.tail_loops.size(); ++l) {
    tpu::LoopPlan& lp = plan.tail_loops[l];
    tpu::run_loop(lp, stats);
    count_ops("fused", r, lp.pos, graph);
    add_loop_costs(plan, l, lp, r, graph, hooks, prec, stats);
  }
}

// Runs the tail of a split region: its fused loops when they bind, else op by op.
void run_tail(const CompiledRegion& info, TpuPlan& plan, const Region& region, std::vector<Node>& graph,
              host::HostMemory& mem, RegionStats& stats, TpuHooks& hooks, int prec) {
  const Region& t = plan.tail.bind(region);
  if (bind_all(plan.tail_loops, t, graph, mem)) {
    run_all(plan, t, graph, stats, hooks, prec);
    return;
  }
  run_part_ops(info, t, plan.tail.pos, graph, mem, stats, hooks);
}

// True when some input of `region` holds an earlier failure: the region
// then runs op by op (run_ops), where only the ops that read it fail.
bool reads_failed_input(const Region& region, const std::vector<Node>& graph) {
  for (int i : region.nodes)
    for (const auto& in : graph[i].inputs)
      if (in.ref.storage->error) return true;
  return false;
}

class TpuKernel final : public Kernel {
 public:
  TpuKernel(const CompiledRegion& info, const Region& region, const std::vector<Node>& graph)
      : Kernel(info), range_("tpu::" + info.name), chip_(tpu::active_chip()) {
    plans_.push_back(build_plan(region, graph, chip_));
  }

  void run(const Region& region, std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats) override {
    run_with_layout(region, graph, mem, stats,
                    std::make_shared<const std::vector<int64_t>>(layout_signature(region, graph)));
  }

  void run_with_layout(const Region& region, std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats,
                       const std::shared_ptr<const std::vector<int64_t>>& sig) override {
    std::lock_guard<std::mutex> lock(mu_);
    // A run with another exact layout (sizes inside one dynamic-shape
    // bucket, offsets, strides, aliasing) uses its own plan: one region kind
    // recurs with several layouts in one step (a block's q, k and v slices),
    // so the kernel keeps the last kMaxPlans, most recent first.
    size_t at = 0;
    while (at < plans_.size() && !same_layout(plans_[at], sig)) ++at;
    if (at == plans_.size()) {
      if (plans_.size() == kMaxPlans) plans_.pop_back();
      plans_.insert(plans_.begin(), build_plan(region, graph, chip_));
      stats.plans_built++;
    } else if (at > 0) {
      std::rotate(plans_.begin(), plans_.begin() + at, plans_.begin() + at + 1);
    }
    TpuPlan& plan_ = plans_.front();
    // The precision the region's ops were recorded at (torch.tpu.precision is
    // per thread). Only MXU ops read it (their numerics and cost), so a
    // region without one skips reading it (the global setting's read is
    // ~300 instructions when the flush's ops did not fix one).
    const auto prec =
        plan_.mxu ? static_cast<at::Float32MatmulPrecision>(run_precision()) : at::Float32MatmulPrecision::HIGHEST;
    const bool tracing = jit::trace_active();
    if (tracing) {
      const tpu::TilingPlan t =
          plan_.has_tiling || !chip_.valid() ? plan_.tiling : tpu::plan_region(region, graph, chip_);
      jit::trace_attach_tiling(tpu::tiling_record(t));
    }
    // A torch.profiler range per region ("tpu::fused_mul_add"), its ops in the
    // range's keyword inputs. No RecordFunction is made when no callback
    // wants the scope (as RECORD_FUNCTION does: its set-up and teardown were
    // ~250 instructions a region).
    std::optional<at::RecordFunction> guard;
    if (auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE)) {
      guard.emplace(std::move(*callbacks));
      if (guard->isActive()) {
        std::string ops;
        for (int i : region.nodes) ops += (ops.empty() ? "" : ",") + host::op_display_name(graph[i]).substr(6);
        const std::unordered_map<std::string, c10::IValue> kwargs = {{"ops", c10::IValue(ops)}};
        guard->before(std::string_view(range_), &kwargs);
      }
    }
    TpuHooks hooks(chip_, prec);
    const CompiledRegion& c = info();
    using Mode = TpuPlan::Mode;
    const Mode mode = mem.inputs_may_hold_errors() && reads_failed_input(region, graph) ? Mode::kOps : plan_.mode;
    switch (mode) {
      case Mode::kLoops: {
        // Each loop in its turn; one that does not plan or bind (a guard
        // failed) runs op by op. After an error the rest runs op by op, where
        // ops reading a failed value fail in turn, and the first error is rethrown.
        for (size_t l = 0; l < plan_.loops.size(); ++l) {
          tpu::LoopPlan& lp = plan_.loops[l];
          if (plan_.planned[l] && tpu::bind_loop(lp, region, graph, mem)) {
            tpu::run_loop(lp, stats);
            count_ops("fused", region, lp.pos, graph);
            add_loop_costs(plan_, l, lp, region, graph, hooks, static_cast<int>(prec), stats);
            continue;
          }
          const Part part = make_part(region, lp.pos, region.anchor);
          try {
            run_part_ops(c, part.bind(region), part.pos, graph, mem, stats, hooks);
          } catch (...) {
            const std::exception_ptr err = std::current_exception();
            const int at = stats.failed_at;
            std::vector<size_t> rest;
            for (size_t k = l + 1; k < plan_.loops.size(); ++k)
              rest.insert(rest.end(), plan_.loops[k].pos.begin(), plan_.loops[k].pos.end());
            std::sort(rest.begin(), rest.end());
            if (!rest.empty()) {
              try {
                host::run_ops(c, make_part(region, rest, region.anchor).bind(region), graph, mem, stats, hooks);
              } catch (...) {
              }
            }
            stats.failed_at = at;
            stats.errors_marked = true;
            std::rethrow_exception(err);
          }
        }
        break;
      }
      case Mode::kMatmul: {
        // The MXU op; a failure fails the region (its epilogue reads the product).
        try {
          keep_op_costs(plan_, hooks, static_cast<int>(prec));
          run_part_ops(c, plan_.head.bind(region), plan_.head.pos, graph, mem, stats, hooks, &plan_.kept);
          hooks.keep_costs(nullptr);
        } catch (...) {
          hooks.keep_costs(nullptr);
          const std::exception_ptr err = std::current_exception();
          const int at = stats.failed_at;
          try {
            host::run_ops(c, plan_.tail.bind(region), graph, mem, stats, hooks);
          } catch (...) {
          }
          stats.failed_at = at;
          stats.errors_marked = true;
          std::rethrow_exception(err);
        }
        run_tail(c, plan_, region, graph, mem, stats, hooks, static_cast<int>(prec));
        for (size_t j : plan_.handed_over) {  // written once by the MXU op, read once by the epilogue
          const TensorRef& r = graph[region.nodes[0]].outputs[j];
          stats.bytes_written -= hooks.logical_bytes(r);
          stats.bytes_read -= hooks.logical_bytes(r);
          stats.padding_bytes -= 2 * hooks.padding_bytes(r);
        }
        break;
      }
      case Mode::kOps:
        // (Also a kMatmul plan's region after an earlier failure: its position 0 is the MXU op there too.)
        count_ops("op_by_op", region, graph);
        keep_op_costs(plan_, hooks, static_cast<int>(prec));
        host::run_ops(c, region, graph, mem, stats, hooks, &plan_.kept);
        break;
    }
    finish(plan_, stats);
  }

 private:
  // Whether `plan` was made for layout `sig`: the same object (the flush plan
  // that gave it before), else equal words, and then the plan keeps `sig` so
  // that this flush plan's next run compares the pointer only.
  static bool same_layout(TpuPlan& plan, const std::shared_ptr<const std::vector<int64_t>>& sig) {
    if (plan.signature == sig) return true;
    if (*plan.signature != *sig) return false;
    plan.signature = sig;
    return true;
  }

  // Simulated time of the region: max(compute, HBM traffic incl. padding and
  // the re-reads its tiling implies) + launch.
  void finish(const TpuPlan& plan, RegionStats& stats) const {
    if (!chip_.valid()) return;  // no target set: no simulated time
    const double hbm = static_cast<double>(stats.bytes_read + stats.bytes_written + stats.padding_bytes +
                                           plan.tiling.hbm_reread_bytes + stats.extra_hbm_bytes);
    stats.memory_s = hbm / chip_.hbm_bandwidth;
    stats.sim_time_s = std::max(stats.compute_s, stats.memory_s) + chip_.launch_s;
  }

  std::mutex mu_;
  const std::string range_;
  const tpu::ChipParams chip_;  // the JIT drops every kernel when the target changes
  static constexpr size_t kMaxPlans = 8;
  std::vector<TpuPlan> plans_;  // by layout, most recently used first
};

class TpuExecutor final : public Executor {
 public:
  const char* name() const override { return "tpu"; }
  // Fusion as the fused loop plans it (tpu::loop_accepts): an op it does not
  // take is cut out of fused regions; a row reduction ends its loop; an MXU
  // op anchors its region with an elementwise epilogue (tiling.h costs them as one kernel).
  bool loops_of_one_shape() const override { return true; }
  OpFusion op_fusion(const std::vector<Node>& graph, int i) const override {
    if (static_cast<PrimKind>(graph[i].kind) == PrimKind::kMatmul) return OpFusion::kAnchor;
    switch (tpu::loop_accepts(graph, i)) {
      case tpu::LoopAccept::kElementwise:
        return OpFusion::kFuses;
      case tpu::LoopAccept::kRowAnchor:
        return OpFusion::kEndsLoop;
      case tpu::LoopAccept::kRowValue:
        return OpFusion::kRowValue;
      case tpu::LoopAccept::kNo:
        break;
    }
    return OpFusion::kOpByOp;
  }
  // Integer loops are loops of their own (tpu::plan_int_loop).
  int loop_domain(const std::vector<Node>& graph, int i) const override { return tpu::int_loop_domain(graph[i]); }
  std::string target() const override { return tpu::active_chip().name; }
  std::shared_ptr<Kernel> compile(const CompiledRegion& info, const Region& region,
                                  const std::vector<Node>& graph) override {
    return std::make_shared<TpuKernel>(info, region, graph);
  }
};

}  // namespace

Executor& tpu_executor() {
  static auto& tpu = *new TpuExecutor();  // never destroyed: flushes may run at exit
  return tpu;
}

}  // namespace tpu_eager
