// KTIR data structure: build from a region, print, parse, verify, run
// (format and rules in docs/ktir.md).
#include "executors/spyre/ktir_ir.h"
#include "executors/aten_grain.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <typeinfo>
#include <utility>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/accumulate.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/add.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/div.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/where.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cummax.h>
#include <ATen/ops/cummin.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/binary_cross_entropy.h>
#include <ATen/ops/huber_loss.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/multilabel_margin_loss_forward.h>
#include <ATen/ops/smooth_l1_loss.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "executors/cpu_vml.h"
#include "executors/region_runner.h"
#include "executors/spyre/chain_pass.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/df16.h"
#include "executors/spyre/df16_ops.h"
#include "executors/spyre/layout.h"
#include "executors/spyre/reduce16.h"
#include "executors/spyre/ring_softmax.h"
#include "executors/spyre/row_pass.h"
#include "jit/lowering.h"
#include "lazy/debug_report.h"
#include "ops/cpu_meta.h"
#include "ops/op_table.h"

static_assert(tpu_eager::kAtenGrainSize == at::internal::GRAIN_SIZE,
              "executors/aten_grain.h mirrors ATen's GRAIN_SIZE");

namespace tpu_eager {
namespace spyre {
namespace {

[[noreturn]] void fail(int line, const std::string& rule, const std::string& msg) {
  TORCH_CHECK_VALUE(false, "KTIR line ", line, ": rule '", rule, "': ", msg);
}

struct DtypeName {
  c10::ScalarType t;
  const char* host;   // in views and args
  const char* torch;  // dtype literals
};
const DtypeName kDtypes[] = {
    {c10::kFloat, "f32", "torch.float32"},
    {c10::kHalf, "f16", "torch.float16"},
    {c10::kBFloat16, "bf16", "torch.bfloat16"},
    {c10::kDouble, "f64", "torch.float64"},
    {c10::kLong, "i64", "torch.int64"},
    {c10::kInt, "i32", "torch.int32"},
    {c10::kShort, "i16", "torch.int16"},
    {c10::kChar, "i8", "torch.int8"},
    {c10::kByte, "u8", "torch.uint8"},
    {c10::kBool, "bool", "torch.bool"},
    {c10::kUInt16, "u16", "torch.uint16"},
    {c10::kUInt32, "u32", "torch.uint32"},
    {c10::kUInt64, "u64", "torch.uint64"},
    {c10::kComplexHalf, "c32", "torch.complex32"},
    {c10::kComplexFloat, "c64", "torch.complex64"},
    {c10::kComplexDouble, "c128", "torch.complex128"},
    {c10::kFloat8_e4m3fn, "f8e4m3fn", "torch.float8_e4m3fn"},
    {c10::kFloat8_e5m2, "f8e5m2", "torch.float8_e5m2"},
};

std::string host_name(c10::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.t == t) return d.host;
  TORCH_CHECK_VALUE(false, "KTIR has no name for dtype ", t);
}

// Device dtype token: the device's name, with the host dtype in parentheses
// when the device holds it in another format (df16(f16), i32(i64)).
std::string type_token(c10::ScalarType t) {
  switch (t) {
    case c10::kHalf:
      return "df16(f16)";
    case c10::kBFloat16:
      return "df16(bf16)";
    case c10::kLong:
      return "i32(i64)";
    default:
      return host_name(t);
  }
}

bool parse_type_token(const std::string& s, c10::ScalarType* out) {
  if (s == "df16(f16)") return *out = c10::kHalf, true;
  if (s == "df16(bf16)") return *out = c10::kBFloat16, true;
  if (s == "i32(i64)") return *out = c10::kLong, true;
  for (const auto& d : kDtypes)
    if (s == d.host && d.t != c10::kHalf && d.t != c10::kBFloat16 && d.t != c10::kLong) return *out = d.t, true;
  return false;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Shortest text that reads back as the same double, always with '.', 'e', inf or nan.
std::string float_text(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const KtirValue& v) {
  switch (v.kind) {
    case KtirValue::kNone:
      return "None";
    case KtirValue::kBool:
      return v.b ? "True" : "False";
    case KtirValue::kInt:
      return std::to_string(v.i);
    case KtirValue::kFloat:
      return float_text(v.f);
    case KtirValue::kString: {
      std::string s = "\"";
      for (char c : v.s) s += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      return s + "\"";
    }
    case KtirValue::kDtype:
      for (const auto& d : kDtypes)
        if (static_cast<int64_t>(d.t) == v.i) return d.torch;
      return std::to_string(v.i);
    case KtirValue::kView:
      return "%" + std::to_string(v.i);
    case KtirValue::kList: {
      std::string s = "[";
      for (size_t i = 0; i < v.list.size(); ++i) s += (i ? ", " : "") + value_text(v.list[i]);
      return s + "]";
    }
  }
  return "None";
}

bool is_dtype_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::ScalarTypeType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::ScalarTypeType;
  return false;
}

KtirValue value_of(const c10::IValue& v, bool dtype) {
  KtirValue k;
  if (v.isNone()) return k;
  if (v.isBool())
    k.kind = KtirValue::kBool, k.b = v.toBool();
  else if (v.isInt())
    k.kind = dtype ? KtirValue::kDtype : KtirValue::kInt, k.i = v.toInt();
  else if (v.isDouble())
    k.kind = KtirValue::kFloat, k.f = v.toDouble();
  else if (v.isString())
    k.kind = KtirValue::kString, k.s = v.toStringRef();
  else if (v.isDevice())
    k.kind = KtirValue::kString, k.s = v.toDevice().str();
  else if (v.isTensor() && v.toTensor().dim() == 0) {  // a Python number received as a 0-dim tensor
    const c10::Scalar s = v.toTensor().item();
    if (s.isBoolean())
      k.kind = KtirValue::kBool, k.b = s.toBool();
    else if (s.isIntegral(false))
      k.kind = KtirValue::kInt, k.i = s.toLong();
    else
      k.kind = KtirValue::kFloat, k.f = s.toDouble();
  } else if (v.isList()) {
    k.kind = KtirValue::kList;
    for (const c10::IValue& e : v.toListRef()) k.list.push_back(value_of(e, false));
  }
  return k;  // generators and other opaque values: None
}

// `name`: an ATen op without its namespace ("add.Tensor"), or another
// namespace's op with it ("mylib::scaled_add", a custom op's library call).
const c10::OperatorHandle* find_op(const std::string& name) {
  const bool qualified = name.find("::") != std::string::npos;
  const auto dot = name.find('.', qualified ? name.find("::") + 2 : 0);
  const std::string base = (qualified ? "" : "aten::") + name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
  auto h = c10::Dispatcher::singleton().findSchema({base, overload});
  if (!h) return nullptr;
  static std::mutex mu;
  static std::map<std::string, c10::OperatorHandle>* cache = new std::map<std::string, c10::OperatorHandle>();
  std::lock_guard<std::mutex> lock(mu);
  return &cache->emplace(name, *h).first->second;
}

// ---------------------------------------------------------------- parser

// An expression as its monomials: the sorted symbols of each term -> its
// coefficient ({} the constant, {k} a linear term).
using Monomials = std::map<std::vector<int>, int64_t>;

Monomials monomials(const KtirExpr& e) {
  Monomials m;
  if (e.constant) m[{}] = e.constant;
  for (size_t k = 0; k < e.coef.size(); ++k)
    if (e.coef[k]) m[{static_cast<int>(k)}] += e.coef[k];
  for (const auto& t : e.products) m[t.syms] += t.c;
  return m;
}

KtirExpr from_monomials(const Monomials& m) {
  KtirExpr e;
  for (const auto& [syms, c] : m) {
    if (!c) continue;
    if (syms.empty()) {
      e.constant += c;
    } else if (syms.size() == 1) {
      if (e.coef.size() <= static_cast<size_t>(syms[0])) e.coef.resize(syms[0] + 1, 0);
      e.coef[syms[0]] += c;
    } else {
      e.products.push_back(KtirExpr::Product{c, syms});
    }
  }
  return e;
}

struct Cursor {
  const std::string& s;
  size_t i = 0;
  int line;
  void ws() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  bool eat(const std::string& t) {
    ws();
    if (s.compare(i, t.size(), t) != 0) return false;
    i += t.size();
    return true;
  }
  void expect(const std::string& t) {
    if (!eat(t)) fail(line, "syntax", "expected '" + t + "' at column " + std::to_string(i + 1) + " in: " + s);
  }
  std::string word() {
    ws();
    size_t b = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '=' && s[i] != ',' && s[i] != ']' && s[i] != ')' && s[i] != '[') ++i;
    return s.substr(b, i - b);
  }
  std::string token() {  // up to the next space
    ws();
    size_t b = i;
    while (i < s.size() && s[i] != ' ') ++i;
    return s.substr(b, i - b);
  }
  int64_t integer() {
    ws();
    size_t b = i;
    if (i < s.size() && s[i] == '-') ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (b == i || (s[b] == '-' && i == b + 1))
      fail(line, "syntax", "expected an integer at column " + std::to_string(b + 1) + " in: " + s);
    if (i - b > (s[b] == '-' ? 19u : 18u))
      fail(line, "syntax", "integer out of range at column " + std::to_string(b + 1) + " in: " + s);
    return std::stoll(s.substr(b, i - b));
  }
  std::vector<int64_t> int_list() {
    expect("[");
    std::vector<int64_t> v;
    if (eat("]")) return v;
    do v.push_back(integer());
    while (eat(","));
    expect("]");
    return v;
  }
  // A size list whose entries may be affine in the symbols ("s0", "s0-1":
  // exprs[i], cleared when none is) or, when `q` is given, "?" at dim 0 (*q set).
  std::vector<int64_t> sym_int_list(std::vector<KtirExpr>* exprs, bool* q = nullptr) {
    expect("[");
    std::vector<int64_t> v;
    exprs->clear();
    bool any = false;
    if (eat("]")) return v;
    do {
      exprs->emplace_back();
      if (q && v.empty() && eat("?")) {
        *q = true;
        v.push_back(0);
      } else {
        v.push_back(affine(&exprs->back()));
        any |= exprs->back().symbolic();
      }
    } while (eat(","));
    expect("]");
    if (!any) exprs->clear();
    return v;
  }
  // An expression (KtirExpr's text: terms [N "*"] SYM ("*" SYM)* and
  // numbers, joined by + and -); returns its constant value (the number
  // when it has no symbol; bound later otherwise).
  int64_t affine(KtirExpr* e) {
    Monomials m;
    ws();
    for (bool first = true;; first = false) {
      int64_t sign = 1;
      if (!first && i < s.size() && (s[i] == '+' || s[i] == '-'))
        sign = s[i++] == '-' ? -1 : 1;
      else if (!first)
        break;
      else if (i + 1 < s.size() && s[i] == '-' && s[i + 1] == 's')
        sign = -1, ++i;
      int64_t c = 1;
      if (i >= s.size() || s[i] != 's') {
        c = integer();
        if (i >= s.size() || s[i] != '*') {
          m[{}] += sign * c;
          continue;
        }
        if (++i >= s.size() || s[i] != 's') fail(line, "syntax", "expected a symbol after '*' in: " + s);
      }
      std::vector<int> syms;
      for (;;) {
        ++i;  // 's'
        const int64_t k = integer();
        if (k < 0 || k > 1000) fail(line, "syntax", "bad symbol s" + std::to_string(k));
        syms.push_back(static_cast<int>(k));
        if (i + 1 >= s.size() || s[i] != '*' || s[i + 1] != 's') break;
        ++i;  // '*'
      }
      std::sort(syms.begin(), syms.end());
      m[syms] += sign * c;
    }
    *e = from_monomials(m);
    return e->constant;
  }
  int view_ref() {
    expect("%");
    return static_cast<int>(integer());
  }
  bool done() {
    ws();
    return i == s.size();
  }
  KtirValue value() {
    ws();
    KtirValue v;
    if (eat("None")) return v;
    if (eat("True")) return v.kind = KtirValue::kBool, v.b = true, v;
    if (eat("False")) return v.kind = KtirValue::kBool, v.b = false, v;
    if (eat("%")) return v.kind = KtirValue::kView, v.i = integer(), v;
    if (eat("[")) {
      v.kind = KtirValue::kList;
      if (eat("]")) return v;
      do v.list.push_back(value());
      while (eat(","));
      expect("]");
      return v;
    }
    if (eat("\"")) {
      v.kind = KtirValue::kString;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        v.s += s[i++];
      }
      expect("\"");
      return v;
    }
    if (eat("torch.")) {
      const std::string w = "torch." + word();
      for (const auto& d : kDtypes)
        if (w == d.torch) return v.kind = KtirValue::kDtype, v.i = static_cast<int64_t>(d.t), v;
      fail(line, "syntax", "unknown dtype " + w);
    }
    const size_t b = i;
    const std::string w = word();
    if (w == "inf" || w == "-inf" || w == "nan") {
      v.kind = KtirValue::kFloat;
      v.f = w == "nan" ? NAN : (w == "inf" ? INFINITY : -INFINITY);
      return v;
    }
    char* end = nullptr;
    if (w.find_first_of(".eE") == std::string::npos) {
      const long long x = std::strtoll(w.c_str(), &end, 10);
      if (!w.empty() && *end == 0) return v.kind = KtirValue::kInt, v.i = x, v;
    } else {
      const double x = std::strtod(w.c_str(), &end);
      if (!w.empty() && *end == 0) return v.kind = KtirValue::kFloat, v.f = x, v;
    }
    fail(line, "syntax", "bad operand '" + w + "' at column " + std::to_string(b + 1) + " in: " + s);
  }
};

// Device element bytes of a host dtype (df16: 2, i64 held as i32: 4).
int64_t device_elem_bytes(c10::ScalarType t) { return t == c10::kLong ? 4 : c10::elementSize(t); }

int64_t last_elem(const KtirView& v) {
  int64_t e = v.offset;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 0) return -1;
    e += (v.sizes[d] - 1) * v.strides[d];
  }
  return e;
}

// Sticks of a tile: its innermost extent padded to whole sticks, times the other extents.
int64_t tile_sticks(const std::vector<int64_t>& sizes, c10::ScalarType t, int64_t stick) {
  const int64_t per = std::max<int64_t>(1, stick / device_elem_bytes(t));
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) rows *= sizes[d];
  const int64_t inner = sizes.empty() ? 1 : sizes.back();
  return rows * ((inner + per - 1) / per);
}

c10::IValue to_ivalue(const KtirValue& v, const c10::TypePtr& type, const std::vector<at::Tensor>& views, int line);

at::Tensor view_tensor(const KtirValue& v, const std::vector<at::Tensor>& views, int line) {
  if (v.i < 0 || v.i >= static_cast<int64_t>(views.size()) || !views[v.i].defined())
    fail(line, "def-use", "%" + std::to_string(v.i) + " is not defined here");
  return views[v.i];
}

c10::IValue to_ivalue(const KtirValue& v, const c10::TypePtr& type, const std::vector<at::Tensor>& views, int line) {
  c10::TypePtr t = type;
  if (auto o = t->cast<c10::OptionalType>()) {
    if (v.kind == KtirValue::kNone) return c10::IValue();
    t = o->getElementType();
  }
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      if (v.kind == KtirValue::kView) return view_tensor(v, views, line);
      if (v.kind == KtirValue::kInt || v.kind == KtirValue::kFloat || v.kind == KtirValue::kBool) {
        at::Tensor s = v.kind == KtirValue::kInt    ? at::scalar_tensor(v.i, at::kLong)
                       : v.kind == KtirValue::kBool ? at::scalar_tensor(v.b, at::kBool)
                                                    : at::scalar_tensor(v.f, at::kDouble);
        s.unsafeGetTensorImpl()->set_wrapped_number(true);
        return s;
      }
      break;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      if (v.kind == KtirValue::kInt || v.kind == KtirValue::kDtype) return v.i;
      break;
    case c10::TypeKind::FloatType:
      if (v.kind == KtirValue::kFloat) return v.f;
      if (v.kind == KtirValue::kInt) return static_cast<double>(v.i);
      break;
    case c10::TypeKind::BoolType:
      if (v.kind == KtirValue::kBool) return v.b;
      break;
    case c10::TypeKind::NumberType:
      if (v.kind == KtirValue::kInt) return v.i;
      if (v.kind == KtirValue::kFloat) return v.f;
      if (v.kind == KtirValue::kBool) return v.b;
      break;
    case c10::TypeKind::StringType:
      if (v.kind == KtirValue::kString) return v.s;
      break;
    case c10::TypeKind::DeviceObjType:
      if (v.kind == KtirValue::kString) return c10::Device(v.s);
      break;
    case c10::TypeKind::ListType: {
      if (v.kind != KtirValue::kList) {
        if (v.kind == KtirValue::kInt) return c10::List<int64_t>({v.i});  // int[1] given as an int
        break;
      }
      const c10::TypePtr el = t->castRaw<c10::ListType>()->getElementType();
      if (el->kind() == c10::TypeKind::TensorType) {
        c10::List<at::Tensor> out;
        for (const auto& e : v.list) out.push_back(to_ivalue(e, el, views, line).toTensor());
        return out;
      }
      if (el->kind() == c10::TypeKind::OptionalType) {
        c10::List<std::optional<at::Tensor>> out;
        for (const auto& e : v.list) {
          c10::IValue x = to_ivalue(e, el, views, line);
          out.push_back(x.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(x.toTensor()));
        }
        return out;
      }
      if (el->kind() == c10::TypeKind::FloatType) {
        c10::List<double> out;
        for (const auto& e : v.list) out.push_back(to_ivalue(e, el, views, line).toDouble());
        return out;
      }
      if (el->kind() == c10::TypeKind::BoolType) {
        c10::List<bool> out;
        for (const auto& e : v.list) out.push_back(to_ivalue(e, el, views, line).toBool());
        return out;
      }
      c10::List<int64_t> out;
      for (const auto& e : v.list) out.push_back(to_ivalue(e, c10::IntType::get(), views, line).toInt());
      return out;
    }
    default:
      if (v.kind == KtirValue::kNone) return c10::IValue();
      break;
  }
  fail(line, "types", "operand " + value_text(v) + " does not fit argument type " + type->str());
}

// True when schema argument `a` of `op` is written without being read (out=,
// the self of fill_, zero_, copy_ and RNG fills): its view needs no value yet.
bool write_only(const std::string& op, const c10::FunctionSchema& schema, size_t a) {
  const auto& arg = schema.arguments()[a];
  if (!arg.alias_info() || !arg.alias_info()->isWrite()) return false;
  if (arg.is_out()) return true;
  static const std::set<std::string> overwrite = {"fill_",    "zero_",       "copy_",        "normal_",
                                                  "uniform_", "random_",     "exponential_", "geometric_",
                                                  "cauchy_",  "log_normal_", "bernoulli_"};
  return a == 0 && overwrite.count(op.substr(0, op.find('.')));
}

// Gives each write-only view operand of `o` a tensor from `make` when it has none.
template <typename F>
void define_written(const KtirOp& o, const c10::FunctionSchema& schema, std::vector<at::Tensor>& views, F&& make) {
  for (size_t a = 0; a < o.args.size() && a < schema.arguments().size(); ++a) {
    const KtirValue& v = o.args[a];
    if (v.kind == KtirValue::kView && v.i >= 0 && v.i < static_cast<int64_t>(views.size()) && !views[v.i].defined() &&
        write_only(o.op, schema, a))
      views[v.i] = make(static_cast<int>(v.i));
  }
}

// The CPU/meta stack of op `o` with view operands from `views`.
torch::jit::Stack op_stack(const KtirOp& o, const c10::FunctionSchema& schema, const std::vector<at::Tensor>& views) {
  const auto& args = schema.arguments();
  if (o.args.size() > args.size())
    fail(o.line, "op",
         o.op + " takes " + std::to_string(args.size()) + " arguments, got " + std::to_string(o.args.size()));
  torch::jit::Stack stack;
  for (size_t a = 0; a < args.size(); ++a) {
    if (a < o.args.size()) {
      stack.push_back(to_ivalue(o.args[a], args[a].real_type(), views, o.line));
    } else if (args[a].default_value()) {
      stack.push_back(*args[a].default_value());
    } else {
      fail(o.line, "op", o.op + ": missing argument '" + args[a].name() + "'");
    }
  }
  return stack;
}

// Fresh (non-aliasing) tensor results of a call, in order.
std::vector<at::Tensor> fresh(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  std::vector<at::Tensor> out;
  const auto& rets = schema.returns();
  for (size_t k = 0; k < rets.size() && k < stack.size(); ++k) {
    if (rets[k].alias_info()) continue;
    if (stack[k].isTensor())
      out.push_back(stack[k].toTensor());
    else if (stack[k].isTensorList())
      for (const auto& t : stack[k].toTensorList()) out.push_back(t);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- build

KtirProgram ktir_build(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card) {
  return ktir_build(compiled, region, graph, card, region_layout(region, graph, card));
}

KtirProgram ktir_build(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card, const RegionLayout& L) {
  KtirProgram p;
  p.name = compiled.name;
  p.grid = L.cores;
  p.rows_per_core = L.rows_per_core;
  p.cores_used = L.cores_used;
  p.ring_reduce = L.ring_reduce;
  // Arguments: the storages of HBM views, in order of first use.
  std::map<const DeferredStorage*, int> arg_of;
  std::vector<std::pair<bool, bool>> rw;  // loaded, stored
  for (const auto& v : L.views) {
    if (v.lx) continue;
    const DeferredStorage* s = v.ref->storage.get();
    auto it = arg_of.find(s);
    if (it == arg_of.end()) {
      it = arg_of.emplace(s, static_cast<int>(p.args.size())).first;
      KtirArg a;
      a.dtype = v.ref->dtype;
      a.elems = static_cast<int64_t>(s->nbytes / c10::elementSize(v.ref->dtype));
      p.args.push_back(a);
      rw.emplace_back(false, false);
    }
    rw[it->second].first |= v.loaded;
    rw[it->second].second |= v.stored;
  }
  for (size_t a = 0; a < p.args.size(); ++a)
    p.args[a].kind = rw[a].first && rw[a].second ? KtirArg::kInOut : (rw[a].first ? KtirArg::kIn : KtirArg::kOut);
  std::map<const DeferredStorage*, int> buf_of;
  for (const auto& v : L.views) {
    KtirView kv;
    kv.lx = v.lx;
    if (v.lx) kv.buf = buf_of.emplace(v.ref->storage.get(), static_cast<int>(buf_of.size())).first->second;
    kv.dtype = v.ref->dtype;
    kv.arg = v.lx ? -1 : arg_of.at(v.ref->storage.get());
    kv.offset = v.ref->offset;
    kv.sizes = v.ref->sizes().vec();
    kv.strides = v.ref->strides().vec();
    p.views.push_back(kv);
    KtirTile t;
    t.view = static_cast<int>(p.tiles.size());
    t.sizes = kv.sizes;
    if (v.split && !t.sizes.empty()) {
      t.sizes[0] = L.rows_per_core;
      t.core_stride = L.rows_per_core;
    }
    p.tiles.push_back(t);
  }
  for (int i : region.nodes) {
    const Node& n = graph[i];
    const auto& schema_args = n.op.schema().arguments();
    KtirOp o;
    o.op = host::op_display_name(n);
    if (o.op.rfind("aten::", 0) == 0) o.op = o.op.substr(6);  // other namespaces keep theirs
    o.handle = &n.op;
    for (size_t a = 0; a < n.args.size(); ++a)
      o.args.push_back(value_of(n.args[a], a < schema_args.size() && is_dtype_type(schema_args[a].real_type())));
    std::map<int, std::vector<std::pair<int, int>>> lists;
    for (const auto& in : n.inputs) {
      KtirValue ref;
      ref.kind = KtirValue::kView;
      ref.i = L.id(in.ref);
      if (in.elem < 0)
        o.args.at(in.arg) = ref;
      else
        lists[in.arg].push_back({in.elem, L.id(in.ref)});
    }
    for (auto& [a, elems] : lists) {
      KtirValue& l = o.args.at(a);
      // Tensor?[] keeps its Nones; fill the views in at their positions.
      size_t len = 0;
      for (const auto& e : elems) len = std::max<size_t>(len, e.first + 1);
      if (l.kind != KtirValue::kList) l = KtirValue{}, l.kind = KtirValue::kList;
      if (l.list.size() < len) l.list.resize(len);
      for (const auto& [e, id] : elems) {
        l.list[e] = KtirValue{};
        l.list[e].kind = KtirValue::kView;
        l.list[e].i = id;
      }
    }
    // Fresh results in return order; an undefined one (an output_mask entry
    // that was off) is None (-1).
    size_t next_out = 0;
    for (size_t k = 0; k < n.returns.size(); ++k) {
      const int r = n.returns[k];
      if (r == -1 && next_out < n.outputs.size()) o.results.push_back(L.id(n.outputs[next_out++]));
      if (r == -4) o.results.push_back(-1);
      if (r == -2)
        for (int e = 0; e < n.list_lens[k] && next_out < n.outputs.size(); ++e)
          o.results.push_back(L.id(n.outputs[next_out++]));
    }
    while (next_out < n.outputs.size()) o.results.push_back(L.id(n.outputs[next_out++]));
    p.ops.push_back(std::move(o));
  }
  // Line numbers as printed (header, arguments, views, tiles, ops).
  int line = 2;
  for (auto& a : p.args) a.line = line++;
  for (auto& v : p.views) v.line = line++;
  for (auto& t : p.tiles) t.line = line++;
  for (auto& o : p.ops) o.line = line++;
  return p;
}

// ---------------------------------------------------------------- symbols

bool KtirExpr::symbolic() const {
  for (int64_t c : coef)
    if (c) return true;
  return !products.empty();
}

namespace {
// x * y and x + y, saturated at the int64 limits (a range's far corner can
// overflow a product of symbols; a saturated value fails the bounds checks).
int64_t sat_mul(int64_t x, int64_t y) {
  int64_t r;
  if (!__builtin_mul_overflow(x, y, &r)) return r;
  return (x < 0) != (y < 0) ? INT64_MIN : INT64_MAX;
}
int64_t sat_add(int64_t x, int64_t y) {
  int64_t r;
  if (!__builtin_add_overflow(x, y, &r)) return r;
  return x < 0 ? INT64_MIN : INT64_MAX;
}
int64_t sym_value(const std::vector<int64_t>& values, int k) {
  return k < static_cast<int>(values.size()) ? values[k] : 0;
}
}  // namespace

int64_t KtirExpr::eval(const std::vector<int64_t>& values) const {
  int64_t v = constant;
  for (size_t k = 0; k < coef.size(); ++k)
    if (coef[k]) v = sat_add(v, sat_mul(coef[k], sym_value(values, static_cast<int>(k))));
  for (const auto& t : products) {
    int64_t m = t.c;
    for (int k : t.syms) m = sat_mul(m, sym_value(values, k));
    v = sat_add(v, m);
  }
  return v;
}

int KtirExpr::single_symbol() const {
  if (!products.empty()) return -1;
  int one = -1;
  for (size_t k = 0; k < coef.size(); ++k) {
    if (!coef[k]) continue;
    if (one >= 0) return -1;
    one = static_cast<int>(k);
  }
  return one;
}

KtirExpr KtirExpr::symbol(int k, int64_t coef, int64_t constant) {
  KtirExpr e;
  e.constant = constant;
  e.coef.assign(k + 1, 0);
  e.coef[k] = coef;
  return e;
}

namespace {

KtirExpr affine_const(int64_t c) {
  KtirExpr e;
  e.constant = c;
  return e;
}

// e * f (products of symbols where both have symbols).
KtirExpr affine_mul(const KtirExpr& e, const KtirExpr& f) {
  Monomials r;
  for (const auto& [x, a] : monomials(e))
    for (const auto& [y, b] : monomials(f)) {
      std::vector<int> xy = x;
      xy.insert(xy.end(), y.begin(), y.end());
      std::sort(xy.begin(), xy.end());
      r[xy] += a * b;
    }
  return from_monomials(r);
}

// e + q * f.
void affine_add(KtirExpr& e, int64_t q, const KtirExpr& f) {
  Monomials m = monomials(e);
  for (const auto& [y, b] : monomials(f)) m[y] += q * b;
  e = from_monomials(m);
}

// e with symbol k replaced by the expression `by`.
KtirExpr affine_replace(const KtirExpr& e, int k, const KtirExpr& by) {
  KtirExpr r;
  for (const auto& [syms, a] : monomials(e)) {
    KtirExpr t = affine_const(a);
    for (int x : syms) t = affine_mul(t, x == k ? by : KtirExpr::symbol(x));
    affine_add(r, 1, t);
  }
  return r;
}

// e with each symbol k that `known` marks replaced by values[k].
KtirExpr affine_subst(const KtirExpr& e, const std::vector<int64_t>& values, const std::vector<char>& known) {
  Monomials r;
  for (const auto& [syms, a] : monomials(e)) {
    std::vector<int> rest;
    int64_t c = a;
    for (int k : syms) {
      if (k < static_cast<int>(known.size()) && known[k])
        c = sat_mul(c, values[k]);
      else
        rest.push_back(k);
    }
    r[rest] += c;
  }
  return from_monomials(r);
}

// e with each symbol k renamed to to[k].
KtirExpr affine_rename(const KtirExpr& e, const std::vector<int>& to) {
  Monomials r;
  for (const auto& [syms, a] : monomials(e)) {
    std::vector<int> x = syms;
    for (int& k : x) k = to[k];
    std::sort(x.begin(), x.end());
    r[x] += a;
  }
  return from_monomials(r);
}

// The offset of `v` as an expression of its stride expressions
// (symbolize_strides): decomposed greedily along the strides, largest
// first; a whole number of strides equal to a subtracted symbol's value is
// that symbol, one of j < parts[k] parts is j*s<k>.
void symbolize_offset(KtirView& v, const std::vector<int64_t>& values, const std::vector<int64_t>& parts) {
  const size_t n = v.sizes.size();
  std::vector<size_t> order;
  for (size_t d = 0; d < n && d < v.strides.size(); ++d)
    if (v.strides[d] != 0) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return v.strides[a] != v.strides[b] ? v.strides[a] < v.strides[b] : a > b;
  });
  auto stride_at = [&](size_t d) {
    return d < v.stride_expr.size() && v.stride_expr[d].symbolic() ? v.stride_expr[d] : affine_const(v.strides[d]);
  };
  // A symbol some size subtracts (d[:, m:] of size s0-s1): a whole number
  // of strides equal to its value is that symbol (offset s1).
  std::vector<char> subtracted(values.size(), 0);
  for (const auto& e : v.size_expr)
    for (size_t k = 0; k < e.coef.size() && k < values.size(); ++k) subtracted[k] |= e.coef[k] < 0;
  auto count = [&](int64_t q) {
    for (size_t k = 0; k < values.size(); ++k)
      if (subtracted[k] && values[k] == q) return KtirExpr::symbol(static_cast<int>(k));
    for (size_t k = 0; k < values.size() && k < parts.size(); ++k)
      if (parts[k] > 1 && values[k] > 0 && q % values[k] == 0 && q / values[k] < parts[k])
        return KtirExpr::symbol(static_cast<int>(k), q / values[k], 0);
    return affine_const(q);
  };
  KtirExpr off;
  int64_t rest = v.offset;
  for (auto it = order.rbegin(); it != order.rend() && rest > 0; ++it) {
    const int64_t q = rest / v.strides[*it];
    if (q <= 0) continue;
    affine_add(off, 1, affine_mul(count(q), stride_at(*it)));
    rest -= q * v.strides[*it];
  }
  off.constant += rest;
  if (off.symbolic()) v.offset_expr = off;
}

// The strides and offset of `v` as expressions of its symbolic sizes
// (ktir_symbolize): dims by increasing stride (0 strides left out); a dim
// whose stride is the previous dim's stride times its size takes that
// product; the first dim, or one that breaks the chain, keeps its number,
// or a symbol of equal value; a size-1 dim after the first does not break
// it. The offset is decomposed greedily along the
// strides, largest first. Values are those of the launch the program was
// built for, so every expression evaluates to its number under `values`.
// `parts[k]` > 1: symbol k is one of that many equal parts of a marked dim
// (qkv.chunk(3, 1)): a stride that many times a dense successor's is the
// marked tensor's pitch ("3*s0"), and an offset of j < parts[k] times its
// value along a stride is j parts ("offset=2*s0").
// `floor`: the least stride of the marked dims of v's storage (0: none
// known); a stride up to it is that dim's own or lies inside one of its
// elements, so it names no symbol by value (the heads' stride 16 of a (n,
// 192) buffer's q.view(n, 4, 16) at n = 16; the rows' 16 of x (n, 16)).
void symbolize_strides(KtirView& v, const std::vector<int64_t>& values, const std::vector<int64_t>& parts,
                       int64_t floor = 0) {
  const size_t n = v.sizes.size();
  if (values.empty() || v.strides.size() != n) return;
  auto size_expr = [&](size_t d) {
    return d < v.size_expr.size() && v.size_expr[d].symbolic() ? v.size_expr[d] : affine_const(v.sizes[d]);
  };
  auto sym_equal = [&](int64_t x) {
    for (size_t k = 0; k < values.size() && x > floor; ++k)
      if (values[k] == x) return KtirExpr::symbol(static_cast<int>(k));
    return affine_const(x);
  };
  std::vector<size_t> order;
  for (size_t d = 0; d < n; ++d)
    if (v.strides[d] != 0) order.push_back(d);
  // Increasing stride; on a tie the inner dim first (a size-1 dim's stride).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return v.strides[a] != v.strides[b] ? v.strides[a] < v.strides[b] : a > b;
  });
  // A stride that breaks the chain: a symbol's value times the previous
  // dim's stride (the pitch of a slice of a dense tensor with a symbolic
  // inner dim: [16, s0-1, s1] of [16, s0, s1] has pitch s0*s1), else as
  // sym_equal.
  auto pitch = [&](int64_t x, int64_t prev_value, const KtirExpr& prev) {
    if (prev.symbolic() && prev_value > 0 && x % prev_value == 0 && x > floor)
      for (size_t k = 0; k < values.size(); ++k)
        if (values[k] * prev_value == x) return affine_mul(prev, KtirExpr::symbol(static_cast<int>(k)));
    return sym_equal(x);
  };
  std::vector<KtirExpr> ex(n);
  std::optional<KtirExpr> next;  // the stride a dense successor would have (a product of symbols too)
  int64_t next_value = -1, prev_value = -1;
  KtirExpr prev;
  // The pitch of an equal part: q times the dense successor's stride.
  auto part_pitch = [&](int64_t x) -> std::optional<KtirExpr> {
    if (!next || !next->symbolic() || next_value <= 0) return std::nullopt;
    for (size_t k = 0; k < parts.size() && k < values.size(); ++k)
      if (parts[k] > 1 && x == parts[k] * next_value) return affine_mul(affine_const(parts[k]), *next);
    return std::nullopt;
  };
  for (size_t d : order) {
    if (next && v.strides[d] == next_value)
      ex[d] = *next;
    else if (auto e = part_pitch(v.strides[d]))
      ex[d] = *e;
    else
      ex[d] = pitch(v.strides[d], prev_value, prev);
    prev = ex[d], prev_value = v.strides[d];
    // A size-1 dim's stride is free (repeat(2, 1)'s [2, 1, 16, s0] holds
    // s0 there): the chain goes on past it.
    if (next && v.sizes[d] == 1) continue;
    next = affine_mul(ex[d], size_expr(d));
    next_value = v.strides[d] * v.sizes[d];
  }
  bool any = false;
  for (const auto& e : ex) any |= e.symbolic();
  if (any) v.stride_expr = ex;
  symbolize_offset(v, values, parts);
}

// One past the last element a view reaches, as an expression: offset +
// sum (size_d - 1) * stride_d + 1 (an empty view: 0).
KtirExpr view_extent(const KtirView& v) {
  KtirExpr e;
  for (size_t d = 0; d < v.sizes.size(); ++d)
    if (v.sizes[d] == 0) return e;
  e = v.offset_expr.symbolic() ? v.offset_expr : affine_const(v.offset);
  for (size_t d = 0; d < v.sizes.size() && d < v.strides.size(); ++d) {
    KtirExpr size = d < v.size_expr.size() && v.size_expr[d].symbolic() ? v.size_expr[d] : affine_const(v.sizes[d]);
    size.constant -= 1;
    const KtirExpr stride =
        d < v.stride_expr.size() && v.stride_expr[d].symbolic() ? v.stride_expr[d] : affine_const(v.strides[d]);
    affine_add(e, 1, affine_mul(size, stride));
  }
  e.constant += 1;
  return e;
}

// The size expression of dim d of view v (a number when not symbolic).
KtirExpr size_at(const KtirView& v, size_t d) {
  return d < v.size_expr.size() && v.size_expr[d].symbolic() ? v.size_expr[d] : affine_const(v.sizes[d]);
}

// The view a cat writes: its result, or cat.out's out= operand; -1 for
// another op.
int cat_result(const KtirOp& o, size_t nviews) {
  int v = -1;
  if (o.op == "cat" && o.results.size() == 1)
    v = o.results[0];
  else if (o.op == "cat.out" && o.results.empty() && o.args.size() == 3 && o.args[2].kind == KtirValue::kView)
    v = static_cast<int>(o.args[2].i);
  return v >= 0 && static_cast<size_t>(v) < nviews ? v : -1;
}

// The size of a dim of stride `stride` and size `size` that merges dims of
// view `v` of the same storage or LX buffer (a reshape: repeat's [16, 2n]
// over its (16, 2, n) buffer, a clone's flattened [16*(s0-1)]): the product of v's sizes along the chain of strides
// from `stride` (each next dim's stride the product so far times `stride`),
// when that chain reaches `size` exactly and names a symbol.
std::optional<KtirExpr> merged_size(const KtirView& v, int64_t stride, int64_t size) {
  KtirExpr prod = affine_const(1);
  int64_t value = 1;
  while (value < size) {
    size_t e = 0;
    while (e < v.sizes.size() && (e >= v.strides.size() || v.strides[e] != stride * value || v.sizes[e] <= 1)) ++e;
    if (e == v.sizes.size()) return std::nullopt;
    prod = affine_mul(prod, size_at(v, e));
    value *= v.sizes[e];
  }
  if (value != size || !prod.symbolic()) return std::nullopt;
  return prod;
}

// Sizes a region creates from its symbolic sizes, as (value, expression):
// a cat's result size along its dim, the sum of its inputs'; and a view
// holding a symbolic view of the same storage and strides (the copy_ target
// of a pad, `F.pad(d, (1, 1))` writing d into [1, n+1) of an n+2 row): its
// size there is the inner's plus the margin (s0+2), when the margin is at
// most half the inner size (a nearby size, as ktir_symbolize's offsets).
// `values`: the symbols' values at this launch (each expression equals its value there).
std::vector<std::pair<int64_t, KtirExpr>> created_sizes(const KtirProgram& p, const std::vector<int64_t>& values) {
  std::vector<std::pair<int64_t, KtirExpr>> out;
  for (const auto& o : p.ops) {
    const int result = cat_result(o, p.views.size());
    if (result < 0 || o.args.empty() || o.args[0].kind != KtirValue::kList) continue;
    const KtirView& r = p.views[result];
    int64_t dim = o.args.size() > 1 && o.args[1].kind == KtirValue::kInt ? o.args[1].i : 0;
    if (dim < 0) dim += static_cast<int64_t>(r.sizes.size());
    if (dim < 0 || dim >= static_cast<int64_t>(r.sizes.size())) continue;
    KtirExpr sum;
    for (const auto& x : o.args[0].list) {
      if (x.kind != KtirValue::kView || x.i < 0 || x.i >= static_cast<int64_t>(p.views.size())) continue;
      const KtirView& in = p.views[x.i];
      if (in.sizes.size() == r.sizes.size()) affine_add(sum, 1, size_at(in, dim));
    }
    if (sum.symbolic() && sum.eval(values) == r.sizes[dim]) out.emplace_back(r.sizes[dim], sum);
  }
  for (const auto& w : p.views)
    for (const auto& v : p.views) {
      if (w.lx || v.lx || w.arg != v.arg || &w == &v || w.strides != v.strides || v.size_expr.empty()) continue;
      for (size_t d = 0; d < v.sizes.size() && d < w.sizes.size(); ++d) {
        const int64_t margin = w.sizes[d] - v.sizes[d];
        if (!v.size_expr[d].symbolic() || margin <= 0 || 2 * margin > v.sizes[d]) continue;
        KtirExpr e = v.size_expr[d];
        e.constant += margin;
        out.emplace_back(w.sizes[d], e);
      }
    }
  for (const auto& w : p.views)
    for (size_t d = 0; d < w.sizes.size() && d < w.strides.size(); ++d)
      if (w.sizes[d] > 1 && w.strides[d] > 0 && !size_at(w, d).symbolic())
        for (const auto& v : p.views)
          if (&v != &w && v.lx == w.lx && (w.lx ? v.buf == w.buf : v.arg == w.arg) && !v.size_expr.empty())
            if (auto e = merged_size(v, w.strides[d], w.sizes[d]); e && e->eval(values) == w.sizes[d]) {
              out.emplace_back(w.sizes[d], *e);
              break;
            }
  return out;
}

}  // namespace

namespace {

// Calls f on every expression of `p`: the rows, element counts, view sizes,
// strides and offsets, tile sizes.
template <class F>
void for_each_expr(KtirProgram& p, F f) {
  f(p.rows_expr);
  for (auto& a : p.args) f(a.elems_expr);
  for (auto& v : p.views) {
    for (auto& e : v.size_expr) f(e);
    for (auto& e : v.stride_expr) f(e);
    f(v.offset_expr);
  }
  for (auto& t : p.tiles)
    for (auto& e : t.size_expr) f(e);
}

// Which dims of each op result follow the marked sizes: the ops rerun on
// meta tensors with every marked dim of a read view grown by kGrowth; a
// result dim whose size then changes follows them (the rows of x @ w), one
// that does not comes from a fixed size (w's columns). Per view, empty for
// views no op makes; all empty when the probe cannot run (a split, a step
// slice or an equal part, whose sizes do not grow alike; an op without a
// meta kernel or that rejects the grown sizes).
std::vector<std::vector<char>> varying_result_dims(const KtirProgram& p, const std::vector<KtirDynamicDim>& dynamic,
                                                   const std::vector<std::pair<int, int>>& sliced = {}) {
  constexpr int64_t kGrowth = 7;
  const size_t nv = p.views.size();
  std::vector<std::vector<char>> out(nv);
  std::vector<std::vector<int64_t>> sizes(nv);
  std::vector<char> read(nv, 0);
  for (size_t i = 0; i < nv; ++i) {
    const KtirView& v = p.views[i];
    read[i] = !v.lx && v.arg >= 0 && static_cast<size_t>(v.arg) < p.args.size() && p.args[v.arg].kind != KtirArg::kOut;
    if (read[i]) sizes[i] = v.sizes;
  }
  for (const auto& d : dynamic) {
    if (d.scale != 1 || d.divisor != 1 || d.part != 1 || d.step != 1 || d.trim != 0) return {};
    if (d.view < 0 || static_cast<size_t>(d.view) >= nv || !read[d.view] || d.dim < 0 ||
        static_cast<size_t>(d.dim) >= sizes[d.view].size())
      continue;
    sizes[d.view][d.dim] = p.views[d.view].sizes[d.dim] + kGrowth;
  }
  // A slice of a storage of no mark cut to the marked size grows with it.
  for (const auto& [view, dim] : sliced)
    if (read[view] && static_cast<size_t>(dim) < sizes[view].size()) sizes[view][dim] += kGrowth;
  std::vector<at::Tensor> meta(nv);
  for (size_t i = 0; i < nv; ++i)
    if (read[i]) meta[i] = at::empty(sizes[i], at::TensorOptions().dtype(p.views[i].dtype).device(c10::kMeta));
  try {
    for (const auto& o : p.ops) {
      const c10::OperatorHandle* h = ktir_op_handle(o);
      if (!h) return {};
      const auto& schema = h->schema();
      // An out= view no op made before: empty, so the op sizes it from the
      // grown operands without a resize warning.
      define_written(o, schema, meta, [&](int v) {
        return at::empty({0}, at::TensorOptions().dtype(p.views[v].dtype).device(c10::kMeta));
      });
      for (const auto& a : o.args)
        if (a.kind == KtirValue::kView && (a.i < 0 || static_cast<size_t>(a.i) >= nv || !meta[a.i].defined()))
          return {};
      torch::jit::Stack stack = op_stack(o, schema, meta);
      c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
      h->callBoxed(stack);
      const std::vector<at::Tensor> got = fresh(schema, stack);
      for (size_t j = 0; j < o.results.size(); ++j) {
        const int r = o.results[j];
        if (r < 0) continue;
        if (j >= got.size() || !got[j].defined() || got[j].dim() != static_cast<int64_t>(p.views[r].sizes.size()))
          return {};
        meta[r] = got[j];
        out[r].assign(p.views[r].sizes.size(), 0);
        for (size_t d = 0; d < out[r].size(); ++d)
          out[r][d] = got[j].size(static_cast<int64_t>(d)) != p.views[r].sizes[d];
      }
    }
  } catch (...) {
    return {};
  }
  return out;
}

// Drops the symbols of `p` that no expression names (their values from
// p.sym_values) and renumbers the rest in order; the old numbers of those kept.
std::vector<int> drop_unused_symbols(KtirProgram& p) {
  const size_t n = p.sym_values.size();
  std::vector<char> used(n, 0);
  for_each_expr(p, [&](KtirExpr& e) {
    for (size_t k = 0; k < e.coef.size() && k < n; ++k) used[k] |= e.coef[k] != 0;
    for (const auto& t : e.products)
      for (int k : t.syms) used[k] = 1;
  });
  std::vector<int> renum(n, -1), kept;
  std::vector<int64_t> values;
  for (size_t k = 0; k < n; ++k) {
    if (!used[k]) continue;
    renum[k] = static_cast<int>(kept.size());
    kept.push_back(static_cast<int>(k));
    values.push_back(p.sym_values[k]);
  }
  for_each_expr(p, [&](KtirExpr& e) {
    if (e.symbolic()) e = affine_rename(e, renum);
  });
  p.sym_values = std::move(values);
  return kept;
}

}  // namespace

void ktir_symbolize(KtirProgram& p, const std::vector<KtirDynamicDim>& dynamic) {
  // The symbols: the distinct bases, each with its range and the offsets
  // (size - base) its dynamic dims have; 0 first (a size equal to the base).
  struct Sym {
    int64_t base, lower, upper;
    std::vector<int64_t> offsets{0};
    std::vector<int64_t> scales;  // k of merged dims of size k * base ("16*s0")
    std::vector<int64_t> minus;   // bases b of dims of size base - b ("s0-s1")
    int64_t part = 1;             // one of `part` equal parts of a marked dim (its symbol: "3*s0" the marked size)
  };
  std::vector<Sym> syms;
  // Marked sizes cut into equal parts (chunk(q), split(base / q)): when the
  // region reads a part (q, k or v of qkv.chunk(3), the first alone too:
  // q = qkv[..., :c] used whole), or splits one (q.view(16, -1, 64)), the
  // part is the symbol: (base, q). A fixed slice that is a whole part of
  // the compile's size by chance (d[:, :8] of n = 40) is taken for one; the
  // next size's launch check plans it again as a number (never a wrong
  // binding).
  std::vector<std::pair<int64_t, int64_t>> cut;
  for (const auto& d : dynamic)
    if (d.part > 1 && d.base > 1 &&
        std::none_of(cut.begin(), cut.end(), [&](const auto& x) { return x.first == d.base; }))
      cut.emplace_back(d.base, d.part);
  auto parts_of = [&](int64_t base) {
    for (const auto& [b, q] : cut)
      if (b == base) return q;
    return int64_t{1};
  };
  // The bases of the marked dims read whole or sliced: a size base - b of
  // two of them is their difference (d[:, m:] of a marked n, m another
  // marked size: "s0-s1").
  std::vector<int64_t> plain;
  for (const auto& d : dynamic)
    if (d.base > 1 && d.scale == 1 && d.divisor == 1 && d.step == 1 && parts_of(d.base) == 1) plain.push_back(d.base);
  // A step slice of a marked dim to its end (d[:, ::2], k.t()[:, 1::2]):
  // the base n and the slice's size t = ceil((n - start) / step) are
  // symbols (n first: it names the pitch and the element count); n is
  // rewritten below as step*t + r + start - step + 1, r in [0, step - 1] a
  // symbol of its own, so every view is valid over a box of ranges. One
  // step slice per base (a second keeps its t a symbol of its own).
  struct StepSlice {
    int64_t n, t, step, start, view, dim;
  };
  std::vector<StepSlice> steps;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> trims;  // a split of a slice: n, a, b, trim
  auto sym_of = [&](int64_t base, int64_t lower, int64_t upper) {
    auto it = std::find_if(syms.begin(), syms.end(), [&](const Sym& x) { return x.base == base; });
    if (it == syms.end()) return syms.insert(syms.end(), Sym{base, lower, upper});
    it->lower = std::max(it->lower, lower), it->upper = std::min(it->upper, upper);
    return it;
  };
  for (const auto& d : dynamic) {
    if (d.base <= 1) continue;
    const int64_t q = parts_of(d.base);
    if (d.step > 1) {
      const bool whole = d.size >= 1 && d.size == (d.base - d.start + d.step - 1) / d.step;
      if (!whole || d.view < 0 || static_cast<size_t>(d.view) >= p.views.size() || d.dim < 0 ||
          static_cast<size_t>(d.dim) >= p.views[d.view].sizes.size() || p.views[d.view].sizes[d.dim] != d.size ||
          std::any_of(steps.begin(), steps.end(), [&](const StepSlice& x) { return x.n == d.base; }))
        continue;
      sym_of(d.base, d.lower, d.upper);
      sym_of(d.size, std::max<int64_t>(1, (d.lower - d.start + d.step - 1) / d.step),
             (d.upper - d.start + d.step - 1) / d.step);
      steps.push_back({d.base, d.size, d.step, d.start, d.view, d.dim});
      continue;
    }
    // Each part of a split (view(16, 4, n / 4), view(b, n / 64, 64)) is a
    // symbol of its own, the marked size their product (the pitch, the
    // element count: strides follow the sizes); its range the quotients of
    // the mark's by the other part.
    // A split of an equal part (q.view(16, -1, 64) of qkv's q): the marked
    // size is part * the product.
    if (d.divisor > 1) {
      if (d.part != (d.part > 1 ? q : 1)) continue;
      const int64_t div = d.divisor * d.part;
      if (d.size <= 1 || d.size * div + d.trim != d.base) continue;
      // A split of a slice (x[:, 1:].view(16, -1, 64)): the base n is a
      // symbol (the pitch, the element count), rewritten below as the
      // parts' product plus the trim.
      if (d.trim > 0) {
        sym_of(d.base, d.lower, d.upper);
        if (std::none_of(trims.begin(), trims.end(), [&](const auto& x) { return std::get<0>(x) == d.base; }))
          trims.emplace_back(d.base, d.size, d.divisor, d.trim);
      }
      const int64_t lower = (std::max<int64_t>(0, d.lower - d.trim) + div - 1) / div;
      const auto it = sym_of(d.size, lower, (d.upper - d.trim) / div);
      it->part = std::max(it->part, d.part);
      continue;
    }
    // An equal part of a cut marked size (qkv.chunk(3, 1)'s q, k, v), or the
    // whole: the part is the symbol, the whole q times it ("3*s0"), its
    // range the quotients of the mark's (a part the JIT keyed by the range
    // lies in it too). Other sizes of a cut base stay numbers.
    if (q > 1) {
      const int64_t part = d.base / q;
      if (d.scale != 1 || (d.size != part && d.size != d.base)) continue;
      // The part's range: the quotients of the mark's (the part itself,
      // read as a dim, lies in the mark's too), at least 1.
      const auto it = sym_of(
          part, std::max<int64_t>({1, (std::max<int64_t>(0, d.lower) + q - 1) / q, d.size == part ? d.lower : 0}),
          d.upper / q);
      if (std::find(it->scales.begin(), it->scales.end(), q) == it->scales.end()) it->scales.push_back(q);
      it->part = q;
      continue;
    }
    // Not sym_of: the mark's range narrows the symbol only through a dim
    // that follows it (near, merged) below; a far fixed slice or a
    // difference keeps its size a number and leaves the range alone.
    auto it = std::find_if(syms.begin(), syms.end(), [&](const Sym& x) { return x.base == d.base; });
    if (it == syms.end()) it = syms.insert(syms.end(), Sym{d.base, d.lower, d.upper});
    // A merged dim (a flatten of the marked tensor): k * base, the marked
    // dim's range.
    if (d.scale > 1) {
      if (d.size != d.scale * d.base) continue;
      if (std::find(it->scales.begin(), it->scales.end(), d.scale) == it->scales.end()) it->scales.push_back(d.scale);
      it->lower = std::max(it->lower, d.lower);
      it->upper = std::min(it->upper, d.upper);
      continue;
    }
    // A size near its base (|c| <= base / 2: d[:, 1:], d[:, :-2]) follows
    // it; a far one (d[:, :2] of n = 40) is a fixed slice more likely: it
    // stays a number, and the base is still the symbol of the pitch and
    // element count of the storage it slices ("strides=[s0, 1]").
    const int64_t c = d.size - d.base;
    if (c < 0 && -c != d.base && std::find(plain.begin(), plain.end(), -c) != plain.end()) {
      if (std::find(it->minus.begin(), it->minus.end(), -c) == it->minus.end()) it->minus.push_back(-c);
      continue;
    }
    if (2 * std::abs(c) > d.base) continue;
    if (std::find(it->offsets.begin(), it->offsets.end(), c) == it->offsets.end()) it->offsets.push_back(c);
    // Every value of the symbol keeps this dim's size inside the range.
    it->lower = std::max({it->lower, d.lower, d.lower - c});
    it->upper = std::min({it->upper, d.upper, d.upper - c});
  }
  if (syms.empty()) return;
  // The expression of a size value: s<k>+c (an exact base first), else none.
  auto expr_of = [&](int64_t v) -> std::optional<KtirExpr> {
    for (int pass = 0; pass < 2; ++pass)
      for (size_t k = 0; k < syms.size(); ++k)
        for (int64_t c : syms[k].offsets) {
          if ((pass == 0) != (c == 0) || syms[k].base + c != v) continue;
          return KtirExpr::symbol(static_cast<int>(k), 1, c);
        }
    for (size_t k = 0; k < syms.size(); ++k)
      for (int64_t b : syms[k].minus)
        for (size_t j = 0; j < syms.size(); ++j)
          if (syms[j].base == b && syms[k].base - b == v) {
            KtirExpr e = KtirExpr::symbol(static_cast<int>(k));
            e.coef.resize(std::max(e.coef.size(), j + 1), 0);
            e.coef[j] = -1;
            return e;
          }
    for (size_t k = 0; k < syms.size(); ++k)
      for (int64_t q : syms[k].scales)
        if (syms[k].base * q == v) return KtirExpr::symbol(static_cast<int>(k), q, 0);
    return std::nullopt;
  };
  // A view the region only reads takes symbols at its marked dims alone:
  // its other sizes are fixed (the head dim 16 of q.view(n, 4, 16) at n =
  // 16; a weight's 64 rows at n = 64: a whole storage of no mark), as the
  // JIT keys them. A slice of a storage of no mark (bias[:T, :T], cos[:T])
  // follows by value at the dims the slice cut short alone (the 16 whole
  // columns of cos[:T] at T = 16 stay a number), and a view the region
  // writes or makes (a result's sizes, a pad's buffer) at every dim.
  std::vector<char> marked_arg(p.args.size(), 0);
  for (const auto& d : dynamic)
    if (d.view >= 0 && static_cast<size_t>(d.view) < p.views.size() && p.views[d.view].arg >= 0)
      marked_arg[p.views[d.view].arg] = 1;
  std::vector<std::vector<char>> free_dims(p.views.size());
  for (size_t i = 0; i < p.views.size(); ++i) {
    const KtirView& v = p.views[i];
    if (v.lx || v.arg < 0 || static_cast<size_t>(v.arg) >= p.args.size() || p.args[v.arg].kind != KtirArg::kIn)
      continue;
    int64_t numel = 1;
    for (int64_t x : v.sizes) numel *= x;
    if (marked_arg[v.arg] || (v.offset == 0 && numel == p.args[v.arg].elems)) {
      free_dims[i].assign(v.sizes.size(), 0);
      continue;
    }
    // A slice of a storage of no mark: the dims whose extent is below the
    // next larger stride (or the storage's end for the largest).
    free_dims[i].assign(v.sizes.size(), 0);
    for (size_t d = 0; d < v.sizes.size() && d < v.strides.size(); ++d) {
      int64_t next = p.args[v.arg].elems;
      for (int64_t st : v.strides)
        if (st > v.strides[d] && st < next) next = st;
      free_dims[i][d] = v.sizes[d] > 1 && v.strides[d] > 0 && v.sizes[d] * v.strides[d] < next;
    }
  }
  for (const auto& d : dynamic)
    if (d.view >= 0 && static_cast<size_t>(d.view) < p.views.size() && d.dim >= 0 &&
        static_cast<size_t>(d.dim) < free_dims[d.view].size())
      free_dims[d.view][d.dim] = 1;
  // A dim of an op's result that the size probe finds fixed, of a value that
  // is also a fixed size of a read view (the 64 columns of layer_norm(x) of
  // x (64, 64) marked at dim 0, the head dim 16 of q @ k.t() at n = 16),
  // stays a number too: by value alone it would be taken for the mark.
  std::vector<int64_t> fixed_values;
  for (size_t i = 0; i < p.views.size(); ++i)
    for (size_t d = 0; d < free_dims[i].size(); ++d)
      if (!free_dims[i][d] && p.views[i].sizes[d] > 1) fixed_values.push_back(p.views[i].sizes[d]);
  std::vector<std::vector<char>> varies;
  if (!fixed_values.empty()) {
    // The dims of slices of storages of no mark (not free: their own
    // rules) of a marked size's value.
    std::vector<std::pair<int, int>> sliced;
    std::vector<int64_t> marked_sizes;
    for (const auto& d : dynamic) marked_sizes.push_back(d.size);
    for (size_t i = 0; i < p.views.size(); ++i)
      if (!free_dims[i].empty() && !marked_arg[p.views[i].arg])
        for (size_t d = 0; d < free_dims[i].size(); ++d)
          if (free_dims[i][d] &&
              std::find(marked_sizes.begin(), marked_sizes.end(), p.views[i].sizes[d]) != marked_sizes.end())
            sliced.emplace_back(static_cast<int>(i), static_cast<int>(d));
    varies = varying_result_dims(p, dynamic, sliced);
  }
  auto may_vary = [&](size_t view, size_t d) {
    if (!free_dims[view].empty()) return free_dims[view][d] != 0;
    if (view >= varies.size() || varies[view].empty() || varies[view][d]) return true;
    return std::find(fixed_values.begin(), fixed_values.end(), p.views[view].sizes[d]) == fixed_values.end();
  };
  for (size_t i = 0; i < p.views.size(); ++i) {
    KtirView& v = p.views[i];
    v.size_expr.assign(v.sizes.size(), KtirExpr{});
    bool any = false;
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      if (v.sizes[d] <= 1 || !may_vary(i, d)) continue;
      if (auto e = expr_of(v.sizes[d])) v.size_expr[d] = *e, any = true;
    }
    if (!any) v.size_expr.clear();
  }
  // Sizes the region creates from symbolic ones (cat's sum, a pad's s0+2):
  // each unmatched size of that value takes the derived expression.
  std::vector<int64_t> bases;
  for (const auto& x : syms) bases.push_back(x.base);
  for (const auto& [value, e] : created_sizes(p, bases)) {
    for (size_t i = 0; i < p.views.size(); ++i)
      for (size_t d = 0; d < p.views[i].sizes.size(); ++d) {
        KtirView& v = p.views[i];
        if (v.sizes[d] != value || v.sizes[d] <= 1 || (d < v.size_expr.size() && v.size_expr[d].symbolic()) ||
            !may_vary(i, d))
          continue;
        if (v.size_expr.empty()) v.size_expr.assign(v.sizes.size(), KtirExpr{});
        v.size_expr[d] = e;
      }
  }
  // The split rows: the dim 0 of a split tile's view.
  for (const auto& t : p.tiles) {
    if (!t.core_stride) continue;
    const KtirView& w = p.views[t.view];
    if (!w.size_expr.empty() && w.size_expr[0].symbolic()) p.rows_expr = w.size_expr[0];
    break;
  }
  for (auto& t : p.tiles) {
    const KtirView& w = p.views[t.view];
    t.size_expr = w.size_expr;
    if (t.core_stride && !t.size_expr.empty()) t.size_expr[0] = KtirExpr{};  // rows_per_core
    bool any = false;
    for (const auto& e : t.size_expr) any |= e.symbolic();
    if (!any) t.size_expr.clear();
  }
  p.sym_values = bases;
  std::vector<int64_t> parts;
  for (const auto& x : syms) parts.push_back(x.part);
  std::vector<int64_t> floors(p.args.size(), 0);
  for (const auto& d : dynamic)
    if (d.view >= 0 && static_cast<size_t>(d.view) < p.views.size() && d.dim >= 0) {
      const KtirView& w = p.views[d.view];
      if (w.lx || w.arg < 0 || static_cast<size_t>(w.arg) >= floors.size() ||
          static_cast<size_t>(d.dim) >= w.strides.size() || w.strides[d.dim] <= 0)
        continue;
      int64_t& f = floors[w.arg];
      f = f == 0 ? w.strides[d.dim] : std::min(f, w.strides[d.dim]);
    }
  for (auto& v : p.views)
    symbolize_strides(v, p.sym_values, parts,
                      v.lx || v.arg < 0 || static_cast<size_t>(v.arg) >= floors.size() ? 0 : floors[v.arg]);
  // A step slice's view: a stride that is a multiple of the marked pitch n
  // * S (S = the step dim's stride / step) is that multiple of s<n> (the
  // chain takes an even n for 2*t), and the offset follows.
  auto sym_index = [&](int64_t base) {
    return static_cast<int>(std::find_if(syms.begin(), syms.end(), [&](const Sym& x) { return x.base == base; }) -
                            syms.begin());
  };
  for (const auto& st : steps) {
    KtirView& w = p.views[st.view];
    const int64_t pitch = st.n * (w.strides[st.dim] / st.step);
    if (w.stride_expr.empty())
      for (int64_t x : w.strides) w.stride_expr.push_back(affine_const(x));
    for (size_t j = 0; j < w.strides.size(); ++j)
      if (static_cast<int64_t>(j) != st.dim && pitch > 0 && w.strides[j] > 0 && w.strides[j] % pitch == 0)
        w.stride_expr[j] = KtirExpr::symbol(sym_index(st.n), w.strides[j] / st.n);
    symbolize_offset(w, p.sym_values, parts);
    // Its argument's elements: a multiple of n (before an extent or a pitch
    // that names t: 16 rows of (n, 16) transposed and stepped by 2 reach
    // 32*t, which an odd n does not).
    if (!w.lx && w.arg >= 0 && static_cast<size_t>(w.arg) < p.args.size()) {
      KtirArg& a = p.args[w.arg];
      if (a.elems > 0 && a.elems % st.n == 0) a.elems_expr = KtirExpr::symbol(sym_index(st.n), a.elems / st.n);
    }
  }
  // A view inside another of its storage with the same strides (a pad's
  // copy_ target: sizes [16, s0], pitch s0+2) takes the other's stride
  // expressions, which its own sizes do not show.
  for (auto& v : p.views) {
    if (v.lx || !v.stride_expr.empty()) continue;
    for (const auto& w : p.views)
      if (!w.lx && w.arg == v.arg && w.strides == v.strides && !w.stride_expr.empty()) {
        v.stride_expr = w.stride_expr;
        break;
      }
  }
  // An argument's elems: the extent (offset + sum (size - 1) * stride + 1) of
  // one of its views that reaches its end (a product of symbols for a
  // tensor with two dynamic dims: "s0*s1"), or its outer size times its
  // outer stride (a part of all rows, qkv's q: 16 rows of pitch 3*s0); else
  // a multiple of a symbol's size expression.
  for (size_t i = 0; i < p.args.size(); ++i) {
    KtirArg& a = p.args[i];
    for (const auto& v : p.views) {
      if (v.lx || v.arg != static_cast<int>(i) || a.elems_expr.symbolic()) continue;
      const KtirExpr e = view_extent(v);
      if (e.symbolic() && e.eval(p.sym_values) == a.elems) a.elems_expr = e;
    }
    for (const auto& v : p.views) {
      if (v.lx || v.arg != static_cast<int>(i) || a.elems_expr.symbolic() || v.stride_expr.empty()) continue;
      const auto outer = std::max_element(v.strides.begin(), v.strides.end()) - v.strides.begin();
      const KtirExpr e = affine_mul(size_at(v, outer), v.stride_expr[outer]);
      if (e.symbolic() && e.eval(p.sym_values) == a.elems) a.elems_expr = e;
    }
    // A storage the region only reads, with no marked view (a weight, or a
    // table sliced to the marked size: cos[:T] of (1024, 16)), keeps its
    // element count: its size is not the marks'.
    const bool weight = a.kind == KtirArg::kIn && !marked_arg[i];
    for (size_t k = 0; k < syms.size() && !weight && !a.elems_expr.symbolic() && a.elems > 0; ++k) {
      for (int64_t c : syms[k].offsets) {
        const int64_t v = syms[k].base + c;
        if (v <= 1 || a.elems % v != 0) continue;
        const int64_t q = a.elems / v;
        a.elems_expr = KtirExpr::symbol(static_cast<int>(k), q, q * c);
        break;
      }
    }
  }
  // Symbols no expression names are dropped (a far dim's base that no
  // stride or element count needs); the rest renumbered.
  // A base n with a dim of size n - m (m another symbol's base): n is
  // m + t, t a symbol of its own (the first such m), so every view is
  // valid over a box of ranges (s0-s1 is not: it needs s1 <= s0): d[:, m:]
  // prints offset=s0 sizes=[16, s1] strides=[s0+s1, 1].
  for (size_t k = 0, n = syms.size(); k < n; ++k) {
    if (syms[k].minus.empty()) continue;
    const int64_t b = syms[k].minus[0];
    const auto j = static_cast<int>(std::find_if(syms.begin(), syms.end(), [&](const Sym& x) { return x.base == b; }) -
                                    syms.begin());
    const Sym rest{syms[k].base - b, std::max<int64_t>(0, syms[k].lower - syms[j].upper),
                   syms[k].upper - syms[j].lower};
    syms.push_back(rest);
    p.sym_values.push_back(rest.base);
    KtirExpr by = KtirExpr::symbol(j);
    affine_add(by, 1, KtirExpr::symbol(static_cast<int>(syms.size() - 1)));
    for_each_expr(p, [&](KtirExpr& e) {
      if (e.symbolic()) e = affine_replace(e, static_cast<int>(k), by);
    });
  }
  for (const auto& [n, a, b, trim] : trims) {
    const int kn = sym_index(n);
    KtirExpr by = affine_mul(KtirExpr::symbol(sym_index(a)), KtirExpr::symbol(sym_index(b)));
    by.constant += trim;
    for_each_expr(p, [&](KtirExpr& e) {
      if (e.symbolic()) e = affine_replace(e, kn, by);
    });
  }
  for (const auto& st : steps) {
    const int kn = sym_index(st.n), kt = sym_index(st.t);
    const int64_t r = st.n - st.start - 1 - st.step * (st.t - 1);
    syms.push_back(Sym{r, 0, st.step - 1});
    p.sym_values.push_back(r);
    KtirExpr by = KtirExpr::symbol(kt, st.step, st.start - st.step + 1);
    affine_add(by, 1, KtirExpr::symbol(static_cast<int>(syms.size() - 1)));
    for_each_expr(p, [&](KtirExpr& e) {
      if (e.symbolic()) e = affine_replace(e, kn, by);
    });
  }
  p.sym_lower.clear(), p.sym_upper.clear();
  for (int k : drop_unused_symbols(p)) {
    p.sym_lower.push_back(syms[k].lower);
    p.sym_upper.push_back(syms[k].upper);
  }
}

void ktir_bind(KtirProgram& p, const std::vector<int64_t>& values) {
  p.sym_values = values;
  for (auto& a : p.args)
    if (a.elems_expr.symbolic()) a.elems = a.elems_expr.eval(values);
  for (auto& v : p.views) {
    for (size_t d = 0; d < v.size_expr.size() && d < v.sizes.size(); ++d)
      if (v.size_expr[d].symbolic()) v.sizes[d] = v.size_expr[d].eval(values);
    for (size_t d = 0; d < v.stride_expr.size() && d < v.strides.size(); ++d)
      if (v.stride_expr[d].symbolic()) v.strides[d] = v.stride_expr[d].eval(values);
    if (v.offset_expr.symbolic()) v.offset = v.offset_expr.eval(values);
  }
  if (p.rows_expr.symbolic()) {
    const int64_t rows = p.rows_expr.eval(values);
    p.rows_per_core = rows > 0 ? (rows + p.grid - 1) / std::max<int64_t>(1, p.grid) : 1;
    p.cores_used = rows > 0 ? (rows + p.rows_per_core - 1) / p.rows_per_core : 1;
  }
  for (auto& t : p.tiles) {
    for (size_t d = 0; d < t.size_expr.size() && d < t.sizes.size(); ++d)
      if (t.size_expr[d].symbolic()) t.sizes[d] = t.size_expr[d].eval(values);
    if (t.core_stride && p.rows_expr.symbolic()) {
      t.core_stride = p.rows_per_core;
      if (!t.sizes.empty()) t.sizes[0] = p.rows_per_core;
    }
  }
}

std::optional<std::vector<int64_t>> ktir_match(const KtirProgram& p, const KtirProgram& launch) {
  if (!ktir_same_structure(p, launch)) return std::nullopt;
  std::vector<int64_t> values(p.sym_values.size(), -1);
  // A size "a*s<k>+c" of value x gives s<k> = (x - c) / a; all must agree.
  // An expression of several symbols gives its one unknown linear symbol
  // once the others are known (a step slice's "2*s0+s1-1": s1 after s0).
  bool progress = false;
  auto take = [&](const KtirExpr& e, int64_t x) {
    int k = -1;
    for (size_t j = 0; j < e.coef.size(); ++j) {
      if (!e.coef[j] || values[j] >= 0) continue;
      if (k >= 0) return true;
      k = static_cast<int>(j);
    }
    if (k < 0) return true;
    for (const auto& t : e.products)
      for (int j : t.syms)
        if (values[j] < 0) return true;
    KtirExpr rest = e;
    rest.coef[k] = 0;
    const int64_t a = e.coef[k], c = rest.eval(values);
    if ((x - c) % a != 0 || (x - c) / a < 0) return false;  // a size is never negative
    values[k] = (x - c) / a;
    progress = true;
    return true;
  };
  // Sizes first, then a symbol no size names (the pitch of a fixed slice
  // d[:, :2]: strides [s0, 1]) from the strides, offsets and element
  // counts; again while a pass finds a value.
  do {
    progress = false;
    for (size_t v = 0; v < p.views.size(); ++v)
      for (size_t d = 0; d < p.views[v].size_expr.size(); ++d)
        if (!take(p.views[v].size_expr[d], launch.views[v].sizes[d])) return std::nullopt;
    for (size_t v = 0; v < p.views.size(); ++v) {
      const KtirView &w = p.views[v], &x = launch.views[v];
      for (size_t d = 0; d < w.stride_expr.size() && d < x.strides.size(); ++d)
        if (!take(w.stride_expr[d], x.strides[d])) return std::nullopt;
      if (!take(w.offset_expr, x.offset)) return std::nullopt;
    }
    for (size_t a = 0; a < p.args.size(); ++a)
      if (!take(p.args[a].elems_expr, launch.args[a].elems)) return std::nullopt;
  } while (progress);
  for (size_t k = 0; k < values.size(); ++k) {
    if (values[k] < 0) return std::nullopt;
    if (k < p.sym_lower.size() && (values[k] < p.sym_lower[k] || values[k] > p.sym_upper[k])) return std::nullopt;
  }
  KtirProgram b = p;
  ktir_bind(b, values);
  if (b.rows_per_core != launch.rows_per_core || b.cores_used != launch.cores_used) return std::nullopt;
  for (size_t a = 0; a < b.args.size(); ++a)
    if (b.args[a].elems != launch.args[a].elems) return std::nullopt;
  for (size_t v = 0; v < b.views.size(); ++v) {
    const KtirView &x = b.views[v], &y = launch.views[v];
    if (x.offset != y.offset || x.sizes != y.sizes || x.strides != y.strides) return std::nullopt;
  }
  for (size_t t = 0; t < b.tiles.size(); ++t)
    if (b.tiles[t].sizes != launch.tiles[t].sizes || b.tiles[t].core_stride != launch.tiles[t].core_stride)
      return std::nullopt;
  return values;
}

// ---------------------------------------------------------------- print

namespace {
// "2*s0+3", "s1", "s0-1", "s1*s2", "2*s0*s1-s1+4": products first, then
// the linear terms, then the constant; a number when `e` has no symbol.
std::string affine_text(const KtirExpr& e, int64_t value) {
  if (!e.symbolic()) return std::to_string(value);
  std::string s;
  auto term = [&](int64_t c, const std::vector<int>& syms) {
    s += c < 0 ? "-" : (s.empty() ? "" : "+");
    if (c != 1 && c != -1) s += std::to_string(c < 0 ? -c : c) + "*";
    for (size_t j = 0; j < syms.size(); ++j) s += (j ? "*s" : "s") + std::to_string(syms[j]);
  };
  for (const auto& t : e.products) term(t.c, t.syms);
  for (size_t k = 0; k < e.coef.size(); ++k)
    if (e.coef[k]) term(e.coef[k], {static_cast<int>(k)});
  if (e.constant) s += (e.constant < 0 ? "-" : "+") + std::to_string(e.constant < 0 ? -e.constant : e.constant);
  return s;
}

// A size list with affine sizes ("s0", "s0-1") where `ex` has them; "?" for
// a split dim 0 bound from the symbolic rows.
std::string sym_list(const std::vector<int64_t>& v, const std::vector<KtirExpr>& ex, bool rows_first) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    s += i ? ", " : "";
    if (i == 0 && rows_first)
      s += "?";
    else
      s += i < ex.size() ? affine_text(ex[i], v[i]) : std::to_string(v[i]);
  }
  return s + "]";
}

std::string stride_list(const KtirView& w) {
  std::string s = "[";
  for (size_t d = 0; d < w.strides.size(); ++d) {
    s += d ? ", " : "";
    s += d < w.stride_expr.size() ? affine_text(w.stride_expr[d], w.strides[d]) : std::to_string(w.strides[d]);
  }
  return s + "]";
}
}  // namespace

std::string ktir_print(const KtirProgram& p) {
  std::ostringstream os;
  const bool rs = p.rows_expr.symbolic();
  os << "ktir.kernel @" << p.name << " grid=[" << p.grid << "] split=dim0";
  if (rs)
    os << "(" << affine_text(p.rows_expr, 0) << ") rows_per_core=? cores_used=?";
  else
    os << " rows_per_core=" << p.rows_per_core << " cores_used=" << p.cores_used;
  os << (p.ring_reduce ? " reduce=ring" : "");
  if (!p.sym_values.empty()) {
    os << " syms=[";
    for (size_t k = 0; k < p.sym_values.size(); ++k) os << (k ? ", " : "") << "s" << k << "=" << p.sym_values[k];
    os << "]";
  }
  if (!p.sym_lower.empty()) {
    os << " ranges=[";
    for (size_t k = 0; k < p.sym_lower.size(); ++k) os << (k ? ", " : "") << p.sym_lower[k] << ".." << p.sym_upper[k];
    os << "]";
  }
  os << " {\n";
  static const char* kinds[] = {"in", "out", "inout"};
  for (size_t a = 0; a < p.args.size(); ++a) {
    const KtirArg& g = p.args[a];
    os << "  %a" << a << " = arg " << kinds[g.kind] << " " << type_token(g.dtype) << " elems=";
    os << affine_text(g.elems_expr, g.elems) << "\n";
  }
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    os << "  %" << v << " = view " << (w.lx ? "LX " : "HBM ") << type_token(w.dtype);
    os << (w.lx ? " %t" + std::to_string(w.buf) : " %a" + std::to_string(w.arg));
    os << " offset=" << affine_text(w.offset_expr, w.offset) << " sizes=" << sym_list(w.sizes, w.size_expr, false)
       << " strides=" << stride_list(w) << "\n";
  }
  for (const auto& t : p.tiles) {
    const bool q = rs && t.core_stride;
    os << "  tile %" << t.view << " sizes=" << sym_list(t.sizes, t.size_expr, q) << " at=[";
    for (size_t d = 0; d < t.sizes.size(); ++d)
      os << (d ? ", " : "")
         << (d == 0 && t.core_stride ? "core*" + (q ? std::string("?") : std::to_string(t.core_stride)) : "0");
    os << "]\n";
  }
  for (const auto& o : p.ops) {
    os << "  ";
    auto res = [](int r) { return r < 0 ? std::string("None") : "%" + std::to_string(r); };
    if (o.results.size() == 1 && o.results[0] >= 0) os << "%" << o.results[0] << " = ";
    if (o.results.size() > 1 || (o.results.size() == 1 && o.results[0] < 0)) {
      os << "(";
      for (size_t j = 0; j < o.results.size(); ++j) os << (j ? ", " : "") << res(o.results[j]);
      os << ") = ";
    }
    os << o.op << "(";
    for (size_t a = 0; a < o.args.size(); ++a) os << (a ? ", " : "") << value_text(o.args[a]);
    os << ")\n";
  }
  os << "}\n";
  return os.str();
}

// ---------------------------------------------------------------- parse

KtirProgram ktir_parse(const std::string& text) {
  KtirProgram p;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  bool header = false, closed = false;
  while (std::getline(in, raw)) {
    ++line;
    const size_t hash = raw.find("//");
    std::string s = hash == std::string::npos ? raw : raw.substr(0, hash);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
    if (s.find_first_not_of(' ') == std::string::npos) continue;
    Cursor c{s, 0, line};
    if (closed) fail(line, "syntax", "text after the kernel's closing '}'");
    if (!header) {
      c.expect("ktir.kernel");
      c.expect("@");
      p.name = c.word();
      c.expect("grid=");
      const auto g = c.int_list();
      if (g.size() != 1) fail(line, "grid", "grid must have one dimension (cores)");
      p.grid = g[0];
      c.expect("split=dim0");
      if (c.eat("(")) {
        c.affine(&p.rows_expr);
        if (!p.rows_expr.symbolic()) fail(line, "syntax", "split=dim0(...) names the symbolic rows");
        c.expect(")");
        c.expect("rows_per_core=?");
        c.expect("cores_used=?");
      } else {
        c.expect("rows_per_core=");
        p.rows_per_core = c.integer();
        c.expect("cores_used=");
        p.cores_used = c.integer();
      }
      if (c.eat("reduce=ring")) p.ring_reduce = true;
      if (c.eat("syms=")) {
        c.expect("[");
        if (!c.eat("]")) {
          do {
            c.expect("s");
            if (c.integer() != static_cast<int64_t>(p.sym_values.size()))
              fail(line, "syntax", "symbols are declared s0, s1, ... in order");
            c.expect("=");
            p.sym_values.push_back(c.integer());
          } while (c.eat(","));
          c.expect("]");
        }
      }
      if (c.eat("ranges=")) {
        c.expect("[");
        do {
          p.sym_lower.push_back(c.integer());
          c.expect("..");
          p.sym_upper.push_back(c.integer());
        } while (c.eat(","));
        c.expect("]");
        if (p.sym_lower.size() != p.sym_values.size())
          fail(line, "syntax", "ranges=[...] has one L..U per symbol of syms=[...]");
      }
      c.expect("{");
      if (!c.done()) fail(line, "syntax", "unexpected text after '{'");
      header = true;
      continue;
    }
    if (c.eat("}")) {
      if (!c.done()) fail(line, "syntax", "unexpected text after '}'");
      closed = true;
      continue;
    }
    if (c.eat("tile")) {
      KtirTile t;
      t.line = line;
      t.view = c.view_ref();
      c.expect("sizes=");
      bool q = false;
      t.sizes = c.sym_int_list(&t.size_expr, &q);
      c.expect("at=");
      c.expect("[");
      size_t d = 0;
      if (!c.eat("]")) {
        do {
          if (c.eat("core*")) {
            if (d != 0) fail(line, "tile", "only dim 0 may be split over the cores");
            if (c.eat("?")) {
              if (!q || !p.rows_expr.symbolic())
                fail(line, "tile", "core*? needs a split dim 0 of '?' and symbolic rows");
              t.core_stride = 1;  // bound with the rows
            } else {
              t.core_stride = c.integer();
            }
          } else if (c.integer() != 0) {
            fail(line, "tile", "a tile starts at 0 or core*<rows> in each dim");
          }
          ++d;
        } while (c.eat(","));
        c.expect("]");
      }
      if (d != t.sizes.size())
        fail(line, "tile", "at= has " + std::to_string(d) + " dims, sizes= has " + std::to_string(t.sizes.size()));
      if (q && !t.core_stride) fail(line, "tile", "a '?' size is the split dim 0 of a tile at core*?");
      if (!c.done()) fail(line, "syntax", "unexpected text at the end of the tile");
      p.tiles.push_back(t);
      continue;
    }
    // "%aK = arg", "%K = view", or an op with results.
    if (c.eat("%a")) {
      const int64_t k = c.integer();
      if (k != static_cast<int64_t>(p.args.size())) fail(line, "arg", "arguments are numbered %a0, %a1, ... in order");
      c.expect("=");
      c.expect("arg");
      KtirArg a;
      a.line = line;
      const std::string kind = c.word();
      if (kind == "in")
        a.kind = KtirArg::kIn;
      else if (kind == "out")
        a.kind = KtirArg::kOut;
      else if (kind == "inout")
        a.kind = KtirArg::kInOut;
      else
        fail(line, "arg", "an argument is in, out or inout, got '" + kind + "'");
      const std::string ty = c.token();
      if (!parse_type_token(ty, &a.dtype)) fail(line, "types", "unknown type '" + ty + "'");
      c.expect("elems=");
      a.elems = c.affine(&a.elems_expr);
      if (!c.done()) fail(line, "syntax", "unexpected text at the end of the argument");
      p.args.push_back(a);
      continue;
    }
    std::vector<int> results;
    bool paren = false;
    if (c.eat("(")) {
      paren = true;
      do results.push_back(c.eat("None") ? -1 : c.view_ref());
      while (c.eat(","));
      c.expect(")");
      c.expect("=");
    } else if (c.s.compare(c.i, 1, "%") == 0 || (c.ws(), c.s.compare(c.i, 1, "%") == 0)) {
      results.push_back(c.view_ref());
      c.expect("=");
    }
    const size_t save = c.i;
    if (!paren && results.size() == 1 && c.eat("view")) {
      KtirView v;
      v.line = line;
      if (results[0] != static_cast<int>(p.views.size())) fail(line, "view", "views are numbered %0, %1, ... in order");
      const std::string mem = c.word();
      if (mem != "HBM" && mem != "LX") fail(line, "view", "memory is HBM or LX, got '" + mem + "'");
      v.lx = mem == "LX";
      const std::string ty = c.token();
      if (!parse_type_token(ty, &v.dtype)) fail(line, "types", "unknown type '" + ty + "'");
      if (!v.lx) {
        c.expect("%a");
        v.arg = static_cast<int>(c.integer());
      } else {
        c.expect("%t");
        v.buf = static_cast<int>(c.integer());
        if (v.buf < 0) fail(line, "view", "LX buffers are %t0, %t1, ...");
      }
      c.expect("offset=");
      v.offset = c.affine(&v.offset_expr);
      c.expect("sizes=");
      v.sizes = c.sym_int_list(&v.size_expr);
      c.expect("strides=");
      c.expect("[");
      if (!c.eat("]")) {
        do {
          v.stride_expr.emplace_back();
          v.strides.push_back(c.affine(&v.stride_expr.back()));
        } while (c.eat(","));
        c.expect("]");
      }
      bool sym_stride = false;
      for (const auto& e : v.stride_expr) sym_stride |= e.symbolic();
      if (!sym_stride) v.stride_expr.clear();
      if (!c.done()) fail(line, "syntax", "unexpected text at the end of the view");
      p.views.push_back(v);
      continue;
    }
    c.i = save;
    KtirOp o;
    o.line = line;
    o.results = results;
    c.ws();
    const size_t b = c.i;
    while (c.i < s.size() && s[c.i] != '(' && s[c.i] != ' ') ++c.i;
    o.op = s.substr(b, c.i - b);
    if (o.op.empty()) fail(line, "syntax", "expected an op in: " + s);
    c.expect("(");
    if (!c.eat(")")) {
      do o.args.push_back(c.value());
      while (c.eat(","));
      c.expect(")");
    }
    if (!c.done()) fail(line, "syntax", "unexpected text after the op");
    p.ops.push_back(std::move(o));
  }
  if (!header) fail(line, "syntax", "no 'ktir.kernel' header");
  if (!closed) fail(line, "syntax", "the kernel is not closed with '}'");
  // Every symbol used is declared with its value in the header.
  const int n_syms = static_cast<int>(p.sym_values.size());
  auto check_sym = [&](int k, int at) {
    if (k >= n_syms) fail(at, "syntax", "symbol s" + std::to_string(k) + " is not declared in the header's syms=[...]");
  };
  auto check_affine = [&](const KtirExpr& e, int at) {
    for (size_t k = 0; k < e.coef.size(); ++k)
      if (e.coef[k]) check_sym(static_cast<int>(k), at);
    for (const auto& t : e.products)
      for (int k : t.syms) check_sym(k, at);
  };
  check_affine(p.rows_expr, 1);
  for (const auto& a : p.args) check_affine(a.elems_expr, a.line);
  for (const auto& v : p.views) {
    for (const auto& e : v.size_expr) check_affine(e, v.line);
    for (const auto& e : v.stride_expr) check_affine(e, v.line);
    check_affine(v.offset_expr, v.line);
  }
  for (const auto& t : p.tiles)
    for (const auto& e : t.size_expr) check_affine(e, t.line);
  if (n_syms) ktir_bind(p, p.sym_values);
  return p;
}

// ---------------------------------------------------------------- verify

namespace {

// Values of one symbol the range check tries: all of [lo, hi] when it holds
// at most kRangeChecks values, else kRangeChecks evenly spaced ones, both ends included.
constexpr int64_t kRangeChecks = 65536;
std::vector<int64_t> range_values(int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  if (hi < lo) return out;
  const int64_t n = hi - lo + 1;
  if (n <= kRangeChecks) {
    for (int64_t v = lo; v <= hi; ++v) out.push_back(v);
  } else {
    for (int64_t i = 0; i < kRangeChecks; ++i) out.push_back(lo + (n - 1) / (kRangeChecks - 1) * i);
    out.back() = hi;
  }
  return out;
}

}  // namespace

namespace {

struct GeometryFault {
  int line = 0;
  std::string rule, msg;
};

// The first broken geometry rule of `p` under symbol values `vals`: an
// element count or a view's size, stride or offset < 0, or a view's
// elements outside its argument (in bytes: a view may reinterpret its
// argument's bytes, x.view(dtype)). ktir_verify applies it at the bound
// values, ktir_verify_ranges at every value of the ranges.
std::optional<GeometryFault> geometry_fault(const KtirProgram& p, const std::vector<int64_t>& vals) {
  auto at = [&](const KtirExpr& e, int64_t number) { return e.symbolic() ? e.eval(vals) : number; };
  for (const auto& g : p.args)
    if (at(g.elems_expr, g.elems) < 0) return GeometryFault{g.line, "arg", "elems must be >= 0"};
  KtirView b;
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    b.offset = at(w.offset_expr, w.offset);
    b.sizes.assign(w.sizes.size(), 0);
    b.strides.assign(w.sizes.size(), 0);
    for (size_t d = 0; d < w.sizes.size(); ++d) {
      b.sizes[d] = d < w.size_expr.size() ? at(w.size_expr[d], w.sizes[d]) : w.sizes[d];
      if (d < w.strides.size())
        b.strides[d] = d < w.stride_expr.size() ? at(w.stride_expr[d], w.strides[d]) : w.strides[d];
    }
    const std::string name = "%" + std::to_string(v);
    for (size_t d = 0; d < b.sizes.size(); ++d)
      if (b.sizes[d] < 0 || b.strides[d] < 0) return GeometryFault{w.line, "view", name + ": negative size or stride"};
    if (b.offset < 0) return GeometryFault{w.line, "view", name + ": negative offset"};
    if (w.lx || w.arg < 0 || w.arg >= static_cast<int>(p.args.size())) continue;
    const KtirArg& g = p.args[w.arg];
    const int64_t last = last_elem(b), elems = at(g.elems_expr, g.elems);
    if ((last + 1) * static_cast<int64_t>(c10::elementSize(w.dtype)) >
        elems * static_cast<int64_t>(c10::elementSize(g.dtype)))
      return GeometryFault{w.line, "view-bounds",
                           name + " reaches element " + std::to_string(last) + " of %a" + std::to_string(w.arg) +
                               ", which has " + std::to_string(elems)};
  }
  return std::nullopt;
}

bool has_products(const KtirProgram& p) {
  auto any = [](const std::vector<KtirExpr>& v) {
    for (const auto& e : v)
      if (!e.products.empty()) return true;
    return false;
  };
  for (const auto& a : p.args)
    if (!a.elems_expr.products.empty()) return true;
  for (const auto& v : p.views)
    if (any(v.size_expr) || any(v.stride_expr) || !v.offset_expr.products.empty()) return true;
  return false;
}

struct PointFault : GeometryFault {
  std::string where;  // "s0=51" or "s0=51, s1=256"
};

// The first geometry fault with symbol k at x and the others at their bound
// values; when the program has a product of symbols, also at each corner of
// the others' ranges (each at its lower or upper end). A condition that is
// linear in each other symbol (products of distinct symbols) takes its
// least value over the ranges at such a point, so trying every x of symbol
// k at the corners covers every combination.
// `products`: has_products(p), computed once by the caller.
std::optional<PointFault> fault_at_others(const KtirProgram& p, size_t k, int64_t x, bool products) {
  const size_t n = p.sym_values.size();
  const size_t corners = products && n > 1 && n <= 12 ? size_t{1} << (n - 1) : 0;
  std::vector<int64_t> vals = p.sym_values;
  for (size_t c = 0; c <= corners; ++c) {
    vals = p.sym_values;
    size_t bit = 0;
    for (size_t j = 0; j < n && c > 0; ++j) {
      if (j == k) continue;
      vals[j] = ((c - 1) >> bit++) & 1 ? p.sym_upper[j] : p.sym_lower[j];
    }
    vals[k] = x;
    if (auto f = geometry_fault(p, vals)) {
      PointFault out{*f, ""};
      for (size_t j = 0; j < n; ++j)
        if (j == k || c > 0)
          out.where += (out.where.empty() ? "s" : ", s") + std::to_string(j) + "=" + std::to_string(vals[j]);
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace

void ktir_verify_ranges(const KtirProgram& p) {
  if (p.sym_lower.empty()) return;
  const int hl = 1;
  for (size_t k = 0; k < p.sym_values.size(); ++k) {
    const std::string range = std::to_string(p.sym_lower[k]) + ".." + std::to_string(p.sym_upper[k]);
    if (p.sym_lower[k] > p.sym_upper[k])
      fail(hl, "sym-range", "s" + std::to_string(k) + " has an empty range " + range);
    if (p.sym_values[k] < p.sym_lower[k] || p.sym_values[k] > p.sym_upper[k])
      fail(hl, "sym-range",
           "s" + std::to_string(k) + "=" + std::to_string(p.sym_values[k]) + " is outside its range " + range);
  }
  const bool products = has_products(p);
  for (size_t k = 0; k < p.sym_values.size(); ++k) {
    for (int64_t x : range_values(p.sym_lower[k], p.sym_upper[k])) {
      auto f = fault_at_others(p, k, x, products);
      if (f)
        fail(f->line, f->rule,
             f->msg + " at " + f->where + " (range " + std::to_string(p.sym_lower[k]) + ".." +
                 std::to_string(p.sym_upper[k]) + ")");
    }
  }
}

void ktir_narrow_ranges(KtirProgram& p) {
  // Scan out from the bound value, kNarrowSpan values at most each way (a
  // compile's cost; a launch outside the range compiles anew). With
  // products, the other symbols' corners move as their ranges narrow: a
  // second round re-checks; a range that still fails is the bound value
  // alone (its geometry is the launch's).
  constexpr int64_t kNarrowSpan = 4096;
  const bool products = has_products(p);
  for (int round = 0; round < 2; ++round) {
    for (size_t k = 0; k < p.sym_values.size() && k < p.sym_lower.size(); ++k) {
      const int64_t v = p.sym_values[k];
      int64_t lo = v, hi = v;
      auto ok = [&](int64_t x) { return !fault_at_others(p, k, x, products); };
      while (lo > p.sym_lower[k] && v - lo < kNarrowSpan && ok(lo - 1)) --lo;
      while (hi < p.sym_upper[k] && hi - v < kNarrowSpan && ok(hi + 1)) ++hi;
      p.sym_lower[k] = lo, p.sym_upper[k] = hi;
    }
  }
  for (size_t k = 0; k < p.sym_values.size() && k < p.sym_lower.size(); ++k)
    for (int64_t x : {p.sym_lower[k], p.sym_upper[k]})
      if (fault_at_others(p, k, x, products)) p.sym_lower[k] = p.sym_upper[k] = p.sym_values[k];
}

namespace {

at::Tensor meta_twin(const KtirView& w) {
  return at::empty_strided(w.sizes, w.strides, at::TensorOptions().dtype(w.dtype).device(c10::kMeta));
}

// CPU's own call-time checks of op `o`: the C++ meta kernel of a structured op
// that a Python meta kernel shadows (ops/cpu_meta.h), as the op's CPU kernel
// runs it first. The Python kernels skip some (_softmax's dim range), so an
// edit they accept would raise CPU's error only when the file runs. Its own
// twins: it may resize out= operands.
void check_with_cpu_meta(const KtirOp& o, const c10::OperatorHandle& op, const c10::FunctionSchema& schema,
                         const KtirProgram& p, const std::vector<at::Tensor>& meta) {
  const std::optional<c10::KernelFunction> cpp = shadowed_cpp_meta_kernel(op);
  if (!cpp) return;
  std::vector<at::Tensor> twins(meta.size());
  for (size_t v = 0; v < meta.size(); ++v)
    if (meta[v].defined()) twins[v] = meta_twin(p.views[v]);
  torch::jit::Stack stack = op_stack(o, schema, twins);
  try {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    cpp->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const c10::Error& e) {
    fail(o.line, "types", o.op + " rejects its operands: " + e.what_without_backtrace());
  }
}

// A view an op writes holds each element once: CPU refuses to write a tensor
// whose elements share memory (a zero stride over more than one element).
// An `in` argument is read only: run_ktir binds the caller's tensor to it.
void check_written_view(const KtirOp& o, int v, const KtirProgram& p) {
  if (v < 0 || v >= static_cast<int>(p.views.size())) return;
  const KtirView& w = p.views[v];
  if (!w.lx && w.arg >= 0 && w.arg < static_cast<int>(p.args.size()) && p.args[w.arg].kind == KtirArg::kIn)
    fail(o.line, "arg",
         o.op + " writes %" + std::to_string(v) + ", a view of %a" + std::to_string(w.arg) +
             ", an `in` argument (read only; declare it inout)");
  if (at::has_internal_overlap(meta_twin(w)) == at::MemOverlap::Yes)
    fail(o.line, "view",
         o.op + " writes %" + std::to_string(v) + ", whose strides " + list(p.views[v].strides) +
             " give several of its elements one address");
}

}  // namespace

void ktir_verify(const KtirProgram& p, const CardParams& card, const std::vector<at::Tensor>* bound) {
  const int hl = 1;  // the header line
  ktir_verify_ranges(p);
  if (p.grid < 1 || (card.cores > 0 && p.grid > card.cores))
    fail(hl, "grid", "grid=[" + std::to_string(p.grid) + "] must be 1.." + std::to_string(card.cores) + " cores");
  if (p.cores_used < 1 || p.cores_used > p.grid)
    fail(hl, "grid", "cores_used=" + std::to_string(p.cores_used) + " must be 1..grid");
  if (p.rows_per_core < 1) fail(hl, "grid", "rows_per_core must be >= 1");
  for (size_t a = 0; a < p.args.size(); ++a) {
    const KtirArg& g = p.args[a];
    if (g.elems < 0) fail(g.line, "arg", "elems must be >= 0");
    if (bound && a < bound->size()) {
      const at::Tensor& t = (*bound)[a];
      if (t.scalar_type() != g.dtype)
        fail(g.line, "types",
             "%a" + std::to_string(a) + " is " + host_name(g.dtype) + ", the tensor bound to it is " +
                 c10::toString(t.scalar_type()));
      if (t.numel() < g.elems)
        fail(g.line, "view-bounds",
             "%a" + std::to_string(a) + " needs " + std::to_string(g.elems) + " elements, the tensor bound to it has " +
                 std::to_string(t.numel()));
    }
  }
  std::vector<int> tile_of(p.views.size(), -1);
  for (size_t k = 0; k < p.tiles.size(); ++k) {
    const KtirTile& t = p.tiles[k];
    if (t.view < 0 || t.view >= static_cast<int>(p.views.size())) fail(t.line, "tile", "tile of an undefined view");
    if (tile_of[t.view] >= 0) fail(t.line, "tile", "view %" + std::to_string(t.view) + " has two tiles");
    tile_of[t.view] = static_cast<int>(k);
  }
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    const std::string name = "%" + std::to_string(v);
    if (w.sizes.size() != w.strides.size()) fail(w.line, "view", name + ": sizes and strides differ in rank");
    if (!w.lx && (w.arg < 0 || w.arg >= static_cast<int>(p.args.size())))
      fail(w.line, "view", name + " views %a" + std::to_string(w.arg) + ", which is not an argument");
  }
  // Sizes, strides and offsets >= 0 and every view inside its argument:
  // the rule the range check applies at every value of the ranges.
  if (auto f = geometry_fault(p, p.sym_values)) fail(f->line, f->rule, f->msg);
  int64_t lx_bytes = 0, lx_min_bytes = 0;
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    const std::string name = "%" + std::to_string(v);
    if (tile_of[v] < 0) fail(w.line, "tile", name + " has no tile");
    const KtirTile& t = p.tiles[tile_of[v]];
    if (t.sizes.size() != w.sizes.size())
      fail(t.line, "tile", "the tile of " + name + " differs from the view in rank");
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] < 0 || t.sizes[d] > w.sizes[d])
        fail(t.line, "tile",
             "tile size " + std::to_string(t.sizes[d]) + " of dim " + std::to_string(d) + " of " + name +
                 " is outside 0.." + std::to_string(w.sizes[d]));
      if (d > 0 && t.sizes[d] != w.sizes[d]) {
        // Only the innermost dim may be cut, and then in whole sticks.
        const int64_t bytes = t.sizes[d] * device_elem_bytes(w.dtype);
        if (d + 1 != t.sizes.size() || bytes % card.stick_bytes != 0)
          fail(t.line, "stick",
               "the tile of " + name + " cuts dim " + std::to_string(d) + " at " + std::to_string(t.sizes[d]) +
                   " elements: tiles hold whole rows or whole " + std::to_string(card.stick_bytes) + "-byte sticks");
      }
    }
    if (t.core_stride) {
      if (t.core_stride != p.rows_per_core || t.sizes[0] != p.rows_per_core)
        fail(t.line, "grid",
             "a split tile takes rows_per_core=" + std::to_string(p.rows_per_core) + " rows at core*" +
                 std::to_string(p.rows_per_core));
      if (p.cores_used * p.rows_per_core < w.sizes[0] || (p.cores_used - 1) * p.rows_per_core >= w.sizes[0])
        fail(t.line, "grid",
             "cores_used=" + std::to_string(p.cores_used) + " cores of " + std::to_string(p.rows_per_core) +
                 " rows do not cover the " + std::to_string(w.sizes[0]) + " rows of " + name + " exactly");
    } else if (!w.sizes.empty() && t.sizes[0] != w.sizes[0] && t.sizes.size() > 1) {
      fail(t.line, "tile", "a replicated tile (at 0) holds all " + std::to_string(w.sizes[0]) + " rows of " + name);
    }
    lx_bytes += tile_sticks(t.sizes, w.dtype, card.stick_bytes) * card.stick_bytes;
    lx_min_bytes += card.stick_bytes;
  }
  // LX: the schedule cuts each core's tiles into steps that fit double
  // buffered; one stick of every view, twice, is the least it can do.
  if (card.lx_usable_bytes_per_core > 0 && 2 * lx_min_bytes > card.lx_usable_bytes_per_core)
    fail(hl, "lx-capacity",
         "one stick of each of the " + std::to_string(p.views.size()) + " views, double buffered, needs " +
             std::to_string(2 * lx_min_bytes) + " bytes; LX holds " + std::to_string(card.lx_usable_bytes_per_core) +
             " per core: the region cannot be tiled to fit LX");
  (void)lx_bytes;
  // Ops: known, operands defined before use, result types and shapes (meta run).
  // Def-use is per storage (an argument or an LX buffer): a write through
  // one view defines every view of it.
  std::vector<at::Tensor> meta(p.views.size());
  auto meta_of = [&](const KtirView& w) {
    return at::empty_strided(w.sizes, w.strides, at::TensorOptions().dtype(w.dtype).device(c10::kMeta));
  };
  auto key = [&](int v) { return p.views[v].lx ? -1 - p.views[v].buf : p.views[v].arg; };
  auto define = [&](int v0) {
    const int k = key(v0);
    for (size_t v = 0; v < p.views.size(); ++v)
      if (key(static_cast<int>(v)) == k && !meta[v].defined()) meta[v] = meta_of(p.views[v]);
  };
  for (size_t v = 0; v < p.views.size(); ++v) {
    const KtirView& w = p.views[v];
    if (!w.lx && p.args[w.arg].kind != KtirArg::kOut) define(static_cast<int>(v));
  }
  for (const auto& o : p.ops) {
    const c10::OperatorHandle* op = find_op(o.op);
    if (!op) fail(o.line, "op", "unknown op '" + o.op + "' (an ATen op name with its overload, e.g. add.Tensor)");
    const auto& schema = op->schema();
    int fresh_returns = 0;
    bool list_return = false;
    for (const auto& r : schema.returns()) {
      if (r.alias_info()) continue;
      if (r.type()->kind() == c10::TypeKind::TensorType)
        fresh_returns++;
      else if (r.type()->kind() == c10::TypeKind::ListType)
        list_return = true;
    }
    if (!list_return && static_cast<int>(o.results.size()) != fresh_returns)
      fail(o.line, "op",
           o.op + " returns " + std::to_string(fresh_returns) + " new tensors, the line names " +
               std::to_string(o.results.size()));
    for (int r : o.results)
      if (r < -1 || r >= static_cast<int>(p.views.size()))
        fail(o.line, "def-use", "result %" + std::to_string(r) + " is not a view");
    define_written(o, schema, meta, [&](int v) {
      define(v);
      return meta[v];
    });
    torch::jit::Stack stack = op_stack(o, schema, meta);  // def-use and operand types
    check_with_cpu_meta(o, *op, schema, p, meta);
    try {
      c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
      op->callBoxed(stack);
    } catch (const c10::NotImplementedError&) {
      stack.clear();  // no meta kernel: types checked when it runs
    } catch (const c10::Error& e) {
      fail(o.line, "types", o.op + " rejects its operands: " + e.what_without_backtrace());
    } catch (const std::exception& e) {  // a Python meta kernel's error (torch._meta_registrations)
      fail(o.line, "types", o.op + " rejects its operands: " + e.what());
    }
    const std::vector<at::Tensor> got = stack.empty() ? std::vector<at::Tensor>() : fresh(schema, stack);
    for (size_t j = 0; j < o.results.size(); ++j) {
      if (o.results[j] < 0) continue;  // None: an undefined result
      const KtirView& w = p.views[o.results[j]];
      if (j < got.size() && got[j].defined()) {
        // An empty view takes any result size: CPU kernels return empty
        // tensors for results they do not compute (native_batch_norm's
        // save_mean in eval mode) where the meta kernel gives full sizes.
        int64_t view_numel = 1;
        for (int64_t n : w.sizes) view_numel *= n;
        if (!got[j].sizes().equals(w.sizes) && view_numel != 0)
          fail(o.line, "types",
               o.op + " result " + std::to_string(j) + " has sizes " + list(got[j].sizes().vec()) + ", its view %" +
                   std::to_string(o.results[j]) + " has " + list(w.sizes));
        // The kind of dtype (meta kernels may differ from CPU's in width,
        // e.g. native_layer_norm's mean in f32 for a 16-bit input).
        auto kind = [](c10::ScalarType t) {
          return c10::isFloatingType(t) ? 0 : (t == c10::kBool ? 1 : (c10::isComplexType(t) ? 2 : 3));
        };
        if (kind(got[j].scalar_type()) != kind(w.dtype))
          fail(o.line, "types",
               o.op + " result " + std::to_string(j) + " is " + host_name(got[j].scalar_type()) + ", its view %" +
                   std::to_string(o.results[j]) + " is " + host_name(w.dtype));
      }
      check_written_view(o, o.results[j], p);
      define(o.results[j]);
    }
    // Written arguments are defined after the op (an out= or in-place view).
    const auto& sargs = schema.arguments();
    for (size_t a = 0; a < o.args.size() && a < sargs.size(); ++a)
      if (o.args[a].kind == KtirValue::kView && sargs[a].alias_info() && sargs[a].alias_info()->isWrite()) {
        check_written_view(o, static_cast<int>(o.args[a].i), p);
        define(static_cast<int>(o.args[a].i));
      }
  }
}

// ---------------------------------------------------------------- run

bool ktir_same_structure(const KtirProgram& a, const KtirProgram& b) {
  if (a.name != b.name || a.grid != b.grid || a.ring_reduce != b.ring_reduce || a.args.size() != b.args.size() ||
      a.views.size() != b.views.size() || a.tiles.size() != b.tiles.size() || a.ops.size() != b.ops.size())
    return false;
  for (size_t i = 0; i < a.args.size(); ++i)
    if (a.args[i].kind != b.args[i].kind || a.args[i].dtype != b.args[i].dtype) return false;
  for (size_t i = 0; i < a.views.size(); ++i) {
    const KtirView &x = a.views[i], &y = b.views[i];
    if (x.lx != y.lx || x.dtype != y.dtype || x.arg != y.arg || x.buf != y.buf || x.sizes.size() != y.sizes.size())
      return false;
  }
  for (size_t i = 0; i < a.tiles.size(); ++i)
    if (a.tiles[i].view != b.tiles[i].view || (a.tiles[i].core_stride == 0) != (b.tiles[i].core_stride == 0))
      return false;
  for (size_t i = 0; i < a.ops.size(); ++i) {
    const KtirOp &x = a.ops[i], &y = b.ops[i];
    if (x.op != y.op || x.results != y.results || x.args.size() != y.args.size()) return false;
    for (size_t k = 0; k < x.args.size(); ++k) {
      const KtirValue &u = x.args[k], &v = y.args[k];
      if ((u.kind == KtirValue::kView) != (v.kind == KtirValue::kView)) return false;
      if (u.kind == KtirValue::kView && u.i != v.i) return false;
      if (u.kind == KtirValue::kList && v.kind == KtirValue::kList && u.list.size() != v.list.size()) return false;
    }
  }
  return true;
}

const c10::OperatorHandle* ktir_op_handle(const KtirOp& o) {
  if (!o.handle) o.handle = find_op(o.op);
  return o.handle;
}

void KtirRunHooks::call(size_t, const c10::OperatorHandle& op, torch::jit::Stack& stack,
                        const std::vector<c10::ScalarType>& result_dtypes) {
  call_op_in_f32(op, stack, result_dtypes, [&](torch::jit::Stack& s) {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.callBoxed(s);
  });
}

std::string KtirRunHooks::where(const KtirProgram& p, size_t k) {
  return "KTIR line " + std::to_string(p.ops[k].line) + " (" + p.ops[k].op + ")";
}

namespace {
// Storage key of a view: its argument (>= 0) or its LX buffer (< 0).
int storage_key(const KtirView& w) { return w.lx ? -1 - w.buf : w.arg; }

template <typename F>
void for_each_view_operand(const KtirValue& v, F&& f) {
  if (v.kind == KtirValue::kView) f(static_cast<int>(v.i));
  if (v.kind == KtirValue::kList)
    for (const auto& e : v.list) for_each_view_operand(e, f);
}
}  // namespace

// ---------------------------------------------------------------- tiles

bool ktir_is_scan(KtirTilePlan::Combine c) {
  return c == KtirTilePlan::kCumsum || c == KtirTilePlan::kCumprod || c == KtirTilePlan::kCummax ||
         c == KtirTilePlan::kCummin;
}

bool ktir_is_order(KtirTilePlan::Combine c) {
  return c == KtirTilePlan::kSort || c == KtirTilePlan::kTopk || c == KtirTilePlan::kKthvalue ||
         c == KtirTilePlan::kMedian || c == KtirTilePlan::kNanMedian || c == KtirTilePlan::kMode;
}

std::vector<int64_t> corelet_shares(int64_t rows, int64_t corelets) {
  TORCH_CHECK_VALUE(corelets >= 1 && rows >= 0, "corelet_shares: needs corelets >= 1 and rows >= 0, got rows ", rows,
                    " and corelets ", corelets);
  std::vector<int64_t> shares(static_cast<size_t>(corelets));
  for (int64_t j = 0, left = rows; j < corelets; ++j) {
    shares[j] = (left + corelets - j - 1) / (corelets - j);
    left -= shares[j];
  }
  return shares;
}

namespace {

// The ring passes of a selection of `t` values: one per 8-bit digit of the
// key, and one for the prefix of equal keys (the row among ties).
int64_t order_select_passes(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)) + 1; }

// The order statistics computed by selection (order_select) rather than
// from merged runs.
bool order_by_selection(KtirTilePlan::Combine c) {
  return c == KtirTilePlan::kTopk || c == KtirTilePlan::kKthvalue || c == KtirTilePlan::kMedian ||
         c == KtirTilePlan::kNanMedian;
}

// The op table's primitive kind of an op by its KTIR name ("add.Tensor");
// kLibrary for ops the table does not list (other namespaces' ops).
PrimKind kind_of_op(const std::string& name) {
  static const std::map<std::string, PrimKind>* kinds = [] {
    auto* m = new std::map<std::string, PrimKind>();
    for (const auto& e : op_table()) m->emplace(e.name, e.kind);
    return m;
  }();
  const auto it = kinds->find(name);
  return it == kinds->end() ? PrimKind::kLibrary : it->second;
}

// The ring ops by ATen name: how their partials combine and, for the losses
// of two row operands (self, target), the elementwise loss the partial sums
// (their combine, kSum or kMean, follows from the reduction). An entry with
// `exact` matches that op name only (max.dim is an argmax, max() of every
// element an amax, max.other no ring op); else every overload of the name.
struct RingOpEntry {
  KtirTilePlan::Combine combine = KtirTilePlan::kNone;
  KtirTilePlan::RingPre pre = KtirTilePlan::kPreNone;
  bool exact = false;
};

const RingOpEntry* ring_op_entry(const std::string& op) {
  using P = KtirTilePlan;
  // Never destroyed: flushes may run during shutdown.
  static const auto* table = new std::map<std::string, RingOpEntry>{
      {"max.dim", {P::kArgMax, P::kPreNone, true}},
      {"min.dim", {P::kArgMin, P::kPreNone, true}},
      {"max", {P::kMax, P::kPreNone, true}},
      {"min", {P::kMin, P::kPreNone, true}},
      {"logsumexp", {P::kLogSumExp}},
      {"cumprod", {P::kCumprod}},
      {"sum", {P::kSum}},
      {"mean", {P::kMean}},
      {"amax", {P::kMax}},
      {"amin", {P::kMin}},
      {"prod", {P::kProd}},
      {"var", {P::kVar}},
      {"std", {P::kVar}},
      {"var_mean", {P::kVar}},
      {"std_mean", {P::kVar}},
      {"argmax", {P::kArgMax}},
      {"argmin", {P::kArgMin}},
      {"_softmax", {P::kSoftmax}},
      {"_log_softmax", {P::kLogSoftmax}},
      {"native_layer_norm", {P::kLayerNorm}},
      {"cumsum", {P::kCumsum}},
      {"nll_loss_forward", {P::kNllLoss}},
      {"linalg_vector_norm", {P::kNorm}},
      {"norm", {P::kNorm}},
      {"renorm", {P::kRenorm}},
      {"renorm_", {P::kRenorm}},
      {"aminmax", {P::kMinMax}},
      {"cummax", {P::kCummax}},
      {"cummin", {P::kCummin}},
      {"nansum", {P::kNanSum}},
      {"count_nonzero", {P::kCountNonzero}},
      {"any", {P::kAny}},
      {"all", {P::kAll}},
      // The order statistics (argsort and msort record sort.stable).
      {"sort", {P::kSort}},
      {"topk", {P::kTopk}},
      {"kthvalue", {P::kKthvalue}},
      {"median", {P::kMedian}},
      {"nanmedian", {P::kNanMedian}},
      {"mode", {P::kMode}},
      {"mse_loss", {P::kNone, P::kPreMse}},
      {"huber_loss", {P::kNone, P::kPreHuber}},
      {"smooth_l1_loss", {P::kNone, P::kPreSmoothL1}},
      {"binary_cross_entropy", {P::kNone, P::kPreBce}},
      {"multilabel_margin_loss_forward", {P::kNone, P::kPreMultilabelMargin}},
  };
  auto it = table->find(op);
  if (it != table->end()) return &it->second;
  it = table->find(op.substr(0, op.find('.')));
  return it != table->end() && !it->second.exact ? &it->second : nullptr;
}

KtirTilePlan::Combine ring_combine_of(const std::string& op) {
  const RingOpEntry* e = ring_op_entry(op);
  return e ? e->combine : KtirTilePlan::kNone;
}

KtirTilePlan::RingPre pair_loss_of(const std::string& op) {
  const RingOpEntry* e = ring_op_entry(op);
  return e ? e->pre : KtirTilePlan::kPreNone;
}

// The pair loss whose gradient op `base` (no overload) is:
// "mse_loss_backward" -> kPreMse; kPreNone for other ops.
KtirTilePlan::RingPre pair_loss_of_gradient(const std::string& base) {
  static const std::string suffix = "_backward";
  if (base.size() <= suffix.size() || base.compare(base.size() - suffix.size(), suffix.size(), suffix) != 0)
    return KtirTilePlan::kPreNone;
  return pair_loss_of(base.substr(0, base.size() - suffix.size()));
}

// The spatial dims (1, 2, 3) of a pooling or upsampling op or gradient by
// its ATen name ("max_pool2d_with_indices_backward", "upsample_bilinear2d",
// "_adaptive_avg_pool3d"), 0 for other ops (fractional max pooling, whose
// random samples are an operand of their own, included).
int pool_spatial_dims(const std::string& base) {
  const bool pool = base.find("pool") != std::string::npos || base.find("upsample") != std::string::npos;
  if (!pool || base.find("fractional") != std::string::npos || base.find("unpool") != std::string::npos) return 0;
  for (int k = 1; k <= 3; ++k)
    if (base.find(std::to_string(k) + "d") != std::string::npos) return k;
  return 0;
}

bool is_scan(KtirTilePlan::Combine c) { return ktir_is_scan(c); }
// cummax/cummin: a scan of (value, index) pairs.
bool is_extremum_scan(KtirTilePlan::Combine c) { return c == KtirTilePlan::kCummax || c == KtirTilePlan::kCummin; }

const KtirValue* arg_named(const KtirOp& o, const c10::FunctionSchema& schema, const char* name) {
  const auto& args = schema.arguments();
  for (size_t a = 0; a < args.size() && a < o.args.size(); ++a)
    if (args[a].name() == name) return &o.args[a];
  return nullptr;
}

// A result of op `o` whose value does not depend on the rows it reads (a
// replicated view a tile step may write, every step the same value), or -1:
// nll_loss_forward's total_weight with reduction='none' (0 on CPU).
// The loss of a gradient that runs on tiles with reduction 'mean'
// (mean_loss_grad): mse_loss_backward and binary_cross_entropy_backward,
// functional or out=, with reduction 1; kPreNone for other ops. Not huber
// and smooth_l1: CPU's kernel computes their clamped branch in one order in
// its vector body and in another in its scalar tail (the last elements of
// the whole tensor), so an element's value depends on its position in the
// whole tensor, which a tile does not reproduce (measured: 5-15 of 74,000
// elements differ by an ulp); they keep the region whole.
KtirTilePlan::RingPre mean_grad_of(const KtirOp& o, const c10::FunctionSchema& schema) {
  const KtirTilePlan::RingPre loss = pair_loss_of_gradient(o.op.substr(0, o.op.find('.')));
  const KtirValue* r = arg_named(o, schema, "reduction");
  if (loss != KtirTilePlan::kPreMse && loss != KtirTilePlan::kPreBce) return KtirTilePlan::kPreNone;
  return r && r->kind == KtirValue::kInt && r->i == 1 ? loss : KtirTilePlan::kPreNone;
}

int row_free_result(const KtirOp& o, const c10::FunctionSchema& schema) {
  if (o.op.substr(0, o.op.find('.')) != "nll_loss_forward" || o.results.size() != 2) return -1;
  const KtirValue* r = arg_named(o, schema, "reduction");
  return r && r->kind == KtirValue::kInt && r->i == 0 ? o.results[1] : -1;
}

// The dims a "dim"/"dims" operand names in a tensor of rank `rank` (None or
// an empty list: all of them).
std::set<int64_t> dims_of(const KtirValue* v, int64_t rank) {
  std::set<int64_t> dims;
  auto wrap = [&](int64_t d) { dims.insert(rank > 0 && d < 0 ? d + rank : d); };
  if (!v || v->kind == KtirValue::kNone || (v->kind == KtirValue::kList && v->list.empty())) {
    for (int64_t d = 0; d < std::max<int64_t>(rank, 1); ++d) dims.insert(d);
  } else if (v->kind == KtirValue::kInt) {
    wrap(v->i);
  } else if (v->kind == KtirValue::kList) {
    for (const auto& e : v->list) wrap(e.kind == KtirValue::kInt ? e.i : 0);
  }
  return dims;
}

// renorm's `dim` is the dim it keeps: each slice along it is scaled by the
// norm of the slice, which reduces every other dim. It mixes rows unless dim
// is 0 of a tensor of more than one dim (each row its own slice).
bool renorm_mixes_rows(const KtirOp& o, const c10::FunctionSchema& schema, int64_t rank) {
  const KtirValue* dim = arg_named(o, schema, "dim");
  if (rank <= 1 || !dim || dim->kind != KtirValue::kInt) return true;
  return (dim->i < 0 ? dim->i + rank : dim->i) != 0;
}

// True when op `o` may mix rows whatever its operand shapes: by its kind
// (the op table), the dims it names, and the operands that address elements
// by position. Elementwise ops and matmuls never do (their shapes decide);
// reductions and data movement only along the dims they name.
bool mixes_rows(const KtirOp& o, const c10::OperatorHandle& op, int64_t rank) {
  const c10::FunctionSchema& schema = op.schema();
  const PrimKind kind = kind_of_op(o.op);
  // nll_loss's gradient: row i of grad_input from row i of self, target
  // (and grad_output with reduction='none'); the weight and total_weight
  // are replicated. The shape probe below checks the rest.
  const std::string base = o.op.substr(0, o.op.find('.'));
  if (base == "nll_loss_backward" || base == "nll_loss2d_backward") return false;
  if (base == "nll_loss_forward") {  // reduction='none': one loss per row
    const KtirValue* r = arg_named(o, schema, "reduction");
    if (r && r->kind == KtirValue::kInt && r->i == 0) return false;
  }
  // Pooling and upsampling (and their gradients) work on the last 1, 2 or 3
  // dims, each plane of the leading dims on its own: with more dims than
  // that, dim 0 is a batch or channel dim and each row's planes are its own.
  // (An operand that fixes the whole sizes, e.g. upsample's input_size, is
  // caught by the shape probe.)
  if (const int k = pool_spatial_dims(base); k > 0 && rank > k) return false;
  if (pair_loss_of(o.op) != KtirTilePlan::kPreNone) {  // reduction='none': one loss per element
    const KtirValue* r = arg_named(o, schema, "reduction");
    if (r && r->kind == KtirValue::kInt && r->i == 0) return false;
  }
  // Their gradients are elementwise in self, target (and grad_output with
  // 'none'; a 0-dim one otherwise). With 'mean' their kernel divides by the
  // element count of the operands it is given (a tile's, not the whole's):
  // the functional ops run on tiles through mean_loss_grad with the whole
  // count (mean_grad_of); other forms keep the region whole.
  if (pair_loss_of_gradient(base) != KtirTilePlan::kPreNone) {
    const KtirValue* r = arg_named(o, schema, "reduction");
    if (r && r->kind == KtirValue::kInt && (r->i == 0 || r->i == 2)) return false;
    if (mean_grad_of(o, schema) != KtirTilePlan::kPreNone) return false;
  }
  if (reduces_all_but_dim(base)) return renorm_mixes_rows(o, schema, rank);
  if (kind == PrimKind::kElementwise || kind == PrimKind::kMatmul) return false;
  // copy_, fill_, zero_ (the device's own kernels): each element from its own (or none).
  if (lowering_of(op).overwrites_self) return false;
  if (kind != PrimKind::kReduction && kind != PrimKind::kData) return true;  // library calls: unknown
  const KtirValue* dim = arg_named(o, schema, "dim");
  if (!dim) dim = arg_named(o, schema, "dims");
  if (dim) return dims_of(dim, rank).count(0) > 0;
  if (const KtirValue* ns = arg_named(o, schema, "normalized_shape"))
    return ns->kind != KtirValue::kList || static_cast<int64_t>(ns->list.size()) >= rank;
  if (kind == PrimKind::kReduction) return true;  // reduces everything (nll_loss, mse_loss, ...)
  for (const char* positional : {"index", "indices", "diagonal", "pad", "repeats", "shifts", "offset", "size"})
    if (arg_named(o, schema, positional)) return true;
  return false;
}

// A gather of rows: op `o` reads rows of a table along its dim 0 at the
// positions an integer index tensor gives, one result row per index row
// (index_select(t, 0, i), t[i], embedding(t, i), gather(t, 0, i)). Then a
// tile of the index rows gives the same tile of result rows from the whole
// table: the index is split (per-tile index loads), the table replicated.
// Sets the table and index view ids.
bool gathers_rows(const KtirOp& o, const c10::FunctionSchema& schema, const KtirProgram& p, int* table, int* index) {
  const std::string base = o.op.substr(0, o.op.find('.'));
  auto view = [](const KtirValue* v) { return v && v->kind == KtirValue::kView ? static_cast<int>(v->i) : -1; };
  auto dim0 = [&](int t) {
    const KtirValue* d = arg_named(o, schema, "dim");
    if (!d || d->kind != KtirValue::kInt || t < 0) return false;
    const int64_t rank = static_cast<int64_t>(p.views[t].sizes.size());
    return d->i == 0 || (rank > 0 && d->i == -rank);
  };
  *table = *index = -1;
  if (base == "index_select" || base == "gather") {
    *table = view(arg_named(o, schema, "self"));
    if (!dim0(*table)) return false;
    *index = view(arg_named(o, schema, "index"));
  } else if (o.op == "index.Tensor") {
    const KtirValue* l = arg_named(o, schema, "indices");
    if (!l || l->kind != KtirValue::kList || l->list.empty()) return false;
    for (size_t j = 1; j < l->list.size(); ++j)
      if (l->list[j].kind != KtirValue::kNone) return false;
    *table = view(arg_named(o, schema, "self"));
    *index = view(&l->list[0]);
  } else if (base == "embedding") {
    *table = view(arg_named(o, schema, "weight"));
    *index = view(arg_named(o, schema, "indices"));
  } else {
    return false;
  }
  if (*table < 0 || *index < 0 || *table == *index) return false;
  const c10::ScalarType it = p.views[*index].dtype;
  return (it == c10::kLong || it == c10::kInt) && !p.views[*index].sizes.empty();
}

}  // namespace

KtirTilePlan ktir_tile_plan(const KtirProgram& p, const KtirTiling& tiling) {
  KtirTilePlan plan;
  plan.tiling = tiling;
  plan.tiling.rows_per_core = std::max<int64_t>(1, tiling.rows_per_core);
  plan.tiling.tile_rows = std::clamp<int64_t>(tiling.tile_rows, 1, plan.tiling.rows_per_core);
  plan.tiling.n_tiles = (plan.tiling.rows_per_core + plan.tiling.tile_rows - 1) / plan.tiling.tile_rows;
  const KtirTiling& T = plan.tiling;
  const size_t nv = p.views.size(), no = p.ops.size();
  plan.phase.assign(no, KtirTilePlan::kPre);
  plan.split.assign(nv, 0);
  plan.load.assign(nv, 0);
  plan.store.assign(nv, 0);
  plan.keep.assign(nv, 0);
  std::string cur_op;  // the op the loop below looks at ("" outside it)
  auto whole = [&](std::string why) {
    plan.tiled = false;
    plan.whole_op = cur_op.empty() ? why : cur_op;
    plan.whole_reason = std::move(why);
    return plan;
  };
  // Rows: dim 0 of the views the program splits over the cores.
  for (const auto& t : p.tiles)
    if (t.core_stride > 0 && !p.views[t.view].sizes.empty()) plan.rows = p.views[t.view].sizes[0];
  if (plan.rows <= 1) return whole("no split rows");
  // The geometry of each step (whether or not the ops can be tiled: timing uses it).
  for (int64_t i = 0; i < T.n_tiles; ++i) {
    std::vector<std::pair<int64_t, int64_t>> cores;
    std::vector<int64_t> rows;
    for (int64_t c = 0; c < T.cores_used; ++c) {
      const int64_t b = std::min(plan.rows, c * T.rows_per_core + i * T.tile_rows);
      const int64_t e = std::min({plan.rows, b + T.tile_rows, (c + 1) * T.rows_per_core});
      cores.emplace_back(b, std::max(b, e));
      for (int64_t r = b; r < e; ++r) rows.push_back(r);
    }
    plan.steps.push_back(std::move(cores));
    const bool one_range = rows.empty() || rows.back() - rows.front() + 1 == static_cast<int64_t>(rows.size());
    plan.step_index.push_back(one_range ? at::Tensor() : at::tensor(rows, at::kLong));
  }

  // Each view's state: -1 undecided (an input), 0 replicated, 1 split, 2 the ring's result.
  std::vector<int> state(nv, -1);
  std::vector<char> candidate(nv, 0);
  for (const auto& t : p.tiles)
    if (t.core_stride > 0) candidate[t.view] = 1;
  int64_t probe = 2;  // a row count no size of the program has
  for (const auto& w : p.views)
    for (int64_t s : w.sizes) probe = std::max(probe, s + 1);
  std::map<int, std::vector<int>> views_of;  // storage -> its views
  for (size_t v = 0; v < nv; ++v) views_of[storage_key(p.views[v])].push_back(static_cast<int>(v));
  std::set<int> tile_written;               // storages tile ops write
  std::vector<std::set<int>> accessed(no);  // storages each op touches
  std::vector<std::set<int>> writes(no);    // storages each op writes
  bool ring_seen = false;
  for (size_t k = 0; k < no; ++k) {
    const KtirOp& o = p.ops[k];
    cur_op = o.op;
    const c10::OperatorHandle* h = ktir_op_handle(o);
    if (!h) return whole("unknown op " + o.op);
    o.handle = h;
    const auto& schema = h->schema();
    const auto& sargs = schema.arguments();
    std::vector<int> operands, written;
    for (size_t a = 0; a < o.args.size() && a < sargs.size(); ++a) {
      const bool w = sargs[a].alias_info() && sargs[a].alias_info()->isWrite();
      for_each_view_operand(o.args[a], [&](int v) {
        operands.push_back(v);
        if (w) written.push_back(v);
      });
    }
    std::vector<int> outs = written;
    for (int r : o.results)
      if (r >= 0) outs.push_back(r);
    for (int v : operands) accessed[k].insert(storage_key(p.views[v]));
    for (int v : outs) accessed[k].insert(storage_key(p.views[v])), writes[k].insert(storage_key(p.views[v]));
    int g_table = -1, g_index = -1;
    const bool gather = gathers_rows(o, schema, p, &g_table, &g_index);
    if (gather && state[g_table] == 1) return whole(o.op + " gathers from rows the tile steps produce");
    if (gather) state[g_table] = 0;  // read whole by every tile step at the indexed rows
    bool reads_ring = false, any_split = false;
    for (int v : operands) {
      reads_ring |= state[v] == 2;
      any_split |= state[v] == 1 || (state[v] == -1 && candidate[v]);
    }
    for (int v : outs) any_split |= state[v] == 1 || (state[v] == -1 && candidate[v]);
    const int64_t rank0 = operands.empty() ? 0 : static_cast<int64_t>(p.views[operands[0]].sizes.size());
    // The ring reduction: the last reduction of the split rows.
    if (p.ring_reduce && !operands.empty() &&
        (state[operands[0]] == 1 || (state[operands[0]] == -1 && candidate[operands[0]])) &&
        kind_of_op(o.op) == PrimKind::kReduction && mixes_rows(o, *h, rank0)) {
      if (ring_seen) return whole("two reductions over the split rows");
      plan.combine = ring_combine_of(o.op);
      // The two-operand losses (mean, sum) and trace: f32 sums of their
      // elementwise loss (of the diagonal) over the ring, as sum/mean.
      int pair_target = -1, pair_weight = -1;
      if (plan.combine == KtirTilePlan::kNone && pair_loss_of(o.op) != KtirTilePlan::kPreNone) {
        const KtirValue* r = arg_named(o, schema, "reduction");
        const KtirValue* t = arg_named(o, schema, "target");
        const KtirValue* w = arg_named(o, schema, "weight");
        const int tv = t && t->kind == KtirValue::kView ? static_cast<int>(t->i) : -1;
        const int wv = w && w->kind == KtirValue::kView ? static_cast<int>(w->i) : -1;
        // A row operand: the input's sizes, split with its rows (F.binary_cross_entropy
        // expands its weight to the input's sizes).
        auto row_operand = [&](int v) {
          return v >= 0 && v != operands[0] && p.views[v].sizes == p.views[operands[0]].sizes &&
                 (state[v] == 1 || (state[v] == -1 && candidate[v]));
        };
        // multilabel_margin_loss: [rows, classes] (a 1-D input is one sample).
        const bool rows_of_samples = pair_loss_of(o.op) != KtirTilePlan::kPreMultilabelMargin || rank0 == 2;
        if (r && r->kind == KtirValue::kInt && (r->i == 1 || r->i == 2) && row_operand(tv) && rows_of_samples &&
            ((!w || w->kind == KtirValue::kNone) || (row_operand(wv) && wv != tv))) {
          plan.combine = r->i == 1 ? KtirTilePlan::kMean : KtirTilePlan::kSum;
          plan.ring_pre = pair_loss_of(o.op);
          pair_target = tv;
          pair_weight = wv;
        }
      } else if (plan.combine == KtirTilePlan::kNone && o.op.substr(0, o.op.find('.')) == "trace" && rank0 == 2) {
        plan.combine = KtirTilePlan::kSum;
        plan.ring_pre = KtirTilePlan::kPreDiag;
      }
      if (plan.combine == KtirTilePlan::kNone) {
        plan.whole_library = true;  // runs its whole reduction as a library call
        return whole(o.op + " has no ring combine");
      }
      if (c10::isComplexType(p.views[operands[0]].dtype)) return whole(o.op + " of complex values over the ring");
      const bool order = ktir_is_order(plan.combine);
      const bool multi = plan.combine == KtirTilePlan::kVar || plan.combine == KtirTilePlan::kLayerNorm ||
                         plan.combine == KtirTilePlan::kNllLoss || plan.combine == KtirTilePlan::kMinMax ||
                         is_extremum_scan(plan.combine) || o.op == "max.dim" || o.op == "min.dim" || order;
      // The result views: fresh results, or the written operands of an
      // order statistic's out= (median.dim_values(x, 0, False, %values,
      // %indices)) or of renorm.out / renorm_ (the normalizing pass writes
      // them after the ring; renorm_'s is its input, read by the steps before).
      plan.ring_outs = o.results;
      const bool into_written = (order || plan.combine == KtirTilePlan::kRenorm) && o.results.empty();
      if (into_written) plan.ring_outs = written;
      if (plan.ring_pre == KtirTilePlan::kPreMultilabelMargin && o.results.size() == 2 && o.results[1] >= 0) {
        // is_target: rows of the split rows each step writes (not the ring's).
        plan.ring_is_target = o.results[1];
        plan.ring_outs.pop_back();
      }
      // nll_loss: its target has the rows too, split and loaded with them.
      int nll_target = -1;
      if (plan.combine == KtirTilePlan::kNllLoss) {
        if (p.views[operands[0]].sizes.size() != 2) return whole(o.op + ": not a [rows, classes] input");
        const KtirValue* t = arg_named(o, schema, "target");
        nll_target = t && t->kind == KtirValue::kView ? static_cast<int>(t->i) : -1;
        // (a target the steps produce, e.g. a batch gather, is that step's rows)
        if (nll_target < 0 || !(state[nll_target] == 1 || (state[nll_target] == -1 && candidate[nll_target])))
          return whole(o.op + ": a target that is not split with the rows");
      }
      const auto& outs_r = plan.ring_outs;
      if (outs_r.empty() || (!multi && outs_r.size() != 1) || (!written.empty() && !into_written))
        return whole(o.op + ": a ring reduction with fresh results");
      for (int r : outs_r)
        if (r < 0) return whole(o.op + ": a ring reduction with fresh results");
      for (size_t j = 1; j < operands.size(); ++j) {
        if (operands[j] == nll_target || operands[j] == pair_target || operands[j] == pair_weight) continue;
        if (std::find(outs_r.begin(), outs_r.end(), operands[j]) != outs_r.end()) continue;  // out= results
        if (state[operands[j]] == 1) return whole(o.op + ": a second split operand");
        if (state[operands[j]] == -1) state[operands[j]] = 0;  // layer_norm's weight/bias: read per row range
      }
      if (nll_target >= 0) state[nll_target] = 1, plan.split[nll_target] = 1;
      if (pair_target >= 0) state[pair_target] = 1, plan.split[pair_target] = 1, plan.ring_target = pair_target;
      if (pair_weight >= 0) state[pair_weight] = 1, plan.split[pair_weight] = 1, plan.ring_weight = pair_weight;
      if (plan.ring_is_target >= 0) {
        state[plan.ring_is_target] = 1, plan.split[plan.ring_is_target] = 1;
        tile_written.insert(storage_key(p.views[plan.ring_is_target]));
      }
      state[operands[0]] = 1;
      plan.split[operands[0]] = 1;
      const KtirValue* dim = arg_named(o, schema, "dim");
      std::set<int64_t> d = dims_of(dim, rank0);
      if (reduces_all_but_dim(o.op.substr(0, o.op.find('.')))) {  // every dim but renorm's
        std::set<int64_t> others;
        for (int64_t x = 0; x < rank0; ++x)
          if (!d.count(x)) others.insert(x);
        d = std::move(others);
      }
      plan.ring_dims.assign(d.begin(), d.end());
      plan.ring_flat = (plan.combine == KtirTilePlan::kArgMax || plan.combine == KtirTilePlan::kArgMin ||
                        plan.combine == KtirTilePlan::kMedian || plan.combine == KtirTilePlan::kNanMedian) &&
                       (!dim || dim->kind == KtirValue::kNone);
      plan.ring_values = o.op == "max.dim" || o.op == "min.dim";
      plan.normalize = plan.combine == KtirTilePlan::kSoftmax || plan.combine == KtirTilePlan::kLogSoftmax ||
                       plan.combine == KtirTilePlan::kLayerNorm || plan.combine == KtirTilePlan::kRenorm ||
                       is_scan(plan.combine);
      // The normalizing pass reads the input whole after the ring: an LX
      // input the steps produce is kept in its buffer (a scan keeps its
      // partial sums instead).
      if (plan.normalize && !is_scan(plan.combine) && p.views[operands[0]].lx) plan.keep[operands[0]] = 1;
      const bool two = multi || (plan.normalize && !is_scan(plan.combine)) || plan.combine == KtirTilePlan::kArgMax ||
                       plan.combine == KtirTilePlan::kArgMin || plan.combine == KtirTilePlan::kLogSumExp ||
                       is_extremum_scan(plan.combine) || order;
      plan.ring_stats = two ? 2 : 1;  // (mean, M2), (max, sum), (value, index); the counts follow from the tiling
      plan.ring_dtype = p.views[operands[0]].dtype == c10::kDouble ? c10::kDouble : c10::kFloat;
      const auto& in = p.views[operands[0]].sizes;
      plan.ring_count = 1;
      for (int64_t x : plan.ring_dims)
        if (x >= 0 && x < static_cast<int64_t>(in.size())) plan.ring_count *= in[x];
      if (plan.ring_pre == KtirTilePlan::kPreMultilabelMargin) plan.ring_count = in[0];  // one loss per row
      if (order) {
        // A hop of the chain carries the runs of the cores before it: on
        // average half the rows (topk: at most k of them).
        std::vector<int64_t> ps = in;
        if (plan.ring_flat) ps = {static_cast<int64_t>(plan.ring_count)};
        if (!ps.empty()) {
          ps[0] = (ps[0] + 1) / 2;
          const KtirValue* kv = arg_named(o, schema, "k");
          if (plan.combine == KtirTilePlan::kTopk && kv && kv->kind == KtirValue::kInt)
            ps[0] = std::min(ps[0], std::max<int64_t>(kv->i, 1));
        }
        if (order_by_selection(plan.combine) && !ps.empty()) {
          // A selection's chains, one after the other: per 8-bit digit of
          // the key a chain of histograms (256 int32 counts per column) and
          // a broadcast of the digit found (one per column) back to every
          // core, which filters its rows by it in the next pass; then a
          // chain of the counts of equal keys (one per column).
          const int64_t digits = order_select_passes(p.views[operands[0]].dtype) - 1;
          std::vector<int64_t> hist = ps, one = ps;
          hist[0] = 256;
          one[0] = 1;
          for (int64_t d = 0; d < digits; ++d) plan.ring_chains.push_back(hist), plan.ring_chains.push_back(one);
          plan.ring_chains.push_back(one);
          ps = hist;
          plan.ring_stats = 1;
          plan.ring_dtype = c10::kInt;
        }
        plan.ring_payload_sizes = std::move(ps);
      }
      for (int r : outs_r) state[r] = 2;
      plan.phase[k] = KtirTilePlan::kRing;
      plan.ring_op = static_cast<int>(k);
      ring_seen = true;
      continue;
    }
    if (!any_split) {  // replicated operands only: once, before the tiles (or after the ring)
      for (int v : operands)
        if (state[v] == -1) state[v] = 0;
      for (int v : outs) state[v] = 0;
      plan.phase[k] = reads_ring || ring_seen ? KtirTilePlan::kPost : KtirTilePlan::kPre;
      continue;
    }
    if (reads_ring && (plan.normalize || ktir_is_order(plan.combine))) {
      // A normalized result (the split rows, whole after the ring's second
      // pass) or an order statistic's (sort's rows, topk's k) feeds this op:
      // it runs after the ring on whole views, unless it also reads rows the
      // steps produce.
      bool tiled_operand = false;
      for (int v : operands) tiled_operand |= state[v] == 1;
      for (int v : outs) tiled_operand |= state[v] == 1;
      if (!tiled_operand) {
        for (int v : operands)
          if (state[v] == -1) state[v] = 0;
        for (int v : outs) state[v] = 2;
        plan.phase[k] = KtirTilePlan::kPost;
        continue;
      }
    }
    if (reads_ring) return whole(o.op + " reads the ring result on the split rows");
    if (!gather && mixes_rows(o, *h, rank0)) return whole(o.op + " is not row-local");
    if (const KtirTilePlan::RingPre g = mean_grad_of(o, schema); g != KtirTilePlan::kPreNone) {
      const KtirValue* self = arg_named(o, schema, "self");
      if (self && self->kind == KtirValue::kView) {
        int64_t n = 1;
        for (int64_t x : p.views[self->i].sizes) n *= x;
        plan.mean_grad.resize(no, {KtirTilePlan::kPreNone, 0});
        plan.mean_grad[k] = {g, n};
      }
    }
    // nll_loss with reduction='none': its total_weight result is 0 whatever
    // the rows (CPU's kernel), so every step writes the same replicated value.
    if (const int tw = row_free_result(o, schema); tw >= 0) {
      outs.erase(std::remove(outs.begin(), outs.end(), tw), outs.end());
      state[tw] = 0;
      tile_written.insert(storage_key(p.views[tw]));
    }
    // Shapes: on `probe` rows of its split operands, each result (and written
    // operand) must be `probe` rows of its view. Undecided inputs are first
    // all split, then only those of the result's rank, then only the first
    // (a matmul's right operand may have the rows' size, replicated).
    const int64_t out_rank = outs.empty() ? -1 : static_cast<int64_t>(p.views[outs[0]].sizes.size());
    for (int v : outs)
      if (!(state[v] == 1 || (state[v] == -1 && candidate[v])))
        return whole(o.op + " writes a replicated view from split rows");
    bool ok = false;
    std::vector<int> chosen;
    int first = -1;
    for (int v : operands)
      if (first < 0 && state[v] == -1 && candidate[v]) first = v;
    for (int attempt = 0; attempt < 3 && !ok; ++attempt) {
      std::vector<char> sp(nv, 0);
      for (int v : operands)
        sp[v] = state[v] == 1 ||
                (state[v] == -1 && candidate[v] &&
                 (attempt == 0 || (attempt == 1 && static_cast<int64_t>(p.views[v].sizes.size()) == out_rank) ||
                  (attempt == 2 && v == first)));
      for (int v : outs) sp[v] = 1;
      std::vector<at::Tensor> meta(nv);
      for (size_t v = 0; v < nv; ++v) {
        std::vector<int64_t> sizes = p.views[v].sizes;
        if (sp[v] && !sizes.empty()) sizes[0] = probe;
        meta[v] = at::empty(sizes, at::TensorOptions().dtype(p.views[v].dtype).device(c10::kMeta));
      }
      try {
        torch::jit::Stack stack = op_stack(o, schema, meta);
        c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
        h->callBoxed(stack);
        const std::vector<at::Tensor> got = fresh(schema, stack);
        ok = got.size() >= o.results.size();
        for (size_t j = 0; ok && j < o.results.size(); ++j)
          if (o.results[j] >= 0 && (!got[j].defined() || !got[j].sizes().equals(meta[o.results[j]].sizes())))
            ok = false;
      } catch (...) {
        ok = false;
      }
      if (ok)
        for (size_t v = 0; v < nv; ++v)
          if (sp[v]) chosen.push_back(static_cast<int>(v));
    }
    if (!ok) return whole(o.op + ": its results are not rows of its split operands");
    for (int v : operands)
      if (state[v] == -1) state[v] = 0;
    for (int v : chosen) state[v] = 1, plan.split[v] = 1;
    for (int v : outs) tile_written.insert(storage_key(p.views[v]));
    plan.phase[k] = KtirTilePlan::kTile;
  }
  cur_op.clear();
  // Aliasing: a storage the tile steps write is accessed through one view
  // only, and no op run outside the steps touches it; an op hoisted before
  // the steps writes nothing an earlier step op touches.
  for (int s : tile_written)
    if (views_of[s].size() > 1) return whole("views of a written storage alias");
  for (size_t k = 0; k < no; ++k) {
    if (plan.phase[k] == KtirTilePlan::kTile || plan.phase[k] == KtirTilePlan::kRing) continue;
    for (int s : accessed[k])
      if (tile_written.count(s)) return whole(p.ops[k].op + " outside the tile steps touches a tiled storage");
    if (plan.phase[k] == KtirTilePlan::kPre)
      for (size_t j = 0; j < k; ++j)
        if (plan.phase[j] == KtirTilePlan::kTile || plan.phase[j] == KtirTilePlan::kRing)
          for (int s : writes[k])
            if (accessed[j].count(s)) return whole(p.ops[k].op + " overwrites what an earlier tile op read");
  }
  bool any_tile = false;
  for (uint8_t ph : plan.phase) any_tile |= ph == KtirTilePlan::kTile || ph == KtirTilePlan::kRing;
  if (!any_tile) return whole("no op on the split rows");
  // Loads: split views a step reads before writing them whole (a fresh
  // result needs no load); stores: split HBM views the steps write.
  std::vector<char> seen(nv, 0);
  for (size_t k = 0; k < no; ++k) {
    if (plan.phase[k] != KtirTilePlan::kTile && plan.phase[k] != KtirTilePlan::kRing) continue;
    const KtirOp& o = p.ops[k];
    const auto& sargs = o.handle->schema().arguments();
    for (size_t a = 0; a < o.args.size() && a < sargs.size(); ++a) {
      const bool w = sargs[a].alias_info() && sargs[a].alias_info()->isWrite();
      for_each_view_operand(o.args[a], [&](int v) {
        if (!plan.split[v]) return;
        if (!seen[v] && !(w && write_only(o.op, o.handle->schema(), a))) plan.load[v] = 1;
        seen[v] = 1;
        // renorm_'s input: the ring's normalizing pass stores it, not the steps.
        const bool ring_out = static_cast<int>(k) == plan.ring_op &&
                              std::find(plan.ring_outs.begin(), plan.ring_outs.end(), v) != plan.ring_outs.end();
        if (w && !p.views[v].lx && !ring_out) plan.store[v] = 1;
      });
    }
    for (int r : o.results)
      if (r >= 0 && plan.split[r]) {
        seen[r] = 1;
        if (!p.views[r].lx) plan.store[r] = 1;
      }
  }
  plan.tiled = true;
  return plan;
}

namespace {

// One core's (or corelet's) partial of a ring reduction: its statistics
// (kSum/kMean/kMax/kMin/kProd: one tensor; kVar/kLayerNorm: mean, M2 with
// `n` elements per result element; kArgMax/kArgMin: value, index;
// kSoftmax/kLogSoftmax: max, sum of exp(x - max)), each with the reduced
// dims kept. Empty before its first rows.
struct RingPart {
  std::vector<at::Tensor> t;
  double n = 0;
};

// The ring op's literal operands, read at each run (they are the launch's).
struct RingParams {
  double correction = 1;  // var/std: the divisor is max(0, n - correction)
  bool std = false;       // std/std_mean: the square root of the variance
  double eps = 1e-5;      // layer_norm
  int weight = -1, bias = -1;
  int target = -1;        // nll_loss
  int64_t reduction = 1;  // nll_loss: 1 mean, 2 sum
  int64_t ignore_index = -100;
  int64_t row_elems = 1;    // elements of one row of the input (flat argmax/argmin indices)
  double ord = 2;           // norm: the order (inf, -inf, 0, 1, 2, any p)
  int64_t k = 1;            // topk, kthvalue
  bool descending = false;  // sort's descending, topk's largest: the run's order
  double maxnorm = 0;       // renorm
};

RingParams ring_params(const KtirOp& o, const std::vector<int64_t>& in_sizes) {
  RingParams rp;
  const c10::FunctionSchema& schema = o.handle->schema();
  const std::string base = o.op.substr(0, o.op.find('.'));
  rp.std = base == "std" || base == "std_mean";
  if (const KtirValue* c = arg_named(o, schema, "correction")) {
    if (c->kind == KtirValue::kInt) rp.correction = static_cast<double>(c->i);
    if (c->kind == KtirValue::kFloat) rp.correction = c->f;
  } else if (const KtirValue* u = arg_named(o, schema, "unbiased")) {
    rp.correction = u->kind == KtirValue::kBool && !u->b ? 0 : 1;
  }
  if (const KtirValue* e = arg_named(o, schema, "eps"))
    if (e->kind == KtirValue::kFloat) rp.eps = e->f;
  if (const KtirValue* w = arg_named(o, schema, "weight"))
    if (w->kind == KtirValue::kView) rp.weight = static_cast<int>(w->i);
  if (const KtirValue* b = arg_named(o, schema, "bias"))
    if (b->kind == KtirValue::kView) rp.bias = static_cast<int>(b->i);
  if (const KtirValue* t = arg_named(o, schema, "target"))
    if (t->kind == KtirValue::kView) rp.target = static_cast<int>(t->i);
  if (const KtirValue* r = arg_named(o, schema, "reduction"))
    if (r->kind == KtirValue::kInt) rp.reduction = r->i;
  if (const KtirValue* g = arg_named(o, schema, "ignore_index"))
    if (g->kind == KtirValue::kInt) rp.ignore_index = g->i;
  for (size_t d = 1; d < in_sizes.size(); ++d) rp.row_elems *= in_sizes[d];
  // linalg_vector_norm's "ord", norm's "p" (None: 2).
  const KtirValue* ord = arg_named(o, schema, "ord");
  if (!ord) ord = arg_named(o, schema, "p");
  if (ord && ord->kind == KtirValue::kInt) rp.ord = static_cast<double>(ord->i);
  if (ord && ord->kind == KtirValue::kFloat) rp.ord = ord->f;
  if (const KtirValue* k = arg_named(o, schema, "k"))
    if (k->kind == KtirValue::kInt) rp.k = k->i;
  const KtirValue* desc = arg_named(o, schema, "descending");
  if (!desc) desc = arg_named(o, schema, "largest");
  if (desc && desc->kind == KtirValue::kBool) rp.descending = desc->b;
  if (const KtirValue* mx = arg_named(o, schema, "maxnorm")) {
    if (mx->kind == KtirValue::kInt) rp.maxnorm = static_cast<double>(mx->i);
    if (mx->kind == KtirValue::kFloat) rp.maxnorm = mx->f;
  }
  return rp;
}

// Per-thread scratch kept across launches, one buffer per use (the cores'
// LX scratch): the widened input of a normalizing ring op, the softmax
// partials' exps and a scan's (value, index) rows reuse their storage
// instead of allocating a tensor of the input's size per launch, whose fresh
// pages the kernel maps and zeroes again at every first touch. A lease holds
// its slot until it goes out of scope; a slot already held (a nested walk)
// or a size over the cap gets a fresh tensor. Contents are never read before
// being written.
class Scratch {
 public:
  enum Slot { kWideIn, kPartial, kScanValues, kScanIndices, kMergeValues, kMergeIndices, kSlots };
  // Bounds the memory a thread keeps: 16 MiB per slot.
  static constexpr int64_t kCapBytes = int64_t{1} << 24;
  Scratch(Slot slot, at::IntArrayRef sizes, c10::ScalarType dtype = at::kFloat) : slot_(slot) {
    const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(c10::elementSize(dtype));
    State& s = state();
    if (bytes > kCapBytes || s.held[slot_]) {
      t_ = at::empty(sizes, at::TensorOptions().dtype(dtype));
      return;
    }
    at::Tensor& buf = s.buf[slot_];
    if (!buf.defined() || buf.numel() < bytes) buf = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
    s.held[slot_] = leased_ = true;
    t_ = buf.narrow(0, 0, bytes).view(dtype).view(sizes);
  }
  ~Scratch() {
    if (leased_) state().held[slot_] = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const at::Tensor& tensor() const { return t_; }

 private:
  struct State {
    at::Tensor buf[kSlots];
    bool held[kSlots] = {};
  };
  static State& state() {
    static thread_local State s;
    return s;
  }
  Slot slot_;
  bool leased_ = false;
  at::Tensor t_;
};

// Whether an elementwise op's fresh result for `t` is laid out row-major
// (TensorIterator orders its output's dims by the input's strides): each
// dim of more than one element has a stride no smaller than the next one's.
bool row_major_order(const at::Tensor& t) {
  int64_t last = std::numeric_limits<int64_t>::max();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) > last) return false;
    last = t.stride(d);
  }
  return true;
}

// m where it is finite, else 0 (logsumexp's shift).
at::Tensor finite_or_zero(const at::Tensor& m) {
  return at::where(m.abs().eq(INFINITY), at::zeros({}, m.options()), m);
}

// The partials of `G` corelets at once: `seg` is [G, m, ...] (m rows of the
// input per corelet, in the accumulator dtype), `first_rows` [G] (int64) the
// first row of each in the whole input. Each partial is [G, <the partial of
// one corelet's rows, reduced dims kept>], computed with CPU's float32
// kernels over dim 1 onwards (each corelet's values are those of its rows
// alone).
RingPart ring_partial(const KtirTilePlan& P, const RingParams& rp, const at::Tensor& seg, const at::Tensor& first_rows,
                      c10::ScalarType acc) {
  RingPart q;
  const int64_t G = seg.size(0);
  std::vector<int64_t> shifted;
  for (int64_t d : P.ring_dims) shifted.push_back(d + 1);
  const at::IntArrayRef dims(shifted);
  // first_rows shaped to broadcast against a [G, 1, ...] partial of rank r.
  auto per_g = [&](int64_t rank) {
    std::vector<int64_t> sizes(rank, 1);
    sizes[0] = G;
    return first_rows.view(sizes);
  };
  switch (P.combine) {
    case KtirTilePlan::kMax:
      q.t = {seg.amax(dims, true)};
      break;
    case KtirTilePlan::kMin:
      q.t = {seg.amin(dims, true)};
      break;
    case KtirTilePlan::kMinMax:
      q.t = {seg.amin(dims, true), seg.amax(dims, true)};
      break;
    case KtirTilePlan::kNanSum:
      q.t = {seg.nansum(dims, true, acc)};
      break;
    case KtirTilePlan::kCountNonzero:
      q.t = {seg.ne(0).sum(dims, true, c10::kLong)};
      break;
    case KtirTilePlan::kAny:  // bool max / min: or / and
      q.t = {seg.ne(0).amax(dims, true)};
      break;
    case KtirTilePlan::kAll:
      q.t = {seg.ne(0).amin(dims, true)};
      break;
    case KtirTilePlan::kNorm:
    case KtirTilePlan::kRenorm:
      // The powers |x|^ord of the corelet's df16 (f32) values, summed in f32
      // (ord +-inf: the max/min of |x|; ord 0: the count of nonzeros).
      if (std::isinf(rp.ord))
        q.t = {rp.ord > 0 ? seg.abs().amax(dims, true) : seg.abs().amin(dims, true)};
      else if (rp.ord == 0)
        q.t = {seg.ne(0).sum(dims, true, acc)};
      else if (rp.ord == 1)
        q.t = {seg.abs().sum(dims, true, acc)};
      else if (rp.ord == 2)
        q.t = {seg.mul(seg).sum(dims, true, acc)};
      else
        q.t = {seg.abs().pow(rp.ord).sum(dims, true, acc)};
      break;
    case KtirTilePlan::kProd: {
      // prod takes one dim; a product over every dim is over the flattened rows.
      if (shifted.size() == 1) {
        q.t = {seg.prod(shifted[0], true, acc)};
      } else {
        std::vector<int64_t> ones(seg.dim(), 1);
        ones[0] = G;
        q.t = {seg.reshape({G, -1}).prod(1, false, acc).reshape(ones)};
      }
      break;
    }
    case KtirTilePlan::kVar:
    case KtirTilePlan::kLayerNorm: {
      const at::Tensor s = seg.sum(dims, true, acc);
      q.n = static_cast<double>(seg.numel() / std::max<int64_t>(1, s.numel()));
      const at::Tensor mean = s.div(q.n);
      const at::Tensor d = seg.sub(mean);
      q.t = {mean, d.mul(d).sum(dims, true, acc)};
      break;
    }
    case KtirTilePlan::kArgMax:
    case KtirTilePlan::kArgMin: {
      const bool is_max = P.combine == KtirTilePlan::kArgMax;
      if (P.ring_flat) {
        const at::Tensor flat = seg.reshape({G, -1});
        const at::Tensor i = is_max ? flat.argmax(1, true) : flat.argmin(1, true);
        const int64_t row_elems = seg.dim() > 1 ? seg.numel() / std::max<int64_t>(1, G * seg.size(1)) : 1;
        q.t = {flat.gather(1, i), i.add(per_g(2).mul(row_elems))};
      } else {
        const at::Tensor i = is_max ? seg.argmax(1, true) : seg.argmin(1, true);
        q.t = {seg.gather(1, i), i.add(per_g(i.dim()))};
      }
      break;
    }
    case KtirTilePlan::kSoftmax:
    case KtirTilePlan::kLogSoftmax: {
      const at::Tensor m = seg.amax(dims, true);
      if (seg.scalar_type() == at::kFloat && row_major_order(seg)) {
        // The same difference, exp and sum, the exps in scratch (row-major,
        // as seg.sub(m) would be).
        Scratch e(Scratch::kPartial, seg.sizes());
        at::Tensor buf = e.tensor();
        at::sub_out(buf, seg, m).exp_();
        q.t = {m, e.tensor().sum(dims, true, acc)};
      } else {
        q.t = {m, seg.sub(m).exp_().sum(dims, true, acc)};
      }
      break;
    }
    case KtirTilePlan::kLogSumExp: {
      // (max, sum of exp(x - finite(max))), finite(m) = 0 where m is +-inf
      // (CPU's logsumexp shifts by that): all -inf sums to 0, not NaN.
      const at::Tensor m = seg.amax(dims, true);
      q.t = {m, seg.sub(finite_or_zero(m)).exp().sum(dims, true, acc)};
      break;
    }
    default:  // kSum, kMean
      q.t = {seg.sum(dims, true, acc)};
  }
  return q;
}

// Merges partial `b` (later rows) into `a` (earlier rows).
RingPart ring_merge(const KtirTilePlan& P, const RingParams& rp, RingPart a, const RingPart& b) {
  if (a.t.empty()) return b;
  if (b.t.empty()) return a;
  RingPart r;
  switch (P.combine) {
    case KtirTilePlan::kMax:
      r.t = {at::maximum(a.t[0], b.t[0])};
      break;
    case KtirTilePlan::kMin:
      r.t = {at::minimum(a.t[0], b.t[0])};
      break;
    case KtirTilePlan::kMinMax:
      r.t = {at::minimum(a.t[0], b.t[0]), at::maximum(a.t[1], b.t[1])};
      break;
    case KtirTilePlan::kAny:
      r.t = {a.t[0].logical_or(b.t[0])};
      break;
    case KtirTilePlan::kAll:
      r.t = {a.t[0].logical_and(b.t[0])};
      break;
    case KtirTilePlan::kNorm:
    case KtirTilePlan::kRenorm:
      if (std::isinf(rp.ord))
        r.t = {rp.ord > 0 ? at::maximum(a.t[0], b.t[0]) : at::minimum(a.t[0], b.t[0])};
      else
        r.t = {a.t[0].add(b.t[0])};
      break;
    case KtirTilePlan::kProd:
      r.t = {a.t[0].mul(b.t[0])};
      break;
    case KtirTilePlan::kVar:
    case KtirTilePlan::kLayerNorm: {
      // Chan et al.'s pairwise merge of (count, mean, M2).
      r.n = a.n + b.n;
      const at::Tensor d = b.t[0].sub(a.t[0]);
      r.t = {a.t[0].add(d.mul(b.n / r.n)), a.t[1].add(b.t[1]).add(d.mul(d).mul(a.n * b.n / r.n))};
      break;
    }
    case KtirTilePlan::kArgMax:
    case KtirTilePlan::kArgMin: {
      // b wins only when strictly better (or NaN where a is not): ties keep
      // a, the earlier rows, so the first index wins as on CPU.
      const at::Tensor better = P.combine == KtirTilePlan::kArgMax ? b.t[0].gt(a.t[0]) : b.t[0].lt(a.t[0]);
      const at::Tensor take = better.logical_or(b.t[0].isnan().logical_and(a.t[0].isnan().logical_not()));
      r.t = {at::where(take, b.t[0], a.t[0]), at::where(take, b.t[1], a.t[1])};
      break;
    }
    case KtirTilePlan::kSoftmax:
    case KtirTilePlan::kLogSoftmax: {
      const at::Tensor m = at::maximum(a.t[0], b.t[0]);
      r.t = {m, a.t[1].mul(a.t[0].sub(m).exp()).add(b.t[1].mul(b.t[0].sub(m).exp()))};
      break;
    }
    case KtirTilePlan::kLogSumExp: {
      // Each sum is relative to its finite(max); rescaled to the new one.
      const at::Tensor m = at::maximum(a.t[0], b.t[0]);
      const at::Tensor f = finite_or_zero(m);
      r.t = {m, a.t[1].mul(finite_or_zero(a.t[0]).sub(f).exp()).add(b.t[1].mul(finite_or_zero(b.t[0]).sub(f).exp()))};
      break;
    }
    case KtirTilePlan::kNllLoss:
      r.t = {a.t[0].add(b.t[0]), a.t[1].add(b.t[1])};
      break;
    default:  // kSum, kMean, kNanSum, kCountNonzero: add
      r.t = {a.t[0].add(b.t[0])};
  }
  return r;
}

// The ring of an f32 sum: the accumulators acc[c] of the cores that have
// rows (`has`), added in core order, ((acc_0 + acc_1) + acc_2) + ..., in one
// loop (ring_merge's adds, the same values); one ring step per add.
at::Tensor ring_add_chain(const at::Tensor& acc, const std::vector<char>& has, KtirWalk* walk) {
  const int64_t n = acc.numel() / acc.size(0);
  at::Tensor total = at::empty(acc.sizes().slice(1), acc.options());
  float* __restrict t = total.mutable_data_ptr<float>();
  const float* a = acc.const_data_ptr<float>();
  bool first = true;
  for (size_t c = 0; c < has.size(); ++c) {
    if (!has[c]) continue;
    const float* __restrict ac = a + static_cast<int64_t>(c) * n;
    if (first) {
      std::memcpy(t, ac, n * sizeof(float));
      first = false;
      continue;
    }
    for (int64_t j = 0; j < n; ++j) t[j] += ac[j];
    if (walk) walk->ring_steps++;
  }
  return total;
}

// Whether softmax's (log_softmax's) corelet partials of `X` [G, rows, ...]
// can run as softmax_ring_partials: the max and sum over dim 1 only, float32
// or bfloat16 values, each block's rows contiguous, at least 2 values per row
// (a sum over one value per row takes ATen's inner, not its outer, order).
bool softmax_partials_fit(const KtirTilePlan& P, const at::Tensor& X) {
  if ((P.combine != KtirTilePlan::kSoftmax && P.combine != KtirTilePlan::kLogSoftmax) ||
      P.ring_dims != std::vector<int64_t>{0} || !vml::available())
    return false;
  if ((X.scalar_type() != at::kFloat && X.scalar_type() != at::kBFloat16) || X.dim() < 3 || X.size(1) == 0)
    return false;
  const int64_t n = X.numel() / std::max<int64_t>(1, X.size(0) * X.size(1));
  return n >= 2 && X[0].is_contiguous() && X.stride(1) == n;
}

// Whether a softmax (log_softmax) ring op reads its input `in` in place, not
// through an f32 copy: bfloat16 rows whose every block of cores'
// rows the partials take as they are (softmax_partials_fit of [1, rows, ...]).
bool softmax_reads_in_place(const KtirTilePlan& P, const at::Tensor& in) {
  return in.scalar_type() == at::kBFloat16 && in.dim() >= 2 && in.is_contiguous() &&
         softmax_partials_fit(P, in.unsqueeze(0));
}

// The corelets' partials of X merged in order per block: RingPart {max, sum}
// of [G, 1, ...] f32, the values ring_partial and ring_merge give.
RingPart softmax_partials(const at::Tensor& X, int64_t corelets) {
  const int64_t G = X.size(0), rows = X.size(1), n = X.numel() / std::max<int64_t>(1, G * rows);
  const std::vector<int64_t> shares = corelet_shares(rows, corelets);
  std::vector<int64_t> sizes = X.sizes().vec();
  sizes[1] = 1;
  const auto f32 = X.options().dtype(at::kFloat);
  RingPart q;
  q.t = {at::empty(sizes, f32), at::empty(sizes, f32)};
  softmax_ring_partials(X.const_data_ptr(), X.scalar_type() == at::kBFloat16, G, X.stride(0), rows, n, shares.data(),
                        corelets, q.t[0].mutable_data_ptr<float>(), q.t[1].mutable_data_ptr<float>());
  return q;
}

// The ring chain of softmax partials (max m, sum s, f32), merged in core
// order as ring_merge does, with the same values: the running max M_c =
// maximum(M_{c-1}, m_c) step by step (at::maximum, whose NaN and signed-zero
// choices the chain keeps), the rescale factors exp(M_{c-1} - M_c) and
// exp(m_c - M_c) and the products s_c * exp(m_c - M_c) of all steps in one
// batch each (elementwise ops: each element's value does not depend on the
// batch), then s = s * exp(M_{c-1} - M_c) + that product, one f32 multiply
// and one f32 add per element and step, as the chain of ATen ops computes
// them. ~6 + cores ATen calls instead of ~8 per core.
RingPart softmax_ring_chain(const std::vector<RingPart>& acc, KtirWalk* walk) {
  std::vector<const RingPart*> used;
  for (const auto& a : acc)
    if (!a.t.empty()) used.push_back(&a);
  if (used.empty()) return {};
  if (used.size() == 1) return *used[0];
  std::vector<at::Tensor> ms, ss, run;
  for (const RingPart* a : used) ms.push_back(a->t[0]), ss.push_back(a->t[1]);
  run.push_back(ms[0]);
  for (size_t c = 1; c < used.size(); ++c) run.push_back(at::maximum(run.back(), ms[c]));
  const int64_t U = static_cast<int64_t>(used.size());
  const at::Tensor M = at::stack(run), m = at::stack(ms), sc = at::stack(ss);
  const at::Tensor fa = M.narrow(0, 0, U - 1).sub(M.narrow(0, 1, U - 1)).exp_().contiguous();
  const at::Tensor fb = m.narrow(0, 1, U - 1).sub(M.narrow(0, 1, U - 1)).exp_();
  const at::Tensor t2 = sc.narrow(0, 1, U - 1).mul(fb).contiguous();
  at::Tensor s = ss[0].to(at::kFloat).contiguous().clone();
  float* sp = s.mutable_data_ptr<float>();
  const float* fap = fa.const_data_ptr<float>();
  const float* t2p = t2.const_data_ptr<float>();
  const int64_t n = s.numel();
  for (int64_t c = 0; c < U - 1; ++c)
    for (int64_t j = 0; j < n; ++j) {
      const float scaled = sp[j] * fap[c * n + j];
      sp[j] = scaled + t2p[c * n + j];
    }
  if (walk) walk->ring_steps += static_cast<int>(U - 1);
  RingPart r;
  r.t = {run.back(), s};
  return r;
}

// softmax_ring_chain for every core's partials at once: `m_all`, `s_all`
// [U, ...] (f32, core c's max and sum in row c), merged in core order with
// the same values. The running max M_c = maximum(M_{c-1}, m_c) is computed
// as a Hillis-Steele scan, M_c = maximum(M_{c-d}, M_c) for d = 1, 2, 4, ...
// (log2 U at::maximum calls instead of U - 1): each call takes the earlier
// range's max first, as the chain does, so a tie (+-0) resolves to the same
// operand and a NaN to the same canonical NaN at every element; each row is
// kept its own inner loop (a padded row stride, so TensorIterator does not
// fuse the rows) and the call stays under ATen's grain size (one chunk), so
// every element takes the same vector or scalar path as in a call on its row
// alone. The caller checks U * n < at::internal::GRAIN_SIZE.
RingPart softmax_ring_chain_all(const at::Tensor& m_all, const at::Tensor& s_all, KtirWalk* walk) {
  const int64_t U = m_all.size(0);
  RingPart r;
  if (U == 1) {
    r.t = {m_all.select(0, 0), s_all.select(0, 0)};
    return r;
  }
  const int64_t n = m_all.numel() / U;
  const int64_t ld = (n / 16 + 1) * 16;  // > n: rows never coalesce
  const auto f32 = m_all.options().dtype(at::kFloat);
  at::Tensor A = at::empty({U, ld}, f32).narrow(1, 0, n), B = at::empty({U, ld}, f32).narrow(1, 0, n);
  const at::Tensor m = m_all.reshape({U, n});
  A.copy_(m);
  for (int64_t d = 1; d < U; d *= 2) {
    B.narrow(0, 0, d).copy_(A.narrow(0, 0, d));
    at::Tensor later = B.narrow(0, d, U - d);
    at::maximum_out(later, A.narrow(0, 0, U - d), A.narrow(0, d, U - d));
    std::swap(A, B);
  }
  const at::Tensor M = A;
  const at::Tensor fa = M.narrow(0, 0, U - 1).sub(M.narrow(0, 1, U - 1)).exp_().contiguous();
  const at::Tensor fb = m.narrow(0, 1, U - 1).sub(M.narrow(0, 1, U - 1)).exp_();
  const at::Tensor sc = s_all.reshape({U, n});
  const at::Tensor t2 = sc.narrow(0, 1, U - 1).mul(fb).contiguous();
  at::Tensor s = sc.select(0, 0).contiguous().clone();
  float* sp = s.mutable_data_ptr<float>();
  const float* fap = fa.const_data_ptr<float>();
  const float* t2p = t2.const_data_ptr<float>();
  for (int64_t c = 0; c < U - 1; ++c)
    for (int64_t j = 0; j < n; ++j) {
      const float scaled = sp[j] * fap[c * n + j];
      sp[j] = scaled + t2p[c * n + j];
    }
  if (walk) walk->ring_steps += static_cast<int>(U - 1);
  const auto part_sizes = m_all.sizes().slice(1);
  r.t = {M.select(0, U - 1).reshape(part_sizes), s.reshape(part_sizes)};
  return r;
}

// cummax/cummin of x [G, rows, ...] along dim 1 by CPU's rule (an element
// is taken when it is NaN, or when the running value is not NaN and the
// element is >= it for cummax, <= for cummin), each of the G blocks from its
// carried pair (cv, ci [G, 1, ...]) when given, else from its first row;
// indices count from firsts[g]. Returns (values [G, rows, ...], indices
// int64). The values are selections, so they equal CPU's scan exactly.
// CPU's rule for the later element b against the running a (cummax: b >= a;
// cummin: b <= a; a NaN b always, a NaN a never yields to a number).
// kMax is a template parameter so each loop body is one fixed select.
template <bool kMax, typename T>
inline bool extremum_takes(T b, T a) {
  const bool b_nan = b != b, a_nan = a != a;  // false for integers
  return b_nan || (!a_nan && (kMax ? b >= a : b <= a));
}

// One row of pairs: (v, ix)[j] = (b[j], bi) when b[j] takes over
// (a[j], ai[j]), else the latter; bi is b's row for every j (kRowIndex) or
// its own index array. Blocks of a fixed trip count with unaliased pointers
// are what GCC's -O2 vectorizer takes (the AVX2 clones below).
template <bool kMax, bool kRowIndex, typename T>
inline __attribute__((always_inline)) void extremum_row(const T* __restrict a, const int64_t* __restrict ai,
                                                        const T* __restrict b, const int64_t* __restrict bi,
                                                        int64_t b_row, T* __restrict v, int64_t* __restrict ix,
                                                        int64_t n) {
  constexpr int64_t kBlock = 32;
  auto one = [&](int64_t j) {
    const bool take = extremum_takes<kMax>(b[j], a[j]);
    v[j] = take ? b[j] : a[j];
    ix[j] = take ? (kRowIndex ? b_row : bi[j]) : ai[j];
  };
  int64_t j = 0;
  for (; j + kBlock <= n; j += kBlock)
    for (int64_t k = 0; k < kBlock; ++k) one(j + k);
  for (; j < n; ++j) one(j);
}

// The float32 rows (every ring scan accumulates in f32), built for AVX2 and
// for the baseline; the loader picks the CPU's.
#define TPU_SPYRE_EXTREMUM_ROW_F32(name, kMax, kRowIndex)                                                             \
  __attribute__((target_clones("avx2", "default"), optimize("tree-vectorize", "vect-cost-model=dynamic"))) void name( \
      const float* a, const int64_t* ai, const float* b, const int64_t* bi, int64_t b_row, float* v, int64_t* ix,     \
      int64_t n) {                                                                                                    \
    extremum_row<kMax, kRowIndex>(a, ai, b, bi, b_row, v, ix, n);                                                     \
  }
TPU_SPYRE_EXTREMUM_ROW_F32(extremum_row_max_f32, true, true)
TPU_SPYRE_EXTREMUM_ROW_F32(extremum_row_min_f32, false, true)
TPU_SPYRE_EXTREMUM_ROW_F32(extremum_merge_row_max_f32, true, false)
TPU_SPYRE_EXTREMUM_ROW_F32(extremum_merge_row_min_f32, false, false)
#undef TPU_SPYRE_EXTREMUM_ROW_F32

// extremum_row for any T: the f32 clones, else the template.
template <bool kMax, bool kRowIndex, typename T>
void extremum_row_any(const T* a, const int64_t* ai, const T* b, const int64_t* bi, int64_t b_row, T* v, int64_t* ix,
                      int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if constexpr (kRowIndex)
      (kMax ? extremum_row_max_f32 : extremum_row_min_f32)(a, ai, b, bi, b_row, v, ix, n);
    else
      (kMax ? extremum_merge_row_max_f32 : extremum_merge_row_min_f32)(a, ai, b, bi, b_row, v, ix, n);
  } else {
    extremum_row<kMax, kRowIndex>(a, ai, b, bi, b_row, v, ix, n);
  }
}

template <bool kMax, typename T>
void extremum_scan_loop(const T* x, int64_t G, int64_t rows, int64_t inner, const int64_t* firsts, const T* cv,
                        const int64_t* ci, T* ov, int64_t* oi, int64_t out_g_stride) {
  for (int64_t g = 0; g < G; ++g) {
    const T* xg = x + g * rows * inner;
    T* vg = ov + g * out_g_stride;
    int64_t* ig = oi + g * out_g_stride;
    for (int64_t r = 0; r < rows; ++r) {
      const T* pv = r > 0 ? vg + (r - 1) * inner : (cv ? cv + g * inner : nullptr);
      const int64_t* pi = r > 0 ? ig + (r - 1) * inner : (ci ? ci + g * inner : nullptr);
      const int64_t at_row = firsts[g] + r;
      const T* xr = xg + r * inner;
      T* vr = vg + r * inner;
      int64_t* ir = ig + r * inner;
      if (!pv) {  // a block's first row without a carried pair: its own values
        std::copy(xr, xr + inner, vr);
        std::fill(ir, ir + inner, at_row);
        continue;
      }
      extremum_row_any<kMax, true>(pv, pi, xr, nullptr, at_row, vr, ir, inner);
    }
  }
}

// The scan into (v, ix) [G, rows, ...] of x's sizes and dtype (ix int64):
// each block's rows contiguous, blocks `v.stride(0)` elements apart (the
// cores' evenly spaced rows of a whole scan buffer).
void extremum_scan_into(bool is_max, const at::Tensor& x, const std::vector<int64_t>& firsts, const at::Tensor& cv,
                        const at::Tensor& ci, const at::Tensor& v, const at::Tensor& ix) {
  const at::Tensor xc = x.contiguous();
  const int64_t G = xc.size(0), rows = xc.size(1), inner = rows > 0 ? xc.numel() / std::max<int64_t>(1, G * rows) : 0;
  const at::Tensor cvc = cv.defined() ? cv.contiguous() : cv, cic = ci.defined() ? ci.contiguous() : ci;
  AT_DISPATCH_ALL_TYPES_AND(at::kBool, xc.scalar_type(), "extremum_scan", [&] {
    auto* loop = is_max ? &extremum_scan_loop<true, scalar_t> : &extremum_scan_loop<false, scalar_t>;
    loop(xc.const_data_ptr<scalar_t>(), G, rows, inner, firsts.data(),
         cvc.defined() ? cvc.const_data_ptr<scalar_t>() : nullptr,
         cic.defined() ? cic.const_data_ptr<int64_t>() : nullptr, v.mutable_data_ptr<scalar_t>(),
         ix.mutable_data_ptr<int64_t>(), v.stride(0));
  });
}

// extremum_merge of the pairs (av, ai) [G, 1, ...] of the earlier rows into
// each row of (bv, bi) [G, rows, ...], by the same rule, in one loop.
template <bool kMax, typename T>
void extremum_merge_loop(const T* av, const int64_t* ai, const T* bv, const int64_t* bi, int64_t G, int64_t rows,
                         int64_t inner, T* ov, int64_t* oi) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = (g * rows + r) * inner;
      extremum_row_any<kMax, false>(av + g * inner, ai + g * inner, bv + o, bi + o, 0, ov + o, oi + o, inner);
    }
}

// The merged pairs in per-thread scratch (the leases `lv`, `li`), valid while they live.
std::pair<at::Tensor, at::Tensor> extremum_merge_rows(bool is_max, const at::Tensor& av, const at::Tensor& ai,
                                                      const at::Tensor& bv, const at::Tensor& bi,
                                                      std::optional<Scratch>& lv, std::optional<Scratch>& li) {
  const at::Tensor a = av.contiguous(), a_i = ai.contiguous(), b = bv.contiguous(), b_i = bi.contiguous();
  const int64_t G = b.size(0), rows = b.size(1), inner = rows > 0 ? b.numel() / std::max<int64_t>(1, G * rows) : 0;
  lv.reset(), li.reset();
  const at::Tensor v = lv.emplace(Scratch::kMergeValues, b.sizes(), b.scalar_type()).tensor();
  const at::Tensor ix = li.emplace(Scratch::kMergeIndices, b.sizes(), at::kLong).tensor();
  AT_DISPATCH_ALL_TYPES_AND(at::kBool, b.scalar_type(), "extremum_merge_rows", [&] {
    auto* loop = is_max ? &extremum_merge_loop<true, scalar_t> : &extremum_merge_loop<false, scalar_t>;
    loop(a.const_data_ptr<scalar_t>(), a_i.const_data_ptr<int64_t>(), b.const_data_ptr<scalar_t>(),
         b_i.const_data_ptr<int64_t>(), G, rows, inner, v.mutable_data_ptr<scalar_t>(), ix.mutable_data_ptr<int64_t>());
  });
  return {v, ix};
}

// The inclusive prefix of K pairs (v, i) [K, 1, ...] merged in order by
// CPU's rule: row c is the pair of rows 0..c (row c later than the prefix
// before it), one row loop per step. Returns contiguous [K, 1, ...] tensors.
template <bool kMax, typename T>
void extremum_prefix_loop(const T* v, const int64_t* i, int64_t K, int64_t inner, T* ov, int64_t* oi) {
  std::copy(v, v + inner, ov);
  std::copy(i, i + inner, oi);
  for (int64_t c = 1; c < K; ++c)
    extremum_row_any<kMax, false>(ov + (c - 1) * inner, oi + (c - 1) * inner, v + c * inner, i + c * inner, 0,
                                  ov + c * inner, oi + c * inner, inner);
}

std::pair<at::Tensor, at::Tensor> extremum_prefix(bool is_max, const at::Tensor& v, const at::Tensor& i) {
  const at::Tensor a = v.contiguous(), a_i = i.contiguous();
  const int64_t K = a.size(0), inner = K > 0 ? a.numel() / K : 0;
  at::Tensor ov = at::empty(a.sizes(), a.options()), oi = at::empty(a.sizes(), a_i.options());
  if (K == 0) return {ov, oi};
  AT_DISPATCH_ALL_TYPES_AND(at::kBool, a.scalar_type(), "extremum_prefix", [&] {
    auto* loop = is_max ? &extremum_prefix_loop<true, scalar_t> : &extremum_prefix_loop<false, scalar_t>;
    loop(a.const_data_ptr<scalar_t>(), a_i.const_data_ptr<int64_t>(), K, inner, ov.mutable_data_ptr<scalar_t>(),
         oi.mutable_data_ptr<int64_t>());
  });
  return {ov, oi};
}

// An order statistic's sorted run of a set of columns: values [inner, n]
// (each row of the tensor one column of the input, sorted) and the input
// rows they come from [inner, n] (int64), both contiguous.
struct OrderRun {
  at::Tensor v, i;
  bool empty() const { return !v.defined(); }
};

// True when `b` goes strictly before `a` in the run's order: ascending with
// NaN after every number, or descending with NaN before (CPU's sort and topk
// order); equal values (0.0 and -0.0, NaN and NaN) are not, so the earlier
// run's element stays first (stable).
template <typename T>
inline bool order_before(T b, T a, bool desc) {
  const bool bn = b != b, an = a != a;  // false for integers
  return desc ? (bn && !an) || b > a : (!bn && an) || b < a;
}

template <typename T>
void order_merge_loop(const T* av, const int64_t* ai, int64_t na, const T* bv, const int64_t* bi, int64_t nb,
                      int64_t inner, int64_t n_out, bool desc, T* ov, int64_t* oi) {
  for (int64_t j = 0; j < inner; ++j) {
    const T *a = av + j * na, *b = bv + j * nb;
    const int64_t *ax = ai + j * na, *bx = bi + j * nb;
    T* o = ov + j * n_out;
    int64_t* ox = oi + j * n_out;
    // Branch-free: each step takes b's head when it goes strictly before
    // a's (or a is used up), else a's (the clamped reads stay in bounds).
    int64_t p = 0, q = 0;
    for (int64_t r = 0; r < n_out; ++r) {
      const int64_t pc = std::min(p, na - 1), qc = std::min(q, nb - 1);
      const bool tb = q < nb && (p >= na || order_before(b[qc], a[pc], desc));
      o[r] = tb ? b[qc] : a[pc];
      ox[r] = tb ? bx[qc] : ax[pc];
      q += tb;
      p += !tb;
    }
  }
}

// Each of G cores' sorted runs of its `len` elements per column: `cols`
// [inner, elems] holds the columns, core g's elements of column j at
// j * elems + off + g * len. The run is the first `keep` of the stable order
// (order_before, then the row: a strict total order, so a partial sort
// gives exactly the stable order's first `keep`); indices count from
// firsts[g]. Out: [G, inner, keep] values and indices.
template <typename T>
void order_runs_loop(const T* cols, int64_t inner, int64_t elems, int64_t off, int64_t G, int64_t len,
                     const int64_t* firsts, bool desc, int64_t keep, T* ov, int64_t* oi) {
  std::vector<int64_t> perm(len);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < inner; ++j) {
      const T* v = cols + j * elems + off + g * len;
      if (keep == 0) continue;
      T* o = ov + (g * inner + j) * keep;
      int64_t* ox = oi + (g * inner + j) * keep;
      if (keep <= 32 || len <= 64) {
        // Short runs (a tile's rows, topk's k): insertion in row order into
        // the sorted run, after the equal values already in it (stable); an
        // element not before the last of a full run is skipped.
        int64_t n = 0;
        for (int64_t r = 0; r < len; ++r) {
          const T x = v[r];
          if (n == keep && !order_before(x, o[n - 1], desc)) continue;
          int64_t q = n < keep ? n++ : n - 1;
          for (; q > 0 && order_before(x, o[q - 1], desc); --q) o[q] = o[q - 1], ox[q] = ox[q - 1];
          o[q] = x, ox[q] = firsts[g] + r;
        }
        continue;
      }
      for (int64_t r = 0; r < len; ++r) perm[r] = r;
      auto cmp = [&](int64_t a, int64_t b) {
        return order_before(v[a], v[b], desc) || (!order_before(v[b], v[a], desc) && a < b);
      };
      if (keep < len)
        std::partial_sort(perm.begin(), perm.begin() + keep, perm.end(), cmp);
      else
        std::sort(perm.begin(), perm.end(), cmp);
      for (int64_t r = 0; r < keep; ++r) o[r] = v[perm[r]], ox[r] = firsts[g] + perm[r];
    }
}

// The stable merge of run `a` (earlier rows) and run `b` (later rows), the
// first `limit` of it (topk's k; -1: all).
OrderRun order_merge(const OrderRun& a, const OrderRun& b, bool desc, int64_t limit) {
  if (a.empty() || a.v.size(1) == 0) return b;
  if (b.empty() || b.v.size(1) == 0) return a;
  const int64_t inner = a.v.size(0), na = a.v.size(1), nb = b.v.size(1);
  const int64_t n = limit >= 0 ? std::min(limit, na + nb) : na + nb;
  OrderRun r{at::empty({inner, n}, a.v.options()), at::empty({inner, n}, a.i.options())};
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, a.v.scalar_type(), "order_merge", [&] {
    order_merge_loop<scalar_t>(a.v.const_data_ptr<scalar_t>(), a.i.const_data_ptr<int64_t>(), na,
                               b.v.const_data_ptr<scalar_t>(), b.i.const_data_ptr<int64_t>(), nb, inner, n, desc,
                               r.v.mutable_data_ptr<scalar_t>(), r.i.mutable_data_ptr<int64_t>());
  });
  return r;
}

// mode from the ascending run: per column the most frequent value (the
// first of the runs of equal values with the largest count: the smallest
// value on a tie of counts; NaN != NaN, so each NaN is a run of one, as in
// CPU's scan) and the index of its last occurrence in the run (the largest
// row holding it: equal values stay in row order).
template <typename T>
void order_mode_loop(const T* v, const int64_t* ix, int64_t inner, int64_t n, T* ov, int64_t* oi) {
  for (int64_t j = 0; j < inner; ++j) {
    const T* c = v + j * n;
    int64_t best = 0, best_f = 0, f = 0;
    for (int64_t r = 0; r < n; ++r) {
      ++f;
      if (r == n - 1 || c[r] != c[r + 1]) {
        if (f > best_f) best_f = f, best = r;
        f = 0;
      }
    }
    ov[j] = c[best];
    oi[j] = ix[j * n + best];
  }
}

// The results of an order statistic from the merged run of every row
// (values [inner, N], indices): sort (values, indices) and topk (the first
// k) as [N or k, ...]; kthvalue the k-th smallest; median the element at
// (N - 1) / 2, or the first NaN of a column holding one; nanmedian the
// element at (m - 1) / 2 of the m non-NaN ones (an all-NaN column: its
// first NaN); mode (order_mode_loop). Shaped as `outs` (the result views).
std::vector<at::Tensor> order_finish(const KtirTilePlan& P, const RingParams& rp, const OrderRun& t,
                                     const std::vector<at::Tensor>& outs) {
  const int64_t inner = t.v.size(0), N = t.v.size(1);
  std::vector<at::Tensor> r;
  switch (P.combine) {
    case KtirTilePlan::kSort:
      r = {t.v.t(), t.i.t()};
      break;
    case KtirTilePlan::kTopk: {
      const int64_t k = std::min(rp.k, N);
      r = {t.v.narrow(1, 0, k).t(), t.i.narrow(1, 0, k).t()};
      break;
    }
    case KtirTilePlan::kKthvalue:
      TORCH_CHECK_INDEX(rp.k >= 1 && rp.k <= N, "kthvalue(): selected number k out of range for dimension 0");
      r = {t.v.select(1, rp.k - 1), t.i.select(1, rp.k - 1)};
      break;
    case KtirTilePlan::kMedian:
    case KtirTilePlan::kNanMedian: {
      const at::Tensor nan = t.v.isnan().sum(1, true);  // NaN sort last: [N - nan, N)
      at::Tensor pos;
      if (P.combine == KtirTilePlan::kMedian) {
        pos = at::where(nan.gt(0), nan.neg().add(N), at::zeros({}, nan.options()).add_((N - 1) / 2));
      } else {
        const at::Tensor m = nan.neg().add(N);
        pos = at::where(m.gt(0), m.sub(1).div(2, "floor"), at::zeros({}, nan.options()));
      }
      r = {t.v.gather(1, pos).squeeze(1), t.i.gather(1, pos).squeeze(1)};
      break;
    }
    default: {  // kMode
      at::Tensor v = at::empty({inner}, t.v.options()), ix = at::empty({inner}, t.i.options());
      AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, t.v.scalar_type(), "order_mode", [&] {
        order_mode_loop<scalar_t>(t.v.const_data_ptr<scalar_t>(), t.i.const_data_ptr<int64_t>(), inner, N,
                                  v.mutable_data_ptr<scalar_t>(), ix.mutable_data_ptr<int64_t>());
      });
      r = {v, ix};
    }
  }
  for (size_t j = 0; j < r.size() && j < outs.size(); ++j) r[j] = r[j].reshape(outs[j].sizes());
  r.resize(std::min(r.size(), outs.size()));
  return r;
}

// ---- Order statistics by selection (topk, kthvalue, median, nanmedian) ----
// An element's order key: an unsigned integer of the value's width whose
// ascending order is the run's order (order_before): ascending with every
// NaN equal and after every number, 0.0 and -0.0 equal; `desc` inverts it
// (descending with NaN first). Equal keys are equal values of the order,
// whose ties go by row (the stable order).
template <typename T, typename K>
struct OrderKey {
  static constexpr K kSign = static_cast<K>(K(1) << (8 * sizeof(K) - 1));
  bool floating, is_signed, desc;
  K inf = 0;  // the bits of +inf (floating types)
  explicit OrderKey(bool d)
      : floating(std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>),
        is_signed(std::numeric_limits<T>::is_signed),
        desc(d) {
    if (floating) {
      const T i = std::numeric_limits<T>::infinity();
      std::memcpy(&inf, &i, sizeof(K));
    }
  }
  K operator()(T v) const {
    K b;
    std::memcpy(&b, &v, sizeof(K));
    K k;
    if (floating) {
      const K m = static_cast<K>(b & static_cast<K>(~kSign));
      k = m > inf       ? static_cast<K>(~K(0))
          : m == 0      ? kSign
          : (b & kSign) ? static_cast<K>(~b)
                        : static_cast<K>(b | kSign);
    } else {
      k = is_signed ? static_cast<K>(b ^ kSign) : b;
    }
    return desc ? static_cast<K>(~k) : k;
  }
};

// Per column j of `keys` [N, C] (row-major), the key at position pos[j] of
// the column's stable order and the count of keys before it (`less`): a
// radix selection, one 8-bit digit per pass from the top, each pass a
// histogram of the digit over the keys that match the key found so far on
// the higher digits (what the cores' histograms summed over the ring give).
template <typename K>
void radix_select(const K* keys, int64_t N, int64_t C, const int64_t* pos, K* found, int64_t* less) {
  constexpr int kBits = 8 * sizeof(K);
  std::vector<uint32_t> hist(static_cast<size_t>(C) * 256);
  for (int64_t j = 0; j < C; ++j) found[j] = 0, less[j] = 0;
  for (int shift = kBits - 8; shift >= 0; shift -= 8) {
    std::fill(hist.begin(), hist.end(), 0u);
    const int hs = shift + 8;
    for (int64_t r = 0; r < N; ++r) {
      const K* row = keys + r * C;
      if (hs >= kBits) {
        for (int64_t j = 0; j < C; ++j) ++hist[j * 256 + ((row[j] >> shift) & 255)];
      } else {
        for (int64_t j = 0; j < C; ++j)
          if (static_cast<K>(row[j] >> hs) == static_cast<K>(found[j] >> hs))
            ++hist[j * 256 + ((row[j] >> shift) & 255)];
      }
    }
    for (int64_t j = 0; j < C; ++j) {
      const uint32_t* h = hist.data() + j * 256;
      int64_t cum = less[j];
      for (int b = 0; b < 256; ++b) {
        if (cum + h[b] > pos[j]) {
          found[j] = static_cast<K>(found[j] | (static_cast<K>(b) << shift));
          break;
        }
        cum += h[b];
      }
      less[j] = cum;
    }
  }
}

// The results of topk, kthvalue, median and nanmedian of the rows `x`
// ([N, C] contiguous, the op's input dtype; a flat median: [N*C, 1]) by
// selection, equal to order_finish's on the merged run: per column the
// wanted position of the stable order (kthvalue k - 1; median the first NaN,
// else (N - 1) / 2; nanmedian (m - 1) / 2 of the m non-NaN, or the first
// NaN), its key by radix_select, and its row: the (pos - less)-th row in row
// order holding that key. topk: every key before the k-th one's, and the
// first rows equal to it, sorted by (key, row). Values are the stored values.
template <typename T, typename K>
std::vector<at::Tensor> order_select_typed(const KtirTilePlan& P, const RingParams& rp, const at::Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1);
  const T* v = x.const_data_ptr<T>();
  const OrderKey<T, K> key(rp.descending);
  std::vector<K> keys(static_cast<size_t>(N * C));
  for (int64_t e = 0; e < N * C; ++e) keys[e] = key(v[e]);
  std::vector<int64_t> pos(C, 0), less(C);
  std::vector<K> found(C);
  const bool topk = P.combine == KtirTilePlan::kTopk;
  const int64_t k = topk ? std::min(rp.k, N) : rp.k;
  if (P.combine == KtirTilePlan::kKthvalue) {
    TORCH_CHECK_INDEX(rp.k >= 1 && rp.k <= N, "kthvalue(): selected number k out of range for dimension 0");
    std::fill(pos.begin(), pos.end(), rp.k - 1);
  } else if (topk) {
    std::fill(pos.begin(), pos.end(), std::max<int64_t>(k - 1, 0));
  } else {  // median, nanmedian: NaN keys are all ones (ascending), after every number
    std::vector<int64_t> nan(C, 0);
    if (key.floating)
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < C; ++j) nan[j] += keys[r * C + j] == static_cast<K>(~K(0));
    for (int64_t j = 0; j < C; ++j) {
      const int64_t m = N - nan[j];
      pos[j] = P.combine == KtirTilePlan::kMedian ? (nan[j] > 0 ? m : (N - 1) / 2) : (m > 0 ? (m - 1) / 2 : 0);
    }
  }
  const auto opt = at::TensorOptions().dtype(at::kLong);
  if (topk && k == 0) return {at::empty({C, 0}, x.options()).t(), at::empty({C, 0}, opt).t()};
  radix_select<K>(keys.data(), N, C, pos.data(), found.data(), less.data());
  if (!topk) {
    at::Tensor vals = at::empty({C}, x.options()), idx = at::empty({C}, opt);
    T* ov = vals.mutable_data_ptr<T>();
    int64_t* oi = idx.mutable_data_ptr<int64_t>();
    std::vector<int64_t> seen(C, 0);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < C; ++j)
        if (keys[r * C + j] == found[j] && seen[j]++ == pos[j] - less[j]) ov[j] = v[r * C + j], oi[j] = r;
    return {vals, idx};
  }
  // topk: the k first of the stable order per column, then sorted by (key, row).
  std::vector<std::pair<K, int64_t>> pick(static_cast<size_t>(C * k));
  std::vector<int64_t> n(C, 0), seen(C, 0);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < C; ++j) {
      const K q = keys[r * C + j];
      if (q < found[j] || (q == found[j] && seen[j]++ <= pos[j] - less[j])) pick[j * k + n[j]++] = {q, r};
    }
  at::Tensor vals = at::empty({C, k}, x.options()), idx = at::empty({C, k}, opt);
  T* ov = vals.mutable_data_ptr<T>();
  int64_t* oi = idx.mutable_data_ptr<int64_t>();
  for (int64_t j = 0; j < C; ++j) {
    auto* b = pick.data() + j * k;
    std::sort(b, b + k);  // (key, row): the stable order
    for (int64_t i = 0; i < k; ++i) ov[j * k + i] = v[b[i].second * C + j], oi[j * k + i] = b[i].second;
  }
  return {vals.t(), idx.t()};
}

// order_select_typed for x's dtype; results shaped as `outs`.
std::vector<at::Tensor> order_select(const KtirTilePlan& P, const RingParams& rp, const at::Tensor& x,
                                     const std::vector<at::Tensor>& outs) {
  std::vector<at::Tensor> r;
  switch (x.scalar_type()) {
#define TTE_ORDER_SELECT(ctype, ktype, name)        \
  case c10::ScalarType::name:                       \
    r = order_select_typed<ctype, ktype>(P, rp, x); \
    break;
    TTE_ORDER_SELECT(c10::Half, uint16_t, Half)
    TTE_ORDER_SELECT(c10::BFloat16, uint16_t, BFloat16)
    TTE_ORDER_SELECT(float, uint32_t, Float)
    TTE_ORDER_SELECT(double, uint64_t, Double)
    TTE_ORDER_SELECT(int64_t, uint64_t, Long)
    TTE_ORDER_SELECT(int32_t, uint32_t, Int)
    TTE_ORDER_SELECT(int16_t, uint16_t, Short)
    TTE_ORDER_SELECT(int8_t, uint8_t, Char)
    TTE_ORDER_SELECT(uint8_t, uint8_t, Byte)
    TTE_ORDER_SELECT(bool, uint8_t, Bool)
#undef TTE_ORDER_SELECT
    default:
      TORCH_CHECK(false, "ktir_execute: an order statistic of ", x.scalar_type());
  }
  for (size_t j = 0; j < r.size() && j < outs.size(); ++j) r[j] = r[j].reshape(outs[j].sizes());
  r.resize(std::min(r.size(), outs.size()));
  return r;
}

// CPU's nll_loss check, with its exception type (IndexError) and message:
// every target not ignored is a class index in [0, classes).
void check_nll_targets(const at::Tensor& t, const at::Tensor& keep, int64_t classes) {
  const at::Tensor bad = keep.logical_and(t.lt(0).logical_or(t.ge(classes)));
  if (!bad.any().item<bool>()) return;
  const int64_t first = t.masked_select(bad)[0].item<int64_t>();
  TORCH_CHECK_INDEX(false, "Target ", first, " is out of bounds.");
}

// The cores of a tile step batched together: from core c (empty cores
// skipped), the run [begin, end) of cores with c's row count for which
// joins(c, e) holds (the batch's other conditions, e.g. equal carry state);
// begin == cores.size() when none is left.
template <class Joins>
std::pair<size_t, size_t> core_run(const std::vector<std::pair<int64_t, int64_t>>& cores, size_t c, Joins&& joins) {
  while (c < cores.size() && cores[c].second == cores[c].first) ++c;
  if (c == cores.size()) return {c, c};
  const int64_t rows = cores[c].second - cores[c].first;
  size_t e = c + 1;
  while (e < cores.size() && cores[e].second - cores[e].first == rows && joins(c, e)) ++e;
  return {c, e};
}

// The results of a reducing ring op from the ring's total (before rounding).
std::vector<at::Tensor> ring_finish(const KtirTilePlan& P, const RingParams& rp, const RingPart& total) {
  switch (P.combine) {
    case KtirTilePlan::kMean:
      return {total.t[0].div(static_cast<double>(P.ring_count))};
    case KtirTilePlan::kVar: {
      at::Tensor v = total.t[1].div(std::max(0.0, total.n - rp.correction));
      if (rp.std) v = v.sqrt();
      return {v, total.t[0]};  // var_mean/std_mean: (var or std, mean)
    }
    case KtirTilePlan::kArgMax:
    case KtirTilePlan::kArgMin:
      if (P.ring_values) return {total.t[0], total.t[1]};  // max.dim/min.dim: (values, indices)
      return {total.t[1]};
    case KtirTilePlan::kLogSumExp:  // log(sum) + finite(max), as CPU's
      return {total.t[1].log().add(finite_or_zero(total.t[0]))};
    case KtirTilePlan::kNllLoss:  // (loss, total_weight); reduction 1 = mean, 2 = sum
      return {rp.reduction == 1 ? total.t[0].div(total.t[1]) : total.t[0], total.t[1]};
    case KtirTilePlan::kMinMax:
      return {total.t[0], total.t[1]};
    case KtirTilePlan::kNorm:  // the ord-th root of the summed powers, once
    case KtirTilePlan::kRenorm:
      if (std::isinf(rp.ord) || rp.ord == 0 || rp.ord == 1) return {total.t[0]};
      if (rp.ord == 2) return {total.t[0].sqrt()};
      return {total.t[0].pow(1.0 / rp.ord)};
    default:
      return {total.t[0]};
  }
}

// x[i] = d * d with d = x[i] - y[i] (two roundings, as CPU's mse kernel).
// Distinct arrays (restrict) and fixed trip counts: GCC's -O2 vectorizes it.
void square_difference_into(float* __restrict x, const float* __restrict y, int64_t n) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    for (int64_t k = j; k < j + 64; ++k) {
      const float d = x[k] - y[k];
      x[k] = d * d;
    }
  }
  for (; j < n; ++j) {
    const float d = x[j] - y[j];
    x[j] = d * d;
  }
}

// mse_loss's elementwise values (reduction 'none') of two contiguous 16-bit
// tiles of one dtype and size, in f32: d = x - y, then d * d, per element of
// their exact f32 values (widen16): CPU's mse kernel's two roundings, the
// bits at::mse_loss gives on the widened tiles, without their f32 copies.
at::Tensor squared_error16(const at::Tensor& x, const at::Tensor& y) {
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  const auto* xb = static_cast<const uint16_t*>(x.const_data_ptr());
  const auto* yb = static_cast<const uint16_t*>(y.const_data_ptr());
  float* o = out.mutable_data_ptr<float>();
  const c10::ScalarType t = x.scalar_type();
  at::parallel_for(0, x.numel(), kAtenGrainSize, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 512;  // y's f32 values per pass (L1)
    float w[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t m = std::min(kBlock, e - i);
      widen16(t, xb + i, o + i, m);
      widen16(t, yb + i, w, m);
      square_difference_into(o + i, w, m);
    }
  });
  return out;
}

// Whether mse_loss's values of tiles x and y can be squared_error16's: one
// 16-bit dtype, the same sizes (no broadcast), contiguous CPU tiles, summed in f32.
bool squared_error16_fits(const at::Tensor& x, const at::Tensor& y, c10::ScalarType acc) {
  return acc == at::kFloat && is_dtype16(x.scalar_type()) && y.scalar_type() == x.scalar_type() &&
         x.sizes().equals(y.sizes()) && x.is_contiguous() && y.is_contiguous() && x.device().is_cpu() &&
         y.device().is_cpu();
}

// The values a loss's or trace's ring partials sum, for the step's rows
// (RingPre): the elementwise loss of the rows of self and target, by CPU's
// kernel with reduction 'none' on their f32 (df16) values (its errors, e.g.
// binary_cross_entropy's input outside [0, 1], are CPU's), or the diagonal
// element of each row ([rows, 1]: x[i, i] of the step's row i, 0 past the
// last column), or multilabel_margin_loss's loss of each row ([rows, 1],
// CPU's kernel with reduction 'none'; its is_target rows are written to their
// tile). `idx` (or [lo, lo + n)) are the step's rows.
at::Tensor ring_pre_values(const KtirTilePlan& P, const KtirOp& o, std::vector<at::Tensor>& vt, int in,
                           c10::ScalarType acc, const at::Tensor& idx, int64_t lo, int64_t n) {
  if (P.ring_pre == KtirTilePlan::kPreMse && squared_error16_fits(vt[in], vt[P.ring_target], acc))
    return squared_error16(vt[in], vt[P.ring_target]);
  const at::Tensor x = vt[in].to(acc);
  if (P.ring_pre == KtirTilePlan::kPreMultilabelMargin) {
    // The loss of each row ([rows, 1]) by CPU's kernel with reduction
    // 'none'; its is_target rows go to their tile.
    auto [loss, is_target] = at::multilabel_margin_loss_forward(x, vt[P.ring_target], 0);
    if (P.ring_is_target >= 0) vt[P.ring_is_target].copy_(is_target);
    return loss.unsqueeze(1);
  }
  if (P.ring_pre == KtirTilePlan::kPreDiag) {
    const int64_t cols = x.size(1);
    const at::Tensor rows = idx.defined() ? idx : at::arange(lo, lo + n, at::TensorOptions().dtype(at::kLong));
    const at::Tensor on = rows.lt(cols).unsqueeze(1);
    const at::Tensor d = x.gather(1, rows.clamp_max(std::max<int64_t>(cols - 1, 0)).unsqueeze(1));
    return at::where(on, d, at::zeros({}, d.options()));
  }
  const at::Tensor y = vt[P.ring_target].to(acc);
  const c10::FunctionSchema& schema = o.handle->schema();
  auto param = [&](const char* name, double dflt) {
    const KtirValue* v = arg_named(o, schema, name);
    return v && v->kind == KtirValue::kFloat ? v->f
           : v && v->kind == KtirValue::kInt ? static_cast<double>(v->i)
                                             : dflt;
  };
  switch (P.ring_pre) {
    case KtirTilePlan::kPreMse:
      return at::mse_loss(x, y, 0);
    case KtirTilePlan::kPreHuber:
      return at::huber_loss(x, y, 0, param("delta", 1.0));
    case KtirTilePlan::kPreSmoothL1:
      return at::smooth_l1_loss(x, y, 0, param("beta", 1.0));
    default:  // kPreBce
      return at::binary_cross_entropy(x, y, P.ring_weight >= 0 ? vt[P.ring_weight].to(acc) : at::Tensor(), 0);
  }
}

// A loss gradient with reduction 'mean' on a tile (KtirTilePlan::mean_grad):
// CPU's elementwise formula with the whole input's element count `n` in
// place of the tile's, the same f32 operations in the same order as CPU's
// kernels (bit-equal to them on the whole tensor): mse (2/n * (self -
// target)) * g; binary_cross_entropy (g * (self - target) / max((1 - self) *
// self, 1e-12)) * weight / n. `s` is the op's boxed stack (its tensors
// already widened), replaced by the result; `out`: the op's out= form, whose
// last argument receives it.
void mean_loss_grad(KtirTilePlan::RingPre loss, int64_t n, bool out, torch::jit::Stack& s) {
  const size_t base = s.size() - (loss == KtirTilePlan::kPreMse ? 4 : 5) - (out ? 1 : 0);
  const at::Tensor g = s[base].toTensor(), x = s[base + 1].toTensor(), y = s[base + 2].toTensor();
  at::Tensor r;
  if (loss == KtirTilePlan::kPreBce) {
    const c10::IValue& w = s[base + 3];
    r = g.mul(x.sub(y)).div(at::scalar_tensor(1.0, x.options()).sub(x).mul(x).clamp_min(1e-12));
    if (w.isTensor() && w.toTensor().defined()) r = r.mul(w.toTensor());
    r = r.div(n);
  } else {  // mse
    r = at::scalar_tensor(2.0 / static_cast<double>(n), x.options()).mul(x.sub(y)).mul(g);
  }
  at::Tensor result = r.expand(x.sizes()).contiguous();
  if (out) result = s.back().toTensor().copy_(result);
  torch::jit::drop(s, s.size() - base);
  s.emplace_back(std::move(result));
}

// renorm's scale factor of each slice's norm, as CPU's kernel computes it
// in the norm's dtype: maxnorm / (norm + 1e-7) where norm > maxnorm, else 1
// (a NaN norm: 1).
at::Tensor renorm_factor(const at::Tensor& norm, double maxnorm) {
  const at::Tensor scaled = at::scalar_tensor(maxnorm, norm.options()).div(norm.add(1e-7));
  return at::where(norm.gt(maxnorm), scaled, at::ones({}, norm.options()));
}

// A normalizing ring op's statistics: softmax (max, sum), layer_norm (mean,
// rstd), renorm (the scale factor).
struct RingStats {
  at::Tensor a, b;
};

RingStats ring_stats(const KtirTilePlan& P, const RingParams& rp, const RingPart& total) {
  if (P.combine == KtirTilePlan::kRenorm) return {renorm_factor(ring_finish(P, rp, total)[0], rp.maxnorm), {}};
  if (P.combine != KtirTilePlan::kLayerNorm) return {total.t[0], total.t[1]};
  const at::Tensor var = total.t[1].div(total.n);  // biased, as layer_norm's
  return {total.t[0], var.add(rp.eps).rsqrt()};
}

// Whether softmax's normalizing pass over `x` (all rows) into `out` can run
// as df16_softmax_bf16_into: contiguous float32 or bfloat16 rows, statistics of one row
// each, a contiguous bfloat16 out of x's size, and CPU's exp available.
bool softmax_bf16_fits(const at::Tensor& out, const at::Tensor& x, const RingStats& st) {
  auto one_row = [&](const at::Tensor& t) {
    return t.scalar_type() == c10::kFloat && t.is_contiguous() && t.dim() == x.dim() && t.size(0) == 1 &&
           t.sizes().slice(1).equals(x.sizes().slice(1));
  };
  return out.scalar_type() == c10::kBFloat16 && out.is_contiguous() && x.is_contiguous() &&
         (x.scalar_type() == c10::kFloat || x.scalar_type() == c10::kBFloat16) && x.dim() > 0 &&
         out.numel() == x.numel() && one_row(st.a) && one_row(st.b) && df16_softmax_bf16_available();
}

// The normalized rows `x` (f32) with the combined statistics.
// `own`: x is a temporary the pass may overwrite (a widened copy).
at::Tensor ring_normalize(const KtirTilePlan& P, const RingStats& st, const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& b, bool own = false) {
  if (own && P.combine == KtirTilePlan::kSoftmax) return x.sub_(st.a).exp_().div_(st.b);
  switch (P.combine) {
    // The first op makes a fresh tensor of x's shape; the rest update it in
    // place (the same kernels and values, without a buffer per op).
    case KtirTilePlan::kSoftmax:
      return x.sub(st.a).exp_().div_(st.b);
    case KtirTilePlan::kLogSoftmax:
      return x.sub(st.a).sub_(st.b.log());
    case KtirTilePlan::kRenorm:
      return own ? x.mul_(st.a) : x.mul(st.a);
    default: {  // kLayerNorm
      at::Tensor y = x.sub(st.a).mul_(st.b);
      if (w.defined()) y = y.mul_(w);
      if (b.defined()) y = y.add_(b);
      return y;
    }
  }
}

// dst[idx[i]] = src[i] along dim 0 (index_copy_'s values): a step's rows in
// core order are a few runs of consecutive rows, copied run by run when both
// tensors are dense rows of one dtype; index_copy_ otherwise. ATen's
// index_copy_ copies element by element (most of an elementwise region's
// time before).
void copy_rows_into(const at::Tensor& dst, const at::Tensor& idx, const at::Tensor& src) {
  const int64_t n = idx.numel();
  if (dst.scalar_type() != src.scalar_type() || dst.dim() == 0 || src.dim() != dst.dim() || src.size(0) != n ||
      !dst.is_contiguous() || !src.is_contiguous() || idx.scalar_type() != at::kLong || !idx.is_contiguous() ||
      !dst.sizes().slice(1).equals(src.sizes().slice(1)) || dst.storage().is_alias_of(src.storage())) {
    dst.index_copy_(0, idx, src);
    return;
  }
  const int64_t* ix = idx.const_data_ptr<int64_t>();
  const int64_t rows = dst.size(0);
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK_INDEX(ix[i] >= 0 && ix[i] < rows, "index_copy_(): index ", ix[i], " is out of bounds for size ", rows);
  const size_t row_bytes = static_cast<size_t>(dst.numel() / std::max<int64_t>(rows, 1)) * dst.element_size();
  auto* d = static_cast<char*>(dst.data_ptr());
  const auto* sp = static_cast<const char*>(src.const_data_ptr());
  for (int64_t i = 0; i < n;) {
    int64_t e = i + 1;
    while (e < n && ix[e] == ix[e - 1] + 1) ++e;
    std::memcpy(d + ix[i] * row_bytes, sp + i * row_bytes, (e - i) * row_bytes);
    i = e;
  }
}

// The row width when `p` is one tile op that sum_rows_width serves (a 16-bit
// or float32 sum over the last dim) from a split, loaded, contiguous HBM view
// into a split, stored, contiguous HBM view of another argument; 0 otherwise.
int64_t row_sums_in_place(const KtirProgram& p, const KtirTilePlan& P, const std::vector<at::Tensor>& views) {
  if (p.ops.size() != 1 || P.phase[0] != KtirTilePlan::kTile || P.ring_op >= 0) return 0;
  const KtirOp& o = p.ops[0];
  if (o.results.size() != 1 || o.results[0] < 0 || o.args.empty() || o.args[0].kind != KtirValue::kView) return 0;
  const int in = static_cast<int>(o.args[0].i), out = o.results[0];
  const KtirView &wi = p.views[in], &wo = p.views[out];
  if (wi.lx || wo.lx || wi.arg == wo.arg || !P.split[in] || !P.load[in] || !P.split[out] || !P.store[out] ||
      !views[in].is_contiguous() || !views[out].is_contiguous() || views[in].size(0) != views[out].size(0))
    return 0;
  const c10::OperatorHandle* handle = ktir_op_handle(o);
  if (!handle) return 0;
  const torch::jit::Stack stack = op_stack(o, handle->schema(), views);
  return sum_rows_width(*handle, stack, {wo.dtype});
}

// One step of row_sums_in_place's program: the sums of each core's rows of
// the step (`cores`, in rows of dim 0) from the input view into `f` (f32,
// one value per summed row of the whole input; on first use allocated for a
// 16-bit input, the output view itself for a float32 one: its values are final).
at::Tensor row_sums_step(const KtirProgram& p, const std::vector<at::Tensor>& views,
                         const std::vector<std::pair<int64_t, int64_t>>& cores, int64_t n, at::Tensor f) {
  const at::Tensor& x = views[p.ops[0].args[0].i];
  const int64_t per_row = x.size(0) > 0 ? x.numel() / x.size(0) / n : 0;  // summed rows per row of dim 0
  const bool f32 = x.scalar_type() == at::kFloat;
  if (!f.defined()) f = f32 ? views[p.ops[0].results[0]] : at::empty({x.numel() / n}, x.options().dtype(at::kFloat));
  float* out = f.mutable_data_ptr<float>();
  for (const auto& [b, e] : cores) {
    if (e <= b) continue;
    const int64_t at = b * per_row * n, rows = (e - b) * per_row;
    if (f32) {
      TORCH_CHECK(row_sums_f32(x.const_data_ptr<float>() + at, rows, n, n, out + b * per_row),
                  "row_sums_step: no CPU-order float32 row sum");  // sum_rows_width checked it
    } else {
      row_sums16(static_cast<const uint16_t*>(x.const_data_ptr()) + at, x.scalar_type() == c10::kBFloat16, rows, n, n,
                 out + b * per_row);
    }
  }
  return f;
}

}  // namespace

void ktir_execute(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks, int* failed_at,
                  const KtirTilePlan* plan, KtirWalk* walk) {
  TORCH_CHECK(arg_bytes.size() == p.args.size(), "ktir_execute: ", p.args.size(), " arguments, got ", arg_bytes.size());
  if (failed_at) *failed_at = -1;
  if (walk) *walk = KtirWalk();
  if (ktir_chain_pass(p, arg_bytes, hooks, plan, walk)) return;  // an elementwise chain in one pass (chain_pass.h)
  if (ktir_row_pass(p, arg_bytes, hooks, plan, walk)) return;    // a float32 row op in place (row_pass.h)
  std::map<int, int64_t> lx_bytes;
  for (const auto& w : p.views)
    if (w.lx)
      lx_bytes[w.buf] = std::max(lx_bytes[w.buf], (last_elem(w) + 1) * static_cast<int64_t>(c10::elementSize(w.dtype)));
  std::map<int, at::Tensor> lx;
  for (const auto& [b, n] : lx_bytes)
    lx[b] = at::zeros({std::max<int64_t>(n, 1)}, at::TensorOptions().dtype(at::kByte));
  auto over = [](const at::Tensor& bytes, const KtirView& w) {
    const int64_t es = c10::elementSize(w.dtype);
    return bytes.narrow(0, 0, bytes.numel() / es * es).view(w.dtype).as_strided(w.sizes, w.strides, w.offset);
  };
  std::vector<at::Tensor> views(p.views.size());
  for (size_t v = 0; v < p.views.size(); ++v)
    views[v] = over(p.views[v].lx ? lx.at(p.views[v].buf) : arg_bytes.at(p.views[v].arg), p.views[v]);
  std::map<int, std::exception_ptr> poisoned;  // storage key -> the error of the op that should have written it
  std::exception_ptr first_error;
  std::vector<char> failed(p.ops.size(), 0);

  // Runs op k on the view tensors `vt` (whole views, or a step's tiles);
  // `body` (when given) replaces the call: the ring op's partials.
  auto run_op = [&](size_t k, std::vector<at::Tensor>& vt, const std::function<void()>& body) {
    if (failed[k]) return;
    const KtirOp& o = p.ops[k];
    TORCH_CHECK_VALUE(ktir_op_handle(o), "KTIR line ", o.line, ": rule 'op': unknown op '", o.op, "'");
    const c10::OperatorHandle& op = *o.handle;
    const auto& schema = op.schema();
    const auto& sargs = schema.arguments();
    std::vector<int> written;
    std::exception_ptr err;
    for (size_t a = 0; a < o.args.size() && a < sargs.size(); ++a) {
      const bool w = sargs[a].alias_info() && sargs[a].alias_info()->isWrite();
      const bool reads = !w || !write_only(o.op, schema, a);
      for_each_view_operand(o.args[a], [&](int v) {
        if (w) written.push_back(v);
        if (reads && !err) {
          auto it = poisoned.find(storage_key(p.views.at(v)));
          if (it != poisoned.end()) err = it->second;
        }
      });
    }
    try {
      if (err) std::rethrow_exception(err);
      hooks.before_op(k);
      try {
        if (body) {
          body();
          return;
        }
        torch::jit::Stack stack = op_stack(o, schema, vt);
        std::vector<c10::ScalarType> dtypes;
        for (int r : o.results) dtypes.push_back(r < 0 ? c10::kFloat : p.views[r].dtype);
        if (plan && k < plan->mean_grad.size() && plan->mean_grad[k].second > 0) {
          // A lowered op (no library call for the hooks to count): the whole count, not the tile's.
          const auto [loss, n] = plan->mean_grad[k];
          call_op_in_f32(op, stack, dtypes,
                         [&](torch::jit::Stack& st) { mean_loss_grad(loss, n, schema.is_mutable(), st); });
        } else {
          hooks.call(k, op, stack, dtypes);
        }
        const std::vector<at::Tensor> got = fresh(schema, stack);
        std::vector<at::Tensor> results, writes;
        for (size_t j = 0; j < o.results.size() && j < got.size(); ++j) {
          if (o.results[j] < 0) continue;
          at::Tensor& view = vt[o.results[j]];
          if (!got[j].is_same(view)) view.copy_(got[j]);  // stored through the view into its storage
          results.push_back(view);
        }
        for (int v : written) writes.push_back(vt[v]);
        hooks.after_op(k, results, writes);
      } catch (c10::Error& e) {
        e.add_context("while running " + hooks.where(p, k));
        throw;
      } catch (const std::runtime_error& e) {
        // Plain runtime_errors (c10::checked_convert's overflow) get the location
        // too; subclasses keep their type (Python maps them differently).
        if (typeid(e) != typeid(std::runtime_error)) throw;
        throw std::runtime_error(std::string(e.what()) + " (while running " + hooks.where(p, k) + ")");
      }
    } catch (...) {
      const std::exception_ptr e = std::current_exception();
      failed[k] = 1;
      for (int r : o.results)
        if (r >= 0) poisoned[storage_key(p.views.at(r))] = e;
      for (int v : written) poisoned[storage_key(p.views.at(v))] = e;
      hooks.failed(k, e);
      if (!first_error) {
        first_error = e;
        if (failed_at) *failed_at = static_cast<int>(k);
      }
    }
  };

  if (!plan || !plan->tiled) {
    for (size_t k = 0; k < p.ops.size(); ++k) run_op(k, views, nullptr);
    if (first_error) std::rethrow_exception(first_error);
    return;
  }
  const KtirTilePlan& P = *plan;
  if (walk) walk->tiled = true;
  for (size_t k = 0; k < p.ops.size(); ++k)
    if (P.phase[k] == KtirTilePlan::kPre) run_op(k, views, nullptr);
  // The ring op's partials: per core, its f32 (f64 for float64, int64 for an
  // integer sum or product) statistics (docs/ktir.md, "Ring reductions").
  const KtirOp* ring = P.ring_op >= 0 ? &p.ops[P.ring_op] : nullptr;
  int ring_in = -1;
  c10::ScalarType acc_dtype = c10::kFloat;
  RingParams rp;
  if (ring) {
    for_each_view_operand(ring->args[0], [&](int v) {
      if (ring_in < 0) ring_in = v;
    });
    const c10::ScalarType in_t = p.views[ring_in].dtype, out_t = p.views[P.ring_outs.at(0)].dtype;
    if (c10::isFloatingType(in_t))
      acc_dtype = in_t == c10::kDouble || out_t == c10::kDouble ? c10::kDouble : c10::kFloat;
    else
      acc_dtype = P.combine == KtirTilePlan::kSum || P.combine == KtirTilePlan::kProd ||
                          P.combine == KtirTilePlan::kNanSum || (is_scan(P.combine) && !is_extremum_scan(P.combine))
                      ? c10::kLong
                      : in_t;
    rp = ring_params(*ring, p.views[ring_in].sizes);
  }
  std::vector<RingPart> acc(P.tiling.cores_used);
  // An order statistic: each core's sorted run of its rows so far.
  std::vector<OrderRun> runs(P.tiling.cores_used);
  const bool order = ring && ktir_is_order(P.combine);
  // topk, kthvalue, median, nanmedian: each step's rows of the input are
  // kept (in its dtype) for the selection after the steps (order_select).
  const bool select = order && order_by_selection(P.combine);
  at::Tensor sel;
  if (select && P.steps.size() != 1) sel = at::empty(p.views[ring_in].sizes, views[ring_in].options());
  // The batched accumulators (all ring ops but nll_loss and the scans): per
  // statistic one [cores_used, ...] tensor, per core whether it has rows yet
  // and its element count.
  std::vector<at::Tensor> acc_b;
  std::vector<char> acc_has(P.tiling.cores_used, 0);
  std::vector<double> acc_n(P.tiling.cores_used, 0);
  // A scan (cumsum): each core's running total after its last rows, and the
  // partial sums of every row (f32, rounded only after the core's prefix is added).
  // cummax/cummin carry (value, index) pairs: the indices in `carry_idx` and `scan_idx`.
  std::vector<at::Tensor> carry(P.tiling.cores_used), carry_idx(P.tiling.cores_used);
  at::Tensor scan, scan_idx;
  // cummax/cummin: each core's last (value, index) pair so far, [cores_used, 1, ...], and whether it has one.
  at::Tensor ext_v, ext_i;
  std::vector<char> ext_has(P.tiling.cores_used, 0);
  std::optional<Scratch> scan_lease, scan_idx_lease;
  if (ring && is_extremum_scan(P.combine)) {  // kept across launches (Scratch)
    scan = scan_lease.emplace(Scratch::kScanValues, p.views[ring_in].sizes, acc_dtype).tensor();
    scan_idx = scan_idx_lease.emplace(Scratch::kScanIndices, p.views[ring_in].sizes, at::kLong).tensor();
  } else if (ring && is_scan(P.combine)) {
    scan = at::empty(p.views[ring_in].sizes, at::TensorOptions().dtype(acc_dtype));
  }
  // The rows of step i of a whole view (the load of a tile), and their store.
  auto step_rows = [&](size_t i, int64_t* lo, int64_t* n) {
    *lo = -1, *n = 0;
    for (const auto& [b, e] : P.steps[i]) {
      if (e > b && *lo < 0) *lo = b;
      *n += e - b;
    }
  };
  // A normalizing ring op (softmax, log_softmax, layer_norm over the split
  // rows) that is the steps' only op and reads an input argument of 16-bit
  // (or any narrower-than-f32) values: its input is widened to f32 once
  // (exact), each step loads its rows of the widened copy, and the second
  // pass normalizes that copy in place. The values are the ones a per-step
  // widening and a re-read give; the copies and conversions are fewer.
  at::Tensor wide_in;
  std::optional<Scratch> wide_lease;
  if (ring && P.normalize && !is_scan(P.combine) && P.combine != KtirTilePlan::kNllLoss && P.split[ring_in] &&
      P.load[ring_in] && !p.views[ring_in].lx && p.args[p.views[ring_in].arg].kind == KtirArg::kIn &&
      p.views[ring_in].dtype != acc_dtype) {
    bool only = true;
    for (size_t k = 0; k < p.ops.size(); ++k)
      if (P.phase[k] == KtirTilePlan::kTile) only = false;
    if (only && acc_dtype == at::kFloat && softmax_reads_in_place(P, views[ring_in])) {
      // Read in place by the partials (softmax_partials) and by softmax's
      // normalizing pass: no f32 copy of the input.
      wide_in = views[ring_in];
    } else if (only && acc_dtype == at::kFloat) {
      wide_lease.emplace(Scratch::kWideIn, views[ring_in].sizes());
      wide_in = wide_lease->tensor().copy_(views[ring_in]);
    } else if (only) {
      wide_in = views[ring_in].to(acc_dtype).contiguous();
    }
  }
  // A sum or mean of 16-bit or float32 values over dim 0 only: its partials read the rows in place
  // (sum_partials; float32 in CPU's order when sum_partials_fit says it is reproduced).
  const bool sums16 = ring && !wide_in.defined() && acc_dtype == at::kFloat &&
                      (P.combine == KtirTilePlan::kSum || P.combine == KtirTilePlan::kMean) &&
                      P.ring_dims == std::vector<int64_t>{0} && P.ring_pre == KtirTilePlan::kPreNone &&
                      (p.views[ring_in].dtype == at::kHalf || p.views[ring_in].dtype == at::kBFloat16 ||
                       p.views[ring_in].dtype == at::kFloat);
  // ... and when the ring op is the steps' only op, over a contiguous HBM view: the partials read each
  // step's rows where they are (no tile copy) and add into the cores' accumulators.
  bool sums_in_place =
      sums16 && P.split[ring_in] && P.load[ring_in] && !p.views[ring_in].lx && views[ring_in].is_contiguous();
  for (size_t k = 0; k < p.ops.size() && sums_in_place; ++k)
    if (P.phase[k] == KtirTilePlan::kTile) sums_in_place = false;
  // A 16-bit or float32 sum over the last dim as the steps' only op: each step sums its cores' rows where
  // they are (no tile copy) into one f32 buffer (float32: the output), rounded and stored after the last
  // step (each row's sum is its own: the values are the tiles').
  const int64_t rows16_n = P.steps.size() > 1 ? row_sums_in_place(p, P, views) : 0;
  at::Tensor rows16_f;
  std::vector<at::Tensor> vt(views.size());
  for (size_t i = 0; i < P.steps.size(); ++i) {
    const auto& cores = P.steps[i];
    int64_t lo = -1, n = 0;
    step_rows(i, &lo, &n);
    if (n == 0) continue;
    const at::Tensor& idx = P.step_index[i];
    const bool whole_rows = P.steps.size() == 1;  // one step holds every row: the views themselves
    if (rows16_n > 0) {
      run_op(0, vt, [&] { rows16_f = row_sums_step(p, views, cores, rows16_n, std::move(rows16_f)); });
      if (walk) walk->tile_steps++;
      continue;
    }
    // Load: each split view's rows of this step into an LX tile.
    for (size_t v = 0; v < views.size(); ++v) {
      if (!P.split[v] || whole_rows) {
        vt[v] = views[v];
        continue;
      }
      if ((wide_in.defined() || sums_in_place) && static_cast<int>(v) == ring_in) {
        // The ring op reads each core's rows of the widened copy in place
        // (below); the tile is that copy's rows, not a gathered one.
        vt[v] = wide_in.defined() ? wide_in : views[v];
      } else if (P.load[v]) {
        vt[v] = idx.defined() ? views[v].index_select(0, idx) : views[v].narrow(0, lo, n).clone();
      } else {
        std::vector<int64_t> sizes = p.views[v].sizes;
        sizes[0] = n;
        vt[v] = at::empty(sizes, views[v].options());
      }
    }
    for (size_t k = 0; k < p.ops.size(); ++k) {
      if (P.phase[k] == KtirTilePlan::kTile) {
        run_op(k, vt, nullptr);
      } else if (P.phase[k] == KtirTilePlan::kRing) {
        run_op(k, vt, [&] {
          // Each core's corelets reduce their share of the core's rows of
          // the step (corelet_shares), the core merges the corelet partials
          // in order, and its accumulator merges the step partials in tile
          // order.
          if (select) {
            // The cores' rows of the step, at their rows of the input.
            if (whole_rows)
              sel = vt[ring_in];
            else if (idx.defined())
              copy_rows_into(sel, idx, vt[ring_in]);
            else
              sel.narrow(0, lo, n).copy_(vt[ring_in]);
            return;
          }
          // One widening per step; with a widened input, its rows are read where they are.
          // A loss or trace: the values its partials sum (ring_pre_values).
          // A 16-bit or f32 sum or mean over dim 0 keeps its rows as they are (sum_partials reads them).
          const at::Tensor x = wide_in.defined() ? wide_in
                               : P.ring_pre != KtirTilePlan::kPreNone
                                   ? ring_pre_values(P, *ring, vt, ring_in, acc_dtype, idx, lo, n)
                               : sums16 ? vt[ring_in].contiguous()
                                        : vt[ring_in].to(acc_dtype).contiguous();
          // partial(offset in x, rows, first row of the whole tensor) -> one corelet's RingPart.
          auto per_corelet = [&](auto&& partial) {
            int64_t off = 0;
            for (size_t c = 0; c < cores.size(); ++c) {
              const int64_t rows = cores[c].second - cores[c].first;
              if (rows == 0) continue;
              const int64_t corelets = rows >= P.tiling.corelets ? P.tiling.corelets : 1;
              RingPart part;
              int64_t first = cores[c].first;
              for (const int64_t m : corelet_shares(rows, corelets)) {
                part = ring_merge(P, rp, std::move(part), partial(off, m, first));
                off += m;
                first += m;
              }
              acc[c] = ring_merge(P, rp, std::move(acc[c]), part);
            }
          };
          if (order) {
            // Each core sorts its rows of the step per column (stable; its
            // two corelets' sorted halves merged give the same run, the merge
            // being a selection) and merges the run into the one of its
            // earlier tiles; topk keeps the first k (a partial sort). Without
            // a dim (median()), the flattened elements form one column.
            const int64_t n_rows = x.size(0);
            const int64_t scale = P.ring_flat ? (n_rows > 0 ? x.numel() / n_rows : 1) : 1;
            const at::Tensor cols =
                (P.ring_flat ? x.reshape({1, -1}) : x.reshape({n_rows, -1}).t()).contiguous();  // [inner, elems]
            const int64_t inner = cols.size(0);
            const int64_t limit = P.combine == KtirTilePlan::kTopk ? std::max<int64_t>(rp.k, 0) : -1;
            int64_t off = 0;
            auto any = [](size_t, size_t) { return true; };
            for (auto run = core_run(cores, 0, any); run.first < cores.size(); run = core_run(cores, run.second, any)) {
              const size_t c = run.first, e = run.second;
              const int64_t rows = cores[c].second - cores[c].first;
              const int64_t G = static_cast<int64_t>(e - c), len = rows * scale;
              std::vector<int64_t> firsts(G);
              for (int64_t g = 0; g < G; ++g) firsts[g] = cores[c + g].first * scale;
              const int64_t keep = limit >= 0 ? std::min(limit, len) : len;
              at::Tensor sv = at::empty({G, inner, keep}, cols.options());
              at::Tensor si = at::empty({G, inner, keep}, cols.options().dtype(at::kLong));
              AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, cols.scalar_type(), "order_runs", [&] {
                order_runs_loop<scalar_t>(cols.const_data_ptr<scalar_t>(), inner, cols.size(1), off, G, len,
                                          firsts.data(), rp.descending, keep, sv.mutable_data_ptr<scalar_t>(),
                                          si.mutable_data_ptr<int64_t>());
              });
              for (int64_t g = 0; g < G; ++g)
                runs[c + g] = order_merge(runs[c + g], OrderRun{sv[g], si[g]}, rp.descending, limit);
              off += G * len;
            }
            return;
          }
          if (P.combine == KtirTilePlan::kNllLoss) {
            // Per corelet: (sum of -w[t] x[i, t], sum of w[t]) over its rows,
            // w[t] = 0 where t is ignore_index.
            const at::Tensor tgt = vt[rp.target];
            per_corelet([&](int64_t off, int64_t m, int64_t) {
              const at::Tensor t = tgt.narrow(0, off, m);
              const at::Tensor keep = t.ne(rp.ignore_index);
              check_nll_targets(t, keep, x.size(1));
              const at::Tensor safe = at::where(keep, t, at::zeros({}, t.options()));
              at::Tensor w =
                  rp.weight >= 0 ? views[rp.weight].to(acc_dtype).index_select(0, safe) : at::ones({m}, x.options());
              w = at::where(keep, w, at::zeros({}, w.options()));
              const at::Tensor picked = x.narrow(0, off, m).gather(1, safe.unsqueeze(1)).squeeze(1);
              RingPart q;
              q.t = {picked.mul(w).sum().neg(), w.sum()};
              return q;
            });
            return;
          }
          if (is_extremum_scan(P.combine)) {
            // The cores of a run with equal rows, evenly spaced, and the same
            // carry state scan their rows of the step as one batch (CPU's
            // scan along dim 1 of [G, rows, ...]: each core's pairs those of
            // its rows alone, indices from its rows' first row), then merge
            // in the pair carried from their earlier tiles.
            int64_t off = 0;
            // Evenly spaced: each core's first row the same gap from the previous one's.
            auto joins = [&](size_t c, size_t e) {
              return ext_has[e] == ext_has[c] &&
                     cores[e].first - cores[e - 1].first == cores[c + 1].first - cores[c].first;
            };
            for (auto run = core_run(cores, 0, joins); run.first < cores.size();
                 run = core_run(cores, run.second, joins)) {
              const size_t c = run.first, e = run.second;
              const int64_t rows = cores[c].second - cores[c].first;
              const int64_t G = static_cast<int64_t>(e - c);
              std::vector<int64_t> sizes = x.sizes().vec();
              sizes[0] = rows;
              sizes.insert(sizes.begin(), G);
              std::vector<int64_t> firsts(G);
              for (int64_t g = 0; g < G; ++g) firsts[g] = cores[c + g].first;
              // The G cores' rows of `scan`: evenly spaced blocks of `rows` rows,
              // written by the scan in place.
              std::vector<int64_t> strides = scan.strides().vec();
              strides.insert(strides.begin(), (G > 1 ? cores[c + 1].first - cores[c].first : rows) * scan.stride(0));
              const at::Tensor v = scan.as_strided(sizes, strides, cores[c].first * scan.stride(0));
              const at::Tensor ix = scan_idx.as_strided(sizes, strides, cores[c].first * scan_idx.stride(0));
              extremum_scan_into(P.combine == KtirTilePlan::kCummax, x.narrow(0, off, G * rows).view(sizes), firsts,
                                 ext_has[c] ? ext_v.narrow(0, c, G) : at::Tensor(),
                                 ext_has[c] ? ext_i.narrow(0, c, G) : at::Tensor(), v, ix);
              if (!ext_v.defined()) {
                std::vector<int64_t> last = v.sizes().vec();
                last[0] = static_cast<int64_t>(cores.size());
                last[1] = 1;
                ext_v = at::empty(last, v.options());
                ext_i = at::empty(last, ix.options());
              }
              ext_v.narrow(0, c, G).copy_(v.narrow(1, rows - 1, 1));
              ext_i.narrow(0, c, G).copy_(ix.narrow(1, rows - 1, 1));
              for (size_t g = c; g < e; ++g) ext_has[g] = 1;
              off += G * rows;
            }
            return;
          }
          if (is_scan(P.combine)) {
            // Each core scans its rows of the step, carrying its running
            // total (product) from its previous tile.
            const bool prod = P.combine == KtirTilePlan::kCumprod;
            int64_t off = 0;
            for (size_t c = 0; c < cores.size(); ++c) {
              const int64_t rows = cores[c].second - cores[c].first;
              if (rows == 0) continue;
              const at::Tensor seg = x.narrow(0, off, rows);
              at::Tensor local = prod ? seg.cumprod(0, acc_dtype) : seg.cumsum(0, acc_dtype);
              if (carry[c].defined()) local = prod ? local.mul(carry[c]) : local.add(carry[c]);
              carry[c] = local.narrow(0, rows - 1, 1);
              scan.narrow(0, cores[c].first, rows).copy_(local);
              off += rows;
            }
            return;
          }
          // The other ring ops: the cores of a run with equal rows (and
          // equal accumulated counts) compute their corelet partials and
          // merges as one batch ([G, ...] tensors, each core's values those
          // of its own rows), the accumulators of all cores live in one
          // [cores_used, ...] tensor per statistic.
          int64_t off = 0;
          auto joins = [&](size_t c, size_t e) { return acc_has[e] == acc_has[c] && acc_n[e] == acc_n[c]; };
          for (auto run = core_run(cores, 0, joins); run.first < cores.size();
               run = core_run(cores, run.second, joins)) {
            const size_t c = run.first, e = run.second;
            const int64_t rows = cores[c].second - cores[c].first;
            const int64_t G = static_cast<int64_t>(e - c);
            std::vector<int64_t> sizes = x.sizes().vec();
            sizes[0] = rows;
            sizes.insert(sizes.begin(), G);
            // The G cores' rows of the step: [G, rows, ...], from the step's
            // tile, or, with the widened input, a strided view of it (the
            // cores' first rows are evenly spaced; each op's values are the
            // same on a view as on a copy, its results are fresh tensors).
            at::Tensor X;
            if (wide_in.defined() || (sums_in_place && !whole_rows)) {
              const int64_t gap = G > 1 ? cores[c + 1].first - cores[c].first : rows;
              bool even = true;
              for (size_t g = c + 1; g < e; ++g) even = even && cores[g].first - cores[g - 1].first == gap;
              TORCH_CHECK(even, "ktir_execute: uneven core rows in a ring step");
              std::vector<int64_t> strides = x.strides().vec();
              strides.insert(strides.begin(), gap * x.stride(0));
              X = x.as_strided(sizes, strides, x.storage_offset() + cores[c].first * x.stride(0));
            } else {
              X = x.narrow(0, off, G * rows).view(sizes);
            }
            std::vector<int64_t> firsts(G);
            const int64_t corelets = rows >= P.tiling.corelets ? P.tiling.corelets : 1;
            // Only argmax/argmin partials read their rows' first row (the index offset).
            const bool positions = P.combine == KtirTilePlan::kArgMax || P.combine == KtirTilePlan::kArgMin;
            const std::vector<int64_t> shares = sums16 ? corelet_shares(rows, corelets) : std::vector<int64_t>{};
            if (sums_in_place && sum_partials_fit(X, shares) && (!acc_b.empty() || c == 0)) {
              // Each core's step partial added to its accumulator in place (ring_merge's f32 adds).
              if (acc_b.empty()) {
                std::vector<int64_t> all = X.sizes().vec();
                all[0] = static_cast<int64_t>(cores.size()), all[1] = 1;
                acc_b.push_back(at::empty(all, X.options().dtype(at::kFloat)));
              }
              float* a =
                  acc_b[0].mutable_data_ptr<float>() + static_cast<int64_t>(c) * (acc_b[0].numel() / acc_b[0].size(0));
              sum_partials_into(X, shares, a, acc_has[c]);
              for (size_t g = c; g < e; ++g) acc_has[g] = 1;
              off += G * rows;
              continue;
            }
            RingPart part;
            bool native = softmax_partials_fit(P, X);
            if (native) part = softmax_partials(X, corelets);
            if (sums16 && sum_partials_fit(X, shares)) {
              part.t = {sum_partials(X, shares)};
              native = true;
            }
            if (!native && X.scalar_type() != acc_dtype) X = X.to(acc_dtype);  // an input read in place
            // Corelet by corelet (corelet_shares), r0 its first row among the core's.
            int64_t r0 = 0;
            for (const int64_t m : native ? std::vector<int64_t>{} : corelet_shares(rows, corelets)) {
              for (int64_t g = 0; g < G; ++g) firsts[g] = cores[c + g].first + r0;
              const at::Tensor first_rows = positions ? at::tensor(firsts, at::kLong) : at::Tensor();
              part = ring_merge(P, rp, std::move(part), ring_partial(P, rp, X.narrow(1, r0, m), first_rows, acc_dtype));
              r0 += m;
            }
            if (acc_b.empty() && c == 0 && e == cores.size()) {
              // Every core in one batch at its first step: the partials are the accumulators.
              for (at::Tensor& t : part.t) acc_b.push_back(t.contiguous());
              for (size_t g = c; g < e; ++g) acc_has[g] = 1, acc_n[g] = part.n;
              off += G * rows;
              continue;
            }
            if (acc_b.empty())
              for (const at::Tensor& t : part.t) {
                std::vector<int64_t> all = t.sizes().vec();
                all[0] = static_cast<int64_t>(cores.size());
                acc_b.push_back(at::empty(all, t.options()));
              }
            RingPart merged = std::move(part);
            if (acc_has[c]) {
              RingPart a;
              for (const at::Tensor& t : acc_b) a.t.push_back(t.narrow(0, c, G));
              a.n = acc_n[c];
              merged = ring_merge(P, rp, std::move(a), merged);
            }
            for (size_t j = 0; j < acc_b.size(); ++j) acc_b[j].narrow(0, c, G).copy_(merged.t[j]);
            for (size_t g = c; g < e; ++g) acc_has[g] = 1, acc_n[g] = merged.n;
            off += G * rows;
          }
        });
      }
    }
    // Store: the split HBM views the step wrote (and the LX views a later
    // pass reads whole), back to their rows.
    if (!whole_rows)
      for (size_t v = 0; v < views.size(); ++v) {
        if (!P.store[v] && !P.keep[v]) continue;
        if (idx.defined())
          copy_rows_into(views[v], idx, vt[v]);
        else
          views[v].narrow(0, lo, n).copy_(vt[v]);
      }
    if (walk) walk->tile_steps++;
  }
  if (rows16_n > 0 && rows16_f.defined() && !failed[0]) {
    // The row sums of every step, rounded once and stored (float32: written in place already).
    const at::Tensor& out = views[p.ops[0].results[0]];
    if (out.scalar_type() != at::kFloat && !df16_store_into(out, rows16_f.view(out.sizes())))
      out.copy_(df16_store(rows16_f, out.scalar_type()).view(out.sizes()));
    hooks.after_op(0, {out}, {});
    debug::count_op("spyre_row_sums", p.name);
  }
  if (ring && !failed[P.ring_op]) {
    // The ring: core 0's partial passes to core 1, which merges its own, and so on.
    run_op(P.ring_op, views, [&] {
      if (order) {
        std::vector<at::Tensor> outs;
        for (int r : P.ring_outs) outs.push_back(views[r]);
        std::vector<at::Tensor> vals;
        if (select) {
          // A selection over the cores' rows (order_select): each pass's
          // histograms are summed along the ring in core order, and the digit
          // found goes back to every core (P.ring_chains: cores_used - 1
          // hops each).
          TORCH_CHECK(sel.defined() && sel.numel() > 0, "ktir_execute: an order statistic over no rows");
          const at::Tensor x = sel.contiguous();
          const at::Tensor cols = P.ring_flat ? x.reshape({-1, 1}) : x.reshape({x.size(0), -1});
          if (walk) walk->ring_steps += static_cast<int64_t>(P.ring_chains.size()) * (P.tiling.cores_used - 1);
          vals = order_select(P, rp, cols, outs);
        } else {
          // The ring merges the cores' runs in core order (earlier rows first
          // on ties). A stable merge is associative (any grouping gives the
          // stable order of the rows), so the cores_used - 1 merges run as a
          // tree: core 2j with 2j + 1, then the pairs, ... with the chain's values.
          std::vector<OrderRun> level;
          for (auto& r : runs)
            if (!r.empty()) level.push_back(std::move(r));
          const int64_t limit = P.combine == KtirTilePlan::kTopk ? std::max<int64_t>(rp.k, 0) : -1;
          if (walk && !level.empty()) walk->ring_steps += static_cast<int64_t>(level.size()) - 1;
          while (level.size() > 1) {
            std::vector<OrderRun> next;
            for (size_t j = 0; j + 1 < level.size(); j += 2)
              next.push_back(order_merge(level[j], level[j + 1], rp.descending, limit));
            if (level.size() % 2) next.push_back(std::move(level.back()));
            level = std::move(next);
          }
          TORCH_CHECK(!level.empty(), "ktir_execute: an order statistic over no rows");
          vals = order_finish(P, rp, level[0], outs);
        }
        for (size_t j = 0; j < vals.size(); ++j) {
          const c10::ScalarType t = p.views[P.ring_outs[j]].dtype;
          // Values are stored values (selections: no rounding), indices int64.
          outs[j].copy_(vals[j].to(t));
        }
        if (ring->results.empty())
          hooks.after_op(P.ring_op, {}, outs);
        else
          hooks.after_op(P.ring_op, outs, {});
        return;
      }
      const bool chain = (P.combine == KtirTilePlan::kSoftmax || P.combine == KtirTilePlan::kLogSoftmax) &&
                         acc_b.size() == 2 && acc_b[1].scalar_type() == c10::kFloat;
      const bool every_core = !acc_b.empty() && std::all_of(acc_has.begin(), acc_has.end(), [](char h) { return h; });
      RingPart total;
      if (chain && every_core && acc_b[0].numel() < at::internal::GRAIN_SIZE)
        total = softmax_ring_chain_all(acc_b[0], acc_b[1], walk);
      const bool adds =
          P.combine == KtirTilePlan::kSum || P.combine == KtirTilePlan::kMean || P.combine == KtirTilePlan::kNanSum;
      const bool add_chain = total.t.empty() && adds && acc_b.size() == 1 && acc_b[0].scalar_type() == c10::kFloat &&
                             acc_b[0].is_contiguous();
      // The cores' accumulators as tensors of their own (not for ring_add_chain, which reads acc_b).
      for (size_t c = 0; c < acc.size() && !acc_b.empty() && total.t.empty() && !add_chain; ++c) {
        if (!acc_has[c]) continue;
        acc[c].t.clear();
        for (const at::Tensor& t : acc_b) acc[c].t.push_back(t.select(0, static_cast<int64_t>(c)));
        acc[c].n = acc_n[c];
      }
      if (!total.t.empty())
        ;  // the batched chain above
      else if (add_chain)
        total.t = {ring_add_chain(acc_b[0], acc_has, walk)};
      else if (chain)
        total = softmax_ring_chain(acc, walk);
      else
        for (auto& a : acc) {
          if (a.t.empty()) continue;
          if (!total.t.empty() && walk) walk->ring_steps++;
          total = ring_merge(P, rp, std::move(total), a);
        }
      auto store = [&](int view, const at::Tensor& value, const at::Tensor* rows_idx, int64_t lo, int64_t n) {
        const c10::ScalarType t = p.views[view].dtype;
        const bool is16 = is_dtype16(t);
        at::Tensor out = views[view];
        if (rows_idx && rows_idx->defined()) {
          out.index_copy_(0, *rows_idx, is16 ? df16_store(value, t) : value.to(t));
          return;
        }
        if (n >= 0) out = out.narrow(0, lo, n);
        if (is16 && df16_store_into(out, value)) return;
        out.copy_((is16 ? df16_store(value, t) : value.to(t)).reshape(out.sizes()));
      };
      std::vector<at::Tensor> results;
      for (int r : ring->results) results.push_back(views[r]);
      if (!P.normalize) {
        const std::vector<at::Tensor> vals = ring_finish(P, rp, total);
        for (size_t j = 0; j < vals.size() && j < ring->results.size(); ++j)
          store(ring->results[j], vals[j], nullptr, 0, -1);
      } else {
        // The normalizing pass: each step's rows of the input (read again
        // from HBM, or from the LX buffer the steps kept) are normalized with
        // the combined statistics, rounded once and stored to their rows.
        if (is_scan(P.combine)) {
          // The ring passes each core the total (product) of the cores
          // before it (core 0 none); the second pass applies it to the
          // core's rows.
          const bool prod = P.combine == KtirTilePlan::kCumprod;
          if (is_extremum_scan(P.combine)) {
            // The ring passes each core the pair of the cores before it (their
            // last pairs merged in core order); the second pass merges it into
            // the core's rows. Core c takes the inclusive prefix of cores
            // 0..c-1 (one row loop per core: the pairs are a row each).
            const bool is_max = P.combine == KtirTilePlan::kCummax;
            int64_t K = 0;
            while (K < static_cast<int64_t>(ext_has.size()) && ext_has[K]) ++K;
            at::Tensor av, ai;
            if (K > 0) std::tie(av, ai) = extremum_prefix(is_max, ext_v.narrow(0, 0, K), ext_i.narrow(0, 0, K));
            if (walk && K > 1) walk->ring_steps += static_cast<int>(K - 1);
            const int64_t total_rows = scan.size(0), rpc = P.tiling.rows_per_core;
            auto put = [&](const at::Tensor& v, const at::Tensor& ix, int64_t lo, int64_t n) {
              store(ring->results[0], v, nullptr, lo, n);
              if (ring->results.size() > 1) store(ring->results[1], ix, nullptr, lo, n);
            };
            put(scan.narrow(0, 0, std::min(rpc, total_rows)), scan_idx.narrow(0, 0, std::min(rpc, total_rows)), 0,
                std::min(rpc, total_rows));
            std::optional<Scratch> merge_v, merge_i;  // the merged rows, stored at once
            // Cores 1..F-1 hold rpc rows each: one batched merge with their prefixes.
            const int64_t F = std::min(K, total_rows / rpc);
            if (F > 1) {
              std::vector<int64_t> sizes = scan.sizes().vec();
              sizes[0] = rpc;
              sizes.insert(sizes.begin(), F - 1);
              auto [v, ix] = extremum_merge_rows(is_max, av.narrow(0, 0, F - 1), ai.narrow(0, 0, F - 1),
                                                 scan.narrow(0, rpc, (F - 1) * rpc).view(sizes),
                                                 scan_idx.narrow(0, rpc, (F - 1) * rpc).view(sizes), merge_v, merge_i);
              sizes.erase(sizes.begin());
              sizes[0] = (F - 1) * rpc;
              put(v.view(sizes), ix.view(sizes), rpc, (F - 1) * rpc);
            }
            for (int64_t c = std::max<int64_t>(F, 1); c < K; ++c) {  // a last core with fewer rows
              const int64_t lo = c * rpc, n = std::min(rpc, total_rows - lo);
              if (n <= 0) break;
              auto [v, ix] = extremum_merge_rows(is_max, av.narrow(0, c - 1, 1), ai.narrow(0, c - 1, 1),
                                                 scan.narrow(0, lo, n).unsqueeze(0),
                                                 scan_idx.narrow(0, lo, n).unsqueeze(0), merge_v, merge_i);
              put(v.squeeze(0), ix.squeeze(0), lo, n);
            }
            // The indices are row numbers below the rows' count: they fit the
            // device's int32 when it does (no range check of each launch).
            if (total_rows <= std::numeric_limits<int32_t>::max() && results.size() > 1) results.pop_back();
            hooks.after_op(P.ring_op, results, {});
            return;
          }
          std::vector<at::Tensor> prefix(carry.size());
          for (size_t c = 1; c < carry.size(); ++c) {
            if (!carry[c - 1].defined()) break;
            prefix[c] = !prefix[c - 1].defined() ? carry[c - 1]
                        : prod                   ? prefix[c - 1].mul(carry[c - 1])
                                                 : prefix[c - 1].add(carry[c - 1]);
            if (walk) walk->ring_steps++;
          }
          for (const auto& step : P.steps)
            for (size_t c = 0; c < step.size(); ++c) {
              const auto [lo, hi] = step[c];
              if (hi <= lo) continue;
              at::Tensor y = scan.narrow(0, lo, hi - lo);
              if (prefix[c].defined()) y = prod ? y.mul(prefix[c]) : y.add(prefix[c]);
              store(ring->results[0], y, nullptr, lo, hi - lo);
            }
          hooks.after_op(P.ring_op, results, {});
          return;
        }
        const RingStats st = ring_stats(P, rp, total);
        // Every step of this pass runs the same elementwise ops on its own
        // rows with the same statistics, so when the steps cover every row
        // of the input they run as one batch (all rows at once, in place of
        // a gather and a scatter per step): each row's value is the one its
        // step computes.
        int64_t covered = 0;
        for (size_t i = 0; i < P.steps.size(); ++i) {
          int64_t lo = -1, n = 0;
          step_rows(i, &lo, &n);
          covered += n;
        }
        const bool batch = covered == views[ring_in].size(0) &&
                           (rp.weight < 0 || views[rp.weight].size(0) == covered) &&
                           (rp.bias < 0 || views[rp.bias].size(0) == covered);
        if (batch) {
          at::Tensor x = wide_in.defined() ? wide_in : views[ring_in].to(acc_dtype);
          const at::Tensor& out = views[P.ring_outs[0]];
          const bool fused = P.combine == KtirTilePlan::kSoftmax && softmax_bf16_fits(out, x, st);
          if (!fused && x.scalar_type() != acc_dtype) {  // an input read in place: widened here
            wide_lease.emplace(Scratch::kWideIn, x.sizes());
            x = wide_lease->tensor().copy_(x);
          }
          at::Tensor w, b;
          if (rp.weight >= 0) w = views[rp.weight].to(acc_dtype);
          if (rp.bias >= 0) b = views[rp.bias].to(acc_dtype);
          const bool own = !x.is_alias_of(views[ring_in]) && x.sizes().equals(views[ring_in].sizes());
          if (fused) {
            // softmax to bfloat16: difference, exp, quotient and df16 store in
            // one pass over the rows (the same f32 values as the ATen ops).
            df16_softmax_bf16_into(out, x, st.a, st.b);
          } else {
            store(P.ring_outs[0], ring_normalize(P, st, x, w, b, own), nullptr, 0, -1);
          }
        }
        for (size_t i = 0; i < P.steps.size() && !batch; ++i) {
          int64_t lo = -1, n = 0;
          step_rows(i, &lo, &n);
          if (n == 0) continue;
          const at::Tensor& idx = P.step_index[i];
          auto rows_of = [&](int v) {
            return idx.defined() ? views[v].index_select(0, idx) : views[v].narrow(0, lo, n);
          };
          const at::Tensor x = rows_of(ring_in).to(acc_dtype);
          at::Tensor w, b;
          if (rp.weight >= 0) w = rows_of(rp.weight).to(acc_dtype);
          if (rp.bias >= 0) b = rows_of(rp.bias).to(acc_dtype);
          store(P.ring_outs[0], ring_normalize(P, st, x, w, b), &idx, lo, n);
        }
        if (P.combine == KtirTilePlan::kLayerNorm) {
          if (ring->results.size() > 1) store(ring->results[1], st.a, nullptr, 0, -1);
          if (ring->results.size() > 2) store(ring->results[2], st.b, nullptr, 0, -1);
        }
      }
      if (ring->results.empty()) {  // renorm.out / renorm_: the written operands
        std::vector<at::Tensor> outs;
        for (int r : P.ring_outs) outs.push_back(views[r]);
        hooks.after_op(P.ring_op, {}, outs);
        return;
      }
      hooks.after_op(P.ring_op, results, {});
    });
  }
  for (size_t k = 0; k < p.ops.size(); ++k)
    if (P.phase[k] == KtirTilePlan::kPost) run_op(k, views, nullptr);
  if (first_error) std::rethrow_exception(first_error);
}

std::vector<at::Tensor> ktir_run(const KtirProgram& p, const CardParams& card, std::vector<at::Tensor> inputs) {
  // Inputs bind to the in and inout arguments in order; out arguments are allocated.
  size_t n_in = 0;
  for (const auto& g : p.args) n_in += g.kind != KtirArg::kOut;
  TORCH_CHECK_VALUE(inputs.size() == n_in, "run_ktir: kernel @", p.name, " takes ", n_in,
                    " input tensors (its in and inout arguments), got ", inputs.size());
  // A symbolic program is bound as a job plan binds it at launch: each
  // symbol from the element count of an input argument whose elems is
  // affine in it alone once the symbols already bound are put in ("16*s0",
  // "16*s0-16"; "s0*s1" after s1 is bound; else the header's value).
  KtirProgram bound;
  const KtirProgram* run = &p;
  if (!p.sym_values.empty()) {
    std::vector<int64_t> values = p.sym_values;
    std::vector<char> from_input(values.size(), 0);
    for (bool progress = true; progress;) {
      progress = false;
      size_t k = 0;
      for (const auto& g : p.args) {
        if (g.kind == KtirArg::kOut) continue;
        const at::Tensor& t = inputs[k++];
        const KtirExpr e = affine_subst(g.elems_expr, values, from_input);
        const int s = e.single_symbol();
        if (s < 0 || !t.defined() || from_input[s]) continue;
        const int64_t n = t.numel(), a = e.coef[s], c = e.constant;
        if ((n - c) % a != 0)
          fail(g.line, "view-bounds",
               "the tensor bound to an argument of " + affine_text(g.elems_expr, 0) + " elements has " +
                   std::to_string(n));
        values[s] = (n - c) / a;
        from_input[s] = 1;
        progress = true;
      }
    }
    // Every input agrees with the values bound (one may name a symbol twice).
    size_t k = 0;
    for (const auto& g : p.args) {
      if (g.kind == KtirArg::kOut) continue;
      const at::Tensor& t = inputs[k++];
      if (g.elems_expr.symbolic() && t.defined() && !affine_subst(g.elems_expr, values, from_input).symbolic() &&
          g.elems_expr.eval(values) != t.numel())
        fail(g.line, "view-bounds",
             "the tensors bind the symbols of " + affine_text(g.elems_expr, 0) + " to " +
                 std::to_string(g.elems_expr.eval(values)) + " elements; the tensor has " + std::to_string(t.numel()));
    }
    bound = p;
    ktir_bind(bound, values);
    run = &bound;
  }
  // The program's own rules first (an out argument's elems sizes its allocation).
  ktir_verify(*run, card, nullptr);
  std::vector<at::Tensor> args;
  size_t next = 0;
  for (const auto& g : run->args)
    args.push_back(g.kind == KtirArg::kOut ? at::zeros({g.elems}, at::TensorOptions().dtype(g.dtype)) : inputs[next++]);
  ktir_verify(*run, card, &args);
  // Each storage as flat bytes; a view reinterprets them in its dtype.
  std::vector<at::Tensor> flat(args.size());
  for (size_t a = 0; a < args.size(); ++a) {
    TORCH_CHECK_VALUE(args[a].is_contiguous() && args[a].device().is_cpu(), "run_ktir: argument %a", a,
                      " must be a contiguous CPU tensor");
    flat[a] = args[a].view({-1}).view(at::kByte);
  }
  // A file has no LX schedule: each core's rows are one tile (the cores and
  // the ring reduction as in a compiled region).
  KtirTiling tiling;
  tiling.rows_per_core = run->rows_per_core;
  tiling.cores_used = run->cores_used;
  tiling.tile_rows = run->rows_per_core;
  tiling.corelets = std::max<int64_t>(1, card.corelets_per_core);
  const KtirTilePlan plan = ktir_tile_plan(*run, tiling);
  KtirRunHooks hooks;
  ktir_execute(*run, flat, hooks, nullptr, &plan);
  std::vector<at::Tensor> outs;
  for (size_t a = 0; a < run->args.size(); ++a)
    if (run->args[a].kind != KtirArg::kIn) outs.push_back(args[a]);
  return outs;
}

}  // namespace spyre
}  // namespace tpu_eager
