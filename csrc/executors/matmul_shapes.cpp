// The products of a matmul-family op (see matmul_shapes.h).
#include "executors/matmul_shapes.h"

#include "jit/lowering.h"

#include <string>
#include <utility>

namespace tpu_eager {

const TensorRef* arg_ref(const Node& n, int arg) {
  for (const auto& in : n.inputs)
    if (in.arg == arg && in.elem < 0) return &in.ref;
  return nullptr;
}

bool gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb) {
  const Lowering& l = lowering_of(n.op);
  const TensorRef* a = l.a_arg >= 0 ? arg_ref(n, l.a_arg) : nullptr;
  const TensorRef* b = l.b_arg >= 0 ? arg_ref(n, l.b_arg) : nullptr;
  if (a && b) {
    ta = a->dtype;
    tb = b->dtype;
  }
  auto dims_ok = [](const TensorRef* r, size_t rank) { return r && r->sizes().size() == rank; };
  switch (l.mxu) {
    case MxuOp::kMm:
    case MxuOp::kAddmm:
      if (!dims_ok(a, 2) || !dims_ok(b, 2)) return false;
      out.push_back({1, double(a->sizes()[0]), double(a->sizes()[1]), double(b->sizes()[1])});
      return true;
    case MxuOp::kBmm:
    case MxuOp::kBaddbmm:
    case MxuOp::kAddbmm:
      if (!dims_ok(a, 3) || !dims_ok(b, 3)) return false;
      out.push_back({double(a->sizes()[0]), double(a->sizes()[1]), double(a->sizes()[2]), double(b->sizes()[2])});
      return true;
    case MxuOp::kMv:
    case MxuOp::kAddmv:
      if (!dims_ok(a, 2) || !dims_ok(b, 1)) return false;
      out.push_back({1, double(a->sizes()[0]), double(a->sizes()[1]), 1});
      return true;
    case MxuOp::kDot:
    case MxuOp::kVdot:
      if (!dims_ok(a, 1) || !dims_ok(b, 1)) return false;
      out.push_back({1, 1, double(a->sizes()[0]), 1});
      return true;
    case MxuOp::kAddr:  // outer product: K = 1
      if (!dims_ok(a, 1) || !dims_ok(b, 1)) return false;
      out.push_back({1, double(a->sizes()[0]), 1, double(b->sizes()[0])});
      return true;
    default:
      return false;
  }
}

bool gemm_operand_args(const Node& n, int& a, int& b) {
  const Lowering& l = lowering_of(n.op);
  if (l.a_arg < 0 || l.mxu == MxuOp::kConvolutionBackward) return false;
  a = l.a_arg;
  b = l.b_arg;
  return true;
}

namespace {

double spatial(c10::IntArrayRef sizes) {  // product of the dims after (batch, channels)
  double p = 1;
  for (size_t i = 2; i < sizes.size(); ++i) p *= static_cast<double>(sizes[i]);
  return p;
}

}  // namespace

bool conv_gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb,
                   double& bias_elems) {
  bias_elems = 0;
  const MxuOp op = lowering_of(n.op).mxu;
  const bool forward = op == MxuOp::kConvolution;
  if (!forward && op != MxuOp::kConvolutionBackward) return false;
  // forward: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
  // backward: (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
  //            output_padding, groups, output_mask)
  const int in_arg = forward ? 0 : 1, w_arg = forward ? 1 : 2;
  const size_t transposed_arg = forward ? 6 : 7, groups_arg = forward ? 8 : 9;
  const TensorRef* x = arg_ref(n, in_arg);
  const TensorRef* w = arg_ref(n, w_arg);
  if (!x || !w || x->sizes().size() < 3 || w->sizes().size() != x->sizes().size() || n.args.size() <= groups_arg)
    return false;
  const bool transposed = n.args[transposed_arg].isBool() && n.args[transposed_arg].toBool();
  const double groups = n.args[groups_arg].isInt() ? static_cast<double>(n.args[groups_arg].toInt()) : 1.0;
  const TensorRef* y = nullptr;  // the convolution's output (forward) or its gradient (backward)
  if (forward) {
    if (n.outputs.empty()) return false;
    y = &n.outputs[0];
  } else {
    y = arg_ref(n, 0);
  }
  if (!y || y->sizes().size() != x->sizes().size()) return false;
  ta = x->dtype;
  tb = w->dtype;
  const double batch = static_cast<double>(x->sizes()[0]);
  const double cin = static_cast<double>(x->sizes()[1]), cout = static_cast<double>(y->sizes()[1]);
  const double kernel = spatial(w->sizes());
  // A transposed convolution is the input gradient of a direct one with x and y swapped.
  const double pos_src = batch * spatial(transposed ? x->sizes() : y->sizes());  // direct conv: output positions
  const double c_src = transposed ? cout : cin;                                  // channels of the direct conv's input
  const double c_dst = transposed ? cin : cout;                                  // channels of the direct conv's output
  if (forward) {
    if (transposed)
      out.push_back({1, pos_src, c_dst / groups, c_src * kernel});
    else
      out.push_back({1, pos_src, c_src / groups * kernel, c_dst});
    return true;
  }
  std::vector<bool> mask = {true, true, true};
  const auto& m = n.args.back();
  if (m.isBoolList()) {
    auto l = m.toBoolList();
    for (size_t i = 0; i < 3 && i < l.size(); ++i) mask[i] = l.get(i);
  }
  const bool grad_x = mask[0], grad_w = mask[1];
  // grad_x: for a direct conv the transposed product (col2im form); for a
  // transposed conv, whose x is the direct conv's output, a direct convolution.
  if (grad_x) {
    if (transposed)
      out.push_back({1, pos_src, c_src / groups * kernel, c_dst});
    else
      out.push_back({1, pos_src, c_dst / groups, c_src * kernel});
  }
  if (grad_w) out.push_back({1, c_dst, pos_src, c_src / groups * kernel});
  if (mask[2]) bias_elems = static_cast<double>(y->numel());
  return true;
}

}  // namespace tpu_eager
