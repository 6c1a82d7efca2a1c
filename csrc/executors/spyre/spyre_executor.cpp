// The simulated Spyre executor: runs regions with the host loop shared with
// the TPU executor (region_runner.h) and Spyre's storage numerics: every
// float16/bfloat16 result of an op, fresh or written in place, is rounded
// through df16 once after the op; int64 results must fit int32. Regions are
// costed with Spyre's cost model (cost_model.h).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include "executors/executor.h"
#include "executors/region_runner.h"
#include "executors/spyre/cost_model.h"
#include "executors/spyre/df16.h"
#include "executors/spyre/df16_ops.h"
#include "executors/spyre/job_plan.h"
#include "executors/spyre/ktir.h"
#include "executors/spyre/ktir_ir.h"
#include "executors/spyre/schedule.h"
#include "executors/spyre/spyre.h"
#include "ops/custom_ops.h"

namespace tpu_eager {
namespace spyre {
namespace {

std::atomic<OverflowThrower> g_thrower{nullptr};

bool is_16bit_float(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

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
  int64_t logical_bytes(const TensorRef& r) override { return device_bytes(r.sizes, r.dtype); }
  int64_t padding_bytes(const TensorRef& r) override {
    return stick_bytes(r.sizes, r.dtype, card_) - device_bytes(r.sizes, r.dtype);
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
      if (is_16bit_float(in.ref.dtype) && !stored) {
        at::Tensor w = mem.written_tensor(in.ref);
        w.copy_(df16_round(w));
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

// A region compiled for Spyre: its KTIR program and tile schedule, planned
// once per layout; each run records them for inspection, adds the region to
// the flush's job plan (binding its storages to device arguments) and runs
// it op by op.
class SpyreKernel final : public Kernel {
 public:
  SpyreKernel(const CompiledRegion& info, const Region& region, const std::vector<Node>& graph)
      : Kernel(info), card_(active_card()) {
    plan(region, graph);
  }

  void run(const Region& region, std::vector<Node>& graph, host::HostMemory& mem, RegionStats& stats) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CompiledRegion& c = info();
    if (layout_signature(region, graph) != signature_) {
      plan(region, graph);  // throws (before any op runs) when the region cannot fit LX
      stats.plans_built++;
    }
    ktir_record(c.name, ktir_);
    job_plan_add_region(c.name, region, graph, card_);
    // Op by op (no fused float32 loop): Spyre's traffic is counted per view
    // in device dtypes and sticks by the shared loop.
    SpyreHooks hooks(card_);
    host::run_ops(c, region, graph, mem, stats, hooks);
    if (card_.valid()) {
      stats.memory_s =
          static_cast<double>(stats.bytes_read + stats.bytes_written + stats.padding_bytes + stats.extra_hbm_bytes) /
          card_.dram_bandwidth;
      stats.sim_time_s = region_seconds(stats.compute_s, stats.memory_s, card_);
    }
    Schedule s = schedule_;
    time_schedule(s, stats.compute_s, stats.memory_s, card_);
    schedule_record(std::move(s));
  }

 private:
  void plan(const Region& region, const std::vector<Node>& graph) {
    signature_.clear();
    program_ = ktir_build(info(), region, graph, card_);
    ktir_ = ktir_print(program_);
    // The verifier's rules (docs/ktir.md) hold for every program we build;
    // a failure is a bug of the lowering, raised before any op runs.
    try {
      ktir_verify(program_, card_);
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
    signature_ = layout_signature(region, graph);
  }

  std::mutex mu_;
  const CardParams card_;  // the JIT drops every kernel when the target changes
  std::vector<int64_t> signature_;
  KtirProgram program_;
  std::string ktir_;
  Schedule schedule_;
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
};

}  // namespace

bool active() { return active_target_kind() == TargetKind::kSpyre; }

at::Tensor rounded(const at::Tensor& t) {
  if (!t.defined() || !is_16bit_float(t.scalar_type())) return t;
  return df16_round(t);
}

void round_in_place(const at::Tensor& t) {
  if (t.defined() && is_16bit_float(t.scalar_type()) && t.numel() > 0) t.copy_(df16_round(t));
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
  static spyre::SpyreExecutor ex;
  return ex;
}

}  // namespace tpu_eager
