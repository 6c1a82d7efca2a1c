// Fused loops of the ring partials (see ring_kernels.h).
#include "executors/spyre/ring_kernels.h"

#include <cmath>
#include <vector>

#include <ATen/ops/empty.h>

#include "executors/tpu/cpu_vml.h"

namespace tpu_eager {
namespace spyre {
namespace {

// m[j] = max(m[j], x[j]) for j < n on NaN-free rows (a plain select: it
// vectorizes to max instructions; a NaN-sticking one did not).
__attribute__((target_clones("avx2", "default"))) void max_row(const float* __restrict x, float* __restrict m,
                                                               int64_t n) {
  for (int64_t j = 0; j < n; ++j) m[j] = x[j] > m[j] ? x[j] : m[j];
}

// Whether x[0..n) holds a NaN.
__attribute__((target_clones("avx2", "default"))) bool has_nan(const float* __restrict x, int64_t n) {
  int bad = 0;
  for (int64_t j = 0; j < n; ++j) bad |= x[j] != x[j];
  return bad != 0;
}

// e[j] = x[j] - m[j] for j < n (IEEE f32, as at::sub).
__attribute__((target_clones("avx2", "default"))) void sub_row(const float* __restrict x, const float* __restrict m,
                                                               float* __restrict e, int64_t n) {
  for (int64_t j = 0; j < n; ++j) e[j] = x[j] - m[j];
}

}  // namespace

bool fits_softmax_partial(const at::Tensor& seg) {
  if (seg.scalar_type() != at::kFloat || seg.dim() < 2 || seg.numel() == 0 || !tpu::vml::available()) return false;
  // Dims 1.. dense (each seg[g] one block); dim 0 any stride.
  int64_t expect = 1;
  for (int64_t d = seg.dim() - 1; d >= 1; --d) {
    if (seg.size(d) != 1 && seg.stride(d) != expect) return false;
    expect *= seg.size(d);
  }
  return true;
}

std::pair<at::Tensor, at::Tensor> softmax_partial_exp(const at::Tensor& seg) {
  const int64_t G = seg.size(0), rows = seg.size(1);
  const int64_t inner = seg.numel() / (G * rows);
  std::vector<int64_t> msizes = seg.sizes().vec();
  msizes[1] = 1;
  at::Tensor m = at::empty(msizes, seg.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor e = at::empty(seg.sizes(), seg.options().memory_format(at::MemoryFormat::Contiguous));
  const float* base = seg.const_data_ptr<float>();
  float* mp = m.mutable_data_ptr<float>();
  float* ep = e.mutable_data_ptr<float>();
  for (int64_t g = 0; g < G; ++g) {
    const float* x = base + g * seg.stride(0);
    float* mg = mp + g * inner;
    if (has_nan(x, rows * inner)) {  // amax's NaN rule, rare: ATen's own
      m.select(0, g).copy_(seg.select(0, g).amax(0, true));
    } else {
      std::copy(x, x + inner, mg);
      for (int64_t r = 1; r < rows; ++r) max_row(x + r * inner, mg, inner);
    }
    for (int64_t r = 0; r < rows; ++r) sub_row(x + r * inner, mg, ep + (g * rows + r) * inner, inner);
  }
  tpu::vml::exp(ep, ep, e.numel());
  return {m, e};
}

}  // namespace spyre
}  // namespace tpu_eager
