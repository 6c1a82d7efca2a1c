// The simulated Spyre executor. compile() builds a region's KTIR program
// (ktir_ir.h), verifies it and tiles it (schedule.h) once; run() binds the
// launch (job plan: each argument to its device storage, the views' sizes,
// strides and offsets and the literal operands of this launch) and
// interprets the program (ktir_execute): each op on its views, in f32 from
// df16 operands with one df16 rounding per result (df16_ops.h), results
// stored through their views. Ops without a KTIR lowering (PrimKind
// kLibrary) run the same way as library calls, counted in metrics
// (library_calls, metrics_report's "spyre_library_call.<op>"). Regions the
// interpreter does not take (RNG ops, custom-op kernels, conjugate/negative
// views) run through the host loop shared with the TPU executor
// (region_runner.h) with the same per-op numerics ("spyre_host_loop.<kernel>").
// int64 results must fit int32. Regions are costed with Spyre's cost model
// (cost_model.h).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include "device/kineto_profiler.h"
#include "lazy/debug_report.h"
#include "ops/custom_ops.h"

#include "executors/executor.h"
#include "executors/region_runner.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/cost_model.h"
#include "executors/spyre/df16.h"
#include "executors/spyre/df16_ops.h"
#include "executors/spyre/job_plan.h"
#include "executors/spyre/layout.h"
#include "executors/spyre/ktir.h"
#include "executors/spyre/ktir_ir.h"
#include "executors/spyre/schedule.h"
#include "executors/spyre/spyre.h"
#include "jit/dynamic_shapes.h"
#include "ops/custom_ops.h"

namespace tpu_eager {
namespace spyre {
namespace {

std::atomic<OverflowThrower> g_thrower{nullptr};

std::string where_of(const Node& n) {
  return host::op_display_name(n) + " (recorded at " + (n.where.empty() ? std::string("<unknown>") : n.where) + ")";
}

class SpyreHooks final : public host::HostRunHooks {
 public:
  explicit SpyreHooks(const CardParams& card) : card_(card) {}
  // 16-bit float ops compute in f32 and round once to df16 (df16_ops.h).
  void call(const Node& n, torch::jit::Stack& stack) override {
    in_f32_ = computes_in_f32(n);
    if (in_f32_)
      call_in_f32(n, stack);
    else
      host::call_cpu(n, stack);
  }
  bool direct_outputs_ok(const Node& n) override { return !computes_in_f32(n); }
  int64_t logical_bytes(const TensorRef& r) override { return device_bytes(r.sizes(), r.dtype); }
  int64_t padding_bytes(const TensorRef& r) override {
    return stick_bytes(r.sizes(), r.dtype, card_) - device_bytes(r.sizes(), r.dtype);
  }
  void after_op(const Node& n, std::vector<at::Tensor>& results, host::HostMemory& mem) override {
    // An op computed in f32 stored its results as df16 already (one rounding).
    const bool stored = in_f32_;
    in_f32_ = false;
    for (auto& r : results) {
      if (!r.defined()) continue;
      check_int32(r, where_of(n));
      if (!stored) r = rounded(r);
    }
    bool rewrote = false;
    for (const auto& in : n.inputs) {
      if (!in.written) continue;
      if (in.ref.dtype == c10::kLong) check_int32(mem.tensor(in.ref), where_of(n));
      if (is_dtype16(in.ref.dtype) && !stored) {
        at::Tensor w = mem.written_tensor(in.ref);
        df16_round_(w);
        rewrote = true;
      }
    }
    if (rewrote) mem.finish_writes();
  }
  void add_op_cost(const Node& n, RegionStats& stats) override {
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) {
      if (auto custom = custom_cost(n.op)) {
        add_custom_cost(n, *custom, stats);
        return;
      }
    }
    const OpCost c = op_cost(n, card_);
    stats.flops += c.flops;
    stats.mxu_flops += 2.0 * c.macs;
    stats.compute_s += c.seconds(card_);
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) stats.library_calls++;
  }

  // A custom op's own cost (custom_ops.set_cost): its FLOPs on all cores'
  // matmul units (MACs = FLOPs / 2) or vector units, and the HBM bytes it moves
  // beyond its tensors read and written once. A Pallas kernel's grid and
  // blocks describe TPU VMEM tiles and are not used here (no LX check: a
  // Pallas kernel has no Spyre lowering whose failure to mimic).
  void add_custom_cost(const Node& n, const CustomCost& c, RegionStats& stats) {
    stats.library_calls++;
    if (c.flops < 0) {
      const OpCost d = op_cost(n, card_);
      stats.flops += d.flops;
      stats.mxu_flops += 2.0 * d.macs;
      stats.compute_s += d.seconds(card_);
    } else {
      stats.flops += c.flops;
      if (c.mxu) stats.mxu_flops += c.flops;
      if (card_.valid()) {
        const double cores = static_cast<double>(card_.cores);
        stats.compute_s += c.mxu ? c.flops / 2.0 / (card_.matmul_macs_per_s_per_core * cores)
                                 : c.flops / (card_.vector_elems_per_s_per_core * cores);
      }
    }
    if (c.hbm_bytes >= 0) {
      int64_t once = 0;
      for (const auto& in : n.inputs) once += in.ref.nbytes();
      for (const auto& out : n.outputs) once += out.nbytes();
      stats.extra_hbm_bytes += std::max<int64_t>(0, c.hbm_bytes - once);
    }
  }

 private:
  const CardParams& card_;
  bool in_f32_ = false;  // the op of the current call ran through call_in_f32
};

// The executor's per-op hooks of the KTIR interpreter: operands' earlier
// errors, int32 checks, library calls and error context name the recorded op.
class InterpreterHooks final : public KtirRunHooks {
 public:
  InterpreterHooks(const CompiledRegion& c, const Region& region, const std::vector<Node>& graph)
      : c_(c), region_(region), graph_(graph) {}
  const Node& node(size_t k) const { return graph_[region_.nodes[k]]; }
  void before_op(size_t k) override {
    const Node& n = node(k);
    // A storage this op overwrites whole loses an earlier op's error once the
    // user has seen it (as in the host loop, region_runner.cpp).
    for (const auto& in : n.inputs) {
      DeferredStorage* s = in.ref.storage.get();
      if (!s->error || !s->error_seen || !in.written || host::reads_written_value(n, in) || !in.ref.covers_storage())
        continue;
      bool read_elsewhere = false;
      for (const auto& other : n.inputs)
        if (&other != &in && other.ref.storage == in.ref.storage &&
            (!other.written || host::reads_written_value(n, other)))
          read_elsewhere = true;
      if (!read_elsewhere) s->set_error(nullptr);
    }
    for (const auto& in : n.inputs)
      if (!in.written || host::reads_written_value(n, in)) check_storage_error(in.ref.storage.get());
  }
  void call(size_t k, const c10::OperatorHandle& op, torch::jit::Stack& stack,
            const std::vector<c10::ScalarType>& result_dtypes) override {
    if (static_cast<PrimKind>(node(k).kind) == PrimKind::kLibrary) debug::count_op("spyre_library_call", op_name(k));
    KtirRunHooks::call(k, op, stack, result_dtypes);
  }
  void after_op(size_t k, const std::vector<at::Tensor>& results, const std::vector<at::Tensor>& written) override {
    for (const auto& t : results) check_int32(t, where_of(node(k)));
    for (const auto& t : written) check_int32(t, where_of(node(k)));
    for (const auto& o : node(k).outputs) o.storage->error = nullptr;  // a fresh value
  }
  void failed(size_t k, const std::exception_ptr& e) override {
    for_each_written_storage(node(k), [&](DeferredStorage* s) { s->set_error(e); });
  }
  std::string where(const KtirProgram& p, size_t k) override {
    const Node& n = node(k);
    return host::op_display_name(n) + " recorded at " + (n.where.empty() ? std::string("<unknown>") : n.where) +
           " (in " + c_.name + ", KTIR line " + std::to_string(p.ops[k].line) + ")";
  }

 private:
  std::string op_name(size_t k) const { return host::op_display_name(node(k)).substr(6); }
  const CompiledRegion& c_;
  const Region& region_;
  const std::vector<Node>& graph_;
};

// True when the KTIR interpreter runs `region`: no RNG op (their streams are
// seeded by the host loop), no custom-op kernel, no conjugate or negative view.
bool interpretable(const Region& region, const std::vector<Node>& graph) {
  for (int i : region.nodes) {
    const Node& n = graph[i];
    if (n.rng) return false;
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary && custom_host_kernel(n.op)) return false;
    for (const auto& in : n.inputs)
      if (in.ref.conj || in.ref.neg) return false;
    for (const auto& o : n.outputs)
      if (o.conj || o.neg) return false;
  }
  return true;
}

// A region compiled for Spyre: its KTIR programs and tile schedule, built
// once per region structure. A launch whose exact layout (sizes inside a
// dynamic-shape bucket, strides, offsets) differs from the last one is bound
// again (the verifier and the tiling rerun on the bound geometry) to the
// first of the kernel's programs that fits it, most recently used first;
// only a launch none fits compiles a new program (a shape some size of which
// equals a weight's by chance keeps its own next to the general one, so the
// general one is not planned again after it). Each run records the program
// for inspection, adds the region to the flush's job plan and interprets
// the bound program.
class SpyreKernel final : public Kernel {
 public:
  SpyreKernel(const CompiledRegion& info, const Region& region, const std::vector<Node>& graph)
      : Kernel(info), card_(active_card()) {
    const RegionLayout L = region_layout(region, graph, card_);
    KtirProgram launch = ktir_build(info, region, graph, card_, L);
    compile_program(launch, L);
    bind(std::move(launch), program().sym_values, region, graph);
    interpretable_ = interpretable(region, graph);
  }

  void run(const Region& region, std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CompiledRegion& c = info();
    const RegionLayout L = region_layout(region, graph, card_);
    KtirProgram launch = ktir_build(c, region, graph, card_, L);  // this launch's geometry and literals
    if (layout_signature(region, graph) != signature_) {
      // A new exact layout: a compiled (symbolic) program serves it when
      // some symbol values make it this launch's program; else it compiles anew.
      std::optional<std::vector<int64_t>> values;
      for (size_t k = 0; k < programs_.size() && !values; ++k)
        if ((values = ktir_match(programs_[k].program, launch)))
          std::rotate(programs_.begin(), programs_.begin() + static_cast<int64_t>(k),
                      programs_.begin() + static_cast<int64_t>(k) + 1);
      if (!values) {
        compile_program(launch, L);
        values = program().sym_values;
        stats.plans_built++;
      }
      bind(std::move(launch), *values, region, graph);  // throws (before any op runs) when it cannot fit LX
    } else {
      bound_ = std::move(launch);  // same geometry; this launch's literal operands
    }
    ktir_record(c.name, ktir_);
    job_plan_add_region(c.name, L, card_);
    job_plan_bind_last(binding_, programs_.front().id, static_cast<int64_t>(programs_.size()));
    walk_ = KtirWalk();
    if (interpretable_) {
      interpret(region, graph, L, mem, stats);
    } else {
      if (debug::level() >= 1) debug::count_op("spyre_host_loop", c.name);
      SpyreHooks hooks(card_);
      host::run_ops(c, region, graph, mem, stats, hooks);
    }
    if (card_.valid()) {
      stats.memory_s =
          static_cast<double>(stats.bytes_read + stats.bytes_written + stats.padding_bytes + stats.extra_hbm_bytes) /
          card_.dram_bandwidth;
      stats.sim_time_s = region_seconds(stats.compute_s, stats.memory_s, card_);
    }
    Schedule s = schedule_;
    time_schedule(s, stats.compute_s, stats.memory_s, card_);
    // The executed schedule: each core's pipeline over the rows it processed
    // in each tile step of the walk (the plan's steps; the same geometry when
    // the program ran on whole views).
    s.executed_tiles = walk_.tiled;
    // A region with split rows that ran on whole views, by the op (or rule)
    // that kept it whole: metrics_report()'s "spyre_whole_region.<op>".
    if (interpretable_ && !walk_.tiled && plan_.rows > 1) {
      debug::count_op("spyre_whole_region", plan_.whole_op);
      // A reduction of the split rows without a tile program (median, sort,
      // topk, ...) runs on the whole rows as a library call.
      if (plan_.whole_library) {
        stats.library_calls++;
        debug::count_op("spyre_library_call", plan_.whole_op);
      }
    }
    s.whole_reason = interpretable_ ? plan_.whole_reason : "host loop";
    s.tile_steps = walk_.tile_steps;
    s.ring_steps_run = walk_.ring_steps;
    std::vector<std::vector<double>> step_rows;
    for (const auto& step : plan_.steps) {
      std::vector<double> r;
      for (const auto& [b, e] : step) r.push_back(static_cast<double>(e - b));
      step_rows.push_back(std::move(r));
    }
    time_executed(s, step_rows, static_cast<double>(plan_.rows));
    stats.schedule_time_s = s.executed_s;
    if (kineto::recording()) {
      std::vector<double> busy;
      for (const auto& t : s.per_core) busy.push_back(t.end_s);
      kineto::note_kernel_schedule(c.name, s.executed_s, s.pipelined_s, busy, s.ring_s, s.ring_latency_s);
    }
    schedule_record(std::move(s));
  }

 private:
  // The compiled program: `launch` with the sizes the region reads from
  // mark_dynamic ranges made symbols (ktir_symbolize).
  void compile_program(const KtirProgram& launch, const RegionLayout& L) {
    std::vector<KtirDynamicDim> dynamic;
    for (size_t i = 0; i < L.views.size(); ++i) {
      const auto& v = L.views[i];
      if (v.lx || !v.loaded) continue;
      for (const jit::DynamicDim& d : jit::dynamic_dims(*v.ref))
        dynamic.push_back(KtirDynamicDim{d.size, d.base, d.lower, d.upper, d.scale, d.divisor, d.part, d.index, d.step,
                                         d.start, static_cast<int64_t>(i), d.dim, d.trim});
    }
    Compiled c{launch, next_id_++};
    ktir_symbolize(c.program, dynamic);
    // A size that only happened to equal a symbol's value may not hold for
    // every value of the range: the range keeps the values where it does.
    ktir_narrow_ranges(c.program);
    if (programs_.size() >= kMaxPrograms) programs_.pop_back();  // the least recently used
    programs_.insert(programs_.begin(), std::move(c));
  }

  // Binds the compiled program to `launch` (its concrete form under symbol
  // `values`): verifies it and tiles it for LX, before any op runs. The text
  // recorded per run is the compiled program with this binding.
  void bind(KtirProgram launch, const std::vector<int64_t>& values, const Region& region,
            const std::vector<Node>& graph) {
    signature_.clear();
    bound_ = std::move(launch);
    const KtirProgram& program_ = program();
    KtirProgram shown = program_;
    ktir_bind(shown, values);
    ktir_ = ktir_print(shown);
    binding_.clear();
    for (size_t k = 0; k < values.size(); ++k) binding_.emplace_back("s" + std::to_string(k), values[k]);
    if (program_.rows_expr.symbolic()) {
      binding_.emplace_back("rows_per_core", shown.rows_per_core);
      binding_.emplace_back("cores_used", shown.cores_used);
    }
    // The symbolic element counts, sizes other than a bare symbol ("s0-1"),
    // strides and offsets, bound: "%a<k>.elems", "%<view>.sizes[<dim>]",
    // "%<view>.offset", "%<view>.strides[<dim>]".
    for (size_t a = 0; a < program_.args.size(); ++a)
      if (program_.args[a].elems_expr.symbolic())
        binding_.emplace_back("%a" + std::to_string(a) + ".elems", shown.args[a].elems);
    for (size_t v = 0; v < program_.views.size(); ++v) {
      const KtirView& w = program_.views[v];
      const std::string name = "%" + std::to_string(v);
      for (size_t d = 0; d < w.size_expr.size(); ++d) {
        const KtirExpr& e = w.size_expr[d];
        const int k = e.single_symbol();
        if (e.symbolic() && (k < 0 || e.coef[k] != 1 || e.constant != 0))
          binding_.emplace_back(name + ".sizes[" + std::to_string(d) + "]", shown.views[v].sizes[d]);
      }
      if (w.offset_expr.symbolic()) binding_.emplace_back(name + ".offset", shown.views[v].offset);
      for (size_t d = 0; d < w.stride_expr.size(); ++d)
        if (w.stride_expr[d].symbolic())
          binding_.emplace_back(name + ".strides[" + std::to_string(d) + "]", shown.views[v].strides[d]);
    }
    // The verifier's rules (docs/ktir.md) hold for every program we build;
    // a failure is a bug of the lowering, raised before any op runs.
    try {
      ktir_verify(bound_, card_);
    } catch (...) {
      ktir_record(info().name, ktir_);
      throw;
    }
    // Tiled before any op runs: a region that cannot fit LX fails untouched.
    try {
      schedule_ = plan_schedule(info().name, region, graph, card_);
    } catch (...) {
      ktir_record(info().name, ktir_);  // inspectable as before the failure
      throw;
    }
    // How the interpreter walks the bound program: the schedule's tiles of
    // whole rows (a row cut into sticks runs one row per step).
    KtirTiling tiling;
    tiling.rows_per_core = schedule_.rows_per_core;
    tiling.cores_used = schedule_.cores_used;
    tiling.tile_rows = schedule_.row_split ? 1 : std::max<int64_t>(1, schedule_.tile_rows);
    tiling.corelets = std::max<int64_t>(1, schedule_.corelets);
    plan_ = ktir_tile_plan(bound_, tiling);
    if (plan_.tiled && plan_.ring_op >= 0) {
      const RegionLayout L = region_layout(region, graph, card_);
      // A normalizing op's statistics go back to every core; a scan's
      // prefixes only travel forward.
      const bool back = plan_.normalize && !ktir_is_scan(plan_.combine);
      // An order statistic's hops carry sorted runs (plan_.ring_payload_sizes).
      const std::vector<int64_t>& partial = ktir_is_order(plan_.combine) ? plan_.ring_payload_sizes : L.partial_sizes;
      if (plan_.ring_chains.empty())
        schedule_ring_payload(schedule_, partial, plan_.ring_dtype, plan_.ring_stats, back, card_);
      else
        schedule_ring_chains(schedule_, plan_.ring_chains, plan_.ring_dtype, card_);
    }
    signature_ = layout_signature(region, graph);
  }

  // Runs the bound program on the launch's device storages (the job plan's
  // arguments), then adds its traffic (each HBM view once, loaded or stored,
  // in device bytes plus stick padding) and its ops' work to `stats`.
  void interpret(const Region& region, std::vector<Node>& graph, const RegionLayout& L, host::HostMemory& mem,
                 RegionStats& stats) {
    std::vector<at::Tensor> arg_bytes(bound_.args.size());
    for (size_t v = 0; v < L.views.size(); ++v) {
      const KtirView& w = bound_.views[v];
      if (w.lx || arg_bytes[w.arg].defined()) continue;
      DeferredStorage* s = L.views[v].ref->storage.get();
      TensorRef flat;
      flat.dtype = at::kByte;
      flat.set_dims({static_cast<int64_t>(s->nbytes)}, {1});
      arg_bytes[w.arg] = host::view_over(mem.storage_for(s), flat);
    }
    for (const auto& v : L.views) {
      if (v.lx) continue;
      const int64_t logical = device_bytes(v.ref->sizes(), v.ref->dtype);
      const int64_t padding = stick_bytes(v.ref->sizes(), v.ref->dtype, card_) - logical;
      if (v.loaded) stats.bytes_read += logical, stats.padding_bytes += padding;
      if (v.stored) stats.bytes_written += logical, stats.padding_bytes += padding;
    }
    InterpreterHooks hooks(info(), region, graph);
    int failed_at = -1;
    try {
      ktir_execute(bound_, arg_bytes, hooks, &failed_at, &plan_, &walk_);
    } catch (...) {
      stats.failed_at = failed_at;
      stats.errors_marked = true;
      throw;
    }
    stats.failed_at = -1;
    for (int i : region.nodes) {
      const Node& n = graph[i];
      const OpCost cost = op_cost(n, card_);
      stats.flops += cost.flops;
      stats.mxu_flops += 2.0 * cost.macs;
      stats.compute_s += cost.seconds(card_);
      if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) stats.library_calls++;
    }
  }

  std::mutex mu_;
  const CardParams card_;  // the JIT drops every kernel when the target changes
  std::vector<int64_t> signature_;
  // A compiled program (symbolic where sizes vary in a mark_dynamic range)
  // and its number among the kernel's programs, in order of compiling.
  struct Compiled {
    KtirProgram program;
    int64_t id = 0;
  };
  // The most programs a kernel keeps (the least recently used dropped).
  static constexpr size_t kMaxPrograms = 8;
  std::vector<Compiled> programs_;  // most recently used first: front() is bound
  int64_t next_id_ = 0;
  const KtirProgram& program() const { return programs_.front().program; }
  KtirProgram bound_;                                     // the program bound to the last launch (concrete)
  std::string ktir_;                                      // text of the compiled program with the last binding
  std::vector<std::pair<std::string, int64_t>> binding_;  // symbol values of the last binding
  Schedule schedule_;
  KtirTilePlan plan_;  // how the interpreter walks bound_ (tiles of the schedule, or whole views)
  KtirWalk walk_;      // what the last run's walk did
  bool interpretable_ = true;
};

class SpyreExecutor final : public Executor {
 public:
  const char* name() const override { return "spyre"; }
  std::string target() const override { return active_card().name; }

  void begin_flush() override {
    ktir_begin_flush();
    schedule_begin_flush();
    job_plan_begin_flush();
  }

  std::shared_ptr<Kernel> compile(const CompiledRegion& info, const Region& region,
                                  const std::vector<Node>& graph) override {
    return std::make_shared<SpyreKernel>(info, region, graph);
  }

  void check_host_value(const at::Tensor& value, const char* what) override { check_int32(value, what); }
  void to_storage_format(const at::Tensor& written) override { round_in_place(written); }
  bool has_eager_numerics() const override { return true; }
  void after_eager_op(std::vector<c10::IValue>& returns, const std::string& what) override {
    spyre::after_eager_op(returns, what);
  }
};

}  // namespace

bool active() { return active_target_kind() == TargetKind::kSpyre; }

at::Tensor rounded(const at::Tensor& t) {
  if (!t.defined() || !is_dtype16(t.scalar_type())) return t;
  return df16_round(t);
}

void round_in_place(const at::Tensor& t) {
  if (t.defined() && is_dtype16(t.scalar_type()) && t.numel() > 0) df16_round_(t);
}

void check_int32(const at::Tensor& t, const std::string& what) {
  if (!t.defined() || t.scalar_type() != c10::kLong || t.numel() == 0) return;
  auto [lo_t, hi_t] = at::aminmax(t);
  const int64_t lo = lo_t.item<int64_t>(), hi = hi_t.item<int64_t>();
  constexpr int64_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
  if (lo >= kMin && hi <= kMax) return;
  throw_overflow(what + ": int64 value " + std::to_string(lo < kMin ? lo : hi) +
                 " does not fit int32 (the Spyre target holds int64 as int32, range [" + std::to_string(kMin) + ", " +
                 std::to_string(kMax) + "])");
}

void after_eager_op(std::vector<c10::IValue>& returns, const std::string& what) {
  auto treat = [&](const at::Tensor& t) {
    check_int32(t, what);
    round_in_place(t);
  };
  for (const auto& v : returns) {
    if (v.isTensor())
      treat(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec()) treat(t);
  }
}

void set_overflow_thrower(OverflowThrower thrower) { g_thrower.store(thrower); }

void throw_overflow(const std::string& msg) {
  if (OverflowThrower t = g_thrower.load()) t(msg);
  TORCH_CHECK(false, "OverflowError: ", msg);
}

}  // namespace spyre

Executor& spyre_executor() {
  static auto& ex = *new spyre::SpyreExecutor();  // never destroyed: flushes may run at exit
  return ex;
}

}  // namespace tpu_eager
