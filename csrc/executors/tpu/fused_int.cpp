// Integer fused loops (see fused_int.h): planning, binding and the tile loop.
#include "executors/tpu/fused_int.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>

#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>

#include "executors/aten_grain.h"
#include "executors/tpu/fused_elementwise.h"
#include "jit/lowering.h"

// The tile loop is compiled for AVX2 (the fused loops run only where
// fused_loops_available(): AVX2 + FMA + F16C) with GCC's -O3 vectorizer:
// the element loops of `apply` then run 4 int64 lanes per instruction.
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")
#pragma GCC optimize("O3")

namespace tpu_eager {
namespace tpu {
namespace fused {
namespace {

constexpr int64_t kTile = 512;

inline int64_t wrap(uint64_t v, IElem t) {
  if (t == IElem::kInt32) return static_cast<int32_t>(static_cast<uint32_t>(v));
  return static_cast<int64_t>(v);
}

// Floor division a = q * b + r (r with b's sign or 0, |r| < |b|) for b != 0,
// b != -1. Operands below 2^53 in magnitude take floor of the float64
// quotient (within 1 of the exact one: both operands are exact doubles and
// the division rounds once), corrected by one step without branches; others
// the integer division instruction. Measured on this machine's Xeon (1M
// int64 // 3, -O2): 20 vs 29 ms for idiv per element.
inline void floor_divmod(int64_t a, int64_t b, int64_t* q, int64_t* r) {
  constexpr int64_t k = int64_t{1} << 53;
  if (a > -k && a < k && b > -k && b < k) {
    int64_t qq = static_cast<int64_t>(std::floor(static_cast<double>(a) / static_cast<double>(b)));
    int64_t rr = a - qq * b;
    const int64_t over = (rr != 0) & ((rr < 0) != (b < 0));  // q one too large
    qq -= over;
    rr += over * b;
    const int64_t under = b > 0 ? rr >= b : rr <= b;  // q one too small
    *q = qq + under;
    *r = rr - under * b;
    return;
  }
  int64_t qq = a / b, rr = a % b;
  const int64_t adjust = (rr != 0) & ((rr < 0) != (b < 0));
  *q = qq - adjust;
  *r = rr + adjust * b;
}

// Python's floor division and remainder of integers (c10::div_floor_integer,
// ATen's remainder kernel), C's truncating ones (div rounding_mode='trunc',
// fmod); b == -1 without the division (INT_MIN / -1 traps on x86).
inline int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) return 0;  // never run: bind_int_loop checks divisors
  if (b == -1) return static_cast<int64_t>(0 - static_cast<uint64_t>(a));
  int64_t q, r;
  floor_divmod(a, b, &q, &r);
  return q;
}
inline int64_t remainder(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t q, r;
  floor_divmod(a, b, &q, &r);
  return r;
}
// Truncated from floored: one step toward zero when the signs differ and r != 0.
inline int64_t trunc_div(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<int64_t>(0 - static_cast<uint64_t>(a));
  int64_t q, r;
  floor_divmod(a, b, &q, &r);
  return q + ((r != 0) & ((a < 0) != (b < 0)));
}
inline int64_t fmod_int(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t q, r;
  floor_divmod(a, b, &q, &r);
  return r - ((r != 0) & ((a < 0) != (b < 0))) * b;
}

// a ** e as ATen's powi computes it for a signed integer type, modulo 2^64
// (the caller wraps to the type): squaring, with e < 0 giving 1 for a == 1,
// +-1 for a == -1 and 0 otherwise. Products modulo 2^n do not depend on
// their order, so any multiplication order gives CPU's wrapped value.
inline int64_t int_pow(int64_t a, int64_t e) {
  if (e < 0) return a == 1 ? 1 : a == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = static_cast<uint64_t>(a);
  for (uint64_t k = static_cast<uint64_t>(e); k != 0; k >>= 1) {
    if (k & 1) r *= x;
    x *= x;
  }
  return static_cast<int64_t>(r);
}

// float32 to `t` as CPU's static_cast on x86 (cvttss2si: NaN and values
// outside the range give the type's minimum); to bool: v != 0.
inline int64_t cvt_float(float v, IElem t) {
  if (t == IElem::kBool) return v != 0.0f;
  if (t == IElem::kInt32)
    return (v >= -2147483648.0f && v < 2147483648.0f) ? static_cast<int64_t>(static_cast<int32_t>(v))
                                                      : std::numeric_limits<int32_t>::min();
  return (v >= -9223372036854775808.0f && v < 9223372036854775808.0f) ? static_cast<int64_t>(v)
                                                                      : std::numeric_limits<int64_t>::min();
}

// One instruction over n elements: d = fn(a, b, c), wrapped to the type.
void apply(const IInstr& in, int64_t n, const int64_t* a, const int64_t* b, const int64_t* c, const float* af,
           int64_t* d) {
  const IElem t = in.type == IElem::kFloat ? IElem::kInt64 : in.type;
  const int bits = in.src == IElem::kInt32 ? 32 : 64;
  using U = uint64_t;
  switch (in.fn) {
    case IFn::kAdd:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(a[j]) + U(c[j]) * U(b[j]), t);
      break;
    case IFn::kMul:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(a[j]) * U(b[j]), t);
      break;
    case IFn::kNeg:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(0 - U(a[j]), t);
      break;
    case IFn::kAbs:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(a[j] < 0 ? 0 - U(a[j]) : U(a[j]), t);
      break;
    case IFn::kMax:
      for (int64_t j = 0; j < n; ++j) d[j] = std::max(a[j], b[j]);
      break;
    case IFn::kMin:
      for (int64_t j = 0; j < n; ++j) d[j] = std::min(a[j], b[j]);
      break;
    case IFn::kSelect:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] != 0 ? b[j] : c[j];
      break;
    case IFn::kEq:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] == b[j];
      break;
    case IFn::kNe:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] != b[j];
      break;
    case IFn::kLt:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] < b[j];
      break;
    case IFn::kLe:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] <= b[j];
      break;
    case IFn::kGt:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] > b[j];
      break;
    case IFn::kGe:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] >= b[j];
      break;
    case IFn::kAnd:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] & b[j];
      break;
    case IFn::kOr:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] | b[j];
      break;
    case IFn::kXor:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] ^ b[j];
      break;
    case IFn::kNot:
      if (t == IElem::kBool) {
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] == 0;
      } else {
        for (int64_t j = 0; j < n; ++j) d[j] = ~a[j];
      }
      break;
    case IFn::kLAnd:
      for (int64_t j = 0; j < n; ++j) d[j] = (a[j] != 0) & (b[j] != 0);
      break;
    case IFn::kLOr:
      for (int64_t j = 0; j < n; ++j) d[j] = (a[j] != 0) | (b[j] != 0);
      break;
    case IFn::kLXor:
      for (int64_t j = 0; j < n; ++j) d[j] = (a[j] != 0) ^ (b[j] != 0);
      break;
    case IFn::kLNot:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] == 0;
      break;
    case IFn::kShl:
      // CPU's lshift: the count as the operand type, 0 outside [0, bits).
      for (int64_t j = 0; j < n; ++j) d[j] = (b[j] < 0 || b[j] >= bits) ? 0 : wrap(U(a[j]) << b[j], t);
      break;
    case IFn::kShr:
      for (int64_t j = 0; j < n; ++j) d[j] = a[j] >> ((b[j] < 0 || b[j] >= bits) ? bits - 1 : b[j]);
      break;
    case IFn::kFloorDiv:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(floor_div(a[j], b[j])), t);
      break;
    case IFn::kTruncDiv:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(trunc_div(a[j], b[j])), t);
      break;
    case IFn::kRemainder:
      for (int64_t j = 0; j < n; ++j) d[j] = remainder(a[j], b[j]);
      break;
    case IFn::kFmod:
      for (int64_t j = 0; j < n; ++j) d[j] = fmod_int(a[j], b[j]);
      break;
    case IFn::kCvtF:
      for (int64_t j = 0; j < n; ++j) d[j] = cvt_float(af[j], t);
      break;
    case IFn::kSign:
      for (int64_t j = 0; j < n; ++j) d[j] = (0 < a[j]) - (a[j] < 0);
      break;
    case IFn::kPow:
      for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(int_pow(a[j], b[j])), t);
      break;
    case IFn::kCopy:
      if (t == IElem::kBool) {
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] != 0;
      } else {
        for (int64_t j = 0; j < n; ++j) d[j] = wrap(U(a[j]), t);
      }
      break;
  }
}

// Reads n elements of an external from element `base` (i % period for a broadcast one) as int64.
void stage(const void* src, IElem e, int64_t period, int64_t base, int64_t n, int64_t* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = period > 0 ? (base + j) % period : base + j;
    switch (e) {
      case IElem::kInt64:
        dst[j] = static_cast<const int64_t*>(src)[i];
        break;
      case IElem::kInt32:
        dst[j] = static_cast<const int32_t*>(src)[i];
        break;
      case IElem::kBool:
        dst[j] = static_cast<const uint8_t*>(src)[i] != 0;
        break;
      case IElem::kFloat:
        break;  // read by kCvtF in place
    }
  }
}

void store(const int64_t* v, IElem e, int64_t base, int64_t n, void* dst) {
  switch (e) {
    case IElem::kInt64:
      std::memcpy(static_cast<int64_t*>(dst) + base, v, n * sizeof(int64_t));
      break;
    case IElem::kInt32:
      for (int64_t j = 0; j < n; ++j) static_cast<int32_t*>(dst)[base + j] = static_cast<int32_t>(v[j]);
      break;
    case IElem::kBool:
      for (int64_t j = 0; j < n; ++j) static_cast<uint8_t*>(dst)[base + j] = v[j] != 0;
      break;
    case IElem::kFloat:  // int64 -> float32, rounded to nearest as static_cast
      for (int64_t j = 0; j < n; ++j) static_cast<float*>(dst)[base + j] = static_cast<float>(v[j]);
      break;
  }
}

}  // namespace

void run_int(const IntProgram& p) {
  const int64_t numel = p.numel;
  const int64_t tiles = (numel + kTile - 1) / kTile;
  const int next = static_cast<int>(p.externals.size());
  // Per external: read in place (a dense int64 or float32 buffer) or staged per tile.
  std::vector<char> direct(next);
  for (int e = 0; e < next; ++e)
    direct[e] = p.period[e] == 0 && (p.ext_type[e] == IElem::kInt64 || p.ext_type[e] == IElem::kFloat);
  // Constants: one tile-long array per constant operand, filled once per thread.
  std::vector<const IOperand*> consts;
  for (const IInstr& in : p.instrs)
    for (const IOperand* o : {&in.a, &in.b, &in.c})
      if (o->kind == IOperand::kConst) consts.push_back(o);
  const int64_t grain = std::max<int64_t>(1, kAtenGrainSize / kTile);
  // Registers, staged externals and constants `width` elements apart: a loop
  // shorter than a tile (the llama's 32 int64 positions) then neither
  // allocates nor zeroes whole tiles.
  const int64_t width = std::min(kTile, numel);
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> mem((p.regs + next + consts.size()) * width);
    int64_t* regs = mem.data();
    int64_t* staged = regs + p.regs * width;
    int64_t* cst = staged + next * width;
    for (size_t k = 0; k < consts.size(); ++k) std::fill(cst + k * width, cst + (k + 1) * width, consts[k]->value);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t base = t * kTile, n = std::min(kTile, numel - base);
      for (int e = 0; e < next; ++e)
        if (!direct[e]) stage(p.externals[e], p.ext_type[e], p.period[e], base, n, staged + e * width);
      size_t ci = 0;
      for (const IInstr& in : p.instrs) {
        const int64_t* ops[3] = {nullptr, nullptr, nullptr};
        const float* af = nullptr;
        int slot = 0;
        for (const IOperand* o : {&in.a, &in.b, &in.c}) {
          switch (o->kind) {
            case IOperand::kReg:
              ops[slot] = regs + o->index * width;
              break;
            case IOperand::kExternal:
              if (p.ext_type[o->index] == IElem::kFloat) {
                af = static_cast<const float*>(p.externals[o->index]) + base;
              } else {
                ops[slot] = direct[o->index] ? static_cast<const int64_t*>(p.externals[o->index]) + base
                                             : staged + o->index * width;
              }
              break;
            case IOperand::kConst:
              ops[slot] = cst + ci++ * width;
              break;
          }
          ++slot;
        }
        int64_t* d = regs + in.dst * width;
        apply(in, n, ops[0], ops[1], ops[2], af, d);
        if (in.out >= 0) store(d, p.out_type[in.out], base, n, p.outputs[in.out]);
      }
    }
  });
}

}  // namespace fused
}  // namespace tpu
}  // namespace tpu_eager

#pragma GCC pop_options

namespace tpu_eager {
namespace tpu {
namespace {

using fused::IElem;
using fused::IFn;
using fused::IInstr;
using fused::IOperand;

// How an op's arguments map to instructions.
enum class IForm : uint8_t {
  kUnary,    // fn(self)
  kBinary,   // fn(self, other): other a tensor, a 0-dim tensor or a Scalar
  kDivide,   // floor_divide / remainder / fmod: fn(self, divisor) (divisor not a loop value)
  kDivMode,  // div(self, other, rounding_mode='floor' | 'trunc')
  kAdd,      // self + alpha * other
  kSub,      // self - alpha * other
  kRsub,     // other - alpha * self
  kCompare,  // fn(self, other) as bool (or self's type, in place)
  kLogical,  // fn(self, other) of a != 0, b != 0 as bool
  kLogicalNot,
  kWhere,       // where(condition, self, other)
  kMaskedFill,  // masked_fill(self, mask, value: Scalar): mask ? value : self
  kClamp,       // clamp(self, min?, max?)
  kClampOne,    // clamp_min / clamp_max(self, bound)
  kCopy,        // copy_(self, src): a cast
  kPowScalar,   // pow(self, exponent: an integral Scalar)
};

struct IntLowering {
  std::string_view name;  // without "aten::" and an in-place '_'
  std::string_view overloads;
  std::string_view out_overloads;
  IForm form;
  IFn fn;
};

// The integer loops' vocabulary, one row per op.
constexpr IntLowering kIntLowerings[] = {
    {"add", "Tensor,Scalar", "out", IForm::kAdd, IFn::kAdd},
    {"sub", "Tensor,Scalar", "out", IForm::kSub, IFn::kAdd},
    {"rsub", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kRsub, IFn::kAdd},
    {"mul", "Tensor,Scalar", "out", IForm::kBinary, IFn::kMul},
    {"neg", "", "out", IForm::kUnary, IFn::kNeg},
    {"abs", "", "out", IForm::kUnary, IFn::kAbs},
    {"maximum", "", "out", IForm::kBinary, IFn::kMax},
    {"minimum", "", "out", IForm::kBinary, IFn::kMin},
    {"clamp", ",Tensor", "out,Tensor_out", IForm::kClamp, IFn::kMax},
    {"clamp_min", ",Tensor", "out,Tensor_out", IForm::kClampOne, IFn::kMax},
    {"clamp_max", ",Tensor", "out,Tensor_out", IForm::kClampOne, IFn::kMin},
    {"where", "self", "self_out", IForm::kWhere, IFn::kSelect},
    {"masked_fill", "Scalar", "Scalar_out", IForm::kMaskedFill, IFn::kSelect},
    {"eq", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kEq},
    {"ne", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kNe},
    {"lt", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kLt},
    {"le", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kLe},
    {"gt", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kGt},
    {"ge", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kCompare, IFn::kGe},
    {"bitwise_and", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kBinary, IFn::kAnd},
    {"bitwise_or", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kBinary, IFn::kOr},
    {"bitwise_xor", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kBinary, IFn::kXor},
    {"bitwise_not", "", "out", IForm::kUnary, IFn::kNot},
    {"logical_and", "", "out", IForm::kLogical, IFn::kLAnd},
    {"logical_or", "", "out", IForm::kLogical, IFn::kLOr},
    {"logical_xor", "", "out", IForm::kLogical, IFn::kLXor},
    {"logical_not", "", "out", IForm::kLogicalNot, IFn::kLNot},
    {"__lshift__", "Tensor,Scalar", "", IForm::kBinary, IFn::kShl},
    // In place: the planner drops the trailing '_' of the op name ("__ilshift__" -> "__ilshift_").
    {"__ilshift_", "Tensor,Scalar", "", IForm::kBinary, IFn::kShl},
    {"__rshift__", "Tensor,Scalar", "", IForm::kBinary, IFn::kShr},
    {"__irshift_", "Tensor,Scalar", "", IForm::kBinary, IFn::kShr},
    {"bitwise_left_shift", "Tensor,Tensor_Scalar", "Tensor_out,Tensor_Scalar_out", IForm::kBinary, IFn::kShl},
    {"bitwise_right_shift", "Tensor,Tensor_Scalar", "Tensor_out,Tensor_Scalar_out", IForm::kBinary, IFn::kShr},
    {"floor_divide", ",Scalar,Tensor", "out", IForm::kDivide, IFn::kFloorDiv},
    {"remainder", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kDivide, IFn::kRemainder},
    {"fmod", "Tensor,Scalar", "Tensor_out,Scalar_out", IForm::kDivide, IFn::kFmod},
    {"div", "Tensor_mode,Scalar_mode", "out_mode,Scalar_mode_out", IForm::kDivMode, IFn::kFloorDiv},
    {"copy", "", "", IForm::kCopy, IFn::kCopy},
    {"sign", "", "out", IForm::kUnary, IFn::kSign},
    // CPU's pow_out fills 1 for an exponent of 0 and copies for 1: powi's values too.
    {"pow", "Tensor_Scalar,Scalar", "Tensor_Scalar_out", IForm::kPowScalar, IFn::kPow},
};

const IntLowering* int_lowering_of(std::string_view name, std::string_view overload, bool is_out) {
  return find_lowering(kIntLowerings, name, overload, is_out);
}

bool ielem_of(at::ScalarType t, IElem* e) {
  switch (t) {
    case at::kLong:
      *e = IElem::kInt64;
      return true;
    case at::kInt:
      *e = IElem::kInt32;
      return true;
    case at::kBool:
      *e = IElem::kBool;
      return true;
    case at::kFloat:
      *e = IElem::kFloat;
      return true;
    default:
      return false;
  }
}

int64_t isize(IElem e) { return e == IElem::kInt64 ? 8 : e == IElem::kBool ? 1 : 4; }

bool is_int(IElem e) { return e == IElem::kInt64 || e == IElem::kInt32; }

// Element `i` of an int64 / int32 / bool buffer of type `t` as int64; false for another type.
bool read_int(const void* data, at::ScalarType t, int64_t i, int64_t* out) {
  switch (t) {
    case at::kLong:
      *out = static_cast<const int64_t*>(data)[i];
      return true;
    case at::kInt:
      *out = static_cast<const int32_t*>(data)[i];
      return true;
    case at::kBool:
      *out = static_cast<const uint8_t*>(data)[i] != 0;
      return true;
    default:
      return false;
  }
}

// An integral scalar argument (Python int or bool, or a wrapped integer
// number) as int64; false for anything else (a float makes CPU compute in float).
bool int_scalar(const c10::IValue& v, int64_t* out) {
  if (v.isScalar()) {
    const auto s = v.toScalar();
    if (s.isBoolean()) {
      *out = s.toBool();
      return true;
    }
    if (!s.isIntegral(false) || s.type() == c10::ScalarType::UInt64) return false;
    *out = s.toLong();
    return true;
  }
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().dim() == 0 && v.toTensor().device().is_cpu())
    return read_int(v.toTensor().const_data_ptr(), v.toTensor().scalar_type(), 0, out);
  return false;
}

bool fits(int64_t v, IElem t) {
  if (t == IElem::kInt32) return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
  if (t == IElem::kBool) return v == 0 || v == 1;
  return true;
}

// The value of param `p` this run; false when it cannot be read or a guard fails.
bool int_param_value(const IntParam& p, const Region& region, const std::vector<Node>& graph, host::HostMemory& mem,
                     int64_t* v) {
  const Node& n = graph[region.nodes[p.pos]];
  if (p.input >= 0) {
    const TensorRef& r = n.inputs[p.input].ref;
    size_t nbytes;
    if (!read_int(mem.data_for(r.storage.get(), &nbytes), r.dtype, r.offset, v)) return false;
  } else if (!int_scalar(n.args[p.arg], v)) {
    return false;
  }
  if (p.negate) *v = static_cast<int64_t>(0 - static_cast<uint64_t>(*v));
  if (p.fits && !fits(*v, p.type)) return false;
  *v = p.type == IElem::kBool ? (*v != 0) : fused::IElem::kInt32 == p.type ? static_cast<int32_t>(*v) : *v;
  if (p.nonzero && *v == 0) return false;
  return true;
}

template <typename T>
bool has_zero(const T* p, int64_t n) {
  bool z = false;
  for (int64_t i = 0; i < n; ++i) z |= p[i] == 0;
  return z;
}

}  // namespace

int int_loop_domain(const Node& n) {
  // Cross-entropy's ops compute in float32; their int64 targets are indices (fused_cross_entropy.cpp).
  if (lowering_of(n.op).loss != LossRow::kNone) return 0;
  bool any_int = false, all_bool = true;
  auto see = [&](at::ScalarType t) {
    any_int = any_int || t == at::kLong || t == at::kInt;
    all_bool = all_bool && t == at::kBool;
  };
  bool writes_bool = false;
  for (const auto& in : n.inputs) {
    see(in.ref.dtype);
    writes_bool = writes_bool || (in.written && in.ref.dtype == at::kBool);
  }
  for (const auto& o : n.outputs) see(o.dtype);
  std::string_view name;
  const InputSlot* w = nullptr;
  bool is_out = false;
  const IntLowering* lw =
      loop_op_form(n, &name, &w, &is_out) ? int_lowering_of(name, n.op.schema().overload_name(), is_out) : nullptr;
  if (lw && lw->form == IForm::kCopy && w) {
    // A float -> bool cast (copy_ into a bool tensor) is the integer loop's kCvtF.
    if (!any_int && !all_bool && writes_bool) return 1;
    // An int32 / int64 / bool -> float32 cast joins either loop (the float loop reads its source converted).
    bool int_src = false;
    for (const auto& in : n.inputs)
      if (!in.written && in.arg == 1)
        int_src = in.ref.dtype == at::kInt || in.ref.dtype == at::kLong || in.ref.dtype == at::kBool;
    if (w->ref.dtype == at::kFloat && int_src) return 2;
  }
  return any_int ? 1 : all_bool ? 2 : 0;
}

bool plan_int_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph,
                   LoopPlan* plan) {
  *plan = LoopPlan{};
  plan->pos = ps;
  auto il = std::make_shared<IntLoop>();
  c10::OptionalIntArrayRef shape;
  StorageMap<IOperand> reg_of(2 * ps.size());
  struct External {
    const DeferredStorage* storage;
    int64_t period;
    IElem elem;
    bool operator==(const External& o) const { return storage == o.storage && period == o.period && elem == o.elem; }
  };
  std::vector<External> ext_of;
  std::vector<IInstr> program;
  std::vector<IElem> out_types;
  int regs = 0;
  const StorageMap<LoopWrite> written_by = loop_writes(region, ps, graph);
  auto is_made = [&](const DeferredStorage* s) {
    const LoopWrite* w = written_by.find(s);
    return w && w->made;
  };
  auto param_operand = [&](IntParam p, IOperand* op) {
    il->params.push_back(p);
    op->kind = IOperand::kConst;
    op->index = static_cast<int>(il->params.size());
    op->value = 0;
  };
  // A tensor operand of type `want` (the loop's values of other types are
  // not read: an op mixing types runs op by op). A 0-dim one that is not a
  // loop value is a runtime constant wrapped to `want`.
  auto tensor_operand = [&](size_t pos, const TensorRef& r, IOperand* op, IElem want) -> bool {
    IElem e;
    if (r.conj || r.neg || !ielem_of(r.dtype, &e)) return false;
    DeferredStorage* s = r.storage.get();
    const IOperand* it = reg_of.find(s);
    const Node& n = graph[region.nodes[pos]];
    if (r.sizes().empty() && !it && e != IElem::kFloat && want != IElem::kFloat && *shape != r.sizes()) {
      if (written_by.contains(s)) return false;
      IntParam p;
      p.pos = static_cast<int>(pos);
      p.input = input_index(n, r);
      p.type = want;
      if (p.input < 0 || (e != want && !(is_int(e) && is_int(want)))) return false;
      param_operand(p, op);
      return true;
    }
    if (e != want || r.offset != 0 || !r.is_dense()) return false;
    int64_t period = 0;
    if (r.sizes() != *shape) {
      period = broadcast_period(r.sizes(), *shape);
      if (period == 0 || it || written_by.contains(s)) return false;
    }
    if (it) {
      *op = *it;
      return true;
    }
    op->kind = IOperand::kExternal;
    op->index = external_index(ext_of, External{s, period, e}, n, r, pos, plan->externals);
    return op->index >= 0;
  };
  auto temp = [&](IInstr ins) {
    ins.dst = regs++;
    program.push_back(ins);
    return IOperand{IOperand::kReg, ins.dst, 0};
  };
  auto define = [&](IInstr ins, const TensorRef& ref, Slot slot, size_t k) -> bool {
    DeferredStorage* s = ref.storage.get();
    const LoopWrite& w = *written_by.find(s);
    IElem type;
    if (!ielem_of(ref.dtype, &type)) return false;
    ins.type = type;
    ins.dst = regs++;
    if (w.last == k && (w.kept || !w.made)) {
      ins.out = static_cast<int>(out_types.size());
      out_types.push_back(type);
      plan->outputs.push_back(slot);
    } else if (type == IElem::kFloat) {
      return false;  // a float32 value the loop would have to keep
    }
    if (type != IElem::kFloat) reg_of[s] = IOperand{IOperand::kReg, ins.dst, 0};
    program.push_back(ins);
    return true;
  };

  for (size_t k = 0; k < ps.size(); ++k) {
    const size_t p = ps[k];
    const Node& n = graph[region.nodes[p]];
    const auto& schema = n.op.schema();
    std::string_view name;
    const std::string& overload = schema.overload_name();
    const InputSlot* w = nullptr;
    bool is_out = false;
    if (!loop_op_form(n, &name, &w, &is_out)) return false;
    const IntLowering* lw = int_lowering_of(name, overload, is_out);
    if (!lw) return false;
    const TensorRef& out = w ? w->ref : n.outputs[0];
    IElem ot;
    if (!ielem_of(out.dtype, &ot) || out.conj || out.neg) return false;
    if (!shape) shape = out.sizes();
    if (out.sizes() != *shape || out.offset != 0 || !out.is_dense()) return false;
    const Slot out_slot = w ? Slot{static_cast<int>(p), input_index(n, w->ref), -1} : Slot{static_cast<int>(p), -1, 0};
    if (w && !is_made(w->ref.storage.get())) plan->written_inputs.push_back(out_slot);
    // The type the op computes in: its self's (comparisons, logical ops, casts) or its result's.
    const InputSlot* self_in = nullptr;
    const int self_arg = lw->form == IForm::kWhere ? 1 : lw->form == IForm::kCopy ? 1 : 0;
    for (const auto& in : n.inputs)
      if (in.arg == self_arg && in.elem < 0 && !in.written) self_in = &in;
    const bool by_self = lw->form == IForm::kCompare || lw->form == IForm::kLogical || lw->form == IForm::kLogicalNot ||
                         lw->form == IForm::kCopy;
    IElem ct = ot;
    if (by_self) {
      if (!self_in || !ielem_of(self_in->ref.dtype, &ct)) return false;
    }
    const bool bool_ok = lw->form == IForm::kLogical || lw->form == IForm::kLogicalNot || lw->form == IForm::kCopy ||
                         lw->form == IForm::kWhere || lw->form == IForm::kMaskedFill || lw->fn == IFn::kAnd ||
                         lw->fn == IFn::kOr || lw->fn == IFn::kXor || lw->fn == IFn::kNot;
    if (ct == IElem::kFloat && lw->form != IForm::kCopy) return false;
    if (ct == IElem::kBool && !bool_ok) return false;
    if (ot == IElem::kFloat && lw->form != IForm::kCopy) return false;
    // Results: the computation's type, a bool (comparisons, logical ops: in
    // place, self's type) or any loop type (casts).
    if (lw->form == IForm::kCompare || lw->form == IForm::kLogical || lw->form == IForm::kLogicalNot) {
      if (ot != IElem::kBool && ot != ct) return false;
    } else if (lw->form != IForm::kCopy && ot != ct) {
      return false;
    }
    // An integral Scalar (or wrapped number) argument as a runtime param of type `t`.
    auto scalar_param = [&](int arg, IOperand* op, IElem t) -> IntParam* {
      int64_t v;
      if (arg >= static_cast<int>(n.args.size()) || !int_scalar(n.args[arg], &v)) return nullptr;
      IntParam prm;
      prm.pos = static_cast<int>(p);
      prm.arg = arg;
      prm.type = t;
      prm.integral = true;
      param_operand(prm, op);
      return &il->params.back();
    };
    auto operand = [&](int arg, IOperand* op, IElem want) -> bool {
      for (const auto& in : n.inputs) {
        if (in.arg != arg || in.elem >= 0) continue;  // (an in-place op's self is read too)
        return tensor_operand(p, in.ref, op, want);
      }
      return scalar_param(arg, op, want) != nullptr;
    };
    auto tensor_arg = [&](int arg, IOperand* op, IElem want) {
      return operand(arg, op, want) && op->kind != IOperand::kConst;
    };
    IInstr ins;
    ins.fn = lw->fn;
    ins.src = ct;
    switch (lw->form) {
      case IForm::kUnary:
        if (!tensor_arg(0, &ins.a, ct)) return false;
        if (ct == IElem::kBool && ins.fn == IFn::kNot) ins.fn = IFn::kLNot;
        break;
      case IForm::kBinary:
      case IForm::kCompare:
        if (!operand(0, &ins.a, ct) || !operand(1, &ins.b, ct)) return false;
        if (ins.a.kind == IOperand::kConst && ins.b.kind == IOperand::kConst) return false;
        break;
      case IForm::kLogical: {
        if (!tensor_arg(0, &ins.a, ct) || !tensor_arg(1, &ins.b, ct)) return false;
        break;
      }
      case IForm::kLogicalNot:
        if (!tensor_arg(0, &ins.a, ct)) return false;
        break;
      case IForm::kDivide:
      case IForm::kDivMode: {
        if (lw->form == IForm::kDivMode) {
          const c10::IValue& mode = n.args[2];
          if (!mode.isString()) return false;
          if (mode.toStringRef() == "trunc") {
            ins.fn = IFn::kTruncDiv;
          } else if (mode.toStringRef() != "floor") {
            return false;
          }
        }
        // The divisor is read from memory or a constant: bind checks it for zero.
        if (!tensor_arg(0, &ins.a, ct) || !operand(1, &ins.b, ct) || ins.b.kind == IOperand::kReg) return false;
        if (ins.b.kind == IOperand::kConst) {
          il->params[ins.b.index - 1].nonzero = true;
        } else {
          il->zero_checked.push_back(ins.b.index);
        }
        break;
      }
      case IForm::kAdd:
      case IForm::kSub:
      case IForm::kRsub: {
        const bool rsub = lw->form == IForm::kRsub;
        if (!operand(rsub ? 1 : 0, &ins.a, ct) || !operand(rsub ? 0 : 1, &ins.b, ct)) return false;
        if (ins.a.kind == IOperand::kConst && ins.b.kind == IOperand::kConst) return false;
        // alpha as the op's type, checked as CPU's Scalar::to<T> (a bool alpha raises: op by op).
        if (n.args[2].isScalar() && n.args[2].toScalar().isBoolean()) return false;
        IntParam* alpha = scalar_param(2, &ins.c, ct);
        if (!alpha) return false;
        alpha->fits = true;
        alpha->negate = lw->form != IForm::kAdd;
        break;
      }
      case IForm::kWhere:
        if (!tensor_arg(0, &ins.a, IElem::kBool) || !operand(1, &ins.b, ct) || !operand(2, &ins.c, ct)) return false;
        break;
      case IForm::kMaskedFill: {
        // CPU's kernel stores the value converted with Scalar::to<T> (raises when it overflows T).
        if (!tensor_arg(1, &ins.a, IElem::kBool) || !tensor_arg(0, &ins.c, ct)) return false;
        IntParam* v = scalar_param(2, &ins.b, ct);
        if (!v) return false;
        v->fits = true;
        break;
      }
      case IForm::kClamp:
      case IForm::kClampOne: {
        if (!tensor_arg(0, &ins.a, ct)) return false;
        const bool one = lw->form == IForm::kClampOne;
        const bool has_min = one ? lw->fn == IFn::kMax : !n.args[1].isNone();
        const bool has_max = one ? lw->fn == IFn::kMin : !n.args[2].isNone();
        if (!has_min && !has_max) return false;
        IOperand lo, hi;
        if (has_min && !operand(1, &lo, ct)) return false;
        if (has_max && !operand(one ? 1 : 2, &hi, ct)) return false;
        // CPU's clamp kernels convert Scalar bounds with Scalar::to<T> (raises on overflow).
        for (const IOperand* o : {&lo, &hi})
          if (o->kind == IOperand::kConst && o->index > 0) il->params[o->index - 1].fits = true;
        if (has_min && has_max) {
          IInstr first;
          first.fn = IFn::kMax;
          first.type = ct;
          first.src = ct;
          first.a = ins.a;
          first.b = lo;
          ins.fn = IFn::kMin;
          ins.a = temp(first);
          ins.b = hi;
        } else {
          ins.fn = has_min ? IFn::kMax : IFn::kMin;
          ins.b = has_min ? lo : hi;
        }
        break;
      }
      case IForm::kPowScalar: {
        // The exponent as the op's type, checked as CPU's Scalar::to<T> (int32: raises when it overflows).
        if (!tensor_arg(0, &ins.a, ct)) return false;
        IntParam* e = scalar_param(1, &ins.b, ct);
        if (!e || !n.args[1].isScalar() || n.args[1].toScalar().isBoolean()) return false;
        e->fits = true;
        break;
      }
      case IForm::kCopy: {
        // copy_(self, src): src of self's shape (or broadcast along leading dims).
        if (!self_in) return false;
        if (ct == IElem::kFloat) {
          if (ot == IElem::kFloat) return false;
          ins.fn = IFn::kCvtF;
        }
        if (!tensor_arg(1, &ins.a, ct)) return false;
        if (ct == IElem::kFloat && ext_of[ins.a.index].period != 0) return false;  // kCvtF reads it in place
        break;
      }
    }
    if (!define(ins, out, out_slot, k)) return false;
  }
  if (program.empty() || !shape) return false;
  fused::IntProgram& prog = il->prog;
  const int64_t numel = c10::multiply_integers(*shape);
  for (const External& e : ext_of) plan->read += (e.period > 0 ? e.period : numel) * isize(e.elem);
  for (IElem t : out_types) plan->written_bytes += numel * isize(t);
  // Registers: one per value, renamed so that one is reused once its value is dead.
  prog.regs = fused::rename_registers(program, static_cast<IOperand*>(nullptr), true);
  prog.instrs = std::move(program);
  prog.numel = numel;
  prog.externals.assign(ext_of.size(), nullptr);
  for (const External& e : ext_of) {
    prog.period.push_back(e.period);
    prog.ext_type.push_back(e.elem);
  }
  prog.outputs.assign(out_types.size(), nullptr);
  prog.out_type = std::move(out_types);
  plan->int_loop = std::move(il);
  return true;
}

bool bind_int_loop(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem) {
  plan.written.clear();
  IntLoop& il = *plan.int_loop;
  for (const Slot& s : plan.written_inputs)
    if (mem.is_temp(slot_storage(s, region, graph, mem))) return false;
  std::vector<int64_t> v(il.params.size());
  for (size_t i = 0; i < il.params.size(); ++i)
    if (!int_param_value(il.params[i], region, graph, mem, &v[i])) return false;
  for (fused::IInstr& ins : il.prog.instrs)
    for (IOperand* o : {&ins.a, &ins.b, &ins.c})
      if (o->kind == IOperand::kConst && o->index > 0) o->value = v[o->index - 1];
  for (size_t i = 0; i < plan.externals.size(); ++i) {
    size_t nbytes;
    il.prog.externals[i] = mem.data_for(slot_storage(plan.externals[i], region, graph, mem), &nbytes);
  }
  // A zero divisor: the ops run op by op, where CPU's kernel raises.
  for (int e : il.zero_checked) {
    const int64_t n = il.prog.period[e] > 0 ? il.prog.period[e] : il.prog.numel;
    const void* d = il.prog.externals[e];
    const bool zero = il.prog.ext_type[e] == IElem::kInt64   ? has_zero(static_cast<const int64_t*>(d), n)
                      : il.prog.ext_type[e] == IElem::kInt32 ? has_zero(static_cast<const int32_t*>(d), n)
                                                             : has_zero(static_cast<const uint8_t*>(d), n);
    if (zero) return false;
  }
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    DeferredStorage* st = slot_storage(plan.outputs[i], region, graph, mem);
    plan.written.push_back(st);
    size_t nbytes;
    il.prog.outputs[i] = mem.device_data(st, &nbytes);
  }
  return true;
}

void run_int_loop(LoopPlan& plan, RegionStats& stats) {
  for (DeferredStorage* s : plan.written) s->error = nullptr;
  fused::run_int(plan.int_loop->prog);
  stats.bytes_read += plan.read;
  stats.bytes_written += plan.written_bytes;
}

}  // namespace tpu
}  // namespace tpu_eager
