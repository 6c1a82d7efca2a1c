// df16 codec over arrays and tensors (format and rounding rules in df16.h).
#include "executors/spyre/df16.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "executors/cpu_vml.h"

namespace tpu_eager {
namespace spyre {

namespace {

// Below this many elements one thread is faster than waking the pool.
constexpr int64_t kGrain = 1 << 15;

// Elements per inner block: a fixed trip count is what lets GCC's -O2 (cheap)
// vectorizer take the loop; the tail runs scalar.
constexpr int64_t kBlock = 64;

// dst[i] = f(src[i]) in blocks of kBlock (src and dst may be the same array:
// each element is read before it is written). Inlined into each caller, so it
// takes the caller's target (the AVX2 clones below vectorize it).
template <typename In, typename Out, typename F>
inline void map_blocked(const In* src, Out* dst, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) dst[i + j] = f(src[i + j]);
  for (; i < n; ++i) dst[i] = f(src[i]);
}

// The modes are template parameters so each loop body is one fixed select
// chain. Works on the IEEE bits (memcpy'd floats do not vectorize).
template <Df16Rounding R, Df16Overflow O>
void encode_loop(const uint32_t* __restrict src, uint16_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_from_f32_bits(u, R, O); });
}

void decode_loop(const uint16_t* __restrict src, uint32_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint16_t h) { return df16_to_f32_bits(h); });
}

// Built for AVX2 and for the baseline; the loader picks the CPU's (ifunc).
__attribute__((target_clones("avx2", "default"))) void round_loop(const uint32_t* __restrict src,
                                                                  uint32_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_round_f32_bits(u); });
}

__attribute__((target_clones("avx2", "default"))) void round_bf16_loop(const uint32_t* __restrict src,
                                                                       uint16_t* __restrict dst, int64_t n) {
  map_blocked(src, dst, n, [](uint32_t u) { return df16_round_bf16_bits(u); });
}

__attribute__((target_clones("avx2", "default"))) void round_bf16_in_place_loop(uint16_t* p, int64_t n) {
  map_blocked(p, p, n, [](uint16_t b) { return df16_round_bf16_bits(static_cast<uint32_t>(b) << 16); });
}

// The IEEE bits of f (as memcpy gives them); unlike memcpy, the builtin
// keeps a loop over an array of floats vectorizable.
inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

// The float32 value of an element: bfloat16 bits widen exactly by a shift.
inline float widen(float v) { return v; }
inline float widen(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

// Softmax's normalizing pass over `rows` rows of n contiguous values (f32,
// or bf16 bits read as their exact f32 widening):
// dst[r * n + j] = bf16 bits of df16(exp(x[r * n + j] - m[j]) / s[j]). The
// difference and the quotient are IEEE f32 (as at::sub's and at::div's), the
// exp is CPU's float32 exp (vml::exp, as torch.exp), so each value is the one
// x.float().sub(m).exp().div(s) gives, rounded once. `buf` holds rows * n +
// kBlock floats (the exps; a row's last partial block reads past its end),
// `s` is padded with ones to a whole number of blocks. One exp call for all
// rows: MKL's VML costs microseconds per call.
template <typename In>
__attribute__((always_inline)) inline void softmax_bf16_rows(const In* __restrict x, const float* __restrict m,
                                                             const float* __restrict s, float* __restrict buf,
                                                             uint16_t* __restrict dst, int64_t rows, int64_t n) {
  const int64_t whole = n / kBlock * kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const In* xr = x + r * n;
    float* br = buf + r * n;
    for (int64_t j = 0; j < whole; j += kBlock)
      for (int64_t k = 0; k < kBlock; ++k) br[j + k] = widen(xr[j + k]) - m[j + k];
    for (int64_t j = whole; j < n; ++j) br[j] = widen(xr[j]) - m[j];
  }
  vml::exp(buf, buf, rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    const float* br = buf + r * n;
    uint16_t* o = dst + r * n;
    for (int64_t j = 0; j < whole; j += kBlock)
      for (int64_t k = 0; k < kBlock; ++k) o[j + k] = df16_round_bf16_bits(f32_bits(br[j + k] / s[j + k]));
    if (whole < n) {
      uint16_t t[kBlock];
      for (int64_t k = 0; k < kBlock; ++k) t[k] = df16_round_bf16_bits(f32_bits(br[whole + k] / s[whole + k]));
      std::memcpy(o + whole, t, static_cast<size_t>(n - whole) * sizeof(uint16_t));
    }
  }
}

// softmax_bf16_rows of each input type, built for AVX2 and the baseline.
__attribute__((target_clones("avx2", "default"))) void softmax_rows(const float* x, const float* m, const float* s,
                                                                    float* buf, uint16_t* dst, int64_t rows,
                                                                    int64_t n) {
  softmax_bf16_rows(x, m, s, buf, dst, rows, n);
}
__attribute__((target_clones("avx2", "default"))) void softmax_rows(const uint16_t* x, const float* m, const float* s,
                                                                    float* buf, uint16_t* dst, int64_t rows,
                                                                    int64_t n) {
  softmax_bf16_rows(x, m, s, buf, dst, rows, n);
}

}  // namespace

bool df16_softmax_bf16_available() { return vml::available(); }

void df16_softmax_bf16_into(const at::Tensor& out, const at::Tensor& x, const at::Tensor& m, const at::Tensor& s) {
  const int64_t n = s.numel();
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  if (rows == 0) return;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const void* in = x.const_data_ptr();
  const float* mv = m.const_data_ptr<float>();
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
  // The sums padded with ones to whole blocks (a row's last block divides
  // past its end; those quotients are dropped).
  std::vector<float> sp((n + kBlock - 1) / kBlock * kBlock, 1.0f);
  std::copy(s.const_data_ptr<float>(), s.const_data_ptr<float>() + n, sp.begin());
  // Rows per chunk: about kChunk elements, whose exps stay in L2 between the
  // steps (no f32 tensor of x's size is written), in few exp calls.
  constexpr int64_t kChunk = 1 << 15;
  const int64_t chunk_rows = std::max<int64_t>(1, kChunk / n);
  at::parallel_for(0, rows, chunk_rows, [&](int64_t b, int64_t e) {
    // Not zeroed (every exp is written before it is read) but for the slack
    // past the last row, which the last block reads.
    const int64_t used = std::min(chunk_rows, e - b) * n;
    std::unique_ptr<float[]> buf(new float[used + kBlock]);
    std::fill(buf.get() + used, buf.get() + used + kBlock, 1.0f);
    for (int64_t r = b; r < e; r += chunk_rows) {
      const int64_t len = std::min(chunk_rows, e - r);
      if (bf16)
        softmax_rows(static_cast<const uint16_t*>(in) + r * n, mv, sp.data(), buf.get(), o + r * n, len, n);
      else
        softmax_rows(static_cast<const float*>(in) + r * n, mv, sp.data(), buf.get(), o + r * n, len, n);
    }
  });
}

void df16_round_bf16_in_place(uint16_t* p, int64_t n) { round_bf16_in_place_loop(p, n); }

void df16_round_bf16_array(const uint32_t* src, uint16_t* dst, int64_t n) { round_bf16_loop(src, dst, n); }

void df16_round_array(const uint32_t* src, uint32_t* dst, int64_t n) { round_loop(src, dst, n); }

void df16_encode_array(const uint32_t* src, uint16_t* dst, int64_t n, Df16Rounding rounding, Df16Overflow overflow) {
  const bool away = rounding == Df16Rounding::kNearestAway;
  const bool nan_inf = overflow == Df16Overflow::kNanInf;
  if (away && nan_inf)
    encode_loop<Df16Rounding::kNearestAway, Df16Overflow::kNanInf>(src, dst, n);
  else if (away)
    encode_loop<Df16Rounding::kNearestAway, Df16Overflow::kSaturate>(src, dst, n);
  else if (nan_inf)
    encode_loop<Df16Rounding::kNearestEven, Df16Overflow::kNanInf>(src, dst, n);
  else
    encode_loop<Df16Rounding::kNearestEven, Df16Overflow::kSaturate>(src, dst, n);
}

void df16_decode_array(const uint16_t* src, uint32_t* dst, int64_t n) { decode_loop(src, dst, n); }

at::Tensor df16_encode(const at::Tensor& x, Df16Rounding rounding, Df16Overflow overflow) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), "df16_encode expects a floating-point tensor, got ",
                   x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "df16_encode expects a CPU tensor, got one on ", x.device());
  // The f32 values as their bits (a dtype view, no copy).
  const at::Tensor src = x.to(at::kFloat).contiguous().view(at::kInt);
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kShort));
  const auto* in = reinterpret_cast<const uint32_t*>(src.const_data_ptr<int32_t>());
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<int16_t>());
  at::parallel_for(0, src.numel(), kGrain, [&](int64_t begin, int64_t end) {
    df16_encode_array(in + begin, o + begin, end - begin, rounding, overflow);
  });
  return out;
}

at::Tensor df16_decode(const at::Tensor& bits) {
  TORCH_CHECK_TYPE(bits.scalar_type() == at::kShort, "df16_decode expects an int16 tensor of df16 bits, got ",
                   bits.scalar_type());
  TORCH_CHECK(bits.device().is_cpu(), "df16_decode expects a CPU tensor, got one on ", bits.device());
  const at::Tensor src = bits.contiguous();
  // Written as f32 bits into an int32 buffer, returned as its float32 view.
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kInt));
  const auto* in = reinterpret_cast<const uint16_t*>(src.const_data_ptr<int16_t>());
  auto* o = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<int32_t>());
  at::parallel_for(0, src.numel(), kGrain,
                   [&](int64_t begin, int64_t end) { df16_decode_array(in + begin, o + begin, end - begin); });
  return out.view(at::kFloat);
}

void df16_round_bf16_into(const at::Tensor& out, const at::Tensor& x) {
  const auto* in = reinterpret_cast<const uint32_t*>(x.const_data_ptr<float>());
  auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_bf16_array(in + b, o + b, e - b); });
}

at::Tensor df16_round_as(const at::Tensor& x, c10::ScalarType dtype) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), "df16_round expects a floating-point tensor, got ",
                   x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "df16_round expects a CPU tensor, got one on ", x.device());
  if (dtype == at::kBFloat16) {  // rounding and conversion in one pass
    const at::Tensor f32 = x.to(at::kFloat).contiguous();
    at::Tensor b16 = at::empty(f32.sizes(), f32.options().dtype(at::kBFloat16));
    df16_round_bf16_into(b16, f32);
    return b16;
  }
  const at::Tensor src = x.to(at::kFloat).contiguous().view(at::kInt);
  const auto* in = reinterpret_cast<const uint32_t*>(src.const_data_ptr<int32_t>());
  at::Tensor out = at::empty(src.sizes(), src.options());
  auto* o = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<int32_t>());
  at::parallel_for(0, src.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_array(in + b, o + b, e - b); });
  const at::Tensor r = out.view(at::kFloat);
  return dtype == at::kFloat ? r : r.to(dtype);
}

at::Tensor df16_round(const at::Tensor& x, Df16Rounding rounding, Df16Overflow overflow) {
  // The default modes: one 32-bit pass (the same values as encode + decode).
  if (rounding == Df16Rounding::kNearestAway && overflow == Df16Overflow::kNanInf)
    return df16_round_as(x, x.scalar_type());
  return df16_decode(df16_encode(x, rounding, overflow)).to(x.scalar_type());
}

void df16_round_(const at::Tensor& x) {
  if (x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.device().is_cpu()) {
    auto* p = reinterpret_cast<uint16_t*>(x.mutable_data_ptr<at::BFloat16>());
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { df16_round_bf16_in_place(p + b, e - b); });
    return;
  }
  x.copy_(df16_round(x));
}

}  // namespace spyre
}  // namespace tpu_eager
