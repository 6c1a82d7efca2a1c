// CPU's float32 exp and log routines. ATen's exp / log kernels do not use
// at::vec (SLEEF) for float32 on x86-64: they call at::vml::vexp / vlog, which
// call MKL's VML (vmsExp / vmsLn) when torch is built with MKL, as its x86-64
// wheels are (ATen/cpu/vml.h). Code that must round exactly as torch.exp /
// torch.log calls these.
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace tpu {
namespace vml {

// True when the running torch provides MKL's VML, so exp/log below are CPU's.
bool available();

// y[i] = exp(x[i]) (log(x[i])) for i < n, rounded as CPU's torch.exp
// (torch.log) on float32; x may equal y. Requires available().
void exp(const float* x, float* y, int64_t n);
void log(const float* x, float* y, int64_t n);

}  // namespace vml
}  // namespace tpu
}  // namespace tpu_eager
