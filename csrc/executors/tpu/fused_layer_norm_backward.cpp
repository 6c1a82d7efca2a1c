// native_layer_norm_backward as a fused row loop (fused_program.h,
// LayerNormBackward), with the residual gradient's add after it: partition
// puts the pair in one loop (partition.cpp, residual_gradient_add); this file
// plans, binds and runs it with CPU's arithmetic (layer_norm_backward_row.inc).
#include <ATen/Parallel.h>

#include <string>
#include <string_view>

#include "executors/direct_kernels.h"
#include "executors/tpu/fused_elementwise.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace tpu {

// A planned layer_norm backward loop; pointers are bound per run.
struct LayerNormBackwardLoop {
  Slot dy, x, mean, rstd, gamma;  // native_layer_norm_backward's inputs
  Slot dx, dgamma, dbeta;         // its outputs
  bool store_dx = true;
  Slot residual, sum;  // the add's other operand and what it writes (invalid: no add)
  fused::LayerNormBackward args;
};

namespace {

bool plain(const TensorRef& r) { return r.dtype == at::kFloat && !r.conj && !r.neg && r.offset >= 0 && r.is_dense(); }

// The plain float32 input of `n` at argument `arg`: its index, or -1.
int input_at(const Node& n, int arg) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.inputs[i].arg == arg && n.inputs[i].elem < 0) return plain(n.inputs[i].ref) ? static_cast<int>(i) : -1;
  return -1;
}

// The capability CPU's LayerNormBackwardKernel runs (its stub is the
// forward's twin); at DEFAULT its vectors are scalar loops of another order.
bool vector_kernel() {
  static const std::string cap = host::layer_norm_kernel_capability();
  return cap == "AVX2" || cap == "AVX512";
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight, bias, output_mask) in float32 with weight and bias given and every
// gradient wanted, at region position `pos`; fills `l` and the row shape.
bool ln_backward_op(const Node& n, int pos, LayerNormBackwardLoop* l) {
  if (n.args.size() != 8 || !n.args[2].isIntList() || !n.args[7].isBoolList() || n.outputs.size() != 3) return false;
  for (bool m : n.args[7].toBoolList())
    if (!m) return false;
  const int dy = input_at(n, 0), x = input_at(n, 1), mean = input_at(n, 3), rstd = input_at(n, 4);
  const int gamma = input_at(n, 5), bias = input_at(n, 6);
  if (dy < 0 || x < 0 || mean < 0 || rstd < 0 || gamma < 0 || bias < 0) return false;
  const c10::IntArrayRef xs = n.inputs[x].ref.sizes();
  int64_t cols = 0;
  if (n.inputs[dy].ref.sizes() != xs || !normalized_cols(n.args[2].toIntVector(), xs, &cols)) return false;
  const int64_t numel = n.inputs[x].ref.numel();
  if (cols < 1 || numel < 1) return false;
  auto& a = l->args;
  a.rows = numel / cols;
  a.cols = cols;
  if (n.inputs[mean].ref.numel() != a.rows || n.inputs[rstd].ref.numel() != a.rows ||
      n.inputs[gamma].ref.numel() != cols)
    return false;
  if (!plain(n.outputs[0]) || n.outputs[0].sizes() != xs || !plain(n.outputs[1]) || !plain(n.outputs[2]) ||
      n.outputs[1].numel() != cols || n.outputs[2].numel() != cols)
    return false;
  l->dy = Slot{pos, dy, -1};
  l->x = Slot{pos, x, -1};
  l->mean = Slot{pos, mean, -1};
  l->rstd = Slot{pos, rstd, -1};
  l->gamma = Slot{pos, gamma, -1};
  l->dx = Slot{pos, -1, 0};
  l->dgamma = Slot{pos, -1, 1};
  l->dbeta = Slot{pos, -1, 2};
  return true;
}

// Whether an add's alpha argument is exactly 1 (CPU's kernel then rounds a + b once).
bool alpha_one(const c10::IValue& v) {
  if (v.isInt()) return v.toInt() == 1;
  if (v.isDouble()) return v.toDouble() == 1.0;
  return false;
}

// add.Tensor / add_.Tensor (alpha 1, float32) at region position `pos`
// with the gradient `dx` (ln's output 0) as one operand: sets the add's
// other operand and the tensor it writes.
bool residual_add_op(const Node& n, int pos, const TensorRef& dx, LayerNormBackwardLoop* l) {
  const std::string_view name = n.op.schema().name();
  const bool inplace = name == "aten::add_";
  if ((name != "aten::add" && !inplace) || n.op.schema().overload_name() != "Tensor" || n.args.size() != 3 ||
      !alpha_one(n.args[2]) || n.wrapped != 0)
    return false;
  const int self = input_at(n, 0), other = input_at(n, 1);
  if (self < 0 || other < 0) return false;
  const TensorRef &s = n.inputs[self].ref, &o = n.inputs[other].ref;
  const bool dx_self = s.storage == dx.storage && s.offset == 0;
  const TensorRef& res = dx_self ? o : s;
  if (!dx_self && !(o.storage == dx.storage && o.offset == 0)) return false;
  if (s.sizes() != dx.sizes() || o.sizes() != dx.sizes() || res.storage == dx.storage) return false;
  l->residual = Slot{pos, dx_self ? other : self, -1};
  if (inplace) {
    if (!n.inputs[self].written || !n.outputs.empty()) return false;
    l->sum = Slot{pos, self, -1};
  } else {
    if (n.outputs.size() != 1 || !plain(n.outputs[0]) || n.outputs[0].sizes() != dx.sizes()) return false;
    l->sum = Slot{pos, -1, 0};
  }
  return true;
}

}  // namespace

bool ln_backward_op_qualifies(const Node& n) {
  LayerNormBackwardLoop l;
  return vector_kernel() && ln_backward_op(n, 0, &l);
}

bool plan_ln_backward_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph,
                           LoopPlan* plan) {
  if (ps.empty() || ps.size() > 2 || !vector_kernel()) return false;
  auto l = std::make_shared<LayerNormBackwardLoop>();
  const int first = static_cast<int>(ps[0]);
  const Node& n = graph[region.nodes[first]];
  if (!ln_backward_op(n, first, l.get())) return false;
  l->store_dx = region.materialize[first][0] != 0;
  const auto& io = [&](const Slot& s) -> const TensorRef& { return n.inputs[s.input].ref; };
  if (ps.size() == 2) {
    const int second = static_cast<int>(ps[1]);
    const Node& add = graph[region.nodes[second]];
    if (!residual_add_op(add, second, n.outputs[0], l.get())) return false;
    const TensorRef& w = l->sum.input >= 0 ? add.inputs[l->sum.input].ref : add.outputs[0];
    // What the add writes is read by no row of the backward but its own, at the same place.
    for (const Slot* s : {&l->x, &l->mean, &l->rstd, &l->gamma})
      if (io(*s).storage == w.storage) return false;
    if (io(l->dy).storage == w.storage && io(l->dy).offset != w.offset) return false;
    // dx written in place by the add: the sum is its only store.
    if (w.storage == n.outputs[0].storage) l->store_dx = false;
  } else {
    l->store_dx = true;
  }
  *plan = LoopPlan{};
  plan->pos = ps;
  const int64_t elems = l->args.rows * l->args.cols;
  plan->read = (2 * elems + 2 * l->args.rows + l->args.cols) * 4 + (ps.size() == 2 ? elems * 4 : 0);
  plan->written_bytes = (elems * (l->store_dx + (ps.size() == 2)) + 2 * l->args.cols) * 4;
  plan->lnb = std::move(l);
  return true;
}

bool bind_ln_backward(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem) {
  plan.written.clear();
  LayerNormBackwardLoop& l = *plan.lnb;
  // A tensor from outside the loop written in place must not be a flush temporary (as bind_loop's).
  if (l.sum.input >= 0 && mem.is_temp(slot_storage(l.sum, region, graph))) return false;
  fused::LayerNormBackward& a = l.args;
  a.dy = slot_in_data(l.dy, region, graph, mem);
  a.x = slot_in_data(l.x, region, graph, mem);
  a.mean = slot_in_data(l.mean, region, graph, mem);
  a.rstd = slot_in_data(l.rstd, region, graph, mem);
  a.gamma = slot_in_data(l.gamma, region, graph, mem);
  a.dx = l.store_dx ? slot_out_data(l.dx, region, graph, mem, plan) : nullptr;
  a.dgamma = slot_out_data(l.dgamma, region, graph, mem, plan);
  a.dbeta = slot_out_data(l.dbeta, region, graph, mem, plan);
  a.residual = l.residual.valid() ? slot_in_data(l.residual, region, graph, mem) : nullptr;
  a.sum = l.sum.valid() ? slot_out_data(l.sum, region, graph, mem, plan) : nullptr;
  return true;
}

void run_ln_backward(LoopPlan& plan, RegionStats& stats) {
  static const bool use_avx512 = std::string(host::layer_norm_kernel_capability()) == "AVX512";
  for (DeferredStorage* s : plan.written) s->error = nullptr;
  if (use_avx512) {
    fused::ln_backward_avx512(plan.lnb->args);
  } else {
    fused::ln_backward_avx2(plan.lnb->args);
  }
  stats.bytes_read += plan.read;
  stats.bytes_written += plan.written_bytes;
}

}  // namespace tpu
}  // namespace tpu_eager
