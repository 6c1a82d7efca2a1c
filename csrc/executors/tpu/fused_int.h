// Integer fused loops: elementwise regions over int64 / int32 / bool values
// (index math, masks, casts), computed as CPU's kernels compute them.
//
// A loop's values live in int64 tile registers. An int32 value is kept
// sign-extended and wrapped to 32 bits after every operation (CPU's int32
// kernels compute modulo 2^32; the low 32 bits of the int64 result are the
// same for add, sub, mul, neg, bitwise ops and left shifts), a bool value is
// 0 / 1. Casts (copy_ between int64, int32, bool and float32) convert as
// CPU's `to` does on x86. The loop is planned once per layout
// (plan_int_loop) and bound per run (bind_int_loop), as the float32 loop of
// fused_elementwise.h; fused_elementwise.cpp dispatches to these functions.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "executors/executor.h"

namespace tpu_eager {
namespace tpu {

struct LoopPlan;
struct Slot;

namespace fused {

// The element type of a buffer an integer loop reads or writes. kFloat:
// float32, only as a cast's source (read) or result (written).
enum class IElem : uint8_t { kInt64, kInt32, kBool, kFloat };

// Integer loop functions; `t` below is the instruction's type (IInstr::type).
//   kAdd       a + c * b (add / sub / rsub with alpha c), wrapping in t
//   kMul, kNeg, kAbs        wrapping in t (abs(INT_MIN) = INT_MIN, as CPU)
//   kMax, kMin maximum / minimum; clamp is kMax then kMin (CPU's clamp: min(max(a, lo), hi))
//   kSelect    a != 0 ? b : c (where.self)
//   kEq .. kGe a OP b as 0 / 1
//   kAnd, kOr, kXor, kNot   bitwise (kNot: ~a; on bool: !a)
//   kLAnd, kLOr, kLXor, kLNot  logical: of a != 0 and b != 0, as 0 / 1
//   kShl, kShr CPU's shifts: a shift count < 0 or >= the bits of t gives 0
//              (left) or a >> (bits - 1) (right)
//   kFloorDiv  c10::div_floor_integer; kTruncDiv a / b; kRemainder the
//              remainder with the divisor's sign (Python's %); kFmod a % b.
//              b == -1: -a and 0 (no trap; CPU gives these, e.g. INT64_MIN // -1
//              = INT64_MIN). b == 0 never runs: bind checks divisors and runs
//              the ops op by op, where CPU's kernel raises "ZeroDivisionError".
//   kCvtF      a float32 external converted to t as CPU's static_cast on x86
//              (cvtt: NaN and values outside t's range give t's minimum;
//              to bool: a != 0, NaN is true)
//   kCopy      a converted to t (int64 -> int32 keeps the low 32 bits, -> bool a != 0)
//   kSign      (0 < a) - (a < 0)
//   kPow       a ** b by squaring, wrapping in t (ATen's powi; b < 0: 1 for a == 1,
//              +-1 for a == -1, else 0); modulo 2^bits the product's order does not matter
enum class IFn : uint8_t {
  kAdd,
  kMul,
  kNeg,
  kAbs,
  kMax,
  kMin,
  kSelect,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kXor,
  kNot,
  kLAnd,
  kLOr,
  kLXor,
  kLNot,
  kShl,
  kShr,
  kFloorDiv,
  kTruncDiv,
  kRemainder,
  kFmod,
  kCvtF,
  kCopy,
  kSign,
  kPow,
};

// An operand: a register, an external buffer (Program::externals) or a
// constant (index > 0: runtime parameter index - 1, bound per run).
struct IOperand {
  enum Kind : uint8_t { kReg, kExternal, kConst } kind = kConst;
  int index = 0;
  int64_t value = 0;
};

struct IInstr {
  IFn fn = IFn::kAdd;
  IElem type = IElem::kInt64;  // the result's type: kInt32 wraps, kBool is 0 / 1 (kFloat: kCopy to float32)
  IElem src = IElem::kInt64;   // the type the operands compute in (shift widths, comparisons)
  int dst = -1;
  IOperand a, b, c;
  int out = -1;  // output it is also stored to (converted to its type), or -1
};

// An integer loop program over `numel` elements.
struct IntProgram {
  std::vector<IInstr> instrs;
  int regs = 0;
  int64_t numel = 0;
  std::vector<const void*> externals;
  std::vector<IElem> ext_type;
  std::vector<int64_t> period;  // per external: broadcast period (0: numel elements), as Program::period
  std::vector<void*> outputs;
  std::vector<IElem> out_type;
};

// Runs the program over tiles of 512 elements split across torch's intra-op
// threads (at::parallel_for, ATen's grain of 32,768 elements).
void run_int(const IntProgram& p);

}  // namespace fused

// A runtime scalar of an integer loop: a Scalar argument (`arg`) or a 0-dim
// integer tensor (`input`) of the node at `pos`, wrapped to the op's type.
struct IntParam {
  int pos = -1;
  int arg = -1;
  int input = -1;
  fused::IElem type = fused::IElem::kInt64;
  bool negate = false;    // sub's alpha
  bool nonzero = false;   // guard: a divisor (zero: op by op, where CPU raises)
  bool fits = false;      // guard: the value fits the type unwrapped (alpha: CPU's Scalar::to<T> checks)
  bool integral = false;  // guard: the Scalar is an integer or bool (a float one: op by op)
};

// The integer form of a LoopPlan (LoopPlan::int_loop).
struct IntLoop {
  fused::IntProgram prog;
  std::vector<IntParam> params;
  std::vector<int> zero_checked;  // externals that are divisors: scanned for zero when bound
};

// Whether graph[i]'s op belongs in an integer loop (an int32 / int64 tensor
// among its operands or results): 1; a pure bool logic op (either loop): 2;
// 0: a float loop. Partition keeps loops of one kind (FusionRules::loop_domain).
int int_loop_domain(const Node& n);

// Plans the ops at positions `ps` of `region` as one integer loop (the
// vocabulary of kIntLowerings in fused_int.cpp); false when an op, a type or
// a layout is not supported (the ops then run op by op, as CPU's kernels).
bool plan_int_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph, LoopPlan* plan);
// Binds an integer plan: buffers, parameters and their guards, divisor
// checks. False: run op by op.
bool bind_int_loop(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem);
void run_int_loop(LoopPlan& plan, RegionStats& stats);

}  // namespace tpu
}  // namespace tpu_eager
