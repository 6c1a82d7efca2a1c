// Softmax's ring partials over a split dim 0 as native loops that read the
// input's own values (float32 or bfloat16), with the values of the ATen ops
// ring_partial and ring_merge run on its float32 widening.
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace spyre {

// The softmax partials (max m, sum s) of G blocks of rows at once, each block
// split into corelet shares merged in order (docs/ktir.md, "Ring reductions"):
// - block g's rows are x + g * block_stride + r * n (r < rows), n >= 2
//   contiguous values each (float32, or bfloat16 when `bf16`: read as their
//   exact float32 widening); corelet j holds the next shares[j] rows (the
//   shares sum to rows);
// - per corelet: m_j = the column max (NaN where a value is NaN, as amax;
//   a bfloat16 column but the last n % 16 may hold its largest other
//   value instead: its s_j is NaN, which makes every softmax value of the
//   column NaN as a NaN max does),
//   s_j = the sum over its rows of exp(x - m_j) (IEEE f32 difference, CPU's
//   f32 exp, ATen's cascade order of a sum over an outer dim);
// - merged in order: M = maximum(m, m_j), s = s * exp(m - M) + s_j *
//   exp(m_j - M), each product and the sum rounded to f32 (no FMA).
// The sign of a zero max may differ from amax's (softmax's values do not
// depend on it). m_out and s_out hold G * n floats each. The exps are taken
// a few blocks at a time in a buffer of at most ~128 KiB, so the launch
// touches no f32 array of the input's size. Requires vml::available().
void softmax_ring_partials(const void* x, bool bf16, int64_t G, int64_t block_stride, int64_t rows, int64_t n,
                           const int64_t* shares, int64_t corelets, float* m_out, float* s_out);

}  // namespace spyre
}  // namespace tpu_eager
