// The KTIR interpreter's float32 row pass (see row_pass.h).
#include "executors/spyre/row_pass.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "executors/aten_grain.h"
#include "executors/spyre/convert16.h"
#include "executors/tpu/fused_elementwise.h"
#include "jit/lowering.h"
#include "lazy/debug_report.h"

namespace tpu_eager {
namespace spyre {
namespace {

// The pass's operands: views (-1: none) and the op's geometry.
// Float32 elements of a 16-bit pass's buffer of widened rows (and of its
// buffer of results): 16 KiB each, so both stay in L1 with the row kernel's reads.
constexpr int64_t kRowChunkFloats = 4096;

struct RowPlan {
  tpu::fused::RowOp op = tpu::fused::RowOp::kSoftmax;
  int in = -1, out = -1, weight = -1, bias = -1, mean = -1, rstd = -1;
  int64_t cols = 0;       // elements of one row of the op
  int64_t row_elems = 0;  // elements of one split row (dim 0) of the views
  float eps = 0.0f;
  c10::ScalarType dtype = c10::kFloat;  // of every view: float32, bfloat16 or float16
};

int64_t numel_of(const KtirView& w) {
  int64_t n = 1;
  for (int64_t s : w.sizes) n *= s;
  return n;
}

// An HBM view of `dtype` whose elements are `numel` consecutive ones.
bool dense(const KtirView& w, int64_t numel, c10::ScalarType dtype) {
  if (w.lx || w.dtype != dtype || w.arg < 0 || numel_of(w) != numel) return false;
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
  R->dtype = in.dtype;
  if (R->dtype != c10::kFloat && !is_dtype16(R->dtype)) return false;
  if (numel <= 0 || in.sizes != out.sizes || !dense(in, numel, R->dtype) || !dense(out, numel, R->dtype) ||
      in.arg == out.arg || p.args[in.arg].kind == KtirArg::kOut || p.args[out.arg].kind == KtirArg::kIn)
    return false;
  if (!row_geometry(o, in.sizes, R) || R->cols <= 0 || numel % R->cols != 0) return false;
  const int64_t rows = numel / R->cols;
  // Weight / bias: `cols` floats read; mean / rstd: one float per row written, or LX (not stored).
  std::vector<int> args_used = {in.arg, out.arg};
  for (int v : {R->weight, R->bias}) {
    if (v < 0) continue;
    if (v >= nviews || !dense(p.views[v], R->cols, R->dtype) || p.args[p.views[v].arg].kind == KtirArg::kOut)
      return false;
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
      if (!dense(w, rows, R->dtype) || p.args[w.arg].kind == KtirArg::kIn) return false;
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
    const int64_t size = static_cast<int64_t>(c10::elementSize(w.dtype));
    return bytes.narrow(0, 0, bytes.numel() / size * size).view(w.dtype).as_strided(w.sizes, w.strides, w.offset);
  };
  auto data = [&](int v) { return v < 0 ? nullptr : view_of(v).data_ptr(); };
  void* x = data(R.in);
  void* y = data(R.out);
  void* mean = data(R.mean);
  void* rstd = data(R.rstd);
  const bool wide = R.dtype == c10::kFloat;
  // 16-bit weight / bias: their float32 values, widened once.
  std::vector<float> affine(wide ? 0 : 2 * R.cols);
  auto affine_of = [&](int v, int64_t slot) -> const float* {
    if (v < 0) return nullptr;
    if (wide) return static_cast<const float*>(data(v));
    float* f = affine.data() + slot * R.cols;
    widen16(R.dtype, static_cast<const uint16_t*>(data(v)), f, R.cols);
    return f;
  };
  const float* gamma = affine_of(R.weight, 0);
  const float* beta = affine_of(R.bias, 1);
  // Rows [b, e) of the split dim: one call of CPU's row kernel.
  tpu::fused::RowAnchor a;
  a.op = R.op;
  a.cols = R.cols;
  a.gamma = gamma;
  a.beta = beta;
  a.eps = R.eps;
  auto run_f32 = [&](int64_t r0, int64_t rows) {
    tpu::fused::RowAnchor c = a;
    c.rows = rows;
    c.out = static_cast<float*>(y) + r0 * R.cols;
    c.mean = mean ? static_cast<float*>(mean) + r0 : nullptr;
    c.rstd = rstd ? static_cast<float*>(rstd) + r0 : nullptr;
    tpu::run_cpu_rows(c, static_cast<const float*>(x) + r0 * R.cols);  // runs: its conditions were checked above
  };
  // 16-bit rows: a few rows at a time widened into a float32 buffer, CPU's
  // float32 row kernel into another, each result rounded once to df16 and
  // stored in the dtype (the op by op path's values: call_op_in_f32).
  const int64_t chunk = std::max<int64_t>(1, kRowChunkFloats / R.cols);
  auto run_16 = [&](int64_t r0, int64_t rows) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(2 * chunk * (R.cols + 1)));
    float* in = buf.data();
    float* out = in + chunk * R.cols;
    float* stats = out + chunk * R.cols;  // mean, then rstd
    const auto dt = R.dtype;
    auto at16 = [](void* base, int64_t e) { return static_cast<uint16_t*>(base) + e; };
    for (int64_t i = r0; i < r0 + rows; i += chunk) {
      const int64_t n = std::min(chunk, r0 + rows - i);
      widen16(dt, at16(x, i * R.cols), in, n * R.cols);
      tpu::fused::RowAnchor c = a;
      c.rows = n;
      c.out = out;
      c.mean = mean ? stats : nullptr;
      c.rstd = rstd ? stats + chunk : nullptr;
      tpu::run_cpu_rows(c, in);
      store16(dt, out, at16(y, i * R.cols), n * R.cols);
      if (mean) store16(dt, stats, at16(mean, i), n);
      if (rstd) store16(dt, stats + chunk, at16(rstd, i), n);
    }
  };
  auto run = [&](int64_t b, int64_t e) {
    const int64_t r0 = b * R.row_elems / R.cols, rows = (e - b) * R.row_elems / R.cols;
    if (wide) return run_f32(r0, rows);
    // Chunks side by side on the intra-op threads (serial inside a step's parallel cores).
    const int64_t chunks = (rows + chunk - 1) / chunk;
    const int64_t grain = std::max<int64_t>(1, kAtenGrainSize / std::max<int64_t>(1, 16 * chunk * R.cols));
    at::parallel_for(0, chunks, grain,
                     [&](int64_t c0, int64_t c1) { run_16(r0 + c0 * chunk, std::min(rows, c1 * chunk) - c0 * chunk); });
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
