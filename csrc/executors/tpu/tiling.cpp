// VMEM tiling plans of fused regions (see tiling.h for the policy).
#include "executors/tpu/tiling.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <unordered_set>

#include <c10/util/accumulate.h>

#include "executors/tpu/cost_model.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace tpu {
namespace {

int64_t round_up(int64_t x, int64_t m) { return m <= 1 ? x : (x + m - 1) / m * m; }
int64_t cdiv(int64_t x, int64_t m) { return (x + m - 1) / m; }

// `full`, then the power-of-two multiples of `align` below it, largest first.
std::vector<int64_t> candidates(int64_t full, int64_t align) {
  std::vector<int64_t> out = {full};
  int64_t b = align;
  while (b * 2 < full) b *= 2;
  for (; b >= align; b /= 2)
    if (b < full) out.push_back(b);
  return out;
}

// An operand as 2-D (rows, cols).
std::pair<int64_t, int64_t> as_2d(c10::IntArrayRef sizes) {
  if (sizes.size() == 1) return {1, sizes[0]};
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) rows *= sizes[i];
  return {rows, sizes.back()};
}

struct Operand2d {
  PlanOperand op;
  int64_t rows, cols;
  bool full;  // spans the whole grid: takes the grid's block
  int buffers;
};

std::vector<Operand2d> to_2d(const std::vector<PlanOperand>& ops, int64_t grid_numel, int64_t grid_rows,
                             int64_t grid_cols) {
  std::vector<Operand2d> out;
  for (const auto& o : ops) {
    if (o.sizes.empty() || c10::multiply_integers(o.sizes) == 0) continue;  // scalars sit in SMEM
    const bool full = c10::multiply_integers(o.sizes) == grid_numel;
    auto [r, c] = as_2d(o.sizes);
    if (full) r = grid_rows, c = grid_cols;
    out.push_back({o, r, c, full, o.role == "temporary" ? 1 : 2});
  }
  return out;
}

int64_t footprint(const std::vector<Operand2d>& ops, int64_t br, int64_t bc, const ChipParams& chip,
                  std::vector<BlockSpec>* specs = nullptr) {
  int64_t total = 0;
  for (const auto& o : ops) {
    const int64_t r = std::min(br, o.rows), c = std::min(bc, o.cols);
    const int64_t bytes = o.buffers * block_bytes(r, c, o.op.dtype, chip);
    total += bytes;
    if (specs) specs->push_back({o.op.role, o.op.dtype, {o.rows, o.cols}, {r, c}, o.buffers, bytes});
  }
  return total;
}

}  // namespace

int64_t block_bytes(int64_t rows, int64_t cols, c10::ScalarType dtype, const ChipParams& chip) {
  return round_up(rows, sublane_tile(dtype, chip)) * round_up(cols, chip.lanes) *
         static_cast<int64_t>(c10::elementSize(dtype));
}

TilingPlan plan_vector(const std::vector<PlanOperand>& operands, const ChipParams& chip) {
  TilingPlan plan;
  plan.kind = "vector";
  plan.vmem_budget_bytes = chip.vmem_bytes;
  // The grid spans the largest operand; a 1-D one is folded into rows of lanes.
  const PlanOperand* big = nullptr;
  int64_t sub = chip.sublanes;
  for (const auto& o : operands) {
    if (o.sizes.empty() || c10::multiply_integers(o.sizes) == 0) continue;
    if (!big || c10::multiply_integers(o.sizes) > c10::multiply_integers(big->sizes)) big = &o;
    sub = std::max(sub, sublane_tile(o.dtype, chip));
  }
  if (!big) {
    plan.kind.clear();
    return plan;
  }
  const int64_t n = c10::multiply_integers(big->sizes);
  auto [rows, cols] = as_2d(big->sizes);
  if (big->sizes.size() == 1) rows = cdiv(n, chip.lanes), cols = std::min<int64_t>(n, chip.lanes);
  const std::vector<Operand2d> ops = to_2d(operands, n, rows, cols);
  // Lane dimension first (lane-dense blocks), then as many rows as fit.
  const int64_t budget = chip.vmem_bytes;
  int64_t bc = chip.lanes, br = sub;
  for (int64_t c : candidates(round_up(cols, chip.lanes), chip.lanes))
    if (footprint(ops, sub, c, chip) <= budget) {
      bc = c;
      break;
    }
  for (int64_t r : candidates(round_up(rows, sub), sub))
    if (footprint(ops, r, bc, chip) <= budget) {
      br = r;
      break;
    }
  plan.block = {br, bc};
  plan.grid = {cdiv(rows, br), cdiv(cols, bc)};
  plan.vmem_bytes = footprint(ops, br, bc, chip, &plan.blocks);
  return plan;
}

TilingPlan plan_matmul(const MatmulProblem& p, const ChipParams& chip) {
  TilingPlan plan;
  plan.kind = "matmul";
  plan.vmem_budget_bytes = chip.vmem_bytes;
  const auto M = static_cast<int64_t>(p.gemm.m), K = static_cast<int64_t>(p.gemm.k), N = static_cast<int64_t>(p.gemm.n),
             B = static_cast<int64_t>(p.gemm.batch);
  const int64_t am = std::max(sublane_tile(p.ta, chip), sublane_tile(p.tout, chip)), d = chip.mxu_size;
  const int64_t Mp = round_up(std::max<int64_t>(M, 1), am), Kp = round_up(std::max<int64_t>(K, 1), d),
                Np = round_up(std::max<int64_t>(N, 1), d);
  const std::vector<Operand2d> extras = to_2d(p.extras, M * N, M, N);
  auto vmem = [&](int64_t bm, int64_t bk, int64_t bn) {
    return 2 * block_bytes(bm, bk, p.ta, chip) + 2 * block_bytes(bk, bn, p.tb, chip) +
           2 * block_bytes(bm, bn, p.tout, chip) + block_bytes(bm, bn, c10::kFloat, chip) +
           footprint(extras, bm, bn, chip);
  };
  struct Choice {
    int64_t bm, bk, bn;
    bool nmk;
    double traffic, steps;
    int64_t a_times, b_times;
  };
  Choice best{am, d, d, false, std::numeric_limits<double>::infinity(), 0, 1, 1};
  bool found = false;
  // Whole operands in VMEM: the least traffic and the fewest steps, no search needed.
  const bool whole = vmem(Mp, Kp, Np) <= chip.vmem_bytes;
  if (whole) {
    best = {Mp, Kp, Np, false, double(p.a_bytes) + double(p.b_bytes), 1, 1, 1};
    found = true;
  }
  const auto cm = whole ? std::vector<int64_t>{} : candidates(Mp, am);
  const auto ck = candidates(Kp, d), cn = candidates(Np, d);
  for (int64_t bm : cm)
    for (int64_t bn : cn)
      for (int64_t bk : ck) {
        if (vmem(bm, bk, bn) > chip.vmem_bytes) continue;
        const int64_t gm = cdiv(Mp, bm), gn = cdiv(Np, bn), gk = cdiv(Kp, bk);
        for (bool nmk : {false, true}) {
          // A block is fetched again only when its index changes between consecutive steps.
          int64_t at, bt;
          if (!nmk) {
            at = gk == 1 ? 1 : gn;
            bt = gn == 1 && gk == 1 ? 1 : gm;
          } else {
            bt = gk == 1 ? 1 : gm;
            at = gm == 1 && gk == 1 ? 1 : gn;
          }
          const double traffic = double(p.a_bytes) * at + double(p.b_bytes) * bt;
          const double steps = double(gm) * gn * gk;
          if (traffic < best.traffic || (traffic == best.traffic && steps < best.steps)) {
            best = {bm, bk, bn, nmk, traffic, steps, at, bt};
            found = true;
          }
        }
      }
  if (!found) best.traffic = double(p.a_bytes) * cdiv(Np, d) + double(p.b_bytes) * cdiv(Mp, am);
  plan.order = best.nmk ? "nmk" : "mnk";
  plan.block = {best.bm, best.bk, best.bn};
  plan.grid = {B, cdiv(Mp, best.bm), cdiv(Np, best.bn), cdiv(Kp, best.bk)};
  if (!found) {  // the minimum block does not fit: every block index changes
    best.a_times = plan.grid[2];
    best.b_times = plan.grid[1];
  }
  plan.hbm_reread_bytes = p.a_bytes * (best.a_times - 1) + p.b_bytes * (best.b_times - 1);
  auto spec = [&](const char* role, c10::ScalarType t, int64_t r, int64_t c, int64_t br, int64_t bc, int buf) {
    plan.blocks.push_back({role, t, {r, c}, {br, bc}, buf, buf * block_bytes(br, bc, t, chip)});
  };
  spec("lhs", p.ta, M, K, best.bm, best.bk, 2);
  spec("rhs", p.tb, K, N, best.bk, best.bn, 2);
  spec("out", p.tout, M, N, best.bm, best.bn, 2);
  spec("acc", c10::kFloat, M, N, best.bm, best.bn, 1);
  footprint(extras, best.bm, best.bn, chip, &plan.blocks);
  plan.vmem_bytes = 0;
  for (const auto& b : plan.blocks) plan.vmem_bytes += b.vmem_bytes;
  plan.useful_macs = p.gemm.batch * p.gemm.m * p.gemm.k * p.gemm.n;
  plan.padded_macs = p.gemm.batch * static_cast<double>(round_up(std::max<int64_t>(M, 1), chip.sublanes)) *
                     static_cast<double>(Kp) * static_cast<double>(Np);
  return plan;
}

namespace {

using RefKey = std::tuple<const DeferredStorage*, int64_t, std::vector<int64_t>, int>;
RefKey key_of(const TensorRef& r) { return {r.storage.get(), r.offset, r.sizes().vec(), static_cast<int>(r.dtype)}; }

// The region's operands: HBM inputs, materialized (or written) outputs, and
// temporaries, each view once.
struct RegionOperand {
  RefKey key;
  PlanOperand op;
};

std::vector<RegionOperand> region_operands(const Region& region, const std::vector<Node>& graph) {
  std::vector<RegionOperand> out;
  std::set<std::pair<RefKey, std::string>> seen;
  std::unordered_set<const DeferredStorage*> produced;
  auto add = [&](const TensorRef& r, const char* role) {
    if (seen.insert({key_of(r), role}).second) out.push_back({key_of(r), {r.sizes().vec(), r.dtype, role}});
  };
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    const auto& args = n.op.schema().arguments();
    for (const auto& in : n.inputs) {
      if (produced.count(in.ref.storage.get())) continue;  // a value of this region
      const bool out_arg = in.arg < static_cast<int>(args.size()) && args[in.arg].is_out();
      if (!out_arg) add(in.ref, "input");
      if (in.written) add(in.ref, "output");
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const bool mat = p < region.materialize.size() && j < region.materialize[p].size() && region.materialize[p][j];
      add(n.outputs[j], mat ? "output" : "temporary");
      produced.insert(n.outputs[j].storage.get());
    }
  }
  return out;
}

// The products of matmul node `n` with their lhs / rhs operand keys and HBM bytes.
struct NodeGemm {
  MatmulProblem problem;
  std::vector<RefKey> own;  // the node's operands, not extras
};

std::vector<NodeGemm> node_gemms(const Node& n, const ChipParams& chip) {
  std::vector<NodeGemm> out;
  if (static_cast<PrimKind>(n.kind) != PrimKind::kMatmul) return out;
  std::vector<Gemm> gemms;
  c10::ScalarType ta = c10::kFloat, tb = c10::kFloat;
  double bias_elems = 0;
  const bool conv = !gemms_of(n, gemms, ta, tb);
  if (conv && !conv_gemms_of(n, gemms, ta, tb, bias_elems)) return out;
  const bool backward = lowering_of(n.op).mxu == MxuOp::kConvolutionBackward;
  // The node's own operands (the products' lhs / rhs and the results); a bias stays an extra operand.
  std::vector<int> own_args = {0, 1};
  if (backward) own_args = {0, 1, 2};
  if (!conv) gemm_operand_args(n, own_args[0], own_args[1]);
  std::vector<RefKey> own;
  for (const auto& in : n.inputs)
    if (in.written || std::find(own_args.begin(), own_args.end(), in.arg) != own_args.end())
      own.push_back(key_of(in.ref));
  for (const auto& o : n.outputs) own.push_back(key_of(o));
  c10::ScalarType tout = ta;
  if (!n.outputs.empty()) tout = n.outputs[0].dtype;
  auto bytes = [&](const TensorRef* r) { return r ? tiled_bytes(r->sizes(), r->dtype, chip) : int64_t{0}; };
  for (size_t i = 0; i < gemms.size(); ++i) {
    NodeGemm g;
    g.problem.gemm = gemms[i];
    g.problem.ta = ta;
    g.problem.tb = tb;
    g.problem.tout = conv ? ta : tout;
    int a = 0, b = 1;
    if (!conv) {
      gemm_operand_args(n, a, b);
    } else if (backward) {
      // lhs: grad_output; rhs: the weight for grad_input, the input for grad_weight.
      const bool grad_w =
          gemms.size() == 2 ? i == 1 : !(n.args.back().isBoolList() && n.args.back().toBoolList().get(0));
      a = 0;
      b = grad_w ? 1 : 2;
    }
    g.problem.a_bytes = bytes(arg_ref(n, a));
    g.problem.b_bytes = bytes(arg_ref(n, b));
    g.own = own;
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

TilingPlan plan_region(const Region& region, const std::vector<Node>& graph, const ChipParams& chip) {
  const std::vector<RegionOperand> operands = region_operands(region, graph);
  std::vector<NodeGemm> gemms;
  for (int i : region.nodes)
    for (auto& g : node_gemms(graph[i], chip)) gemms.push_back(std::move(g));
  if (gemms.empty()) {
    std::vector<PlanOperand> ops;
    for (const auto& o : operands) ops.push_back(o.op);
    return plan_vector(ops, chip);
  }
  TilingPlan best;
  int64_t reread = 0;
  double useful = 0, padded = 0;
  for (auto& g : gemms) {
    const std::set<RefKey> own(g.own.begin(), g.own.end());
    for (const auto& o : operands)
      if (!own.count(o.key)) g.problem.extras.push_back(o.op);
    TilingPlan plan = plan_matmul(g.problem, chip);
    reread += plan.hbm_reread_bytes;
    useful += plan.useful_macs;
    padded += plan.padded_macs;
    if (best.kind.empty() || plan.useful_macs > best.useful_macs) best = std::move(plan);
  }
  best.hbm_reread_bytes = reread;
  best.useful_macs = useful;
  best.padded_macs = padded;
  return best;
}

jit::TilingRecord tiling_record(const TilingPlan& plan) {
  jit::TilingRecord r;
  r.kind = plan.kind;
  r.order = plan.order;
  r.grid = plan.grid;
  r.block = plan.block;
  for (const auto& b : plan.blocks)
    r.blocks.push_back({b.role, c10::toString(b.dtype), b.shape, b.block, b.buffers, b.vmem_bytes});
  r.vmem_bytes = plan.vmem_bytes;
  r.vmem_budget_bytes = plan.vmem_budget_bytes;
  r.hbm_reread_bytes = plan.hbm_reread_bytes;
  r.mxu_utilization = plan.mxu_utilization();
  return r;
}

}  // namespace tpu
}  // namespace tpu_eager
