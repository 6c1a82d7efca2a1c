// CPU's float32 exp, log, sin, cos, tanh and sqrt routines. ATen's kernels
// of these ops do not use at::vec (SLEEF) for float32 on x86-64: they call
// at::vml::vexp / vlog / vsin / vcos / vtanh / vsqrt (UnaryOpsKernel.cpp),
// which call MKL's VML (vmsExp, vmsLn, ...) when torch is built with MKL, as
// its x86-64 wheels are (ATen/cpu/vml.h). Code that must round exactly as
// torch.exp etc. calls these.
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace tpu {
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

}  // namespace vml
}  // namespace tpu
}  // namespace tpu_eager
