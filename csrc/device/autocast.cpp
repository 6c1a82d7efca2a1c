// Autocast for "tpu" (PRIVATEUSE1_NOTES pitfall 6): a fallthrough for ops
// without a policy, and CUDA's per-op policies (matmuls and convolutions in
// the lower-precision type, numerically sensitive ops in float32).
// <ATen/autocast_mode.h> pulls in most of ATen, so it lives in this unit alone.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at::autocast;
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using c10::optional;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TPU_FP32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
}

}  // namespace
