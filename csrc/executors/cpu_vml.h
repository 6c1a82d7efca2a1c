// CPU's float32 exp, log, sin, cos, tanh and sqrt routines. ATen's kernels
// of these ops do not use at::vec (SLEEF) for float32 on x86-64: they call
// at::vml::vexp / vlog / vsin / vcos / vtanh / vsqrt (UnaryOpsKernel.cpp),
// which call MKL's VML (vmsExp, vmsLn, ...) when torch is built with MKL, as
// its x86-64 wheels are (ATen/cpu/vml.h). Code that must round exactly as
// torch.exp etc. calls these.
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace vml {

// True when the running torch provides MKL's VML, so the routines below are CPU's.
bool available();

// y[i] = f(x[i]) for i < n, rounded as CPU's torch.f on float32; x may equal
// y. Require available().
void exp(const float* x, float* y, int64_t n);
void log(const float* x, float* y, int64_t n);
void sin(const float* x, float* y, int64_t n);
void cos(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void sqrt(const float* x, float* y, int64_t n);
// CPU's float32 erf kernel calls VML's erf too (vmsErf); bfloat16 / float16
// erf use at::vec's erf, as the fused loop does.
void erf(const float* x, float* y, int64_t n);

// gelu / gelu_backward with approximate='none' as CPU computes them, on n
// contiguous values of `type` (0 float32, 1 bfloat16, 2 float16) held as
// float32 (exactly representable in `type`): CPU's gelu and gelu_backward
// run oneDNN's eltwise kernels for contiguous float32 (and, on CPUs with
// AVX512 BW/VL/DQ, bfloat16) tensors instead of ATen's at::vec formula, so
// these call the CPU op itself (at::gelu_out / at::gelu_backward_out on
// tensors over the buffers, converted to `type`), rounding exactly as
// torch.nn.functional.gelu does. For MathRoutines::kCpu. x may equal y.
void gelu(int type, const float* x, float* y, int64_t n);
void gelu_backward(int type, const float* grad, const float* x, float* y, int64_t n);

}  // namespace vml
}  // namespace tpu_eager
