// The simulated TPU executor: runs fused regions on host memory with the TPU's
// numerics (MXU precision modes) and accounts, per region, HBM traffic with
// tiled-layout padding and simulated time on the active chip (cost_model.h).
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <ATen/Context.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <ATen/ops/sub.h>

#include "executors/executor.h"
#include "executors/tpu/chip.h"
#include "executors/tpu/cost_model.h"
#include "executors/tpu/fused_elementwise.h"
#include "views/view_chain.h"

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

// True when op `n` reads the current value of its written argument `in`:
// out= arguments and the self of ops that overwrite it entirely are only written.
bool reads_written_value(const Node& n, const InputSlot& in) {
  const auto& schema = n.op.schema();
  if (in.arg < static_cast<int>(schema.arguments().size()) && schema.arguments()[in.arg].is_out()) return false;
  if (in.arg != 0) return true;
  static const std::unordered_set<std::string> overwrite = {
      "fill_", "zero_", "normal_", "uniform_", "random_", "exponential_",
      "geometric_", "cauchy_", "log_normal_", "bernoulli_", "copy_"};
  return !overwrite.count(schema.name().substr(6));
}

// Identity of a view for counting HBM traffic once per region.
using ViewKey = std::tuple<const DeferredStorage*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;
ViewKey view_key(const TensorRef& r) {
  return {r.storage.get(), r.offset, r.sizes, r.strides, static_cast<int>(r.dtype)};
}

class TpuExecutor final : public Executor {
 public:
  const char* name() const override { return "tpu"; }
  std::string target() const override { return tpu::active_chip().name; }

  void run_region(const CompiledRegion& compiled, const Region& region, std::vector<Node>& graph,
                  host::HostMemory& mem, RegionStats& stats) override {
    const auto prec = at::globalContext().float32MatmulPrecision();
    if (tpu::run_fused_elementwise(region, graph, mem, stats)) {
      const tpu::ChipParams chip = tpu::active_chip();
      for (int i : region.nodes) add_op_cost(graph[i], chip, prec, stats);
      finish(chip, stats);
      return;
    }
    const tpu::ChipParams chip = tpu::active_chip();
    std::unordered_set<const DeferredStorage*> produced;
    std::set<ViewKey> reads, writes;
    // HBM traffic of one view, once per region: logical bytes plus its layout padding.
    auto traffic = [&](const TensorRef& r, std::set<ViewKey>& seen, int64_t& logical) {
      if (!seen.insert(view_key(r)).second) return;
      logical += r.nbytes();
      stats.padding_bytes += tpu::tiled_bytes(r.sizes, r.dtype, chip) - r.nbytes();
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
    for (size_t p = 0; p < region.nodes.size(); ++p) {
      Node& n = graph[region.nodes[p]];
      for (const auto& in : n.inputs) {
        DeferredStorage* s = in.ref.storage.get();
        if (produced.count(s) || mem.is_temp(s) || (in.written && !reads_written_value(n, in))) continue;
        traffic(in.ref, reads, stats.bytes_read);
      }
      stats.failed_at = static_cast<int>(p);
      torch::jit::Stack stack = host::build_stack(n, mem);  // re-raises an input's earlier error as is
      try {
        const bool mxu = static_cast<PrimKind>(n.kind) == PrimKind::kMatmul && run_mxu_emulated(n, stack, prec);
        if (!mxu) host::call_cpu(n, stack);
      } catch (c10::Error& e) {
        e.add_context("while running aten::" + n.op.schema().name().substr(6) +
                      (n.op.schema().overload_name().empty() ? "" : "." + n.op.schema().overload_name()) +
                      " recorded at " + (n.where.empty() ? std::string("<unknown>") : n.where) + " (in " +
                      compiled.name + ")");
        throw;
      }
      mem.finish_writes();
      std::vector<at::Tensor> results = host::fresh_results(n, stack);
      for (size_t j = 0; j < n.outputs.size(); ++j) {
        const bool materialize = region.materialize[p][j];
        bind_output(n.outputs[j], results.at(j), materialize, mem);
        if (materialize) traffic(n.outputs[j], writes, stats.bytes_written);
        produced.insert(n.outputs[j].storage.get());
      }
      for (const auto& in : n.inputs)
        if (in.written && !mem.is_temp(in.ref.storage.get())) traffic(in.ref, writes, stats.bytes_written);
      for (const auto& in : n.inputs)
        if (last_use[in.ref.storage.get()] == p) mem.release_temp(in.ref.storage.get());
      for (const auto& out : n.outputs)
        if (last_use[out.storage.get()] == p) mem.release_temp(out.storage.get());
      add_op_cost(n, chip, prec, stats);
    }
    stats.failed_at = -1;
    finish(chip, stats);
  }

 private:
  static void add_op_cost(const Node& n, const tpu::ChipParams& chip, at::Float32MatmulPrecision prec,
                          RegionStats& stats) {
    const tpu::OpCost cost = tpu::op_cost(n, chip, prec);
    stats.flops += cost.flops;
    stats.mxu_flops += cost.mxu_flops;
    stats.compute_s += cost.seconds(chip);
    if (static_cast<PrimKind>(n.kind) == PrimKind::kLibrary) stats.library_calls++;
  }

  // Simulated time of the region: max(compute, HBM traffic incl. padding) + launch.
  static void finish(const tpu::ChipParams& chip, RegionStats& stats) {
    if (!chip.valid()) return;  // no target set: no simulated time
    const double hbm = static_cast<double>(stats.bytes_read + stats.bytes_written + stats.padding_bytes);
    stats.memory_s = hbm / chip.hbm_bandwidth;
    stats.sim_time_s = std::max(stats.compute_s, stats.memory_s) + chip.launch_s;
  }

  static void bind_output(const TensorRef& ref, const at::Tensor& result, bool materialize, host::HostMemory& mem) {
    DeferredStorage* s = ref.storage.get();
    s->error = nullptr;
    if (materialize) {
      // Store through the inverse of the output's view chain.
      TensorRef flat_ref;
      flat_ref.dtype = ref.dtype;
      flat_ref.sizes = {static_cast<int64_t>(s->nbytes / c10::elementSize(ref.dtype))};
      flat_ref.strides = {1};
      at::Tensor flat = host::view_over(mem.device_buffer(s), flat_ref);
      views::scatter(flat, views::decompose(flat.numel(), ref.sizes, ref.strides, ref.offset), ref.sizes,
                     ref.strides, ref.offset, result);
      s->error = nullptr;
      return;
    }
    // A temporary: keep the CPU result's storage when it has the recorded layout.
    if (result.scalar_type() == ref.dtype && result.storage_offset() == ref.offset &&
        result.sizes().equals(ref.sizes) && result.strides().equals(ref.strides) &&
        result.storage().nbytes() >= s->nbytes) {
      mem.bind_temp(s, result.storage());
      return;
    }
    at::Tensor buf = at::empty({static_cast<int64_t>(s->nbytes)}, at::TensorOptions().dtype(at::kByte));
    host::view_over(buf.storage(), ref).copy_(result);
    mem.bind_temp(s, buf.storage());
  }
};

}  // namespace

Executor& active_executor() {
  static TpuExecutor tpu;
  return tpu;
}

}  // namespace tpu_eager
