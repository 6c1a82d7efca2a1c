// CPU kernels writing into given outputs (see direct_kernels.h).
#include "executors/direct_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cmath>
#include <limits>
#include <string>

// The per-capability kernel pointers of a dispatch stub are exported, its
// chooser (DispatchStubImpl::get_call_ptr) is not; these macros (set when
// torch itself is built) declare the pointers of the x86 capabilities.
#ifndef HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#ifndef HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif
#include <ATen/Version.h>
#include <ATen/Parallel.h>
#include <ATen/native/batch_norm.h>
#include <ATen/native/layer_norm.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/native/cpu/utils.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/linalg_vector_norm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include "executors/aten_grain.h"
#include "executors/cpu_features.h"
#include "jit/lowering.h"

namespace tpu_eager {
namespace host {
namespace {

// The kernel a dispatch stub would call on this CPU: the one of ATen's
// capability (ATEN_CPU_CAPABILITY or the CPU's), AVX2's when a stub has no
// AVX512 kernel, as DispatchStub does.
template <typename Stub>
typename Stub::FnPtr cpu_kernel() {
  static const std::string cap = at::get_cpu_capability();
  if (cap == "AVX512" && Stub::AVX512) return Stub::AVX512;
  if ((cap == "AVX512" || cap == "AVX2") && Stub::AVX2) return Stub::AVX2;
  return Stub::DEFAULT;
}

// The capability of the kernel cpu_kernel<Stub>() picks: "AVX512", "AVX2" or
// "DEFAULT" (a stub may register fewer kernels than the CPU could run).
template <typename Stub>
const char* kernel_capability() {
  const auto kernel = cpu_kernel<Stub>();
  if (kernel && kernel == Stub::AVX512) return "AVX512";
  if (kernel && kernel == Stub::AVX2) return "AVX2";
  return "DEFAULT";
}

bool dense_f32(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous(); }

// M rows of N = prod(normalized_shape) elements; false when normalized_shape
// does not end the input's shape (CPU's kernel then raises its own error).
bool rows_and_cols(const at::Tensor& x, const c10::IValue& normalized_shape, int64_t* m, int64_t* n) {
  if (!normalized_shape.isIntList()) return false;
  const auto shape = normalized_shape.toIntVector();
  const int64_t axis = x.dim() - static_cast<int64_t>(shape.size());
  if (shape.empty() || axis < 0) return false;
  *m = 1;
  *n = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d >= axis && x.size(d) != shape[d - axis]) return false;
    (d < axis ? *m : *n) *= x.size(d);
  }
  return true;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
bool layer_norm(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  const at::Tensor x = a[0].toTensor();
  const at::Tensor w = a[2].isTensor() ? a[2].toTensor() : at::Tensor();
  const at::Tensor b = a[3].isTensor() ? a[3].toTensor() : at::Tensor();
  int64_t m = 0, n = 0;
  if (!dense_f32(x) || (w.defined() && !dense_f32(w)) || (b.defined() && !dense_f32(b)) || outs.size() != 3 ||
      !rows_and_cols(x, a[1], &m, &n) || m == 0 || n == 0)
    return false;
  for (const auto& o : outs)
    if (!dense_f32(o)) return false;
  auto* kernel = cpu_kernel<at::native::LayerNormKernel_DECLARE_DISPATCH_type>();
  if (!kernel) return false;
  at::Tensor y = outs[0], mean = outs[1], rstd = outs[2];
  kernel(x, w, b, m, n, a[4].toDouble(), &y, &mean, &rstd);
  return true;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
//   -> (grad_input, grad_weight, grad_bias), every mask entry set
bool layer_norm_backward(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  const at::Tensor dy = a[0].toTensor(), x = a[1].toTensor(), mean = a[3].toTensor(), rstd = a[4].toTensor();
  const at::Tensor w = a[5].isTensor() ? a[5].toTensor() : at::Tensor();
  const at::Tensor b = a[6].isTensor() ? a[6].toTensor() : at::Tensor();
  int64_t m = 0, n = 0;
  if (!dense_f32(dy) || !dense_f32(x) || !dense_f32(mean) || !dense_f32(rstd) || !dense_f32(w) || !dense_f32(b) ||
      outs.size() != 3 || !rows_and_cols(x, a[2], &m, &n) || m == 0 || n == 0 || !dy.sizes().equals(x.sizes()))
    return false;
  for (const auto& o : outs)
    if (!dense_f32(o)) return false;
  auto* kernel = cpu_kernel<at::native::LayerNormBackwardKernel_DECLARE_DISPATCH_type>();
  if (!kernel) return false;
  at::Tensor dx = outs[0], dw = outs[1], db = outs[2];
  kernel(dy, x, mean, rstd, w, m, n, &dx, &dw, &db);
  return true;
}

}  // namespace

const char* layer_norm_kernel_capability() {
  return kernel_capability<at::native::LayerNormKernel_DECLARE_DISPATCH_type>();
}

namespace {

// masked_fill.Scalar / .Tensor(self, mask, value): CPU's kernel clones self,
// broadcast with the mask, into a contiguous tensor and fills that in place;
// the clone is here the copy into the output.
bool masked_fill(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (outs.size() != 1 || !outs[0].is_contiguous() || !a[0].isTensor() || !a[1].isTensor()) return false;
  outs[0].copy_(a[0].toTensor());
  if (a[2].isTensor()) {
    outs[0].masked_fill_(a[1].toTensor(), a[2].toTensor());
  } else {
    outs[0].masked_fill_(a[1].toTensor(), a[2].toScalar());
  }
  return true;
}

// clone into a dense output is a copy (clone.out is clone plus a second copy).
bool clone_into(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  outs.at(0).copy_(a.at(0).toTensor());
  return true;
}

// One (height, width) parameter of max_pool2d: one value for both, or two.
bool pool_pair(const c10::IValue& v, int64_t fallback, int64_t* h, int64_t* w) {
  if (!v.isIntList()) return false;
  const auto list = v.toIntVector();
  if (list.empty()) {
    *h = *w = fallback;
  } else if (list.size() == 1) {
    *h = *w = list[0];
  } else if (list.size() == 2) {
    *h = list[0];
    *w = list[1];
  } else {
    return false;
  }
  return true;
}

// The K x K windows at stride S of one plane: each output is the first of the
// window's maximum in row-major order, a NaN replacing any earlier value (the
// comparison `v > max || isnan(v)` CPU's max-pooling kernel makes, from -inf
// with the window's first position), so values and indices equal CPU's.
// K == 0: the kernel size `k` at run time.
template <int K>
void max_pool_plane(const float* in, float* out, int64_t* idx, int64_t width, int64_t oh_n, int64_t ow_n, int64_t k,
                    int64_t s) {
  const int64_t kk = K ? K : k;
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const int64_t h0 = oh * s;
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t w0 = ow * s;
      float best = -std::numeric_limits<float>::infinity();
      int64_t at = h0 * width + w0;
      for (int64_t dh = 0; dh < kk; ++dh) {
        const float* row = in + (h0 + dh) * width + w0;
        for (int64_t dw = 0; dw < kk; ++dw) {
          const float v = row[dw];
          const bool take = (v > best) | (v != v);
          best = take ? v : best;
          at = take ? (h0 + dh) * width + w0 + dw : at;
        }
      }
      out[oh * ow_n + ow] = best;
      idx[oh * ow_n + ow] = at;
    }
  }
}

// max_pool_plane<2> with stride 2, eight outputs at a time (AVX2): the even
// and odd columns of the window's two rows are the four candidates, taken in
// the same order with the same comparison. Indices fit int32 (checked by the caller).
// Columns 0, 2, .., 14 (even_cols) or 1, 3, .., 15 (odd_cols) of the 16 floats
// a, b: (a0 a2 b0 b2 | a4 a6 b4 b6) -> (a0 a2 a4 a6 b0 b2 b4 b6).
__attribute__((target("avx2"))) inline __m256 even_cols(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}
__attribute__((target("avx2"))) inline __m256 odd_cols(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

__attribute__((target("avx2"))) void max_pool_plane_2x2_avx2(const float* in, float* out, int64_t* idx, int64_t width,
                                                             int64_t oh_n, int64_t ow_n) {
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const int32_t offs[4] = {0, 1, static_cast<int32_t>(width), static_cast<int32_t>(width) + 1};
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const float* r0 = in + 2 * oh * width;
    const float* r1 = r0 + width;
    int64_t ow = 0;
    for (; ow + 8 <= ow_n; ow += 8) {
      const __m256 a0 = _mm256_loadu_ps(r0 + 2 * ow), b0 = _mm256_loadu_ps(r0 + 2 * ow + 8);
      const __m256 a1 = _mm256_loadu_ps(r1 + 2 * ow), b1 = _mm256_loadu_ps(r1 + 2 * ow + 8);
      const __m256 cand[4] = {even_cols(a0, b0), odd_cols(a0, b0), even_cols(a1, b1), odd_cols(a1, b1)};
      const __m256i base = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(2 * oh * width + 2 * ow)), lane2);
      __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      __m256i at = base;
      for (int k = 0; k < 4; ++k) {
        const __m256 v = cand[k];
        const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, v, take);
        const __m256i pos = _mm256_add_epi32(base, _mm256_set1_epi32(offs[k]));
        at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(pos), take));
      }
      _mm256_storeu_ps(out + oh * ow_n + ow, best);
      int64_t* dst = idx + oh * ow_n + ow;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(at)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(at, 1)));
    }
    for (; ow < ow_n; ++ow) {
      float best = -std::numeric_limits<float>::infinity();
      int64_t at = 2 * oh * width + 2 * ow;
      for (int k = 0; k < 4; ++k) {
        const int64_t pos = 2 * oh * width + 2 * ow + offs[k];
        const float v = in[pos];
        const bool take = (v > best) | (v != v);
        best = take ? v : best;
        at = take ? pos : at;
      }
      out[oh * ow_n + ow] = best;
      idx[oh * ow_n + ow] = at;
    }
  }
}

// max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
//   -> (out, indices) on dense float32 (N,)C,H,W with square windows, one
// stride for both dims, no padding or dilation, and every window inside the
// input (other cases, and ceil_mode's partial last window, are left to CPU's
// out= kernel). CPU's generic kernel spends ~160 instructions per 2x2 window
// on index arithmetic (benchmarks/run_all.py's CNN step: its largest kernel).
bool max_pool2d_with_indices(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 6 || outs.size() != 2 || !a[0].isTensor()) return false;
  const at::Tensor x = a[0].toTensor();
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0, dh = 0, dw = 0;
  if (!pool_pair(a[1], -1, &kh, &kw) || kh <= 0 || !pool_pair(a[2], kh, &sh, &sw) || !pool_pair(a[3], 0, &ph, &pw) ||
      !pool_pair(a[4], 1, &dh, &dw))
    return false;
  if (kh != kw || sh != sw || sh <= 0 || ph != 0 || pw != 0 || dh != 1 || dw != 1) return false;
  if (!dense_f32(x) || (x.dim() != 3 && x.dim() != 4) || !dense_f32(outs[0]) || !outs[1].is_contiguous() ||
      outs[1].scalar_type() != at::kLong || outs[0].dim() != x.dim() || !outs[0].sizes().equals(outs[1].sizes()))
    return false;
  const int64_t height = x.size(-2), width = x.size(-1);
  const int64_t oh_n = outs[0].size(-2), ow_n = outs[0].size(-1);
  const int64_t planes = x.numel() / std::max<int64_t>(height * width, 1);
  if (outs[0].numel() != planes * oh_n * ow_n || (oh_n > 0 && (oh_n - 1) * sh + kh > height) ||
      (ow_n > 0 && (ow_n - 1) * sw + kw > width) || x.numel() == 0)
    return false;
  const float* in = x.const_data_ptr<float>();
  float* out = outs[0].data_ptr<float>();
  int64_t* idx = outs[1].data_ptr<int64_t>();
  const int64_t in_plane = height * width, out_plane = oh_n * ow_n;
  const bool avx2 = cpu::has(cpu::Feature::kAvx2);
  at::parallel_for(0, planes, 0, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const float* pi = in + c * in_plane;
      float* po = out + c * out_plane;
      int64_t* px = idx + c * out_plane;
      if (kh == 2 && sh == 2 && avx2 && in_plane < (int64_t{1} << 31)) {
        max_pool_plane_2x2_avx2(pi, po, px, width, oh_n, ow_n);
      } else if (kh == 2) {
        max_pool_plane<2>(pi, po, px, width, oh_n, ow_n, kh, sh);
      } else if (kh == 3) {
        max_pool_plane<3>(pi, po, px, width, oh_n, ow_n, kh, sh);
      } else {
        max_pool_plane<0>(pi, po, px, width, oh_n, ow_n, kh, sh);
      }
    }
  });
  return true;
}

// max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride,
// padding, dilation, ceil_mode, indices) -> grad_input on a contiguous
// float32 (N,)C,H,W self, dense float32 gradients and int64 indices. CPU's
// out= kernel zeroes the whole gradient (a pass of its own), then adds each
// output's gradient at its index, plane by plane in output order, skipping
// index -1; here each plane is zeroed just before its additions (in cache),
// and the additions are the same, in the same order (+0.0 + g, repeated
// indices summed in output order), so the values equal CPU's for any indices
// in range. A plane holding an index outside it makes the kernel decline
// (CPU's kernel then runs, as before, and writes the whole gradient again).
bool max_pool2d_backward(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 8 || outs.size() != 1 || !a[0].isTensor() || !a[1].isTensor() || !a[7].isTensor()) return false;
  const at::Tensor go = a[0].toTensor(), x = a[1].toTensor(), ind = a[7].toTensor();
  const at::Tensor& gi = outs[0];
  if (!dense_f32(go) || !dense_f32(x) || !dense_f32(gi) || (x.dim() != 3 && x.dim() != 4) ||
      x.suggest_memory_format() != at::MemoryFormat::Contiguous || !gi.sizes().equals(x.sizes()) ||
      !ind.is_contiguous() || ind.scalar_type() != at::kLong || !ind.sizes().equals(go.sizes()) ||
      go.dim() != x.dim() || x.numel() == 0)
    return false;
  const int64_t in_plane = x.size(-2) * x.size(-1), out_plane = go.size(-2) * go.size(-1);
  const int64_t planes = x.numel() / in_plane;
  if (go.numel() != planes * out_plane) return false;
  const float* g = go.const_data_ptr<float>();
  const int64_t* idx = ind.const_data_ptr<int64_t>();
  float* out = gi.data_ptr<float>();
  std::atomic<bool> out_of_range{false};
  at::parallel_for(0, planes, 0, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t* __restrict pi = idx + c * out_plane;
      const float* __restrict pg = g + c * out_plane;
      float* __restrict po = out + c * in_plane;
      std::memset(po, 0, static_cast<size_t>(in_plane) * sizeof(float));
      bool bad = false;
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t k = pi[o];
        if (static_cast<uint64_t>(k) < static_cast<uint64_t>(in_plane)) {
          po[k] += pg[o];
        } else {
          bad = bad || k != -1;
        }
      }
      if (bad) out_of_range.store(true, std::memory_order_relaxed);
    }
  });
  return !out_of_range.load();
}

// Per-channel sum and sum of squared deviations of `planes` channels of a
// contiguous (N, C, S) float32 input, channels c .. c + L - 1: each channel's
// sums are the same sequence of double additions CPU's contiguous batch-norm
// statistics make (sum += x; mean = float(sum / count); var_sum += float((x -
// mean) * (x - mean)), batch by batch, element by element), so the results are
// equal; L channels at once only interleave independent chains.
template <int L>
void channel_stats(const float* x, int64_t batch, int64_t channels, int64_t plane, int64_t c, float* mean,
                   float* var_sum) {
  const int64_t count = batch * plane;
  double sum[L] = {};
  for (int64_t n = 0; n < batch; ++n) {
    const float* p = x + (n * channels + c) * plane;
    for (int64_t i = 0; i < plane; ++i)
      for (int l = 0; l < L; ++l) sum[l] += p[l * plane + i];
  }
  float m[L];
  for (int l = 0; l < L; ++l) m[l] = mean[c + l] = static_cast<float>(sum[l] / count);
  double var[L] = {};
  for (int64_t n = 0; n < batch; ++n) {
    const float* p = x + (n * channels + c) * plane;
    for (int64_t i = 0; i < plane; ++i)
      for (int l = 0; l < L; ++l) {
        const float d = p[l * plane + i] - m[l];
        var[l] += d * d;
      }
  }
  for (int l = 0; l < L; ++l) var_sum[c + l] = static_cast<float>(var[l]);
}

// Element i of four channel rows (r[k] + i, k = 0..3) as one vector (channel k in lane k).
__attribute__((target("avx2"))) inline __m128 lanes_at(const float* const* r, int64_t i) {
  return _mm_setr_ps(r[0][i], r[1][i], r[2][i], r[3][i]);
}

// (v - m) * (v - m) in float, then widened: the scalar loop's float product
// added to its double sum (no fused multiply-add across the two types).
__attribute__((target("avx2"))) inline __m256d squared_deviation(__m128 v, __m128 m) {
  const __m128 d = _mm_sub_ps(v, m);
  return _mm256_cvtps_pd(_mm_mul_ps(d, d));
}

// The term one pass adds per element: the widened element (the mean's sum) or
// its squared deviation from the channel's mean m (the variance's sum).
template <bool kDeviation>
__attribute__((target("avx2"))) inline __m256d pass_term(__m128 v, __m128 m) {
  if constexpr (kDeviation) return squared_deviation(v, m);
  return _mm256_cvtps_pd(v);
}

// One pass of channel_stats_avx2 over all batches: acc[g] (zeroed here) gets
// pass_term of each element in the scalar loop's order (m read only by the
// variance's pass).
template <int G, bool kDeviation>
__attribute__((target("avx2"))) void channel_pass_avx2(const float* x, int64_t batch, int64_t channels, int64_t plane,
                                                       int64_t c, const __m128* m, __m256d* acc) {
  const float* r[G][4];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_pd();
  for (int64_t n = 0; n < batch; ++n) {
    for (int g = 0; g < G; ++g)
      for (int k = 0; k < 4; ++k) r[g][k] = x + (n * channels + c + 4 * g + k) * plane;
    int64_t i = 0;
    for (; i + 4 <= plane; i += 4) {
      for (int g = 0; g < G; ++g) {
        const __m128 mg = kDeviation ? m[g] : _mm_setzero_ps();
        __m128 v0 = _mm_loadu_ps(r[g][0] + i), v1 = _mm_loadu_ps(r[g][1] + i);
        __m128 v2 = _mm_loadu_ps(r[g][2] + i), v3 = _mm_loadu_ps(r[g][3] + i);
        _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
        acc[g] = _mm256_add_pd(acc[g], pass_term<kDeviation>(v0, mg));
        acc[g] = _mm256_add_pd(acc[g], pass_term<kDeviation>(v1, mg));
        acc[g] = _mm256_add_pd(acc[g], pass_term<kDeviation>(v2, mg));
        acc[g] = _mm256_add_pd(acc[g], pass_term<kDeviation>(v3, mg));
      }
    }
    for (; i < plane; ++i)
      for (int g = 0; g < G; ++g)
        acc[g] = _mm256_add_pd(acc[g], pass_term<kDeviation>(lanes_at(r[g], i), kDeviation ? m[g] : _mm_setzero_ps()));
  }
}

// channel_stats of 4 * G channels c .. c + 4G - 1 with AVX2: each channel's
// double sum is one lane of a vector accumulator, fed element by element in
// the scalar loop's order (batch by batch, i = 0 .. plane - 1), so every lane
// makes channel_stats<1>'s sequence of additions and the results are equal.
// Four elements of four channels are loaded as four rows and transposed
// (lane k of vector j: channel k, element i + j); the G accumulators are
// independent chains (G = 4: sixteen channels' additions in flight, where the
// scalar loop of four channels has four).
template <int G>
__attribute__((target("avx2"))) void channel_stats_avx2(const float* x, int64_t batch, int64_t channels, int64_t plane,
                                                        int64_t c, float* mean, float* var_sum) {
  const int64_t count = batch * plane;
  __m256d acc[G];
  __m128 m[G];
  channel_pass_avx2<G, false>(x, batch, channels, plane, c, m, acc);
  for (int g = 0; g < G; ++g) {
    alignas(32) double s[4];
    _mm256_store_pd(s, acc[g]);
    for (int k = 0; k < 4; ++k) mean[c + 4 * g + k] = static_cast<float>(s[k] / count);
    m[g] = _mm_loadu_ps(mean + c + 4 * g);
  }
  channel_pass_avx2<G, true>(x, batch, channels, plane, c, m, acc);
  for (int g = 0; g < G; ++g) {
    alignas(32) double s[4];
    _mm256_store_pd(s, acc[g]);
    for (int k = 0; k < 4; ++k) var_sum[c + 4 * g + k] = static_cast<float>(s[k]);
  }
}

// The statistics of channel groups [begin, end) (four channels a group; the
// last may be partial): sixteen, eight or four channels at a time with AVX2,
// else (and for a partial group) channel by channel in groups of four.
void channel_stats_range(const float* x, int64_t batch, int64_t channels, int64_t plane, int64_t begin, int64_t end,
                         float* mean, float* var_sum) {
  const bool avx2 = cpu::has(cpu::Feature::kAvx2);
  int64_t g = begin;
  while (g < end) {
    const int64_t c = g * 4, full = std::min(end, channels / 4) - g;  // whole groups from g
    if (avx2 && full >= 4) {
      channel_stats_avx2<4>(x, batch, channels, plane, c, mean, var_sum);
      g += 4;
    } else if (avx2 && full >= 2) {
      channel_stats_avx2<2>(x, batch, channels, plane, c, mean, var_sum);
      g += 2;
    } else if (avx2 && full >= 1) {
      channel_stats_avx2<1>(x, batch, channels, plane, c, mean, var_sum);
      g += 1;
    } else if (c + 4 <= channels) {
      channel_stats<4>(x, batch, channels, plane, c, mean, var_sum);
      g += 1;
    } else {
      for (int64_t k = c; k < channels; ++k) channel_stats<1>(x, batch, channels, plane, k, mean, var_sum);
      g += 1;
    }
  }
}

// native_batch_norm(input, weight, bias, running_mean, running_var, training=True, momentum, eps)
//   -> (out, save_mean, save_invstd) on contiguous float32 (N, C, *) input with a
// plane of more than one element, weight, bias and running statistics all
// given. CPU's batch_norm_cpu_out: the statistics (channel_stats), then per
// channel save_invstd = 1 / sqrt(double(var_sum / count) + eps), running_mean
// = m * mean + (1 - m) * running_mean in float, running_var = m * double(var_sum
// / (count - 1)) + (1 - m) * running_var (m = float(momentum)), then CPU's own
// normalization kernel (batch_norm_cpu_stub). CPU's statistics loop is one
// serial chain of double additions per channel (the CNN step's second largest
// kernel); interleaving channels (channel_stats_range: sixteen a time in AVX2
// lanes) makes it several times faster, equal bit for bit.
bool batch_norm_train(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 8 || outs.size() != 3 || !a[0].isTensor()) return false;
  for (int i = 1; i <= 4; ++i)
    if (!a[i].isTensor()) return false;
  if (!a[5].isBool() || !a[5].toBool()) return false;
  const at::Tensor x = a[0].toTensor(), w = a[1].toTensor(), b = a[2].toTensor();
  at::Tensor rm = a[3].toTensor(), rv = a[4].toTensor();
  if (!dense_f32(x) || x.dim() < 3 || x.suggest_memory_format() != at::MemoryFormat::Contiguous) return false;
  const int64_t batch = x.size(0), channels = x.size(1);
  if (batch == 0 || channels == 0) return false;
  const int64_t plane = x.numel() / (batch * channels), count = batch * plane;
  if (plane <= 1 || count <= 1 || count > (int64_t{1} << 24)) return false;  // count exact in float
  for (const at::Tensor* t : {&w, &b, static_cast<const at::Tensor*>(&rm), static_cast<const at::Tensor*>(&rv)})
    if (!dense_f32(*t) || t->dim() != 1 || t->numel() != channels) return false;
  at::Tensor out = outs[0], save_mean = outs[1], save_invstd = outs[2];
  if (!dense_f32(out) || !out.sizes().equals(x.sizes()) || !dense_f32(save_mean) || !dense_f32(save_invstd) ||
      save_mean.numel() != channels || save_invstd.numel() != channels)
    return false;
  auto* normalize = cpu_kernel<at::native::batch_norm_cpu_stub_DECLARE_DISPATCH_type>();
  if (!normalize) return false;
  std::vector<float> var_sum(channels);
  float* mean = save_mean.data_ptr<float>();
  const float* xp = x.const_data_ptr<float>();
  at::parallel_for(0, (channels + 3) / 4, 1, [&](int64_t begin, int64_t end) {
    channel_stats_range(xp, batch, channels, plane, begin, end, mean, var_sum.data());
  });
  const double eps = a[7].toDouble();
  const float m = static_cast<float>(a[6].toDouble());
  float* invstd = save_invstd.data_ptr<float>();
  float* rmp = rm.data_ptr<float>();
  float* rvp = rv.data_ptr<float>();
  const float count_f = static_cast<float>(count), unbiased_f = static_cast<float>(count - 1);
  for (int64_t c = 0; c < channels; ++c) {
    const float var = var_sum[c] / count_f;
    invstd[c] = (var == 0 && eps == 0) ? 0.0f : static_cast<float>(1 / std::sqrt(static_cast<double>(var) + eps));
    rmp[c] = m * mean[c] + (1 - m) * rmp[c];
    const double unbiased = var_sum[c] / unbiased_f;
    rvp[c] = static_cast<float>(m * unbiased + (1 - m) * rvp[c]);
  }
  normalize(out, x, w, b, save_mean, save_invstd, rm, rv, /*train=*/true, eps);
  return true;
}

// ---- sum over leading dims (a bias gradient's column sum) in CPU's order ----
//
// CPU's float sum (ATen's cascade_sum) of a contiguous [rows, cols] input over
// its rows adds each column in one of two orders, decided by the column's place
// in the vector groups of its kernel:
//  - "cascade": the rows in order into four levels of partial sums
//    (multi_row_sum), for columns in groups of 4 vectors (or of 4 columns when
//    fewer columns than a vector are summed);
//  - "interleaved": four such cascades over rows k, k + 4, k + 8, ... (k =
//    0..3), the rows after the last multiple of 4 added to the first, then
//    the four summed in order (row_sum), for the columns after those groups.
// Each result is then added to the output's zero (+0.0 for -0.0).

constexpr int64_t kSumBlock = 64;  // columns summed at once: eight 8-float vectors

// Lanes [0, n) of a vector (n <= 8) as a store / load mask.
__attribute__((target("avx2"))) inline __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// acc[v] += vector v of a row of 8 * (V - 1) + last floats (the rest of the last vector read as 0).
template <int V>
__attribute__((target("avx2"), always_inline)) inline void add_row(__m256* acc, const float* row, int last,
                                                                   __m256i mask) {
#pragma GCC unroll 8
  for (int v = 0; v + 1 < V; ++v) acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(row + 8 * v));
  const float* p = row + 8 * (V - 1);
  acc[V - 1] = _mm256_add_ps(acc[V - 1], last == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask));
}

// The sums of the 8 * (V - 1) + last columns of rows x + i * stride, i < size,
// in the cascade order (lane by lane the additions of ATen's multi_row_sum:
// four levels, level 0 in registers), into sum[c]; with kPlusZero 0.0f + the sum
// (CPU's store into its zeroed output).
template <int V, bool kPlusZero>
__attribute__((target("avx2"))) void cascade_vecs(const float* x, int64_t stride, int64_t size, int last, float* sum) {
  constexpr int kLevels = 4;
  const int64_t power = std::max<int64_t>(4, at::native::utils::CeilLog2(size) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  const __m256i tail = first_lanes(last);
  __m256 acc0[V], acc[kLevels][V];  // acc[1..3]: levels 1 to 3
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) {
    acc0[v] = _mm256_setzero_ps();
    for (int j = 1; j < kLevels; ++j) acc[j][v] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row<V>(acc0, x + i * stride, last, tail);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {  // level 1 takes level 0
      acc[1][v] = _mm256_add_ps(acc[1][v], acc0[v]);
      acc0[v] = _mm256_setzero_ps();
    }
    if ((i & (mask << power)) != 0) continue;
    for (int j = 2; j < kLevels; ++j) {
      for (int v = 0; v < V; ++v) {
        acc[j][v] = _mm256_add_ps(acc[j][v], acc[j - 1][v]);
        acc[j - 1][v] = _mm256_setzero_ps();
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) add_row<V>(acc0, x + i * stride, last, tail);
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) {
    __m256 t = acc0[v];
    for (int j = 1; j < kLevels; ++j) t = _mm256_add_ps(t, acc[j][v]);
    if (kPlusZero) t = _mm256_add_ps(_mm256_setzero_ps(), t);
    if (v + 1 < V || last == 8) {
      _mm256_storeu_ps(sum + 8 * v, t);
    } else {
      _mm256_maskstore_ps(sum + 8 * v, tail, t);
    }
  }
}

// cascade_vecs for n columns (1 <= n <= kSumBlock).
template <bool kPlusZero>
void cascade_columns(const float* x, int64_t stride, int64_t size, int64_t n, float* sum) {
  using Cascade = void (*)(const float*, int64_t, int64_t, int, float*);
  static constexpr Cascade kByVectors[] = {
      cascade_vecs<1, kPlusZero>, cascade_vecs<2, kPlusZero>, cascade_vecs<3, kPlusZero>, cascade_vecs<4, kPlusZero>,
      cascade_vecs<5, kPlusZero>, cascade_vecs<6, kPlusZero>, cascade_vecs<7, kPlusZero>, cascade_vecs<8, kPlusZero>};
  kByVectors[(n - 1) / 8](x, stride, size, static_cast<int>(n - (n - 1) / 8 * 8), sum);
}

// out[c] = 0.0f + the sum of column c < n (n <= kSumBlock) of `rows` rows at x, in the interleaved order.
void interleaved_columns(const float* x, int64_t cols, int64_t rows, int64_t n, float* out) {
  float part[4][kSumBlock];
  for (int k = 0; k < 4; ++k) cascade_columns<false>(x + k * cols, 4 * cols, rows / 4, n, part[k]);
  for (int64_t i = rows / 4 * 4; i < rows; ++i)
    for (int64_t c = 0; c < n; ++c) part[0][c] += x[i * cols + c];
  for (int64_t c = 0; c < n; ++c) out[c] = 0.0f + (((part[0][c] + part[1][c]) + part[2][c]) + part[3][c]);
}

// Columns [begin, end) of a [rows, cols] input x summed into out as CPU's
// kernel sums them when its loop gets exactly these columns (vector width `width`).
void column_sum_range(const float* x, int64_t rows, int64_t cols, int64_t begin, int64_t end, int64_t width,
                      float* out) {
  const int64_t n = end - begin;
  const int64_t group = n >= width ? 4 * width : 4;  // the vector path's 4 vectors, else the scalar path's 4 columns
  const int64_t cascaded = begin + n / group * group;
  for (int64_t c = begin; c < end; c += kSumBlock) {
    const int64_t stop = std::min(c + kSumBlock, end);
    const int64_t split = std::clamp(cascaded, c, stop);  // [c, split) cascade, [split, stop) interleaved
    if (split > c) cascade_columns<true>(x + c, cols, rows, split - c, out + c);
    if (stop > split) interleaved_columns(x + split, cols, rows, stop - split, out + split);
  }
}

// The float vector width of the sum kernel CPU runs here: 16 (AVX512), 8
// (AVX2), or 0 when it is DEFAULT's (not reproduced: CPU's kernel runs; the
// cascade here is AVX2 code, which an AVX2 or AVX512 kernel implies the CPU has).
int64_t sum_kernel_width() {
  using Stub = at::native::sum_stub_DECLARE_DISPATCH_type;
  static const int64_t width = [] {
    const auto kernel = cpu_kernel<Stub>();
    if (kernel && kernel == Stub::AVX512) return int64_t{16};
    if (kernel && kernel == Stub::AVX2) return int64_t{8};
    return int64_t{0};
  }();
  return width;
}

}  // namespace

int64_t cpu_sum_kernel_width() { return sum_kernel_width(); }

bool cpu_column_sums(const float* x, int64_t rows, int64_t cols, float* out) {
  const int64_t width = sum_kernel_width();
  if (width == 0 || rows < 2 || cols < 2) return false;
  // parallel_reduce's threshold
  if (rows * cols < kAtenGrainSize || at::get_num_threads() == 1 || at::in_parallel_region()) {
    column_sum_range(x, rows, cols, 0, cols, width, out);
    return true;
  }
  at::parallel_for(0, cols, 1, [&](int64_t begin, int64_t end) {
    constexpr int64_t kRound = 32;  // 128 bytes of floats
    begin -= begin % kRound;
    if (end != cols) end -= end % kRound;
    if (begin < end) column_sum_range(x, rows, cols, begin, end, width, out);
  });
  return true;
}

namespace {

// sum.dim_IntList(self, dim, keepdim, dtype=None) of a contiguous float32
// self over its leading dims 0..k-1 (k >= 1, at least one dim kept): CPU's
// outer sum of a [rows, cols] matrix (rows, cols >= 2), bit for bit, with
// CPU's split of the columns between threads (a TensorIterator's
// parallel_dim_reduction: at::parallel_for over the columns, chunk bounds
// rounded down to 32 columns) when it has one. False otherwise.
bool column_sum(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 4 || outs.size() != 1 || !a[0].isTensor() || !a[1].isIntList() || !a[3].isNone()) return false;
  const at::Tensor x = a[0].toTensor();
  if (!dense_f32(x) || sum_kernel_width() == 0 || x.dim() < 2) return false;
  const auto dims = a[1].toIntVector();
  uint64_t reduced = 0;
  for (int64_t d : dims) {
    if (d < -x.dim() || d >= x.dim()) return false;  // CPU raises its own error
    reduced |= uint64_t{1} << (d < 0 ? d + x.dim() : d);
  }
  const int64_t k = static_cast<int64_t>(__builtin_popcountll(reduced));
  if (k == 0 || k >= x.dim() || reduced != (uint64_t{1} << k) - 1 || static_cast<int64_t>(dims.size()) != k)
    return false;  // not exactly a set of leading dims
  int64_t rows = 1;
  for (int64_t d = 0; d < k; ++d) rows *= x.size(d);
  const int64_t cols = x.numel() / std::max<int64_t>(rows, 1);
  const at::Tensor& out = outs[0];
  if (rows < 2 || cols < 2 || !dense_f32(out) || out.numel() != cols) return false;
  return cpu_column_sums(x.const_data_ptr<float>(), rows, cols, out.data_ptr<float>());
}

// ---- the 2-norm of a whole tensor (clip_grad_norm_'s per-gradient norms) in CPU's order ----

// Whether CPU's float 2-norm kernel (norm_stub) here is its AVX2 one: torch
// 2.13's x86 build has no AVX512 one, so AVX512 CPUs run it too. Others decline.
bool norm_kernel_is_avx2() {
  static const bool avx2 = std::strcmp(kernel_capability<at::native::norm_stub_DECLARE_DISPATCH_type>(), "AVX2") == 0;
  return avx2;
}

// sqrt of the sum of squares of x[0, n) with the arithmetic of the AVX2 build
// of CPU's norm kernel (norm_kernel_tensor_iterator_impl's reduce-last-dim
// path, one output): 8 lanes acc += x * x (product rounded, then added) over
// the whole vectors, the lanes added in order, then the tail of n % 8 floats
// as that build's compiler emitted it: when 4 or more, 4 squares rounded and
// added in order, and the remaining ones (fewer than 4) as fused multiply-adds.
__attribute__((target("avx2"))) float norm2_avx2(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d < n - n % 8; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = lanes[0];
  for (int j = 1; j < 8; ++j) s = s + lanes[j];
  if (n - d >= 4) {
    for (const int64_t end = d + 4; d < end; ++d) {
      const float sq = x[d] * x[d];  // no fma in this function's target: rounded as CPU's vmulps
      s = s + sq;
    }
  }
  for (; d < n; ++d) s = std::fma(x[d], x[d], s);
  return std::sqrt(s);
}

// linalg_vector_norm(self, ord=2, dim=None or [], keepdim, dtype=None) of a
// contiguous float32 self of at least 2 elements into a float32 output, bit
// for bit as CPU's AVX2 norm kernel (one output element: no thread split).
// False otherwise (another ord, dims or dtype, a DEFAULT or AVX512 kernel):
// CPU's kernel runs.
bool vector_norm(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 5 || outs.size() != 1 || !a[0].isTensor() || !a[1].isScalar() || !a[4].isNone()) return false;
  if (!(a[2].isNone() || (a[2].isIntList() && a[2].toIntVector().empty()))) return false;
  const c10::Scalar ord = a[1].toScalar();
  const bool two = ord.isIntegral(false) ? ord.to<int64_t>() == 2 : ord.isFloatingPoint() && ord.to<double>() == 2.0;
  const at::Tensor x = a[0].toTensor();
  const at::Tensor& out = outs[0];
  if (!two || !norm_kernel_is_avx2() || !dense_f32(x) || x.numel() < 2 || !dense_f32(out) || out.numel() != 1)
    return false;
  *out.data_ptr<float>() = norm2_avx2(x.const_data_ptr<float>(), x.numel());
  return true;
}

// _foreach_norm.Scalar(tensors, ord, dtype) into outs (one per tensor), as CPU's
// kernel computes it: linalg_vector_norm of each whole tensor. Each 2-norm that
// vector_norm takes (contiguous float32, no dtype) runs it; every other tensor
// runs CPU's linalg_vector_norm.out into its output (the structured kernel of
// the functional op). Never declines; CPU's errors propagate.
bool foreach_norm(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (a.size() != 3 || !a[0].isTensorList() || !a[1].isScalar()) return false;
  const c10::List<at::Tensor> xs = a[0].toTensorList();
  if (xs.size() != outs.size()) return false;
  const c10::Scalar ord = a[1].toScalar();
  const std::optional<c10::ScalarType> dtype =
      a[2].isNone() ? std::nullopt : std::optional<c10::ScalarType>(a[2].toScalarType());
  torch::jit::Stack one{c10::IValue(), a[1], c10::IValue(), false, a[2]};
  std::vector<at::Tensor> out(1);
  for (size_t i = 0; i < outs.size(); ++i) {
    const at::Tensor x = xs.get(i);
    one[0] = x;
    out[0] = outs[i];
    if (vector_norm(one, out)) continue;
    at::Tensor o = outs[i];
    at::cpu::linalg_vector_norm_out(o, x, ord, std::nullopt, false, dtype);
  }
  return true;
}

// mm(self, mat2) / addmm(self, mat1, mat2, beta, alpha) into outs[0]: CPU's
// structured out= kernel (its meta checks, then its impl) called unboxed, as
// the boxed mm.out / addmm.out call runs it, without building the out= stack
// and unboxing it (~100 instructions a call of the llama step's 45 mms).
bool mm_into(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (outs.size() != 1 || a.size() != 2 || !a[0].isTensor() || !a[1].isTensor()) return false;
  at::Tensor out = outs[0];
  at::cpu::mm_out(out, a[0].toTensor(), a[1].toTensor());
  return true;
}
bool addmm_into(const torch::jit::Stack& a, const std::vector<at::Tensor>& outs) {
  if (outs.size() != 1 || a.size() != 5 || !a[0].isTensor() || !a[1].isTensor() || !a[2].isTensor()) return false;
  at::Tensor out = outs[0];
  at::cpu::addmm_out(out, a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), a[3].toScalar(), a[4].toScalar());
  return true;
}

using DirectKernel = bool (*)(const torch::jit::Stack&, const std::vector<at::Tensor>&);

// The direct kernel of an op (the lowering table's DirectImpl), or null.
DirectKernel direct_kernel(const c10::OperatorHandle& op) {
  switch (lowering_of(op).host) {
    case DirectImpl::kMaskedFill:
      return &masked_fill;
    case DirectImpl::kLayerNorm:
      return &layer_norm;
    case DirectImpl::kLayerNormBackward:
      return &layer_norm_backward;
    case DirectImpl::kClone:
      return &clone_into;
    case DirectImpl::kMaxPool2dWithIndices:
      return &max_pool2d_with_indices;
    case DirectImpl::kBatchNormTrain:
      return &batch_norm_train;
    case DirectImpl::kMaxPool2dBackward:
      return &max_pool2d_backward;
    case DirectImpl::kColumnSum:
      return &column_sum;
    case DirectImpl::kVectorNorm:
      return &vector_norm;
    case DirectImpl::kForeachNorm:
      return &foreach_norm;
    case DirectImpl::kMm:
      return &mm_into;
    case DirectImpl::kAddmm:
      return &addmm_into;
    case DirectImpl::kNone:
      break;
  }
  return nullptr;
}

}  // namespace

bool run_direct_kernel(const Node& n, const torch::jit::Stack& args, const std::vector<at::Tensor>& outs) {
  const DirectKernel kernel = direct_kernel(n.op);
  return kernel && kernel(args, outs);
}

bool has_direct_kernel(const Node& n) { return direct_kernel(n.op) != nullptr; }

bool writes_list_outputs(const Node& n) { return lowering_of(n.op).host == DirectImpl::kForeachNorm; }

bool takes_strided_inputs(const Node& n) { return lowering_of(n.op).strided_inputs; }

}  // namespace host
}  // namespace tpu_eager
