// CPU kernels writing into given outputs (see direct_kernels.h).
#include "executors/direct_kernels.h"

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
#include <ATen/native/layer_norm.h>

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
  using Stub = at::native::LayerNormKernel_DECLARE_DISPATCH_type;
  const auto kernel = cpu_kernel<Stub>();
  if (kernel && kernel == Stub::AVX512) return "AVX512";
  if (kernel && kernel == Stub::AVX2) return "AVX2";
  return "DEFAULT";
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

bool takes_strided_inputs(const Node& n) { return lowering_of(n.op).strided_inputs; }

}  // namespace host
}  // namespace tpu_eager
