// Softmax's ring partials as native loops (the ATen ops' values, fewer passes).
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace spyre {

// The softmax partials (max m, sum s) of G blocks of rows at once, each block
// split into corelet shares merged in order, with the values of the ATen ops
// ring_partial and ring_merge run (docs/ktir.md, "Ring reductions"):
// - block g's rows are x + g * block_stride + r * n (r < rows), n contiguous
//   float32 values each; corelet j holds the next shares[j] rows
//   (sum of shares = rows, n >= 2);
// - per corelet: m_j = the column max (NaN where a value is NaN, as amax),
//   s_j = the sum over its rows of exp(x - m_j) (IEEE difference, CPU's f32
//   exp, and ATen's cascade order of a sum over an outer dim);
// - merged in order: M = maximum(m, m_j), s = s * exp(m - M) + s_j *
//   exp(m_j - M), each product and the sum rounded to f32 (no FMA).
// The sign of a zero max may differ from amax's (softmax's values do not
// depend on it). `work` holds G * rows * n floats; m_out and s_out G * n
// each. Requires vml::available().
void softmax_ring_partials(const float* x, int64_t G, int64_t block_stride, int64_t rows, int64_t n,
                           const int64_t* shares, int64_t corelets, float* work, float* m_out, float* s_out);

}  // namespace spyre
}  // namespace tpu_eager
