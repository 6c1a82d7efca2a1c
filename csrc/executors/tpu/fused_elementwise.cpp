// Fused elementwise regions: planning the register program of a region
// (the tile loops are in fused_kernels_*.cpp, one per instruction set).
#include "executors/tpu/fused_elementwise.h"

#include <ATen/Version.h>
#include <c10/util/accumulate.h>

#include "executors/direct_kernels.h"
#include "executors/aten_grain.h"
#include "executors/cpu_features.h"
#include "executors/cpu_vml.h"
#include "executors/tpu/fused_program.h"
#include "jit/lowering.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <unordered_map>
#include <cmath>
#include <cstdint>
#include <mutex>

namespace tpu_eager {
namespace tpu {
namespace {

using fused::Fn;
using fused::Instr;
using fused::Operand;

using fused::Elem;
using tpu_eager::RowReduce;

// How an op's arguments map to loop instructions (plan_loop lowers each form).
enum class Form : uint8_t {
  kUnary,         // fn(self)
  kBinary,        // fn(self, other): other a tensor or a Scalar
  kAdd,           // self + alpha * other
  kSub,           // self - alpha * other
  kRsub,          // other - alpha * self
  kCompare,       // fn(self, other) as a bool (or self's type, in place)
  kWhereSelf,     // where(condition, self, other)
  kMaskedFill,    // masked_fill(self, mask, value: Scalar)
  kClamp,         // clamp(self, min?, max?), Scalar or Tensor bounds
  kClampOne,      // clamp_min / clamp_max(self, bound)
  kPowScalar,     // pow(self, exponent: Scalar), exponents 2, 3 (0.5, -0.5, -1 for float32)
  kGelu,          // gelu(self, approximate)
  kGeluBwd,       // gelu_backward(grad_output, self, approximate)
  kThresholdBwd,  // threshold_backward(grad_output, self, threshold)
  kLerp,          // lerp(self, end, weight: Scalar)
  kAddcmul,       // addcmul(self, t1, t2, value)
  kAddcdiv,
  kLogical,     // fn(self, other) of bool tensors into a bool (0 / 1 values: and = a * b, or = max, xor = a != b)
  kLogicalNot,  // not(self) of a bool tensor (a == 0)
  kCast,        // copy_(self, src): an int32 / int64 / bool src into a float32 self (src * 1, exact)
};

// How a Scalar (or 0-dim tensor) operand of a bfloat16 / float16 op enters
// its computation: rounded to the op's type (kCast: CPU's TensorIterator
// casts it to the common type), or as float32 (kOpmath: CPU's mul / div
// kernels read a scalar operand's original value, BinaryOpsKernel.cpp).
enum class ScalarIn : uint8_t { kCast, kOpmath };

constexpr uint8_t kF32 = 1, kBF16 = 2, kF16 = 4, kAnyFloat = kF32 | kBF16 | kF16;
constexpr uint8_t kB = 8;  // bool operands and result only (exact as the loop's 0.0f / 1.0f)

// One op's lowering: its name (without "aten::" and an in-place '_'), the
// overloads taken (comma-separated; functional / in-place, then out=), its
// form and function, the types it is bit-equal to CPU's kernel in (tested in
// tests/executors/tpu/test_fused_vocab.py; see docs/performance.md for where CPU's kernel
// differs and why a type is left out), and how a Scalar enters.
struct Lowering {
  std::string_view name;
  std::string_view overloads;
  std::string_view out_overloads;
  Form form;
  Fn fn;
  uint8_t dtypes;
  ScalarIn scalar = ScalarIn::kCast;
};

// The fused loops' vocabulary, one row per op. Transcendental float32 unary
// ops follow set_fused_math (fused_program.h); bfloat16 / float16 versions of
// them call SLEEF in CPU's kernels and are left to run op by op.
// - sigmoid_backward: CPU's float16 kernel rounds each product to float16
//   (Vectorized<Half> arithmetic); bfloat16 computes in float32.
// - pow: float16 calls SLEEF's pow; bfloat16 0.5 / -0.5 / -1 are sqrt / rsqrt
//   / reciprocal kernels of their own.
constexpr Lowering kLowerings[] = {
    {"add", "Tensor,Scalar", "out", Form::kAdd, Fn::kAdd, kAnyFloat},
    {"sub", "Tensor,Scalar", "out", Form::kSub, Fn::kAdd, kAnyFloat},
    {"rsub", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kRsub, Fn::kAdd, kAnyFloat},
    {"mul", "Tensor,Scalar", "out", Form::kBinary, Fn::kMul, kAnyFloat, ScalarIn::kOpmath},
    {"div", "Tensor,Scalar", "out", Form::kBinary, Fn::kDiv, kAnyFloat, ScalarIn::kOpmath},
    {"neg", "", "out", Form::kUnary, Fn::kNeg, kAnyFloat},
    {"abs", "", "out", Form::kUnary, Fn::kAbs, kAnyFloat},
    {"relu", "", "out", Form::kUnary, Fn::kRelu, kAnyFloat},
    {"exp", "", "out", Form::kUnary, Fn::kExp, kF32},
    {"log", "", "out", Form::kUnary, Fn::kLog, kF32},
    {"sin", "", "out", Form::kUnary, Fn::kSin, kF32},
    {"cos", "", "out", Form::kUnary, Fn::kCos, kF32},
    {"tanh", "", "out", Form::kUnary, Fn::kTanh, kF32},
    {"sigmoid", "", "out", Form::kUnary, Fn::kSigmoid, kF32},
    {"sqrt", "", "out", Form::kUnary, Fn::kSqrt, kF32},
    {"rsqrt", "", "out", Form::kUnary, Fn::kRsqrt, kF32},
    {"reciprocal", "", "out", Form::kUnary, Fn::kReciprocal, kF32},
    {"sign", "", "out", Form::kUnary, Fn::kSign, kAnyFloat},
    {"silu", "", "out", Form::kUnary, Fn::kSilu, kAnyFloat},
    {"silu_backward", "", "grad_input", Form::kBinary, Fn::kSiluBwd, kAnyFloat},
    {"erf", "", "out", Form::kUnary, Fn::kErf, kAnyFloat},
    {"eq", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kEq, kAnyFloat},
    {"ne", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kNe, kAnyFloat},
    {"lt", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kLt, kAnyFloat},
    {"le", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kLe, kAnyFloat},
    {"gt", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kGt, kAnyFloat},
    {"ge", "Tensor,Scalar", "Tensor_out,Scalar_out", Form::kCompare, Fn::kGe, kAnyFloat},
    {"where", "self", "self_out", Form::kWhereSelf, Fn::kSelect, kAnyFloat},
    {"masked_fill", "Scalar", "Scalar_out", Form::kMaskedFill, Fn::kWhere, kAnyFloat},
    {"maximum", "", "out", Form::kBinary, Fn::kMaximum, kAnyFloat},
    {"minimum", "", "out", Form::kBinary, Fn::kMinimum, kAnyFloat},
    {"clamp", ",Tensor", "out,Tensor_out", Form::kClamp, Fn::kClampMin, kAnyFloat},
    {"clamp_min", ",Tensor", "out,Tensor_out", Form::kClampOne, Fn::kClampMin, kAnyFloat},
    {"clamp_max", ",Tensor", "out,Tensor_out", Form::kClampOne, Fn::kClampMax, kAnyFloat},
    {"pow", "Tensor_Scalar,Scalar", "Tensor_Scalar_out", Form::kPowScalar, Fn::kMul, kF32 | kBF16},
    {"gelu", "", "out", Form::kGelu, Fn::kGelu, kAnyFloat},
    {"gelu_backward", "", "grad_input", Form::kGeluBwd, Fn::kGeluBwd, kAnyFloat},
    // CPU's threshold kernel compares a bfloat16 / float16 self with the threshold as float32.
    {"threshold_backward", "", "grad_input", Form::kThresholdBwd, Fn::kThresholdBwd, kAnyFloat, ScalarIn::kOpmath},
    {"sigmoid_backward", "", "grad_input", Form::kBinary, Fn::kSigmoidBwd, kF32 | kBF16},
    {"tanh_backward", "", "grad_input", Form::kBinary, Fn::kTanhBwd, kAnyFloat},
    {"lerp", "Scalar", "Scalar_out", Form::kLerp, Fn::kAdd, kF32},
    {"addcmul", "", "out", Form::kAddcmul, Fn::kFma, kF32},
    {"addcdiv", "", "out", Form::kAddcdiv, Fn::kAdd, kF32},
    {"logical_and", "", "out", Form::kLogical, Fn::kMul, kB},
    {"logical_or", "", "out", Form::kLogical, Fn::kMaximum, kB},
    {"logical_xor", "", "out", Form::kLogical, Fn::kNe, kB},
    {"logical_not", "", "out", Form::kLogicalNot, Fn::kEq, kB},
    {"bitwise_and", "Tensor", "Tensor_out", Form::kLogical, Fn::kMul, kB},
    {"bitwise_or", "Tensor", "Tensor_out", Form::kLogical, Fn::kMaximum, kB},
    {"bitwise_xor", "Tensor", "Tensor_out", Form::kLogical, Fn::kNe, kB},
    {"bitwise_not", "", "out", Form::kLogicalNot, Fn::kEq, kB},
    // An integer or bool tensor cast into a float32 one joins the float loop (int_loop_domain 2).
    {"copy", "", "", Form::kCast, Fn::kMul, kF32},
};

// The lowering of op `name` (no in-place '_') at `overload`, or null.
const Lowering* lowering_of(std::string_view name, std::string_view overload, bool is_out) {
  return find_lowering(kLowerings, name, overload, is_out);
}

// The loop element type of a tensor type; kFloat for an unsupported one is
// never returned: `ok` says whether it is one. int32 / int64 are loop types
// only as a cast's source (`ints`).
Elem elem_of(at::ScalarType t, bool* ok = nullptr, bool ints = false) {
  if (ok) *ok = true;
  switch (t) {
    case at::kInt:
    case at::kLong:
      if (ok) *ok = ints;
      return t == at::kInt ? Elem::kInt32 : Elem::kInt64;
    case at::kFloat:
      return Elem::kFloat;
    case at::kBool:
      return Elem::kBool;
    case at::kBFloat16:
      return Elem::kBFloat16;
    case at::kHalf:
      return Elem::kHalf;
    default:
      if (ok) *ok = false;
      return Elem::kBool;  // never a computation type
  }
}

uint8_t dtype_bit(Elem e) {
  return e == Elem::kFloat ? kF32 : e == Elem::kBFloat16 ? kBF16 : e == Elem::kHalf ? kF16 : kB;
}

int64_t elem_size(Elem e) {
  return e == Elem::kInt64 ? 8 : e == Elem::kFloat || e == Elem::kInt32 ? 4 : e == Elem::kBool ? 1 : 2;
}

// v rounded to bfloat16 / float16 as c10 converts (kFloat: v).
float round_to(float v, Elem e) {
  if (e == Elem::kBFloat16) return static_cast<float>(c10::BFloat16(v));
  if (e == Elem::kHalf) return static_cast<float>(c10::Half(v));
  return v;
}

// A real Scalar as the float32 the computation uses. CPU wraps such an
// operand and casts it without an overflow check (x * 1e300 is inf), where
// Scalar::toFloat() would throw; planning must not throw.
float as_float(const at::Scalar& s) {
  if (s.isFloatingPoint()) return static_cast<float>(s.toDouble());
  if (s.isBoolean()) return s.toBool() ? 1.0f : 0.0f;
  if (s.type() == c10::ScalarType::UInt64) return static_cast<float>(s.toUInt64());
  return static_cast<float>(s.toLong());
}

// A scalar argument (Python number or 0-dim tensor) as a float constant.
bool scalar_operand(const c10::IValue& v, Operand* op) {
  if (v.isScalar()) {
    const auto s = v.toScalar();
    if (s.isComplex()) return false;
    op->kind = Operand::kConst;
    op->value = as_float(s);
    return true;
  }
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().dim() == 0 && v.toTensor().device().is_cpu() &&
      !v.toTensor().is_complex()) {
    // A wrapped Python number (double or int64) read in place: item() is an op call.
    const at::Tensor& t = v.toTensor();
    op->kind = Operand::kConst;
    op->value = t.scalar_type() == at::kDouble ? static_cast<float>(*t.const_data_ptr<double>())
                : t.scalar_type() == at::kLong ? static_cast<float>(*t.const_data_ptr<int64_t>())
                                               : as_float(t.item());
    return true;
  }
  return false;
}

// sum.dim_IntList / mean.dim (`row`: kSum / kMean) over one dim (`*dim`) of
// a float32 tensor of shape `sizes` with no dtype argument: CPU's float sum
// over a contiguous last dim (lse::sum_row's order), mean its sum divided by
// the count. False for anything else, and for one row of at least GRAIN_SIZE
// (32,768) floats, which CPU's sum splits between threads.
bool per_row_sum(RowReduce row, const Node& n, c10::IntArrayRef sizes, fused::RowOp* op, int64_t* dim) {
  if (row != RowReduce::kSum && row != RowReduce::kMean) return false;
  if (n.args.size() < 4 || !n.args[1].isIntList() || n.args[1].toIntList().size() != 1 || !n.args[2].isBool() ||
      !n.args[3].isNone())
    return false;
  if (n.inputs.size() != 1 || n.inputs[0].ref.dtype != at::kFloat) return false;
  if (!sizes.empty() && sizes.back() >= kAtenGrainSize && c10::multiply_integers(sizes) == sizes.back()) return false;
  *op = row == RowReduce::kSum ? fused::RowOp::kSum : fused::RowOp::kMean;
  *dim = n.args[1].toIntList().get(0);
  return true;
}

// Whether `op` leaves one value per row that later loops of the region read
// (kSum / kMean: an RMSNorm's mean(x ** 2, -1, keepdim=True)).
bool per_row_value(fused::RowOp op) { return op == fused::RowOp::kSum || op == fused::RowOp::kMean; }

// _softmax / _log_softmax / logsumexp (`row`, the op's lowering) over the
// last dim of a float32 tensor of shape `sizes`, as CPU computes them; sum /
// mean (per_row_sum).
bool row_anchor(RowReduce row, const Node& n, c10::IntArrayRef sizes, fused::RowOp* op) {
  int64_t dim = 0;
  if (row == RowReduce::kSoftmax || row == RowReduce::kLogSoftmax) {
    if (!n.args[1].isInt() || !n.args[2].isBool() || n.args[2].toBool()) return false;
    *op = row == RowReduce::kSoftmax ? fused::RowOp::kSoftmax : fused::RowOp::kLogSoftmax;
    dim = n.args[1].toInt();
  } else if (row == RowReduce::kLogSumExp) {
    if (!vml::available() || !n.args[1].isIntList() || n.args[1].toIntList().size() != 1) return false;
    *op = fused::RowOp::kLogSumExp;
    dim = n.args[1].toIntList().get(0);
    // A single row of at least GRAIN_SIZE (32,768) floats: CPU's sum splits it
    // between threads (two-pass reduction), an order the row loop does not follow.
    if (!sizes.empty() && sizes.back() >= kAtenGrainSize && c10::multiply_integers(sizes) == sizes.back()) return false;
  } else if (!per_row_sum(row, n, sizes, op, &dim)) {
    return false;
  }
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  return ndim > 0 && (dim == ndim - 1 || dim == -1);
}

// native_layer_norm's normalized_shape as `cols` (normalized_cols).
bool layer_norm_cols(const Node& n, c10::IntArrayRef shape, int64_t* cols) {
  if (!n.op.schema().overload_name().empty() || n.outputs.size() != 3 || !n.args[1].isIntList() ||
      !n.args[4].isDouble())
    return false;
  if (!normalized_cols(n.args[1].toIntVector(), shape, cols)) return false;
  for (const auto& o : n.outputs)
    if (o.dtype != at::kFloat || o.offset != 0 || !o.is_dense()) return false;
  return true;
}

// The row length when a row-major tensor of `sizes` is `shape` with its last
// dim 1 (one value per row, broadcast along the row: an RMSNorm's rstd of
// [B, T, 1] scaling x of [B, T, C]); element i of the broadcast is element
// i / cols. 0 otherwise.
int64_t row_broadcast(c10::IntArrayRef sizes, c10::IntArrayRef shape) {
  if (sizes.size() != shape.size() || shape.empty() || sizes.back() != 1 || shape.back() <= 1) return 0;
  for (size_t d = 0; d + 1 < shape.size(); ++d)
    if (sizes[d] != shape[d]) return 0;
  return shape.back();
}

// The row length when `r` is a tensor of one value per row expanded along
// its last dim (stride 0 there, size > 1; the leading dims row-major over
// those values, as expand(..., C) of a contiguous [..., 1] makes): element i
// of it is value i / cols. 0 otherwise.
int64_t expanded_row(const TensorRef& r) {
  const size_t n = r.sizes().size();
  if (n == 0 || r.strides().size() != n || r.strides()[n - 1] != 0 || r.sizes()[n - 1] <= 1) return 0;
  int64_t expect = 1;
  for (size_t d = n - 1; d-- > 0;) {
    if (r.sizes()[d] != 1 && r.strides()[d] != expect) return 0;
    expect *= r.sizes()[d];
  }
  return r.sizes()[n - 1];
}

// The runtime value of `p` for this run of `region`; false when it cannot
// be read or a guard fails.
bool param_value(const Param& p, const Region& region, const std::vector<Node>& graph, host::HostMemory& mem,
                 float* v) {
  const Node& n = graph[region.nodes[p.pos]];
  if (p.input >= 0) {
    const TensorRef& r = n.inputs[p.input].ref;
    size_t nbytes;
    const void* data = mem.data_for(r.storage.get(), &nbytes);
    switch (r.dtype) {
      case at::kFloat:
        *v = static_cast<const float*>(data)[r.offset];
        break;
      case at::kBFloat16:
        *v = static_cast<float>(static_cast<const c10::BFloat16*>(data)[r.offset]);
        break;
      case at::kHalf:
        *v = static_cast<float>(static_cast<const c10::Half*>(data)[r.offset]);
        break;
      default:
        return false;
    }
  } else if (const c10::IValue& a = n.args[p.arg]; a.isDouble()) {
    // The common kinds read directly (scalar_operand's values, without a Scalar).
    const double d = a.toDouble();
    *v = static_cast<float>(d);
    if (p.check_overflow && std::isinf(*v) && std::isfinite(d)) return false;
  } else if (a.isInt()) {
    *v = static_cast<float>(a.toInt());  // never overflows float
  } else {
    Operand c;
    if (!scalar_operand(a, &c)) return false;
    if (p.check_overflow && std::isinf(c.value) && a.isScalar() && std::isfinite(a.toScalar().toDouble())) return false;
    *v = c.value;
  }
  if (p.abs_lt_half >= 0 && (std::abs(*v) < 0.5f) != (p.abs_lt_half == 1)) return false;  // on the argument
  if (p.transform == Param::Transform::kNeg) *v = -*v;
  if (p.transform == Param::Transform::kMinusOne) *v = *v - 1.0f;
  *v = round_to(*v, p.round);
  if (p.is_one >= 0 && (*v == 1.0f) != (p.is_one == 1)) return false;  // on the value the loop uses
  if (p.abs_one >= 0 && (std::abs(*v) == 1.0f) != (p.abs_one == 1)) return false;
  if (p.reject_nan && std::isnan(*v)) return false;
  if (p.has_equals && !(*v == p.equals)) return false;
  return true;
}

}  // namespace

namespace {

// Whether the float32 tensor `r` can be read by a loop over `shape` through
// its strides (fused::StridedRead in `*out`): its sizes broadcast to `shape`
// (right-aligned; a missing or size-1 dim reads stride 0), its strides are
// non-negative, and `shape` has at most StridedRead::kMaxDims dims and
// elements. Covers the views the dense, period and repeat forms do not: a
// transposed q of attention heads, a column half q[..., D/2:] of rotary
// embedding, cos of [B, 1, T, D] broadcast over the heads.
bool strided_read(const TensorRef& r, c10::IntArrayRef shape, fused::StridedRead* out) {
  const size_t nd = shape.size(), nr = r.sizes().size();
  if (nd == 0 || nd > fused::StridedRead::kMaxDims || nr > nd || r.strides().size() != nr || r.offset < 0) return false;
  out->offset = r.offset;
  out->extent = r.offset + 1;
  out->sizes.assign(shape.begin(), shape.end());
  out->strides.assign(nd, 0);
  for (size_t j = 0; j < nr; ++j) {
    const size_t d = nd - nr + j;
    if (shape[d] == 0) return false;
    if (r.sizes()[j] == shape[d] && shape[d] > 1) {
      if (r.strides()[j] < 0) return false;
      out->strides[d] = r.strides()[j];
      out->extent += (shape[d] - 1) * r.strides()[j];
    } else if (r.sizes()[j] != 1 && r.sizes()[j] != shape[d]) {
      return false;
    }
  }
  for (size_t d = 0; d < nd - nr; ++d)
    if (shape[d] == 0) return false;
  return true;
}

// `s` with its size-1 dims dropped and each dim merged into the one outside
// it when the two step through memory as one (outer stride = inner stride *
// inner size, broadcast stride 0 included): every loop element maps to the
// same buffer element, walked in fewer, longer runs by stage_strided /
// scatter_strided (q's heads [B, H, T, D] of [B, T, H, D] with B = 1, or
// cos [1, 1, T, D] broadcast over the heads, carried through every dim per run).
void coalesce_dims(fused::StridedRead& s) {
  std::vector<int64_t> sizes, strides;
  for (size_t d = 0; d < s.sizes.size(); ++d) {
    if (s.sizes[d] == 1) continue;
    if (!sizes.empty() && strides.back() == s.strides[d] * s.sizes[d]) {
      sizes.back() *= s.sizes[d];
      strides.back() = s.strides[d];
      continue;
    }
    sizes.push_back(s.sizes[d]);
    strides.push_back(s.strides[d]);
  }
  if (sizes.empty()) {  // one element
    sizes.push_back(1);
    strides.push_back(0);
  }
  s.sizes = std::move(sizes);
  s.strides = std::move(strides);
}

// The order a fused loop iterates in: its outputs' memory order. Row-major
// outputs (`permuted` false) iterate in their own index order; outputs laid
// out densely in another order of their dims (CPU keeps an input's permuted
// layout for an elementwise result: q * cos, q a transposed view
// [B, H, T, D] of [B, T, H, D], has q's strides) iterate over `perm`'s
// order: loop element i is the element at memory offset i of every output,
// and each operand is read in that order (a dense one with the outputs'
// strides as is, any other float32 one through its strides permuted).
struct LoopOrder {
  bool permuted = false;
  std::vector<int> perm;  // loop dim k is tensor dim perm[k] (outermost first)
  Dims strides;           // the outputs' strides (size-1 dims: 0)
};

// The loop order of an op writing `out` of `shape`: permuted when `out`
// (offset 0) is not row-major but dense in the order of its dims by
// decreasing stride (size-1 dims first, in their order). False otherwise.
bool permuted_order(const TensorRef& out, LoopOrder* order) {
  const size_t nd = out.sizes().size();
  if (nd < 2 || nd > fused::StridedRead::kMaxDims || out.strides().size() != nd || out.offset != 0 || out.is_dense())
    return false;
  std::vector<int> perm, big;
  for (size_t d = 0; d < nd; ++d) {
    if (out.sizes()[d] == 0) return false;
    (out.sizes()[d] == 1 ? perm : big).push_back(static_cast<int>(d));
  }
  std::stable_sort(big.begin(), big.end(), [&](int a, int b) { return out.strides()[a] > out.strides()[b]; });
  perm.insert(perm.end(), big.begin(), big.end());
  Dims strides;
  strides.resize(nd, 0);
  int64_t expect = 1;
  for (size_t k = nd; k-- > 0;) {
    const int d = perm[k];
    if (out.sizes()[d] == 1) continue;
    if (out.strides()[d] != expect) return false;
    strides[d] = expect;
    expect *= out.sizes()[d];
  }
  order->permuted = true;
  order->perm = std::move(perm);
  order->strides = std::move(strides);
  return true;
}

// Whether `r` (sizes `shape`) lies in memory as the loop's outputs do: offset
// 0 and the outputs' strides on every dim of size > 1 (read element i of it
// is loop element i).
bool in_loop_order(const TensorRef& r, c10::IntArrayRef shape, const LoopOrder& order) {
  if (!order.permuted) return r.offset == 0 && r.sizes() == shape && r.is_dense();
  if (r.offset != 0 || r.sizes() != shape || r.strides().size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && r.strides()[d] != order.strides[d]) return false;
  return true;
}

}  // namespace

// (fused_elementwise.h) The elements per repetition of a row-major tensor of `sizes` broadcast to
// `shape` along leading dims only (its shape is shape's last dims, with any
// dims before them 1): element i of the broadcast is element i % period.
// 0 when it is not such a broadcast.
int64_t broadcast_period(c10::IntArrayRef sizes, c10::IntArrayRef shape) {
  if (sizes.size() > shape.size()) return 0;
  const size_t lead = shape.size() - sizes.size();
  size_t first = 0;  // the first dim of `sizes` that is not 1
  while (first < sizes.size() && sizes[first] == 1) ++first;
  int64_t period = 1;
  for (size_t d = first; d < sizes.size(); ++d) {
    if (sizes[d] != shape[lead + d]) return 0;
    period *= sizes[d];
  }
  return period;
}

// The tensor an op writes in place (its self) or as its out= argument; null
// for a functional op and for one that writes more than one tensor.
const InputSlot* written_slot(const Node& n) {
  const InputSlot* w = nullptr;
  for (const auto& in : n.inputs) {
    if (!in.written) continue;
    if (w) return nullptr;
    w = &in;
  }
  return w;
}

// The input index of `r` in `n.inputs` (r is one of them).
int input_index(const Node& n, const TensorRef& r) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (&n.inputs[i].ref == &r) return static_cast<int>(i);
  return -1;
}

bool overload_in_list(std::string_view list, std::string_view overload) {
  while (true) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == overload) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
}

bool loop_op_form(const Node& n, std::string_view* name, const InputSlot** w, bool* is_out) {
  const auto& schema = n.op.schema();
  *name = std::string_view(schema.name()).substr(6);  // without "aten::"
  *w = nullptr;
  *is_out = false;
  if (!schema.is_mutable()) return n.outputs.size() == 1;
  *w = written_slot(n);
  if (!*w || (*w)->elem >= 0 || !n.outputs.empty()) return false;
  *is_out = schema.arguments()[(*w)->arg].is_out();
  if (*is_out) return true;
  if ((*w)->arg != 0 || name->back() != '_') return false;
  name->remove_suffix(1);
  return true;
}

StorageMap<LoopWrite> loop_writes(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph) {
  StorageMap<LoopWrite> writes(2 * ps.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    const Node& n = graph[region.nodes[ps[k]]];
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      LoopWrite& w = writes[n.outputs[j].storage.get()];
      w.last = k;
      w.made = true;
      w.kept = w.kept || region.materialize[ps[k]][j];
    }
    for (const auto& in : n.inputs)
      if (in.written) writes[in.ref.storage.get()].last = k;
  }
  return writes;
}

// Set while loop_accepts plans an op alone: whether the loop can take it at
// all, not whether it is worth a loop by itself (it will have producers).
static thread_local bool g_probing = false;

bool fused_loops_available() {
  using cpu::Feature;
  return cpu::has(Feature::kAvx2) && cpu::has(Feature::kFma) && cpu::has(Feature::kF16c);  // F16C: float16 casts
}

bool has_fused_lowering(const Node& n) {
  std::string_view name;
  const InputSlot* w = nullptr;
  bool is_out = false;
  if (!loop_op_form(n, &name, &w, &is_out)) return false;
  const TensorRef* out = w ? &w->ref : &n.outputs[0];
  const std::string& overload = n.op.schema().overload_name();
  const Lowering* lw = lowering_of(name, overload, is_out);
  if (!lw) return false;
  at::ScalarType t = out->dtype;
  if (lw->form == Form::kCompare) {
    t = at::ScalarType::Undefined;
    for (const auto& in : n.inputs)
      if (in.arg == 0 && in.elem < 0 && !in.written) t = in.ref.dtype;
  }
  bool ok = false;
  const Elem e = elem_of(t, &ok);
  return ok && (lw->dtypes & dtype_bit(e)) != 0;
}

// Whether the loop runs gelu / gelu_backward (approximate='none') of node
// `n`, computing in `type`, by CPU's op per tile (Instr::cpu_op): where CPU's
// op runs oneDNN's kernel (Activation.cpp use_mkldnn: a contiguous float32 or
// bfloat16 self of more than one element), and for a bfloat16 / float16
// gelu_backward (ATen's reduced-type formula is not followed). Otherwise
// ATen's GeluKernel, whose last elements of each range are libm's erf.
static bool gelu_by_cpu_op(const Node& n, bool backward, Elem type) {
  if (type != Elem::kFloat && type != Elem::kBFloat16) return backward && type == Elem::kHalf;
  if (backward && type == Elem::kBFloat16) return true;
  for (const auto& in : n.inputs)
    if (in.arg == (backward ? 1 : 0) && in.elem < 0) return in.ref.is_dense() && in.ref.numel() > 1;
  return false;  // a Python scalar self: one element
}

fused::LayerNormRowFn cpu_layer_norm_row() {
  // The row kernel of the capability CPU's layer_norm runs (none for DEFAULT).
  static const std::string cap = host::layer_norm_kernel_capability();
  // (torch registers it for AVX2 only: on an AVX-512 machine, its values with AVX-512 instructions.)
  static const bool avx512 = at::get_cpu_capability() == "AVX512";
  return cap == "AVX512"           ? &fused::layer_norm_row_avx512
         : cap == "AVX2" && avx512 ? &fused::layer_norm_row_avx2_on_avx512
         : cap == "AVX2"           ? &fused::layer_norm_row_avx2
                                   : nullptr;
}

bool cpu_softmax_vectorized() {
  static const bool vectorized = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX2" || cap == "AVX512";  // at DEFAULT CPU's softmax is lane by lane with libm
  }();
  return vectorized;
}

// Plans the ops at positions `ps` of `region` (ascending) as one loop. An
// elementwise op may write in place or through out=: its written tensor is
// then a value like a fresh output, stored to its device buffer only by the
// last op of the loop that writes it, when that buffer is observable (a
// tensor from outside the loop, or a fresh output the region materializes).
// Runtime scalars become Params (bound per run); a decision that depends on
// a scalar's value becomes a guard of its Param. False when an op is not supported.
bool plan_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph, LoopPlan* plan) {
  static const bool vector_softmax = cpu_softmax_vectorized();
  // Cross-entropy's pairs (their int64 targets are indices, not loop values).
  if (!ps.empty() && tpu_eager::lowering_of(graph[region.nodes[ps.back()]].op).loss != LossRow::kNone)
    return plan_cross_entropy_loop(region, ps, graph, plan);
  // layer_norm backward's row loop (and the residual gradient's add).
  if (!ps.empty() && tpu_eager::lowering_of(graph[region.nodes[ps[0]]].op).host == DirectImpl::kLayerNormBackward)
    return plan_ln_backward_loop(region, ps, graph, plan);
  // A loop over integers (an int32 / int64 value among its ops) is the integer planner's.
  for (size_t p : ps)
    if (int_loop_domain(graph[region.nodes[p]]) == 1) return plan_int_loop(region, ps, graph, plan);
  *plan = LoopPlan{};
  plan->pos = ps;
  c10::OptionalIntArrayRef shape;
  // The loop's order: its first op's output's memory order (LoopOrder); a
  // permuted loop has no row reduction.
  LoopOrder order;
  {
    const Node& first = graph[region.nodes[ps[0]]];
    std::string_view nm;
    const InputSlot* fw = nullptr;
    bool fo = false;
    const auto& fl = tpu_eager::lowering_of(first.op);
    if (fl.row == RowReduce::kNone && !fl.concat && loop_op_form(first, &nm, &fw, &fo))
      permuted_order(fw ? fw->ref : first.outputs[0], &order);
  }
  StorageMap<Operand> reg_of(2 * ps.size());  // loop value -> register or output
  // External buffers read: storage, period (Program::period) and element type.
  struct External {
    const DeferredStorage* storage;
    int64_t period;
    Elem elem;
    int64_t repeat = 0;  // Program::repeat
    int strided = -1;    // index in strided_of (Program::strided), or -1
    bool operator==(const External& o) const {
      return storage == o.storage && period == o.period && elem == o.elem && repeat == o.repeat && strided == o.strided;
    }
  };
  std::vector<External> ext_of;
  std::vector<fused::StridedRead> strided_of;
  std::vector<Instr> program;
  std::vector<DeferredStorage*> outputs;            // storages of the loop's stores, in instruction order
  std::vector<Elem> out_types;                      // their element types
  std::vector<fused::StridedRead> out_writes;       // their strided writes (Program::out_strided; none: dense)
  std::vector<const DeferredStorage*> concat_made;  // cat outputs: written through strides, never read back
  int regs = 0;                                     // one per value until assign_registers renames them

  const StorageMap<LoopWrite> written_by = loop_writes(region, ps, graph);
  auto is_made = [&](const DeferredStorage* s) {
    const LoopWrite* w = written_by.find(s);
    return w && w->made;
  };
  // A runtime constant operand taking param `p`.
  auto param_operand = [&](const Param& p, Operand* op) {
    plan->params.push_back(p);
    op->kind = Operand::kConst;
    op->index = static_cast<int>(plan->params.size());
    op->value = 0.0f;
  };

  // A tensor operand of type `want` (a bool mask read as 0 / 1; bfloat16 /
  // float16 widened to float), the input `r` of the node at position `pos`.
  // One with fewer elements than the loop, broadcast along leading dims, is
  // read from its buffer, which the loop must not write. A 0-dim one (any
  // float type) is a runtime constant.
  auto tensor_operand = [&](size_t pos, const TensorRef& r, Operand* op, Elem want = Elem::kFloat) -> bool {
    if (r.conj || r.neg) return false;
    if (std::find(concat_made.begin(), concat_made.end(), r.storage.get()) != concat_made.end()) return false;
    bool known = false;
    const bool ints = want == Elem::kInt32 || want == Elem::kInt64;  // a cast's source
    const Elem elem = elem_of(r.dtype, &known, ints);
    if (ints && r.sizes().empty()) return false;  // (a 0-dim one would be a runtime constant: none of int type)
    const bool mask = want == Elem::kBool;
    const bool zero_dim_const = r.sizes().empty() && !mask && known && elem != Elem::kBool;
    if (!known || (elem != want && !zero_dim_const)) return false;
    DeferredStorage* s = r.storage.get();
    const Operand* it = reg_of.find(s);
    const Node& n = graph[region.nodes[pos]];
    if (r.sizes().empty() && !it && !mask) {     // a 0-dim device tensor: a runtime constant
      if (written_by.contains(s)) return false;  // ... unless the loop writes it
      Param p;
      p.pos = static_cast<int>(pos);
      p.input = input_index(n, r);
      if (p.input < 0) return false;
      param_operand(p, op);
      return true;
    }
    // Any other layout of a float32 tensor the loop does not make or write
    // is read through its strides (strided_read).
    auto read_strided = [&]() {
      fused::StridedRead sr;
      // (float32 only: stage_strided copies float elements; a 16-bit one is widened by stage_external)
      if (it || written_by.contains(s) || elem != want || elem != Elem::kFloat || !strided_read(r, *shape, &sr))
        return false;
      if (order.permuted) {  // read in the loop's order: its dims permuted as the outputs' are
        fused::StridedRead logical = sr;
        for (size_t k = 0; k < order.perm.size(); ++k) {
          sr.sizes[k] = logical.sizes[order.perm[k]];
          sr.strides[k] = logical.strides[order.perm[k]];
        }
      }
      const int in = input_index(n, r);
      if (in < 0) return false;
      op->kind = Operand::kExternal;
      op->index = static_cast<int>(ext_of.size());
      ext_of.push_back({s, 0, elem, 0, static_cast<int>(strided_of.size())});
      strided_of.push_back(std::move(sr));
      plan->externals.push_back(Slot{static_cast<int>(pos), in, -1});
      return true;
    };
    if (order.permuted) {
      // A permuted loop reads an operand laid out as its outputs as is,
      // any other through its strides.
      if (!in_loop_order(r, *shape, order)) return read_strided();
      if (elem != want) return false;
      if (it) {
        *op = *it;
        return true;
      }
      op->kind = Operand::kExternal;
      op->index = external_index(ext_of, External{s, 0, elem, 0}, n, r, pos, plan->externals);
      return op->index >= 0;
    }
    if (r.offset != 0) return read_strided();
    int64_t period = 0, repeat = 0;
    if (!r.is_dense()) {
      // A per-row value expanded along the row (expand of [..., 1]: an
      // RMSNorm backward's mean gradient): read as a row broadcast.
      repeat = elem == Elem::kFloat && r.sizes() == *shape ? expanded_row(r) : 0;
      if (repeat == 0 || it || written_by.contains(s)) return read_strided();
    } else if (r.sizes() != *shape) {
      period = broadcast_period(r.sizes(), *shape);
      if (period == 0 && elem == Elem::kFloat) repeat = row_broadcast(r.sizes(), *shape);
      if ((period == 0 && repeat == 0) || it || written_by.contains(s)) return read_strided();
    }
    if (elem != want) return false;
    if (it) {  // a loop value (a bool one held as 0.0f / 1.0f)
      *op = *it;
      return true;
    }
    op->kind = Operand::kExternal;
    op->index = external_index(ext_of, External{s, period, elem, repeat}, n, r, pos, plan->externals);
    return op->index >= 0;
  };
  // A staged external (broadcast or bool) lives in a tile register: a row
  // anchor reads its input in place, so it must be something else.
  auto staged = [&](const Operand& o) {
    return o.kind == Operand::kExternal && (ext_of[o.index].period > 0 || ext_of[o.index].elem != Elem::kFloat ||
                                            ext_of[o.index].repeat > 0 || ext_of[o.index].strided >= 0);
  };
  // An intermediate value of a multi-instruction op: a register.
  auto temp = [&](Instr ins) {
    ins.dst = regs++;
    program.push_back(ins);
    return Operand{Operand::kReg, ins.dst, 0.0f};
  };
  // The op's value, the last instruction `ins`, written to storage `s` (the
  // tensor `slot`) by op k: stored to the device buffer when no later op of
  // the loop writes `s` and the buffer is observable, else kept in a register.
  // `alpha_param`: the param of ins.alpha, or -1.
  auto define = [&](Instr ins, const TensorRef& ref, Slot slot, size_t k, int alpha_param) {
    DeferredStorage* s = ref.storage.get();
    const LoopWrite& w = *written_by.find(s);  // every written storage has an entry
    const bool store = w.last == k && (w.kept || !w.made);
    Operand value;
    // A bfloat16 / float16 result is rounded to its type, as CPU stores it.
    const Elem type = elem_of(ref.dtype);
    if (type == Elem::kBFloat16 || type == Elem::kHalf) ins.round = type;
    if (store) {
      ins.out = static_cast<int>(outputs.size());
      outputs.push_back(s);
      out_types.push_back(type);
      out_writes.emplace_back();
      plan->outputs.push_back(slot);
      value.kind = Operand::kOutput;
      value.index = ins.out;
    } else {
      ins.dst = regs++;
      value.kind = Operand::kReg;
      value.index = ins.dst;
    }
    reg_of[s] = value;
    if (alpha_param >= 0) plan->alpha_params.emplace_back(static_cast<int>(program.size()), alpha_param);
    program.push_back(ins);
  };

  for (size_t k = 0; k < ps.size(); ++k) {
    const size_t p = ps[k];
    const bool last_op = k + 1 == ps.size();
    const Node& n = graph[region.nodes[p]];
    const auto& schema = n.op.schema();
    const RowReduce row = tpu_eager::lowering_of(n.op).row;
    if (order.permuted && row != RowReduce::kNone) return false;
    if (tpu_eager::lowering_of(n.op).concat) {
      // cat(tensors, dim) of float32 inputs of the loop's shape (empty 1-D
      // ones skipped, as CPU skips them): input j is stored (as x * 1, exact)
      // through the output's strides at offset j * width along `dim`, in the
      // loop's order. The output is written only here, never read back.
      // clone(self): a cat of its one input (its second argument is the memory format).
      const bool clone = n.inputs.size() == 1 && n.inputs[0].elem < 0;
      if (n.outputs.size() != 1 || n.args.size() < 2 || (!clone && !n.args[1].isInt()) || !region.materialize[p][0])
        return false;
      const TensorRef& out = n.outputs[0];
      if (out.dtype != at::kFloat || out.conj || out.neg || out.offset < 0) return false;
      std::vector<const InputSlot*> parts;
      for (const auto& in : n.inputs) {
        if ((in.elem < 0 && !clone) || in.written) return false;
        if (in.ref.sizes().size() == 1 && in.ref.sizes()[0] == 0) continue;
        parts.push_back(&in);
      }
      if (parts.empty()) return false;
      if (!shape) shape = parts[0]->ref.sizes();
      const int64_t nd = static_cast<int64_t>(shape->size());
      int64_t dim = clone ? 0 : n.args[1].toInt();
      if (dim < 0) dim += nd;
      if (nd == 0 || nd > static_cast<int64_t>(fused::StridedRead::kMaxDims) || dim < 0 || dim >= nd ||
          static_cast<int64_t>(out.sizes().size()) != nd || static_cast<int64_t>(out.strides().size()) != nd)
        return false;
      for (int64_t d = 0; d < nd; ++d) {
        const int64_t want = d == dim ? (*shape)[d] * static_cast<int64_t>(parts.size()) : (*shape)[d];
        if (out.sizes()[d] != want || (*shape)[d] == 0 || out.strides()[d] < 0) return false;
      }
      for (size_t j = 0; j < parts.size(); ++j) {
        const TensorRef& r = parts[j]->ref;
        if (r.dtype != at::kFloat || r.sizes() != *shape) return false;
        Instr ins;
        ins.fn = Fn::kMul;
        if (!tensor_operand(p, r, &ins.a) || ins.a.kind == Operand::kConst) return false;
        ins.b = Operand{Operand::kConst, 0, 1.0f};
        fused::StridedRead wr;  // where input j lands, dims in the loop's order
        wr.offset = out.offset + static_cast<int64_t>(j) * (*shape)[dim] * out.strides()[dim];
        wr.extent = wr.offset + 1;
        wr.sizes.resize(nd);
        wr.strides.resize(nd);
        for (int64_t k = 0; k < nd; ++k) {
          const int64_t d = order.permuted ? order.perm[k] : k;
          wr.sizes[k] = (*shape)[d];
          wr.strides[k] = out.strides()[d];
          wr.extent += ((*shape)[d] - 1) * out.strides()[d];
        }
        ins.out = static_cast<int>(outputs.size());
        outputs.push_back(out.storage.get());
        out_types.push_back(Elem::kFloat);
        out_writes.push_back(std::move(wr));
        plan->outputs.push_back(Slot{static_cast<int>(p), -1, 0});
        program.push_back(ins);
      }
      concat_made.push_back(out.storage.get());
      continue;
    }
    if (last_op && row == RowReduce::kLayerNorm) {
      // The loop's last op normalizes rows of the program's last value (or of an input).
      if (!shape) shape = n.outputs[0].sizes();
      fused::RowAnchor& anchor = plan->anchor;
      anchor.ln_row = cpu_layer_norm_row();
      if (!anchor.ln_row || !region.materialize[p][0]) return false;
      if (n.outputs[0].sizes() != *shape || !layer_norm_cols(n, *shape, &anchor.cols)) return false;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const InputSlot& in = n.inputs[i];
        if (in.elem >= 0) return false;
        if (in.arg == 0) {
          if (!tensor_operand(p, in.ref, &anchor.in) || anchor.in.kind == Operand::kConst || staged(anchor.in))
            return false;
          continue;
        }
        const TensorRef& r = in.ref;
        if ((in.arg != 2 && in.arg != 3) || r.dtype != at::kFloat || r.conj || r.neg || !r.is_dense() ||
            c10::multiply_integers(r.sizes()) != anchor.cols || reg_of.contains(r.storage.get()))
          return false;
        (in.arg == 2 ? plan->gamma : plan->beta) = Slot{static_cast<int>(p), static_cast<int>(i), -1};
        plan->read += anchor.cols * 4;
      }
      if (anchor.in.kind == Operand::kConst) return false;  // no input slot
      // Alone with weight and bias it is CPU's own kernel that the existing
      // path calls (direct_kernels), ~8% faster than this loop one row at a
      // time on 4096x1024, unless this loop streams its output
      // (Program::stream), which CPU's kernel does not, or takes the moments of
      // several rows at once (rows of whole vectors in blocks of
      // kLayerNormMomentRows); without them CPU's kernel takes a scalar loop
      // and this one is ~1.7x faster.
      // Rows of whole vectors on either capability (AVX512's 16 floats).
      const int64_t rows = anchor.cols ? c10::multiply_integers(*shape) / anchor.cols : 0;
      const bool moment_rows = fused::layer_norm_moment_rows(rows, anchor.cols) &&
                               rows >= fused::kLayerNormMomentRows && anchor.cols % 16 == 0;
      if (!g_probing && program.empty() && plan->gamma.valid() && plan->beta.valid() && !moment_rows &&
          2 * c10::multiply_integers(*shape) * static_cast<int64_t>(sizeof(float)) < fused::stream_store_threshold())
        return false;
      anchor.op = fused::RowOp::kLayerNorm;
      Param eps;  // CPU's kernel takes eps as the input's type
      eps.pos = static_cast<int>(p);
      eps.arg = 4;
      plan->params.push_back(eps);
      plan->eps_param = static_cast<int>(plan->params.size()) - 1;
      anchor.rows = anchor.cols ? c10::multiply_integers(*shape) / anchor.cols : 0;
      plan->has_anchor = true;
      break;
    }
    std::string_view name;
    const std::string& overload = schema.overload_name();
    const InputSlot* w = nullptr;
    bool is_out = false;
    if (!loop_op_form(n, &name, &w, &is_out)) return false;
    const TensorRef& out = w ? w->ref : n.outputs[0];
    bool known_type = false;
    elem_of(out.dtype, &known_type);
    if (!known_type || out.conj || out.neg) return false;
    // The shape the op iterates over: a row reduction's input (its output has one value per row).
    const bool reduces = row == RowReduce::kLogSumExp || row == RowReduce::kSum || row == RowReduce::kMean;
    const auto& sizes = reduces && !w && n.inputs.size() == 1 ? n.inputs[0].ref.sizes() : out.sizes();
    if (!shape) shape = sizes;
    if (sizes != *shape || (order.permuted ? !in_loop_order(out, *shape, order) : out.offset != 0 || !out.is_dense()))
      return false;
    const Slot out_slot = w ? Slot{static_cast<int>(p), input_index(n, w->ref), -1} : Slot{static_cast<int>(p), -1, 0};
    // Writing a flush temporary from an earlier region in place: checked when bound.
    if (w && !is_made(w->ref.storage.get())) plan->written_inputs.push_back(out_slot);
    if (!w && last_op && out.dtype == at::kFloat && row_anchor(row, n, sizes, &plan->anchor.op)) {
      // The loop's last op reduces rows of the program's last value (or of an input).
      fused::RowAnchor& anchor = plan->anchor;
      if (!region.materialize[p][0] || n.inputs.size() != 1 || n.inputs[0].arg != 0) return false;
      if (!vector_softmax && (anchor.op == fused::RowOp::kSoftmax || anchor.op == fused::RowOp::kLogSoftmax))
        return false;
      if (!tensor_operand(p, n.inputs[0].ref, &anchor.in) || anchor.in.kind == Operand::kConst || staged(anchor.in))
        return false;
      anchor.cols = shape->back();
      anchor.rows = anchor.cols ? c10::multiply_integers(*shape) / anchor.cols : 0;
      plan->has_anchor = true;
      break;
    }
    // The op's lowering rule (kLowerings); none: the loop does not plan.
    const Lowering* lw = lowering_of(name, overload, is_out);
    if (!lw) return false;
    // The type the op computes in: its operands' (comparisons) or its result's.
    const InputSlot* self_in = nullptr;
    for (const auto& in : n.inputs)
      if (in.arg == (lw->form == Form::kWhereSelf ? 1 : 0) && in.elem < 0 && !in.written) self_in = &in;
    if (lw->form == Form::kWhereSelf || lw->form == Form::kCompare) {
      if (!self_in) return false;
    }
    const at::ScalarType compute_dtype = lw->form == Form::kCompare ? self_in->ref.dtype : out.dtype;
    bool known = false;
    const Elem ct = elem_of(compute_dtype, &known);
    // Bool math only in the bool rows (kB), and those only on bool.
    if (!known || (ct == Elem::kBool) != (lw->dtypes == kB) || !(lw->dtypes & dtype_bit(ct))) return false;
    if (lw->form == Form::kCompare ? out.dtype != at::kBool && out.dtype != compute_dtype : out.dtype != compute_dtype)
      return false;
    const bool reduced = ct == Elem::kBFloat16 || ct == Elem::kHalf;
    // A Scalar (or wrapped number) argument as a runtime param; false when
    // it is not a real number. Its value now only for the decisions below.
    // A bfloat16 / float16 op rounds it to its type unless its kernel keeps
    // it in float32 (ScalarIn::kOpmath).
    auto scalar_param = [&](int arg, Operand* op, float* now, bool check_overflow) -> int {
      Operand c;
      if (!scalar_operand(n.args[arg], &c)) return -1;
      if (check_overflow && std::isinf(c.value) && n.args[arg].isScalar() &&
          std::isfinite(n.args[arg].toScalar().toDouble()))
        return -1;
      Param prm;
      prm.pos = static_cast<int>(p);
      prm.arg = arg;
      prm.check_overflow = check_overflow;
      if (reduced && lw->scalar == ScalarIn::kCast) prm.round = ct;
      param_operand(prm, op);
      if (now) *now = round_to(c.value, prm.round);
      return op->index - 1;
    };
    // Arguments by position: tensors come from n.inputs (never the out=
    // argument), the rest from n.args. A tensor operand has the op's type
    // (`want`; a bool mask for where / masked_fill); a 0-dim one is a runtime
    // constant, rounded as a Scalar is.
    auto operand = [&](int arg, Operand* op, Elem want) -> bool {
      for (const auto& in : n.inputs) {
        if (in.arg != arg || in.elem >= 0) continue;
        if (!tensor_operand(p, in.ref, op, want)) return false;
        if (op->kind == Operand::kConst && reduced && lw->scalar == ScalarIn::kCast)
          plan->params[op->index - 1].round = ct;
        return true;
      }
      return want != Elem::kBool && scalar_param(arg, op, nullptr, false) >= 0;
    };
    auto tensor_arg = [&](int arg, Operand* op, Elem want) {
      return operand(arg, op, want) && op->kind != Operand::kConst;
    };
    // A rounding step of CPU's kernel inside the op (bfloat16 x ** 3 rounds x * x).
    auto rounded_temp = [&](Instr t) {
      t.round = reduced ? ct : Elem::kFloat;
      return temp(t);
    };
    Instr ins;
    ins.fn = lw->fn;
    int alpha_param = -1;
    switch (lw->form) {
      case Form::kUnary:
        if (!tensor_arg(0, &ins.a, ct)) return false;
        break;
      case Form::kBinary:
        // The loop reads its first operand from memory; a product with a
        // constant first (torch._foreach_mul_(xs, 0.99) records
        // mul.out(0.99, x, out=x)) is the same value with its operands swapped.
        if (!operand(0, &ins.a, ct) || !operand(1, &ins.b, ct)) return false;
        if (ins.a.kind == Operand::kConst && ins.fn == Fn::kMul && !reduced) std::swap(ins.a, ins.b);
        if (ins.a.kind == Operand::kConst) return false;
        break;
      case Form::kCompare:
        if (!tensor_arg(0, &ins.a, ct) || !operand(1, &ins.b, ct)) return false;
        break;
      case Form::kLogical:
        if (!tensor_arg(0, &ins.a, Elem::kBool) || !tensor_arg(1, &ins.b, Elem::kBool)) return false;
        break;
      case Form::kCast: {
        // copy_(self, src): src (int32, int64 or bool, read converted to
        // float32 as CPU's copy converts; of self's shape or broadcast along
        // leading dims) times 1, which is exact.
        const InputSlot* src = nullptr;
        for (const auto& in : n.inputs)
          if (in.arg == 1 && in.elem < 0 && !in.written) src = &in;
        if (!src) return false;
        const at::ScalarType st = src->ref.dtype;
        if (st != at::kInt && st != at::kLong && st != at::kBool) return false;
        if (!tensor_arg(1, &ins.a, elem_of(st, nullptr, true))) return false;
        ins.b = Operand{Operand::kConst, 0, 1.0f};
        break;
      }
      case Form::kLogicalNot:
        if (!tensor_arg(0, &ins.a, Elem::kBool)) return false;
        ins.b = Operand{Operand::kConst, 0, 0.0f};
        break;
      case Form::kAdd:
      case Form::kSub:
      case Form::kRsub: {
        // add / sub: self + alpha * other (sub negates alpha) as one FMA, as
        // CPU's kernel; rsub: other - alpha * self.
        const bool rsub = lw->form == Form::kRsub;
        if (!operand(rsub ? 1 : 0, &ins.a, ct) || !operand(rsub ? 0 : 1, &ins.b, ct)) return false;
        // A bool alpha on a float result makes CPU raise (its alpha_check): op by op.
        if (n.args[2].isScalar() && n.args[2].toScalar().isBoolean()) return false;
        Operand alpha;
        alpha_param = scalar_param(2, &alpha, &ins.alpha, true);
        if (alpha_param < 0) return false;
        if (lw->form != Form::kAdd) {
          plan->params[alpha_param].transform = Param::Transform::kNeg;
          ins.alpha = -ins.alpha;
        }
        // CPU's scalar loop (the last elements) computes a bfloat16 / float16
        // alpha * other rounded before the sum: equal only for alpha = +-1.
        if (reduced) {
          plan->params[alpha_param].abs_one = 1;
          if (std::abs(ins.alpha) != 1.0f) return false;
        }
        if (ins.a.kind == Operand::kConst) {
          // A constant first: c + alpha * x. Plain sum (alpha 1): swapped;
          // c - x (alpha -1): -x + c, the same single rounding.
          plan->params[alpha_param].is_one = ins.alpha == 1.0f;  // guards the choice
          if (ins.alpha == 1.0f) {
            std::swap(ins.a, ins.b);
          } else if (ins.alpha == -1.0f && ins.b.kind != Operand::kConst) {
            plan->params[alpha_param].abs_one = 1;
            Instr neg;
            neg.fn = Fn::kNeg;
            neg.a = ins.b;
            ins.b = ins.a;
            ins.a = temp(neg);
            alpha_param = -1;
            ins.alpha = 1.0f;
          } else {
            return false;
          }
        }
        if (ins.a.kind == Operand::kConst) return false;  // the loop reads its first operand from memory
        break;
      }
      case Form::kWhereSelf: {
        // where(condition, self, other): CPU's kernel picks self or other (cast to the result type).
        if (!tensor_arg(0, &ins.a, Elem::kBool) || !operand(1, &ins.b, ct) || !operand(2, &ins.c, ct)) return false;
        break;
      }
      case Form::kMaskedFill: {
        // CPU's kernel (masked_fill_kernel) stores the value, converted to
        // the tensor's type, where the mask is set; a value that overflows float raises there.
        if (!tensor_arg(0, &ins.a, ct) || !tensor_arg(1, &ins.b, Elem::kBool)) return false;
        Operand value;
        alpha_param = scalar_param(2, &value, &ins.alpha, true);
        if (alpha_param < 0) return false;
        break;
      }
      case Form::kClamp:
      case Form::kClampOne: {
        // clamp with Scalar bounds: at::vec::clamp (CPU's clamp_scalar
        // kernel), which is clamp_min then clamp_max; with both Tensor
        // bounds: maximum then minimum (NaN bounds propagate); one bound:
        // CPU's clamp_min / clamp_max kernel. A NaN Scalar bound fills NaN
        // at CPU's op level: guarded.
        if (!tensor_arg(0, &ins.a, ct)) return false;
        const bool has_min = lw->form == Form::kClampOne ? lw->fn == Fn::kClampMin : !n.args[1].isNone();
        const bool has_max = lw->form == Form::kClampOne ? lw->fn == Fn::kClampMax : !n.args[2].isNone();
        if (!has_min && !has_max) return false;
        Operand lo, hi;
        if (has_min && !operand(1, &lo, ct)) return false;
        if (has_max && !operand(lw->form == Form::kClampOne ? 1 : 2, &hi, ct)) return false;
        for (const Operand* o : {&lo, &hi})
          if (o->kind == Operand::kConst && o->index > 0) plan->params[o->index - 1].reject_nan = true;
        // Tensor bounds: CPU's kernels take at::vec::maximum / minimum (a NaN bound gives NaN).
        const bool tensors = overload == "Tensor" || overload == "Tensor_out";
        const Fn lower = tensors ? Fn::kMaximum : Fn::kClampMin, upper = tensors ? Fn::kMinimum : Fn::kClampMax;
        if (has_min && has_max) {
          Instr first;
          first.fn = lower;
          first.a = ins.a;
          first.b = lo;
          ins.fn = upper;
          ins.a = temp(first);
          ins.b = hi;
        } else {
          ins.fn = has_min ? lower : upper;
          ins.b = has_min ? lo : hi;
        }
        break;
      }
      case Form::kPowScalar: {
        // CPU's pow with a Scalar exponent (PowKernel.cpp): 2 -> x * x,
        // 3 -> x * x * x (bfloat16: rounded after each product), and for
        // float32 0.5 / -0.5 / -1 its sqrt / rsqrt / reciprocal kernels. The
        // exponent's value is guarded (other exponents: op by op; 0 and 1
        // are a fill and a copy at CPU's op level).
        if (!tensor_arg(0, &ins.a, ct)) return false;
        Operand e;
        float ev = 0.0f;
        const int ep = scalar_param(1, &e, &ev, false);
        if (ep < 0 || !n.args[1].isScalar() || n.args[1].toScalar().isBoolean()) return false;
        plan->params[ep].round = Elem::kFloat;  // compared as given
        plan->params[ep].equals = ev;
        plan->params[ep].has_equals = true;
        if (ev == 2.0f || ev == 3.0f) {
          Instr sq;
          sq.fn = Fn::kMul;
          sq.a = ins.a;
          sq.b = ins.a;
          if (ev == 2.0f) {
            ins = sq;
          } else {
            ins.fn = Fn::kMul;
            ins.b = ins.a;
            ins.a = rounded_temp(sq);
          }
        } else if (ev == 1.0f) {
          // CPU's pow_out copies the base for an exponent of 1 (Pow.cpp): x * 1
          // is x in every type (a signaling NaN would come out quiet).
          ins.fn = Fn::kMul;
          ins.b = Operand{Operand::kConst, 0, 1.0f};
        } else if (!reduced && (ev == 0.5f || ev == -0.5f || ev == -1.0f)) {
          ins.fn = ev == 0.5f ? Fn::kSqrt : ev == -0.5f ? Fn::kRsqrt : Fn::kReciprocal;
        } else {
          return false;
        }
        break;
      }
      case Form::kGelu:
      case Form::kGeluBwd: {
        const int approx_arg = lw->form == Form::kGelu ? 1 : 2;
        if (!n.args[approx_arg].isString()) return false;
        const std::string& approx = n.args[approx_arg].toStringRef();
        if (approx != "none" && approx != "tanh") return false;
        const bool tanh = approx == "tanh";
        if (lw->form == Form::kGelu) {
          ins.fn = tanh ? Fn::kGeluTanh : Fn::kGelu;
          if (!tensor_arg(0, &ins.a, ct)) return false;
        } else {
          ins.fn = tanh ? Fn::kGeluTanhBwd : Fn::kGeluBwd;
          if (!tensor_arg(0, &ins.a, ct) || !operand(1, &ins.b, ct)) return false;
        }
        ins.cpu_op = !tanh && gelu_by_cpu_op(n, lw->form == Form::kGeluBwd, ct);
        break;
      }
      case Form::kThresholdBwd: {
        // threshold_backward(grad, self, threshold): self <= threshold ? 0 : grad.
        if (!tensor_arg(0, &ins.a, ct) || !operand(1, &ins.b, ct)) return false;
        Operand th;
        alpha_param = scalar_param(2, &th, &ins.alpha, false);
        if (alpha_param < 0) return false;
        break;
      }
      case Form::kLerp: {
        // CPU's vector kernel (LerpKernel.cpp, lerp_vec): with a float weight
        // w, start + w * (end - start) when |w| < 0.5, else
        // end + (w - 1) * (end - start), each product-sum one FMA.
        Operand start, end, wop;
        float weight;
        if (!tensor_arg(0, &start, ct) || !tensor_arg(1, &end, ct)) return false;
        alpha_param = scalar_param(2, &wop, &weight, true);
        if (alpha_param < 0) return false;
        Instr diff;
        diff.fn = Fn::kAdd;
        diff.a = end;
        diff.b = start;
        diff.alpha = -1.0f;  // end + (-1) * start: one rounding, as end - start
        const bool small = std::abs(weight) < 0.5f;
        plan->params[alpha_param].abs_lt_half = small;
        if (!small) plan->params[alpha_param].transform = Param::Transform::kMinusOne;
        ins.fn = Fn::kAdd;
        ins.a = small ? start : end;
        ins.b = temp(diff);
        ins.alpha = small ? weight : weight - 1.0f;
        break;
      }
      case Form::kAddcmul:
      case Form::kAddcdiv: {
        // CPU's kernels (PointwiseOpsKernel.cpp): addcmul = fma(value * t1,
        // t2, self) (its compiler contracts self + value * t1 * t2), addcdiv =
        // self + (value * t1) / t2; both measured bit-equal to these forms.
        Operand self, t1, t2, value;
        if (!tensor_arg(0, &self, ct) || !tensor_arg(1, &t1, ct) || !tensor_arg(2, &t2, ct) ||
            scalar_param(3, &value, nullptr, true) < 0)
          return false;
        Instr scaled;
        scaled.fn = Fn::kMul;
        scaled.a = t1;
        scaled.b = value;
        const Operand vt1 = temp(scaled);
        if (lw->form == Form::kAddcmul) {
          ins.fn = Fn::kFma;
          ins.a = vt1;
          ins.b = t2;
          ins.c = self;
        } else {
          Instr quot;
          quot.fn = Fn::kDiv;
          quot.a = vt1;
          quot.b = t2;
          ins.fn = Fn::kAdd;
          ins.a = self;
          ins.b = temp(quot);
        }
        break;
      }
    }
    ins.given_out = w != nullptr;
    define(ins, w ? w->ref : n.outputs[0], out_slot, k, alpha_param);
  }

  if (!plan->has_anchor && program.empty()) return false;
  if (plan->has_anchor && !concat_made.empty()) return false;  // (the row loop writes dense outputs only)
  fused::RowAnchor& anchor = plan->anchor;
  if (plan->has_anchor && anchor.rows * anchor.cols == 0) return false;
  const int64_t numel = c10::multiply_integers(*shape);
  if (plan->has_anchor) plan->anchor_out = Slot{static_cast<int>(ps.back()), -1, 0};
  int64_t stat_bytes = 0;  // layer_norm's materialized mean / rstd
  if (plan->has_anchor && anchor.op == fused::RowOp::kLayerNorm) {
    for (int j = 1; j <= 2; ++j) {
      if (!region.materialize[ps.back()][j]) continue;
      (j == 1 ? plan->mean : plan->rstd) = Slot{static_cast<int>(ps.back()), -1, j};
      stat_bytes += anchor.rows * 4;
    }
  }
  // Bytes the loop reads and writes: the counters, and whether it streams its outputs.
  int64_t& read = plan->read;
  int64_t& written = plan->written_bytes;
  for (const External& e : ext_of)
    read += (e.period > 0 ? e.period : e.repeat > 0 ? numel / e.repeat : numel) * elem_size(e.elem);
  written = stat_bytes;
  for (Elem t : out_types) written += numel * elem_size(t);
  const bool one_per_row = anchor.op == fused::RowOp::kLogSumExp || per_row_value(anchor.op);
  if (plan->has_anchor) written += (one_per_row ? anchor.rows : numel) * 4;
  fused::Program& prog = plan->prog;
  // A softmax region of wider rows than kSoftmaxExpRowFloats never streams:
  // its exp values, stored to y and scaled in place, are read back from
  // cache. Narrower rows keep them in a row of their own and write y once,
  // streamed past the threshold as other loops (docs/performance.md, rows25).
  const bool softmax_in_y =
      plan->has_anchor && anchor.op == fused::RowOp::kSoftmax && anchor.cols > fused::kSoftmaxExpRowFloats;
  prog.stream = read + written >= fused::stream_store_threshold() && !softmax_in_y;
  prog.regs = fused::assign_registers(program, plan->has_anchor ? &anchor.in : nullptr);
  prog.instrs = std::move(program);
  prog.numel = numel;
  prog.externals.assign(ext_of.size(), nullptr);
  for (const External& e : ext_of) {
    prog.period.push_back(e.period);
    prog.ext_type.push_back(e.elem);
    prog.repeat.push_back(e.repeat);
    prog.strided.push_back(e.strided >= 0 ? strided_of[e.strided] : fused::StridedRead{});
    if (e.strided >= 0) coalesce_dims(prog.strided.back());
  }
  prog.outputs.assign(outputs.size(), nullptr);
  prog.out_type = std::move(out_types);
  if (!concat_made.empty()) {
    prog.out_strided = std::move(out_writes);
    for (fused::StridedRead& w : prog.out_strided)
      if (!w.sizes.empty()) coalesce_dims(w);
  }
  return true;
}

namespace {

// The facts plan_loop's acceptance of node `n` alone depends on: the op,
// its tensors' dtypes and layouts, its structural arguments' values and its
// scalars' kinds (and whether a finite one overflows float).
void acceptance_key(const Node& n, std::vector<int64_t>& key) {
  key.clear();
  key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&n.op.schema())));
  auto ref = [&](const TensorRef& r) {
    key.push_back(static_cast<int64_t>(r.dtype) | (int64_t{r.conj} << 8) | (int64_t{r.neg} << 9) |
                  (int64_t{r.offset != 0} << 10) | (int64_t{r.is_dense()} << 11));
    key.push_back(static_cast<int64_t>(r.sizes().size()));
    key.insert(key.end(), r.sizes().begin(), r.sizes().end());
    key.insert(key.end(), r.strides().begin(), r.strides().end());
  };
  for (const auto& in : n.inputs) {
    key.push_back((static_cast<int64_t>(in.arg) << 20) | (static_cast<int64_t>(in.elem + 1) << 1) | in.written);
    ref(in.ref);
  }
  key.push_back(-1);
  for (const auto& o : n.outputs) ref(o);
  for (const auto& a : n.args) {
    if (a.isInt()) {
      key.insert(key.end(), {1, a.toInt()});
    } else if (a.isBool()) {
      key.insert(key.end(), {2, a.toBool()});
    } else if (a.isIntList()) {
      key.push_back(3);
      key.push_back(static_cast<int64_t>(a.toIntList().size()));
      for (auto x : a.toIntList()) key.push_back(x);
    } else if (a.isScalar()) {
      const auto sc = a.toScalar();
      const bool overflows =
          sc.isFloatingPoint() && std::isfinite(sc.toDouble()) && std::isinf(static_cast<float>(sc.toDouble()));
      key.push_back(4 + 8 * (sc.isFloatingPoint() + 2 * sc.isBoolean() + 4 * sc.isComplex() + 8 * overflows));
    } else if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();  // a wrapped number (CPU 0-dim tensor)
      key.push_back(t.defined() ? 5 + 8 * (static_cast<int64_t>(t.scalar_type()) + 64 * t.dim()) : 5);
    } else {
      key.push_back(6 + 8 * static_cast<int64_t>(a.isNone()));
    }
  }
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL;
    return static_cast<size_t>(h);
  }
};

}  // namespace

LoopAccept loop_accepts(const std::vector<Node>& graph, int i) {
  if (!fused_loops_available()) return LoopAccept::kNo;
  static std::mutex mu;
  // Never destroyed: a daemon thread's flush may still read it at exit.
  static auto& memo = *new std::unordered_map<std::vector<int64_t>, LoopAccept, KeyHash>();
  const Node& n = graph[i];
  // Cross-entropy's ops run only in pairs (partition's cross_entropy_pair).
  if (tpu_eager::lowering_of(n.op).loss != LossRow::kNone)
    return cross_entropy_op_qualifies(n) ? LoopAccept::kElementwise : LoopAccept::kNo;
  if (tpu_eager::lowering_of(n.op).host == DirectImpl::kLayerNormBackward)
    return ln_backward_op_qualifies(n) ? LoopAccept::kElementwise : LoopAccept::kNo;
  thread_local std::vector<int64_t> key;  // reused: no allocation per query
  acceptance_key(n, key);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
  }
  // The op alone, every output materialized (a row anchor stores its result).
  Region probe;
  probe.nodes = {i};
  probe.anchor = static_cast<PrimKind>(n.kind) == PrimKind::kReduction ? PrimKind::kReduction : PrimKind::kElementwise;
  probe.materialize.emplace_back(n.outputs.size(), 1);
  LoopAccept accept = LoopAccept::kNo;
  try {
    LoopPlan lp;
    g_probing = true;
    const bool ok = plan_loop(probe, {0}, graph, &lp);
    g_probing = false;
    if (ok)
      accept = !lp.has_anchor                ? LoopAccept::kElementwise
               : per_row_value(lp.anchor.op) ? LoopAccept::kRowValue
                                             : LoopAccept::kRowAnchor;
  } catch (...) {  // planning never decides an error: the op runs through its CPU kernel
    g_probing = false;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (memo.size() >= 16384) memo.clear();  // bounded: distinct ops x layouts of a program
  memo.emplace(key, accept);
  return accept;
}

DeferredStorage* slot_storage(const Slot& s, const Region& region, const std::vector<Node>& graph) {
  const Node& n = graph[region.nodes[s.pos]];
  return s.input >= 0 ? n.inputs[s.input].ref.storage.get() : n.outputs[s.output].storage.get();
}

void number_slots(LoopPlan& plan, const Region& region, const std::vector<Node>& graph) {
  std::vector<int> first(region.nodes.size(), 0);  // index of each position's first reference
  for (size_t p = 1; p < first.size(); ++p) {
    const Node& n = graph[region.nodes[p - 1]];
    first[p] = first[p - 1] + static_cast<int>(n.inputs.size() + n.outputs.size());
  }
  auto number = [&](Slot& s) {
    if (!s.valid()) return;
    const Node& n = graph[region.nodes[s.pos]];
    s.ref = first[s.pos] + (s.input >= 0 ? s.input : static_cast<int>(n.inputs.size()) + s.output);
  };
  for (std::vector<Slot>* v : {&plan.externals, &plan.outputs, &plan.written_inputs})
    for (Slot& s : *v) number(s);
  for (Slot* s : {&plan.anchor_out, &plan.gamma, &plan.beta, &plan.mean, &plan.rstd}) number(*s);
}

bool normalized_cols(c10::IntArrayRef normalized, c10::IntArrayRef shape, int64_t* cols) {
  if (normalized.empty() || normalized.size() > shape.size()) return false;
  if (!std::equal(normalized.begin(), normalized.end(), shape.end() - normalized.size())) return false;
  *cols = c10::multiply_integers(normalized);
  return true;
}

const float* slot_in_data(const Slot& s, const Region& region, const std::vector<Node>& graph, host::HostMemory& mem) {
  const TensorRef& r = graph[region.nodes[s.pos]].inputs[s.input].ref;
  size_t nbytes;
  return static_cast<const float*>(mem.data_for(r.storage.get(), &nbytes)) + r.offset;
}

float* slot_out_data(const Slot& s, const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                     LoopPlan& plan) {
  DeferredStorage* st = slot_storage(s, region, graph, mem);
  plan.written.push_back(st);
  size_t nbytes;
  const int64_t offset = s.input >= 0 ? graph[region.nodes[s.pos]].inputs[s.input].ref.offset : 0;
  return static_cast<float*>(mem.device_data(st, &nbytes)) + offset;
}

namespace {

// The device memory a loop writes for slot `s`, and its size in bytes (`*nbytes`).
void* out_buffer(const Slot& s, const Region& region, std::vector<Node>& graph, host::HostMemory& mem, LoopPlan& plan,
                 size_t* nbytes) {
  DeferredStorage* st = slot_storage(s, region, graph, mem);
  plan.written.push_back(st);
  return mem.device_data(st, nbytes);
}
float* out_ptr(const Slot& s, const Region& region, std::vector<Node>& graph, host::HostMemory& mem, LoopPlan& plan) {
  size_t nbytes;
  return static_cast<float*>(out_buffer(s, region, graph, mem, plan, &nbytes));
}

// Operand 0 / 1 / 2 (a / b / c) of `ins`.
Operand& operand_of(Instr& ins, uint8_t which) { return which == 0 ? ins.a : which == 1 ? ins.b : ins.c; }

// Fills plan.param_operands from its program (once: the program is fixed once planned).
void index_param_operands(LoopPlan& plan) {
  plan.param_operands.clear();
  for (size_t k = 0; k < plan.prog.instrs.size(); ++k)
    for (uint8_t which = 0; which < 3; ++which) {
      const Operand& o = operand_of(plan.prog.instrs[k], which);
      if (o.kind == Operand::kConst && o.index > 0) plan.param_operands.emplace_back(static_cast<uint32_t>(k), which);
    }
  plan.param_operands_made = true;
}

}  // namespace

// Binds the float program (and row anchor) of `plan` (bind_loop).
static bool bind_program(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem);

bool bind_loop(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem) {
  if (plan.int_loop) return bind_int_loop(plan, region, graph, mem);
  if (plan.lnb) return bind_ln_backward(plan, region, graph, mem);
  if (!bind_program(plan, region, graph, mem)) return false;
  return !plan.ce || bind_cross_entropy(plan, region, graph, mem);
}

static bool bind_program(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem) {
  plan.written.clear();
  plan.keep_alive.clear();
  for (const Slot& s : plan.written_inputs)
    if (mem.is_temp(slot_storage(s, region, graph, mem))) return false;
  float values[64];
  std::vector<float> many;
  float* v = values;
  if (plan.params.size() > 64) {
    many.resize(plan.params.size());
    v = many.data();
  }
  for (size_t i = 0; i < plan.params.size(); ++i)
    if (!param_value(plan.params[i], region, graph, mem, &v[i])) return false;
  if (!plan.param_operands_made) index_param_operands(plan);
  for (const auto& [instr, which] : plan.param_operands) {
    Operand& o = operand_of(plan.prog.instrs[instr], which);
    o.value = v[o.index - 1];
  }
  for (const auto& [instr, param] : plan.alpha_params) plan.prog.instrs[instr].alpha = v[param];
  fused::RowAnchor& anchor = plan.anchor;
  if (plan.has_anchor && anchor.in.kind == Operand::kConst && anchor.in.index > 0)
    anchor.in.value = v[anchor.in.index - 1];
  if (plan.eps_param >= 0) anchor.eps = v[plan.eps_param];
  for (size_t i = 0; i < plan.externals.size(); ++i) {
    size_t nbytes;
    const void* data = mem.data_for(slot_storage(plan.externals[i], region, graph, mem), &nbytes);
    // A strided read must lie inside this run's buffer (else the loop runs op by op).
    if (i < plan.prog.strided.size() &&
        plan.prog.strided[i].extent * static_cast<int64_t>(sizeof(float)) > static_cast<int64_t>(nbytes))
      return false;
    plan.prog.externals[i] = data;
  }
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    size_t nbytes;
    plan.prog.outputs[i] = out_buffer(plan.outputs[i], region, graph, mem, plan, &nbytes);
    // A strided write must lie inside this run's buffer (else the loop runs op by op).
    if (i < plan.prog.out_strided.size() && !plan.prog.out_strided[i].sizes.empty() &&
        plan.prog.out_strided[i].extent * static_cast<int64_t>(sizeof(float)) > static_cast<int64_t>(nbytes))
      return false;
  }
  if (plan.has_anchor) {
    anchor.out = out_ptr(plan.anchor_out, region, graph, mem, plan);
    for (auto [slot, ptr] :
         {std::pair<const Slot*, const float**>{&plan.gamma, &anchor.gamma}, {&plan.beta, &anchor.beta}}) {
      *ptr = nullptr;
      if (!slot->valid()) continue;
      plan.keep_alive.push_back(mem.tensor(graph[region.nodes[slot->pos]].inputs[slot->input].ref));
      *ptr = plan.keep_alive.back().data_ptr<float>();
    }
    anchor.mean = plan.mean.valid() ? out_ptr(plan.mean, region, graph, mem, plan) : nullptr;
    anchor.rstd = plan.rstd.valid() ? out_ptr(plan.rstd, region, graph, mem, plan) : nullptr;
  }
  return true;
}

void run_loop(LoopPlan& plan, RegionStats& stats) {
  if (plan.int_loop) {
    run_int_loop(plan, stats);
    return;
  }
  // The capability ATen runs (the CPU's best unless ATEN_CPU_CAPABILITY asks for less).
  if (plan.lnb) {  // layer_norm backward: no program
    run_ln_backward(plan, stats);
    return;
  }
  if (plan.ce && !plan.has_anchor) {  // cross-entropy's backward: no program
    run_cross_entropy(plan, stats);
    return;
  }
  static const bool use_avx512 = at::get_cpu_capability() == "AVX512";
  for (DeferredStorage* s : plan.written) s->error = nullptr;
  if (plan.has_anchor) {
    if (use_avx512) {
      fused::run_rows_avx512(plan.prog, plan.anchor);
    } else {
      fused::run_rows_avx2(plan.prog, plan.anchor);
    }
    if (plan.ce) run_cross_entropy(plan, stats);  // the loss from the log-probabilities just written
  } else if (use_avx512) {
    fused::run_avx512(plan.prog);
  } else {
    fused::run_avx2(plan.prog);
  }
  stats.bytes_read += plan.read;
  stats.bytes_written += plan.written_bytes;
  plan.keep_alive.clear();
}

bool run_cpu_rows(fused::RowAnchor a, const float* x) {
  if (!fused_loops_available() || a.rows < 0 || a.cols <= 0) return false;
  if (a.op == fused::RowOp::kLayerNorm) {
    a.ln_row = cpu_layer_norm_row();
    if (!a.ln_row) return false;
  } else if (a.op != fused::RowOp::kSoftmax && a.op != fused::RowOp::kLogSoftmax) {
    return false;
  } else if (!cpu_softmax_vectorized()) {
    return false;
  }
  // No instruction: the row op reads its input in place (external 0). Kept
  // per thread so that its compiled form (fused_kernels.inc) is built once.
  thread_local fused::Program prog;
  prog.externals.assign(1, x);
  prog.numel = a.rows * a.cols;
  a.in = fused::Operand{fused::Operand::kExternal, 0, 0.0f};
  static const bool use_avx512 = at::get_cpu_capability() == "AVX512";  // as run_loop
  if (use_avx512)
    fused::run_rows_avx512(prog, a);
  else
    fused::run_rows_avx2(prog, a);
  return true;
}

}  // namespace tpu
}  // namespace tpu_eager
