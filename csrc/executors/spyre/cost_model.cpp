// The simulated Spyre's cost model (see cost_model.h).
#include "executors/spyre/cost_model.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "executors/matmul_shapes.h"
#include "jit/ir.h"

namespace tpu_eager {
namespace spyre {
namespace {

int64_t round_up(int64_t x, int64_t m) { return m <= 1 ? x : (x + m - 1) / m * m; }

double stick_elements(const TensorRef& r, const CardParams& card) {
  return static_cast<double>(stick_bytes(r.sizes(), r.dtype, card) / device_itemsize(r.dtype));
}

std::mutex g_mu;
CardParams& card_slot() {
  static CardParams* card = new CardParams();  // never destroyed: flushes may run during shutdown
  return *card;
}

}  // namespace

CardParams active_card() {
  std::lock_guard<std::mutex> lock(g_mu);
  return card_slot();
}

void set_active_card(const CardParams& card) {
  std::lock_guard<std::mutex> lock(g_mu);
  card_slot() = card;
}

int64_t device_itemsize(c10::ScalarType dtype) {
  if (dtype == c10::kHalf || dtype == c10::kBFloat16) return 2;
  if (dtype == c10::kLong) return 4;
  return static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t device_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n * device_itemsize(dtype);
}

int64_t stick_elems(c10::ScalarType dtype, const CardParams& card) {
  return std::max<int64_t>(1, card.stick_bytes / device_itemsize(dtype));
}

int64_t stick_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype, const CardParams& card) {
  const int64_t item = device_itemsize(dtype);
  if (sizes.empty()) return round_up(item, card.stick_bytes);
  int64_t lead = 1;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) lead *= sizes[i];
  return lead * round_up(sizes.back(), stick_elems(dtype, card)) * item;
}

double OpCost::seconds(const CardParams& card) const {
  if (!card.valid()) return 0;
  const double cores = static_cast<double>(card.cores);
  return macs / (card.matmul_macs_per_s_per_core * cores) + vector_elems / (card.vector_elems_per_s_per_core * cores);
}

OpCost op_cost(const Node& n, const CardParams& card) {
  OpCost c;
  const auto kind = static_cast<PrimKind>(n.kind);
  if (kind == PrimKind::kMatmul) {
    std::vector<Gemm> gemms;
    c10::ScalarType ta = c10::kFloat, tb = c10::kFloat;
    if (gemms_of(n, gemms, ta, tb)) {
      // K runs along A's sticks and N along B's: both are padded to whole sticks.
      for (const Gemm& g : gemms) {
        const auto pk = static_cast<double>(round_up(static_cast<int64_t>(g.k), stick_elems(ta, card)));
        const auto pn = static_cast<double>(round_up(static_cast<int64_t>(g.n), stick_elems(tb, card)));
        c.flops += 2.0 * g.batch * g.m * g.k * g.n;
        c.macs += g.batch * g.m * pk * pn;
      }
      return c;
    }
  }
  const VectorWork w = vector_work(n, [&](const TensorRef& r) { return stick_elements(r, card); });
  c.flops = w.flops;
  c.vector_elems = w.padded_elems;
  return c;
}

double region_seconds(double compute_s, double memory_s, const CardParams& card) {
  return compute_s + memory_s - card.overlap * std::min(compute_s, memory_s);
}

}  // namespace spyre
}  // namespace tpu_eager
