// Cross-entropy in fused row loops (see fused_elementwise.h, CrossEntropyLoop):
// the forward's nll_loss_forward after the _log_softmax row loop it reads,
// the backward's nll_loss_backward + _log_softmax_backward_data as one row
// loop (fused_program.h, CrossEntropyBackward). Partition puts each pair in
// one loop (partition.cpp, cross_entropy_pair); this file plans, binds and
// runs it, with CPU's arithmetic (ATen/native/LossNLL.cpp, cpu/SoftMaxKernel.cpp).
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/native/cpu/utils.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <string>

#include "executors/tpu/fused_elementwise.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace tpu {

// A planned cross-entropy loop; pointers and runtime values are bound per run.
struct CrossEntropyLoop {
  bool backward = false;
  int64_t reduction = 1;  // at::Reduction: 0 none, 1 mean, 2 sum
  int64_t ignore_index = -100;
  int64_t rows = 0, cols = 0;
  Slot target, weight;         // weight invalid: none
  Slot loss, total_weight;     // forward: nll_loss_forward's outputs
  Slot grad_output, total_in;  // backward: nll_loss_backward's loss gradient and total_weight
  Slot log_probs, grad_input;  // backward: _log_softmax_backward_data's output argument and result
  // Bound by bind_cross_entropy.
  const int64_t* target_data = nullptr;
  const float* weight_data = nullptr;
  float* loss_data = nullptr;
  float* total_data = nullptr;
  fused::CrossEntropyBackward bwd;
};

namespace {

// The input of `n` at argument `arg` (a plain tensor argument), or null.
const InputSlot* arg_input(const Node& n, int arg, int* index) {
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i].arg == arg && n.inputs[i].elem < 0) {
      *index = static_cast<int>(i);
      return &n.inputs[i];
    }
  }
  return nullptr;
}

bool plain(const TensorRef& r, at::ScalarType t) {
  return r.dtype == t && !r.conj && !r.neg && r.offset >= 0 && r.is_dense();
}

// Whether the reduction and ignore_index arguments at `red_arg`, `red_arg + 1` are ints; sets them.
bool int_args(const Node& n, size_t red_arg, CrossEntropyLoop* ce) {
  if (n.args.size() <= red_arg + 1 || !n.args[red_arg].isInt() || !n.args[red_arg + 1].isInt()) return false;
  ce->reduction = n.args[red_arg].toInt();
  ce->ignore_index = n.args[red_arg + 1].toInt();
  return ce->reduction >= 0 && ce->reduction <= 2;
}

// The target (int64, rows) at `t_arg` and weight (float32, cols, optional) at
// `t_arg + 1` of node at region position `pos`.
bool target_and_weight(const Node& n, int pos, int t_arg, CrossEntropyLoop* ce) {
  int ti = -1, wi = -1;
  const InputSlot* t = arg_input(n, t_arg, &ti);
  if (!t || t->written || !plain(t->ref, at::kLong) || t->ref.sizes() != Dims{ce->rows}) return false;
  ce->target = Slot{pos, ti, -1};
  if (const InputSlot* w = arg_input(n, t_arg + 1, &wi)) {
    if (w->written || !plain(w->ref, at::kFloat) || w->ref.sizes() != Dims{ce->cols}) return false;
    ce->weight = Slot{pos, wi, -1};
  }
  return true;
}

// nll_loss_forward(self [N, C], target [N], weight?, reduction, ignore_index) in float32.
bool nll_forward_op(const Node& n, int pos, CrossEntropyLoop* ce) {
  int si = -1;
  const InputSlot* self = arg_input(n, 0, &si);
  if (!self || !plain(self->ref, at::kFloat) || self->ref.sizes().size() != 2 || n.outputs.size() != 2) return false;
  ce->rows = self->ref.sizes()[0];
  ce->cols = self->ref.sizes()[1];
  if (ce->rows < 1 || ce->cols < 1 || !int_args(n, 3, ce) || !target_and_weight(n, pos, 1, ce)) return false;
  const Dims loss_shape = ce->reduction == 0 ? Dims{ce->rows} : Dims{};
  if (!plain(n.outputs[0], at::kFloat) || n.outputs[0].sizes() != loss_shape || !plain(n.outputs[1], at::kFloat) ||
      !n.outputs[1].sizes().empty())
    return false;
  ce->loss = Slot{pos, -1, 0};
  ce->total_weight = Slot{pos, -1, 1};
  return true;
}

// nll_loss_backward(grad_output, self [N, C], target, weight?, reduction, ignore_index, total_weight) in float32.
bool nll_backward_op(const Node& n, int pos, CrossEntropyLoop* ce) {
  int gi = -1, si = -1, ti = -1;
  const InputSlot* self = arg_input(n, 1, &si);
  if (!self || !plain(self->ref, at::kFloat) || self->ref.sizes().size() != 2 || n.outputs.size() != 1) return false;
  ce->rows = self->ref.sizes()[0];
  ce->cols = self->ref.sizes()[1];
  if (ce->rows < 1 || ce->cols < 1 || !int_args(n, 4, ce) || !target_and_weight(n, pos, 2, ce)) return false;
  const InputSlot* g = arg_input(n, 0, &gi);
  const InputSlot* tw = arg_input(n, 6, &ti);
  if (!g || !plain(g->ref, at::kFloat) || !tw || !plain(tw->ref, at::kFloat) || tw->ref.numel() != 1) return false;
  if (ce->reduction == 0 ? g->ref.sizes() != Dims{ce->rows} : g->ref.numel() != 1) return false;
  if (!plain(n.outputs[0], at::kFloat) || n.outputs[0].sizes() != self->ref.sizes()) return false;
  ce->grad_output = Slot{pos, gi, -1};
  ce->total_in = Slot{pos, ti, -1};
  return true;
}

// _log_softmax_backward_data(grad_output [N, C], output [N, C], dim 1 / -1, float32).
bool log_softmax_backward_op(const Node& n, int pos, c10::IntArrayRef shape, CrossEntropyLoop* ce) {
  int gi = -1, oi = -1;
  const InputSlot* g = arg_input(n, 0, &gi);
  const InputSlot* o = arg_input(n, 1, &oi);
  if (!g || !o || o->written || !plain(g->ref, at::kFloat) || !plain(o->ref, at::kFloat) || g->ref.sizes() != shape ||
      o->ref.sizes() != shape || n.outputs.size() != 1 || !plain(n.outputs[0], at::kFloat) ||
      n.outputs[0].sizes() != shape)
    return false;
  if (n.args.size() < 4 || !n.args[2].isInt() || (n.args[2].toInt() != 1 && n.args[2].toInt() != -1) ||
      !n.args[3].isInt() || n.args[3].toInt() != static_cast<int64_t>(at::kFloat))
    return false;
  ce->log_probs = Slot{pos, oi, -1};
  ce->grad_input = Slot{pos, -1, 0};
  return true;
}

// CPU's nll_loss forward over the gathered rows (nll_loss_out_frame): per
// row -x[t] * w (none), or the loss and weight sums in its cascade of 8
// levels, in row order (mean: divided by the total weight).
void nll_forward(const CrossEntropyLoop& ce, const float* x) {
  const int64_t* tg = ce.target_data;
  const float* w = ce.weight_data;
  if (ce.reduction == 0) {
    at::parallel_for(0, ce.rows, 0, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const int64_t t = tg[i];
        ce.loss_data[i] = t == ce.ignore_index ? 0.0f : -x[i * ce.cols + t] * (w ? w[t] : 1.0f);
      }
    });
    *ce.total_data = 0.0f;
    return;
  }
  constexpr int64_t kLevels = 8;
  const int64_t power = std::max<int64_t>(4, at::native::utils::CeilLog2(ce.rows) / kLevels);
  const int64_t mask = (int64_t{1} << power) - 1;
  int64_t ignored = 0;
  float wsum[kLevels] = {0}, lsum[kLevels] = {0};
  for (int64_t b = 0; b < ce.rows; ++b) {
    const int64_t t = tg[b];
    if (t == ce.ignore_index) {
      ++ignored;
      continue;
    }
    const float v = x[b * ce.cols + t];
    if (w) {
      lsum[0] -= v * w[t];
      wsum[0] += w[t];
    } else {
      lsum[0] -= v;
    }
    for (int64_t j = 0; j + 1 < kLevels; ++j) {
      if ((b & (mask << (j * power))) != 0) break;
      wsum[j + 1] += wsum[j];
      lsum[j + 1] += lsum[j];
      wsum[j] = 0;
      lsum[j] = 0;
    }
  }
  const float total = !w ? static_cast<float>(ce.rows - ignored) : std::accumulate(wsum, wsum + kLevels, 0.0f);
  float loss = std::accumulate(lsum, lsum + kLevels, 0.0f);
  if (ce.reduction == 1) loss /= total;
  *ce.loss_data = loss;
  *ce.total_data = total;
}

}  // namespace

bool cross_entropy_op_qualifies(const Node& n) {
  CrossEntropyLoop ce;
  switch (lowering_of(n.op).loss) {
    case LossRow::kNllLoss:
      return nll_forward_op(n, 0, &ce);
    case LossRow::kNllLossBackward:
      return nll_backward_op(n, 0, &ce);
    case LossRow::kLogSoftmaxBackward:
      return log_softmax_backward_op(n, 0, n.outputs.empty() ? c10::IntArrayRef{} : n.outputs[0].sizes(), &ce);
    case LossRow::kNone:
      break;
  }
  return false;
}

bool plan_cross_entropy_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph,
                             LoopPlan* plan) {
  const int last = static_cast<int>(ps.back());
  const Node& n = graph[region.nodes[last]];
  auto ce = std::make_shared<CrossEntropyLoop>();
  const LossRow loss = lowering_of(n.op).loss;
  if (loss == LossRow::kNllLoss && ps.size() >= 2) {
    // The row loop up to its _log_softmax, then the gather of its result.
    const std::vector<size_t> head(ps.begin(), ps.end() - 1);
    if (!nll_forward_op(n, last, ce.get())) return false;
    // The row op stores the log-probabilities the loss reads, also when
    // nothing after the region does (a loss under no_grad): planned as stored.
    Region stored = region;
    stored.materialize[head.back()].assign(stored.materialize[head.back()].size(), 1);
    if (!plan_loop(stored, head, graph, plan) || !plan->has_anchor || plan->int_loop ||
        plan->anchor.op != fused::RowOp::kLogSoftmax || plan->anchor.rows != ce->rows || plan->anchor.cols != ce->cols)
      return false;
    int si = -1;
    const InputSlot* self = arg_input(n, 0, &si);
    if (slot_storage(plan->anchor_out, region, graph) != self->ref.storage.get() || self->ref.offset != 0) return false;
    plan->pos = ps;
    plan->ce = std::move(ce);
    return true;
  }
  // CPU's softmax backward at DEFAULT capability takes libm's exp lane by lane, not SLEEF's.
  static const bool vector_exp = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX2" || cap == "AVX512";
  }();
  if (loss != LossRow::kLogSoftmaxBackward || ps.size() != 2 || !vector_exp) return false;
  const int first = static_cast<int>(ps[0]);
  const Node& nb = graph[region.nodes[first]];
  if (lowering_of(nb.op).loss != LossRow::kNllLossBackward || !nll_backward_op(nb, first, ce.get())) return false;
  // Its gradient of the log-probabilities lives only in the loop (never stored).
  if (region.materialize[first][0]) return false;
  const Dims shape{ce->rows, ce->cols};
  int gi = -1;
  const InputSlot* g = arg_input(n, 0, &gi);
  if (!log_softmax_backward_op(n, last, shape, ce.get()) || g->ref.storage != nb.outputs[0].storage ||
      g->ref.offset != 0)
    return false;
  *plan = LoopPlan{};
  plan->pos = ps;
  ce->backward = true;
  plan->read = (ce->rows * ce->cols + ce->rows) * 4 + ce->rows * 8;
  plan->written_bytes = ce->rows * ce->cols * 4;
  plan->ce = std::move(ce);
  return true;
}

bool bind_cross_entropy(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem) {
  CrossEntropyLoop& ce = *plan.ce;
  // A target out of range: the ops run op by op, where CPU's kernel raises.
  const Node& tn = graph[region.nodes[ce.target.pos]];
  size_t nbytes;
  const TensorRef& tr = tn.inputs[ce.target.input].ref;
  ce.target_data = static_cast<const int64_t*>(mem.data_for(tr.storage.get(), &nbytes)) + tr.offset;
  for (int64_t i = 0; i < ce.rows; ++i) {
    const int64_t t = ce.target_data[i];
    if (t != ce.ignore_index && (t < 0 || t >= ce.cols)) return false;
  }
  ce.weight_data = ce.weight.valid() ? slot_in_data(ce.weight, region, graph, mem) : nullptr;
  if (!ce.backward) {
    ce.loss_data = slot_out_data(ce.loss, region, graph, mem, plan);
    ce.total_data = slot_out_data(ce.total_weight, region, graph, mem, plan);
    return true;
  }
  fused::CrossEntropyBackward& a = ce.bwd;
  a.rows = ce.rows;
  a.cols = ce.cols;
  a.target = ce.target_data;
  a.weight = ce.weight_data;
  a.ignore_index = ce.ignore_index;
  a.out = slot_in_data(ce.log_probs, region, graph, mem);
  const float* gout = slot_in_data(ce.grad_output, region, graph, mem);
  a.grad_rows = ce.reduction == 0 ? gout : nullptr;
  if (ce.reduction != 0) {
    const float tw = *slot_in_data(ce.total_in, region, graph, mem);
    a.grad = -(ce.reduction == 1 ? *gout / tw : *gout);  // nll_loss_backward_out_frame's `grad`
  }
  a.grad_input = slot_out_data(ce.grad_input, region, graph, mem, plan);
  return true;
}

void run_cross_entropy(LoopPlan& plan, RegionStats& stats) {
  const CrossEntropyLoop& ce = *plan.ce;
  if (!ce.backward) {
    nll_forward(ce, plan.anchor.out);  // after the row loop wrote the log-probabilities
    return;
  }
  static const bool use_avx512 = at::get_cpu_capability() == "AVX512";
  for (DeferredStorage* s : plan.written) s->error = nullptr;
  if (use_avx512) {
    fused::ce_backward_avx512(ce.bwd);
  } else {
    fused::ce_backward_avx2(ce.bwd);
  }
  stats.bytes_read += plan.read;
  stats.bytes_written += plan.written_bytes;
}

}  // namespace tpu
}  // namespace tpu_eager
