// The KTIR interpreter's float32 row pass (see row_pass.h).
#include "executors/spyre/row_pass.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "executors/aten_grain.h"
#include "executors/tpu/fused_elementwise.h"
#include "jit/lowering.h"
#include "lazy/debug_report.h"

namespace tpu_eager {
namespace spyre {
namespace {

// The pass's operands: views (-1: none) and the op's geometry.
struct RowPlan {
  tpu::fused::RowOp op = tpu::fused::RowOp::kSoftmax;
  int in = -1, out = -1, weight = -1, bias = -1, mean = -1, rstd = -1;
  int64_t cols = 0;       // elements of one row of the op
  int64_t row_elems = 0;  // elements of one split row (dim 0) of the views
  float eps = 0.0f;
};

int64_t numel_of(const KtirView& w) {
  int64_t n = 1;
  for (int64_t s : w.sizes) n *= s;
  return n;
}

// A float32 HBM view whose elements are `numel` consecutive floats.
bool dense_f32(const KtirView& w, int64_t numel) {
  if (w.lx || w.dtype != c10::kFloat || w.arg < 0 || numel_of(w) != numel) return false;
  int64_t want = 1;
  for (size_t d = w.sizes.size(); d-- > 0;) {
    if (w.sizes[d] != 1 && w.strides[d] != want) return false;
    want *= w.sizes[d];
  }
  return true;
}

// An operand that is a view (its id) or None (-1); false for anything else.
bool view_or_none(const KtirValue& v, int* view) {
  *view = v.kind == KtirValue::kView ? static_cast<int>(v.i) : -1;
  return v.kind == KtirValue::kView || v.kind == KtirValue::kNone;
}

// The op's row geometry from its literal operands: softmax's dim (the last,
// half_to_float false), layer_norm's normalized_shape (the last dims) and eps.
bool row_geometry(const KtirOp& o, const std::vector<int64_t>& sizes, RowPlan* R) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  if (R->op != tpu::fused::RowOp::kLayerNorm) {
    if (o.args.size() != 3 || o.args[1].kind != KtirValue::kInt || o.args[2].kind != KtirValue::kBool || o.args[2].b ||
        nd == 0)
      return false;
    const int64_t dim = o.args[1].i;
    R->cols = sizes.back();
    return dim == nd - 1 || dim == -1;
  }
  if (o.args.size() != 5 || o.args[1].kind != KtirValue::kList || o.args[1].list.size() > sizes.size() ||
      !view_or_none(o.args[2], &R->weight) || !view_or_none(o.args[3], &R->bias))
    return false;
  const KtirValue& eps = o.args[4];
  if (eps.kind != KtirValue::kFloat && eps.kind != KtirValue::kInt) return false;
  R->eps = static_cast<float>(eps.kind == KtirValue::kFloat ? eps.f : static_cast<double>(eps.i));
  const auto& shape = o.args[1].list;
  R->cols = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const KtirValue& s = shape[k];
    if (s.kind != KtirValue::kInt || s.i != sizes[sizes.size() - shape.size() + k]) return false;
    R->cols *= s.i;
  }
  return !shape.empty();
}

bool plan_rows(const KtirProgram& p, const KtirTilePlan* plan, RowPlan* R) {
  if (p.ops.size() != 1) return false;
  const KtirOp& o = p.ops[0];
  const c10::OperatorHandle* handle = ktir_op_handle(o);
  if (!handle) return false;
  switch (lowering_of(*handle).row) {
    case RowReduce::kSoftmax:
      R->op = tpu::fused::RowOp::kSoftmax;
      break;
    case RowReduce::kLogSoftmax:
      R->op = tpu::fused::RowOp::kLogSoftmax;
      break;
    case RowReduce::kLayerNorm:
      R->op = tpu::fused::RowOp::kLayerNorm;
      break;
    default:
      return false;
  }
  const bool ln = R->op == tpu::fused::RowOp::kLayerNorm;
  const int nviews = static_cast<int>(p.views.size());
  if (o.args.empty() || o.args[0].kind != KtirValue::kView || o.results.size() != (ln ? 3u : 1u)) return false;
  R->in = static_cast<int>(o.args[0].i);
  R->out = o.results[0];
  if (R->in < 0 || R->in >= nviews || R->out < 0 || R->out >= nviews) return false;
  const KtirView &in = p.views[R->in], &out = p.views[R->out];
  const int64_t numel = numel_of(in);
  if (numel <= 0 || in.sizes != out.sizes || !dense_f32(in, numel) || !dense_f32(out, numel) || in.arg == out.arg ||
      p.args[in.arg].kind == KtirArg::kOut || p.args[out.arg].kind == KtirArg::kIn)
    return false;
  if (!row_geometry(o, in.sizes, R) || R->cols <= 0 || numel % R->cols != 0) return false;
  const int64_t rows = numel / R->cols;
  // Weight / bias: `cols` floats read; mean / rstd: one float per row written, or LX (not stored).
  std::vector<int> args_used = {in.arg, out.arg};
  for (int v : {R->weight, R->bias}) {
    if (v < 0) continue;
    if (v >= nviews || !dense_f32(p.views[v], R->cols) || p.args[p.views[v].arg].kind == KtirArg::kOut) return false;
    if (p.views[v].arg == out.arg) return false;
  }
  if (ln) {
    R->mean = o.results[1], R->rstd = o.results[2];
    for (int* v : {&R->mean, &R->rstd}) {
      if (*v >= nviews) return false;
      if (*v < 0 || p.views[*v].lx) {
        *v = -1;
        continue;
      }
      const KtirView& w = p.views[*v];
      if (!dense_f32(w, rows) || p.args[w.arg].kind == KtirArg::kIn) return false;
      for (int a : args_used)
        if (a == w.arg) return false;
      if (R->weight >= 0 && p.views[R->weight].arg == w.arg) return false;
      if (R->bias >= 0 && p.views[R->bias].arg == w.arg) return false;
      args_used.push_back(w.arg);
    }
  }
  R->row_elems = numel / in.sizes[0];
  if (plan && plan->tiled) {
    if (plan->ring_op >= 0 || plan->phase.size() != 1 || plan->phase[0] != KtirTilePlan::kTile) return false;
    if (R->row_elems % R->cols != 0) return false;  // a row of the op spans split rows
    for (int v : {R->in, R->out, R->mean, R->rstd})
      if (v >= 0 && (static_cast<size_t>(v) >= plan->split.size() || !plan->split[v])) return false;
  }
  return true;
}

}  // namespace

bool ktir_row_pass(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks,
                   const KtirTilePlan* plan, KtirWalk* walk) {
  RowPlan R;
  if (!plan_rows(p, plan, &R)) return false;
  // Whether CPU's kernel of the op runs vectors here (else op by op: its scalar loop).
  if (R.op == tpu::fused::RowOp::kLayerNorm ? !tpu::cpu_layer_norm_row() : !tpu::cpu_softmax_vectorized()) return false;
  if (!tpu::fused_loops_available()) return false;
  try {
    hooks.before_op(0);
  } catch (...) {
    return false;  // the op by op path reports the operand's error where it belongs
  }
  auto view_of = [&](int v) {
    const KtirView& w = p.views[v];
    const at::Tensor& bytes = arg_bytes.at(w.arg);
    return bytes.narrow(0, 0, bytes.numel() / 4 * 4).view(w.dtype).as_strided(w.sizes, w.strides, w.offset);
  };
  auto floats = [&](int v) { return v < 0 ? nullptr : view_of(v).data_ptr<float>(); };
  const float* x = floats(R.in);
  float* y = floats(R.out);
  float* mean = floats(R.mean);
  float* rstd = floats(R.rstd);
  // Rows [b, e) of the split dim: one call of CPU's row kernel.
  tpu::fused::RowAnchor a;
  a.op = R.op;
  a.cols = R.cols;
  a.gamma = floats(R.weight);
  a.beta = floats(R.bias);
  a.eps = R.eps;
  auto run = [&](int64_t b, int64_t e) {
    tpu::fused::RowAnchor c = a;
    const int64_t r0 = b * R.row_elems / R.cols;
    c.rows = (e - b) * R.row_elems / R.cols;
    c.out = y + r0 * R.cols;
    c.mean = mean ? mean + r0 : nullptr;
    c.rstd = rstd ? rstd + r0 : nullptr;
    tpu::run_cpu_rows(c, x + r0 * R.cols);  // runs: its conditions were checked above
  };
  if (plan && plan->tiled) {
    if (walk) walk->tiled = true;
    for (const auto& cores : plan->steps) {
      // The step's cores side by side on the intra-op threads (each row's values its own).
      int64_t rows = 0;
      for (const auto& [b, e] : cores) rows = std::max<int64_t>(rows, e - b);
      if (rows == 0) continue;
      const int64_t grain = std::max<int64_t>(1, kAtenGrainSize / std::max<int64_t>(1, 16 * rows * R.row_elems));
      at::parallel_for(0, static_cast<int64_t>(cores.size()), grain, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          if (cores[c].second > cores[c].first) run(cores[c].first, cores[c].second);
      });
      if (walk) walk->tile_steps++;
    }
  } else {
    run(0, p.views[R.in].sizes[0]);
  }
  std::vector<at::Tensor> results;
  for (int v : {R.out, R.mean, R.rstd})
    if (v >= 0) results.push_back(view_of(v));
  hooks.after_op(0, results, {});
  debug::count_op("spyre_row_pass", p.name);
  return true;
}

}  // namespace spyre
}  // namespace tpu_eager
