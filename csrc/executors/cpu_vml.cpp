// CPU's float32 exp and log through MKL's VML (see cpu_vml.h).
#include "executors/cpu_vml.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/Context.h>

// MKL's VML entry points (mkl_vml_functions.h), exported by libtorch_cpu when
// torch is built with MKL; weak so that the extension still loads without.
// MKL_INT is int (LP64, as ATen/cpu/vml.h assumes); the mode is MKL_INT64.
extern "C" {
__attribute__((weak)) void vmsExp(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsLn(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsSin(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsCos(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsTanh(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsSqrt(int n, const float* a, float* r, long long mode);
__attribute__((weak)) void vmsErf(int n, const float* a, float* r, long long mode);
}

namespace tpu_eager {
namespace vml {
namespace {

// The mode ATen passes (ATen/cpu/vml.h): VML_HA | VML_FTZDAZ_OFF |
// VML_ERRMODE_IGNORE, values from MKL's mkl_vml_defines.h.
constexpr long long kMode = 0x00000002 | 0x00140000 | 0x00000100;

// ATen splits calls at MKL_INT's maximum; so does this (n per call fits an int).
template <typename F>
void chunked(F f, const float* x, float* y, int64_t n) {
  constexpr int64_t kMax = 2147483647;
  for (int64_t i = 0; i < n; i += kMax) f(static_cast<int>(std::min(kMax, n - i)), x + i, y + i, kMode);
}

}  // namespace

bool available() {
  static const bool ok = at::hasMKL() && vmsExp != nullptr && vmsLn != nullptr && vmsSin != nullptr &&
                         vmsCos != nullptr && vmsTanh != nullptr && vmsSqrt != nullptr && vmsErf != nullptr;
  return ok;
}

void exp(const float* x, float* y, int64_t n) { chunked(vmsExp, x, y, n); }

void log(const float* x, float* y, int64_t n) { chunked(vmsLn, x, y, n); }

void sin(const float* x, float* y, int64_t n) { chunked(vmsSin, x, y, n); }

void cos(const float* x, float* y, int64_t n) { chunked(vmsCos, x, y, n); }

void tanh(const float* x, float* y, int64_t n) { chunked(vmsTanh, x, y, n); }

void sqrt(const float* x, float* y, int64_t n) { chunked(vmsSqrt, x, y, n); }

void erf(const float* x, float* y, int64_t n) { chunked(vmsErf, x, y, n); }

namespace {

at::ScalarType scalar_type(int type) { return type == 1 ? at::kBFloat16 : type == 2 ? at::kHalf : at::kFloat; }

// A tensor of `type` over (float32) or converted from (bfloat16 / float16) n floats.
at::Tensor wrap(int type, const float* x, int64_t n) {
  const at::Tensor f = at::from_blob(const_cast<float*>(x), {n}, at::TensorOptions().dtype(at::kFloat));
  return type == 0 ? f : f.to(scalar_type(type));
}

// Writes t (of n elements) into y as floats.
void unwrap(const at::Tensor& t, float* y, int64_t n) {
  at::Tensor out = at::from_blob(y, {n}, at::TensorOptions().dtype(at::kFloat));
  if (t.data_ptr() != out.data_ptr()) out.copy_(t);
}

}  // namespace

void gelu(int type, const float* x, float* y, int64_t n) {
  const at::Tensor in = wrap(type, x, n);
  at::Tensor out = type == 0 ? at::from_blob(y, {n}, at::TensorOptions().dtype(at::kFloat)) : at::empty_like(in);
  at::gelu_out(out, in, "none");
  unwrap(out, y, n);
}

void gelu_backward(int type, const float* grad, const float* x, float* y, int64_t n) {
  const at::Tensor g = wrap(type, grad, n), in = wrap(type, x, n);
  at::Tensor out = type == 0 ? at::from_blob(y, {n}, at::TensorOptions().dtype(at::kFloat)) : at::empty_like(in);
  at::gelu_backward_out(out, g, in, "none");
  unwrap(out, y, n);
}

}  // namespace vml
}  // namespace tpu_eager
