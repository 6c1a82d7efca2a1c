// The simulated TPU's cost model (see cost_model.h for the rules and sources).
#include "executors/tpu/cost_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "executors/matmul_shapes.h"
#include "jit/ir.h"

namespace tpu_eager {
namespace tpu {
namespace {

int64_t round_up(int64_t x, int64_t m) { return m <= 1 ? x : (x + m - 1) / m * m; }

bool is_float16(c10::ScalarType t) { return t == c10::kBFloat16 || t == c10::kHalf; }
bool is_narrow(c10::ScalarType t) { return is_float16(t) || c10::elementSize(t) == 1; }

double tiled_elems(const TensorRef& r, const ChipParams& chip) {
  return static_cast<double>(tiled_bytes(r.sizes(), r.dtype, chip)) / static_cast<double>(c10::elementSize(r.dtype));
}

}  // namespace

int64_t sublane_tile(c10::ScalarType dtype, const ChipParams& chip) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  return item >= 4 ? chip.sublanes : chip.sublanes * (4 / item);
}

int64_t tiled_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype, const ChipParams& chip) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  if (sizes.empty()) return item;
  if (sizes.size() == 1) return round_up(sizes[0], chip.lanes * std::max<int64_t>(1, 4 / item)) * item;
  int64_t lead = 1;
  for (size_t i = 0; i + 2 < sizes.size(); ++i) lead *= sizes[i];
  const int64_t rows = sizes[sizes.size() - 2], cols = sizes.back();
  return lead * round_up(rows, sublane_tile(dtype, chip)) * round_up(cols, chip.lanes) * item;
}

int mxu_passes(c10::ScalarType a, c10::ScalarType b, at::Float32MatmulPrecision prec) {
  if (is_narrow(a) && is_narrow(b)) return 1;
  const bool floats = (a == c10::kFloat || is_float16(a)) && (b == c10::kFloat || is_float16(b));
  if (!floats) return 6;
  switch (prec) {
    case at::Float32MatmulPrecision::MEDIUM:
      return 1;
    case at::Float32MatmulPrecision::HIGH:
      return 3;
    default:
      return 6;
  }
}

double OpCost::seconds(const ChipParams& chip) const {
  if (!chip.valid()) return 0;
  return mxu_flops / chip.peak_bf16_flops + vpu_elems / chip.vpu_elems_per_s;
}

void add_gemm_cost(const Gemm& g, double passes, const ChipParams& chip, OpCost& c) {
  const auto pm = static_cast<double>(round_up(static_cast<int64_t>(g.m), chip.sublanes));
  const auto pk = static_cast<double>(round_up(static_cast<int64_t>(g.k), chip.mxu_size));
  const auto pn = static_cast<double>(round_up(static_cast<int64_t>(g.n), chip.mxu_size));
  c.flops += 2.0 * g.batch * g.m * g.k * g.n;
  c.mxu_flops += 2.0 * g.batch * pm * pk * pn * passes;
}

OpCost op_cost(const Node& n, const ChipParams& chip, at::Float32MatmulPrecision prec) {
  OpCost c;
  const auto kind = static_cast<PrimKind>(n.kind);
  if (kind == PrimKind::kMatmul) {
    std::vector<Gemm> gemms;
    c10::ScalarType ta = c10::kFloat, tb = c10::kFloat;
    double bias_elems = 0;
    if (gemms_of(n, gemms, ta, tb) || conv_gemms_of(n, gemms, ta, tb, bias_elems)) {
      const double passes = mxu_passes(ta, tb, prec);
      for (const Gemm& g : gemms) add_gemm_cost(g, passes, chip, c);
      // A bias / alpha-beta epilogue is applied while the MXU results are
      // drained and is not costed separately; a convolution's grad_bias is a
      // reduction on the vector unit.
      c.flops += bias_elems;
      c.vpu_elems += bias_elems;
      return c;
    }
  }
  const VectorWork w = vector_work(n, [&](const TensorRef& r) { return tiled_elems(r, chip); });
  c.flops = w.flops;
  c.vpu_elems = w.padded_elems;
  return c;
}

}  // namespace tpu
}  // namespace tpu_eager
