// Scalars that CPU's kernels convert with an overflow check into the result dtype (or its opmath type).
#include "ops/scalar_checks.h"

#include <string>
#include <unordered_map>

#include <ATen/Dispatch.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/TypeCast.h>
#include <c10/util/complex.h>

namespace tpu_eager {
namespace {

struct Row {
  const char* arg;
  bool integral;         // converted to an integer result dtype
  FloatTarget floating;  // converted for a floating result dtype
};

constexpr FloatTarget R = FloatTarget::kResult;
constexpr FloatTarget O = FloatTarget::kOpmath;

// Per op (name without "aten::" and without a trailing "_"), the arguments
// CPU's kernel converts with Scalar::to<T>(). Found by sweeping CPU
// (tools/sweep_scalar_conversions.py over op_db's samples, plus the call forms
// of tests/record/test_scalar_overflow*.py): int8 results with 300, float16 with 1e6
// and 70000, bfloat16 with 3.4e38, float32 and complex64 with 1e39, complex32
// with 1e6; the type named in CPU's message tells the result dtype from float
// (opmath). An operand Scalar that
// TensorIterator wraps into a 0-dim tensor (add's `other`, mul, div, eq,
// where, ...) wraps without a check and is not listed; float64 results
// convert to double, which never overflows.
const std::unordered_map<std::string, std::vector<Row>>& table() {
  static const auto* m = new std::unordered_map<std::string, std::vector<Row>>{
      {"fill", {{"value", true, R}}},
      {"masked_fill", {{"value", true, R}}},
      {"index_fill", {{"value", true, R}}},
      {"scatter", {{"value", true, R}}},
      {"constant_pad_nd", {{"value", true, R}}},
      {"scalar_tensor", {{"s", true, FloatTarget::kFloat32Result}}},
      {"_unsafe_masked_index", {{"fill", true, R}}},
      {"add", {{"alpha", true, R}}},
      {"sub", {{"alpha", true, R}}},
      {"rsub", {{"alpha", true, R}}},
      {"_add_relu", {{"alpha", true, R}}},
      {"index_add", {{"alpha", true, R}}},
      {"addcmul", {{"value", true, O}}},
      {"addcdiv", {{"value", true, O}}},
      {"addmm", {{"beta", true, O}, {"alpha", true, O}}},
      {"addmv", {{"beta", true, R}, {"alpha", true, R}}},
      {"addr", {{"beta", true, R}, {"alpha", true, R}}},
      {"baddbmm", {{"beta", true, O}, {"alpha", true, O}}},
      {"addbmm", {{"beta", true, O}, {"alpha", true, O}}},
      {"clamp", {{"min", true, R}, {"max", true, R}}},
      {"clamp_min", {{"min", true, R}}},
      {"clamp_max", {{"max", true, R}}},
      {"threshold", {{"threshold", true, O}, {"value", true, R}}},
      {"hardtanh", {{"min_val", true, R}, {"max_val", true, R}}},
      {"hardshrink", {{"lambd", false, R}}},
      {"elu", {{"alpha", false, O}, {"scale", false, O}, {"input_scale", false, O}}},
      {"celu", {{"alpha", false, O}}},
      {"leaky_relu", {{"negative_slope", false, O}}},
      {"softplus", {{"beta", false, O}, {"threshold", false, O}}},
      {"lerp", {{"weight", false, O}}},
      {"rrelu_with_noise", {{"lower", false, O}, {"upper", false, O}}},
      {"multi_margin_loss", {{"margin", false, O}, {"p", false, FloatTarget::kInt}}},
      {"histc", {{"min", false, R}, {"max", false, R}}},
      {"segment_reduce", {{"initial", false, R}}},
      {"linspace", {{"start", true, R}, {"end", true, R}}},
      {"logspace", {{"start", true, R}, {"end", true, R}}},
      // float32 results convert the exponent to double.
      {"pow", {{"exponent", true, FloatTarget::kReducedResult}}},
  };
  return *m;
}

// The Scalar an argument holds: a Python number, or a 0-dim CPU tensor passed
// as a value (masked_fill.Tensor, index_fill.int_Tensor read it with item()).
// A device tensor's value is not known before the flush: no check.
bool scalar_of(const c10::IValue& v, bool tensor_value, at::Scalar* out) {
  if (v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) {
    *out = v.toScalar();
    return true;
  }
  if (tensor_value && v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.device().is_cpu() && t.dim() == 0) {
      *out = t.item();
      return true;
    }
  }
  return false;
}

// Scalar::to<T>() is the conversion CPU's kernels make; it throws on overflow.
template <typename T>
bool fits(const at::Scalar& s) {
  try {
    (void)s.to<T>();
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Whether `s` survives Scalar::to<T>() for the type `t` (Undefined: no conversion).
bool fits_as(const at::Scalar& s, c10::ScalarType t) {
  using c10::ScalarType;
  switch (t) {
    case ScalarType::Half:
      return fits<c10::Half>(s);
    case ScalarType::BFloat16:
      return fits<c10::BFloat16>(s);
    case ScalarType::Float:
      return fits<float>(s);
    case ScalarType::Double:
      return fits<double>(s);  // fails only for a complex value
    case ScalarType::ComplexHalf:
      return fits<c10::complex<c10::Half>>(s);
    case ScalarType::ComplexFloat:
      return fits<c10::complex<float>>(s);
    case ScalarType::Int:
      return fits<int>(s);
    default:
      return true;  // complex<double> holds every Scalar
  }
}

// The type CPU's kernel converts a `target` argument to for a floating or complex `result`.
c10::ScalarType converted_type(FloatTarget target, c10::ScalarType result) {
  using c10::ScalarType;
  const bool reduced = result == ScalarType::Half || result == ScalarType::BFloat16;
  switch (target) {
    case FloatTarget::kNone:
      return ScalarType::Undefined;
    case FloatTarget::kInt:
      return ScalarType::Int;
    case FloatTarget::kResult:
      return result;
    case FloatTarget::kReducedResult:
      return reduced || result == ScalarType::ComplexHalf ? result : ScalarType::Undefined;
    case FloatTarget::kFloat32Result:
      return reduced ? ScalarType::Undefined : result;
    case FloatTarget::kOpmath:
      return reduced ? ScalarType::Float : result;  // complex32 (addcmul): complex<Half>, measured
  }
  return ScalarType::Undefined;
}

// Whether the op's first argument is a real tensor.
bool real_self(const torch::jit::Stack& stack, size_t first) {
  return first < stack.size() && stack[first].isTensor() && stack[first].toTensor().defined() &&
         !c10::isComplexType(stack[first].toTensor().scalar_type());
}

}  // namespace

ScalarConversions scalar_conversions_of(const c10::FunctionSchema& schema) {
  ScalarConversions out;
  std::string name = schema.name().substr(schema.name().find("::") + 2);
  if (name.size() > 1 && name.back() == '_') name.pop_back();
  auto it = table().find(name);
  if (it == table().end()) return out;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    for (const Row& r : it->second)
      if (args[i].name() == r.arg) out.args.push_back({static_cast<int>(i), r.integral, r.floating});
  out.tensor_value = name == "masked_fill" || name == "index_fill";
  // index_fill_ rejects a complex Scalar for every non-complex self, bool too
  // ("index_fill_(): Converting complex Scalar to non-complex type is not supported").
  out.complex_into_bool = name != "index_fill";
  return out;
}

bool scalar_args_fit(const ScalarConversions& conv, const torch::jit::Stack& stack, size_t first,
                     c10::ScalarType result) {
  const bool integral = c10::isIntegralType(result, /*includeBool=*/false);
  if (result == c10::ScalarType::Bool && !conv.complex_into_bool) {
    for (const ScalarConversion& c : conv.args) {
      at::Scalar s;
      if (first + c.arg < stack.size() && scalar_of(stack[first + c.arg], conv.tensor_value, &s) && s.isComplex())
        return false;
    }
    return true;
  }
  if (!integral && !c10::isFloatingType(result) && !c10::isComplexType(result)) return true;
  for (const ScalarConversion& c : conv.args) {
    if (first + c.arg >= stack.size()) continue;
    const c10::IValue& v = stack[first + c.arg];
    if (v.isNone()) continue;
    // A small int (add's alpha=1, a step count) into a floating or complex
    // result fits every type CPU converts it to (Half's +-65504 is the
    // narrowest; int32 for FloatTarget::kInt), without building a Scalar.
    if (v.isInt() && !integral && v.toInt() >= -65504 && v.toInt() <= 65504) continue;
    // The common case, a Python float into a floating result: the overflow
    // test Scalar::to<T>() makes for a double (c10::overflows), without
    // building a Scalar (part of every add/clamp/fill call).
    if (v.isDouble() && !integral) {
      const double d = v.toDouble();
      bool fits_d = true;
      switch (converted_type(c.floating, result)) {
        case c10::ScalarType::Half:
          fits_d = !c10::overflows<c10::Half, double>(d);
          break;
        case c10::ScalarType::BFloat16:
          fits_d = !c10::overflows<c10::BFloat16, double>(d);
          break;
        case c10::ScalarType::Float:
          fits_d = !c10::overflows<float, double>(d);
          break;
        case c10::ScalarType::Int:
          fits_d = !c10::overflows<int, double>(d);
          break;
        default:
          break;  // double, complex<float>, complex<Half>: see fits_as
      }
      if (!fits_d) return false;
      if (!c10::isComplexType(result)) continue;
    }
    at::Scalar s;
    if (!scalar_of(v, conv.tensor_value, &s)) continue;
    bool ok = true;
    // A complex value with a real input or result: CPU's kernels reject it
    // in several ways (a conversion to double, a complex dtype they lack).
    if (s.isComplex() && (!c10::isComplexType(result) || real_self(stack, first))) return false;
    if (integral) {
      if (!c.integral) continue;
      // With the unsigned 16/32/64-bit types (AT_DISPATCH_INTEGRAL_TYPES lacks them).
      AT_DISPATCH_V2(result, "scalar_args_fit", AT_WRAP([&] { ok = fits<scalar_t>(s); }),
                     AT_EXPAND(AT_INTEGRAL_TYPES_V2));
    } else {
      ok = fits_as(s, converted_type(c.floating, result));
    }
    if (!ok) return false;
  }
  return true;
}

bool scalars_keyed_by_value(const ScalarConversions& conv, const torch::jit::Stack& stack, size_t first) {
  for (const ScalarConversion& c : conv.args) {
    if (first + c.arg >= stack.size()) continue;
    const c10::IValue& v = stack[first + c.arg];
    if (!v.isInt() && !v.isBool() && !v.isNone()) return false;
  }
  return true;
}

}  // namespace tpu_eager
