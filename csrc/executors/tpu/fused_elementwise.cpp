// The fused elementwise loop: a tiny register program run over tiles.
//
// The tile loops use ATen's AVX2 vector type, which calls the same SLEEF
// routines as CPU's vectorized kernels (so results match CPU's to the ulp
// that their different loop tails may change). This file alone is compiled
// for AVX2+FMA; run_fused_elementwise checks the CPU at run time.
#pragma GCC target("avx2,fma")
// The pragma enables the instructions; SLEEF's header also looks at the macros.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
#include "executors/tpu/fused_elementwise.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstring>
#include <string>
#include <unordered_map>

#include <ATen/Parallel.h>

namespace tpu_eager {
namespace tpu {
namespace {

enum class Fn : uint8_t { kAdd, kMul, kDiv, kNeg, kAbs, kRelu, kExp, kLog, kSin, kCos, kTanh, kSigmoid, kSqrt,
                          kRsqrt, kReciprocal };

// An operand: a tile register, an external (device) buffer, or a constant.
struct Operand {
  enum Kind : uint8_t { kReg, kExternal, kConst } kind = kConst;
  int index = 0;       // register or external index
  float value = 0.0f;  // constant
};

struct Instr {
  Fn fn;
  int dst;             // register
  Operand a, b;
  float alpha = 1.0f;  // add/sub: a + alpha * b (one rounding, like CPU's fused multiply-add)
  int out = -1;        // index of the materialized output it writes, or -1
};

bool unary_fn(const std::string& name, Fn* fn) {
  static const std::unordered_map<std::string, Fn> table = {
      {"neg", Fn::kNeg},   {"abs", Fn::kAbs},   {"relu", Fn::kRelu},         {"exp", Fn::kExp},
      {"log", Fn::kLog},   {"sin", Fn::kSin},   {"cos", Fn::kCos},           {"tanh", Fn::kTanh},
      {"sigmoid", Fn::kSigmoid}, {"sqrt", Fn::kSqrt}, {"rsqrt", Fn::kRsqrt}, {"reciprocal", Fn::kReciprocal}};
  auto it = table.find(name);
  if (it == table.end()) return false;
  *fn = it->second;
  return true;
}

bool is_contiguous(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

using Vec = at::vec::Vectorized<float>;

template <Fn F>
inline Vec apply(const Vec& a, const Vec& b, const Vec& alpha, bool unit_alpha) {
  if constexpr (F == Fn::kAdd) return unit_alpha ? a + b : at::vec::fmadd(b, alpha, a);
  if constexpr (F == Fn::kMul) return a * b;
  if constexpr (F == Fn::kDiv) return a / b;
  if constexpr (F == Fn::kNeg) return a.neg();
  if constexpr (F == Fn::kAbs) return a.abs();
  if constexpr (F == Fn::kRelu) return at::vec::clamp_min(a, Vec(0.0f));
  if constexpr (F == Fn::kExp) return a.exp();
  if constexpr (F == Fn::kLog) return a.log();
  if constexpr (F == Fn::kSin) return a.sin();
  if constexpr (F == Fn::kCos) return a.cos();
  if constexpr (F == Fn::kTanh) return a.tanh();
  if constexpr (F == Fn::kSigmoid) return ((Vec(0.0f) - a).exp() + Vec(1.0f)).reciprocal();  // as CPU's kernel
  if constexpr (F == Fn::kSqrt) return a.sqrt();
  if constexpr (F == Fn::kRsqrt) return a.rsqrt();
  if constexpr (F == Fn::kReciprocal) return a.reciprocal();
  return a;
}

// One loop per instruction keeps each tight; the tail uses a partial vector.
template <Fn F>
void run_tile(float* d, const float* a, const float* b, float av, float bv, float alpha, int64_t n) {
  const Vec va(av), vb(bv), valpha(alpha);
  const bool unit = alpha == 1.0f;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec x = a ? Vec::loadu(a + i) : va;
    const Vec y = b ? Vec::loadu(b + i) : vb;
    apply<F>(x, y, valpha, unit).store(d + i);
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    const Vec x = a ? Vec::loadu(a + i, rest) : va;
    const Vec y = b ? Vec::loadu(b + i, rest) : vb;
    apply<F>(x, y, valpha, unit).store(d + i, rest);
  }
}

void run_instr(const Instr& in, float* d, const float* a, const float* b, int64_t n) {
  const float av = in.a.value, bv = in.b.value;
  switch (in.fn) {
#define CASE(F) \
  case Fn::F: run_tile<Fn::F>(d, a, b, av, bv, in.alpha, n); break;
    CASE(kAdd) CASE(kMul) CASE(kDiv) CASE(kNeg) CASE(kAbs) CASE(kRelu) CASE(kExp) CASE(kLog) CASE(kSin) CASE(kCos)
    CASE(kTanh) CASE(kSigmoid) CASE(kSqrt) CASE(kRsqrt) CASE(kReciprocal)
#undef CASE
  }
}

// A scalar argument (Python number or 0-dim tensor) as a float constant.
bool scalar_operand(const c10::IValue& v, Operand* op) {
  if (v.isScalar()) {
    const auto s = v.toScalar();
    if (s.isComplex()) return false;
    op->kind = Operand::kConst;
    op->value = s.toFloat();
    return true;
  }
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().dim() == 0 && v.toTensor().device().is_cpu() &&
      !v.toTensor().is_complex()) {
    op->kind = Operand::kConst;
    op->value = v.toTensor().item<float>();
    return true;
  }
  return false;
}

}  // namespace

bool run_fused_elementwise(const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                           RegionStats& stats) {
  static const bool cpu_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!cpu_ok || region.nodes.size() < 2) return false;
  const std::vector<int64_t>* shape = nullptr;
  std::unordered_map<const DeferredStorage*, int> reg_of;  // region value -> register
  std::vector<at::Tensor> externals;
  std::unordered_map<const DeferredStorage*, int> ext_of;
  std::vector<Instr> program;
  std::vector<std::pair<TensorRef, int>> outputs;  // materialized outputs and their registers
  int regs = 0;

  auto tensor_operand = [&](const TensorRef& r, Operand* op) -> bool {
    if (r.dtype != at::kFloat || r.conj || r.neg) return false;
    auto it = reg_of.find(r.storage.get());
    if (r.sizes.empty() && it == reg_of.end()) {  // a 0-dim device tensor: a runtime constant
      op->kind = Operand::kConst;
      op->value = mem.tensor(r).item<float>();
      return true;
    }
    if (r.sizes != *shape || r.offset != 0 || !is_contiguous(r.sizes, r.strides)) return false;
    if (it != reg_of.end()) {
      op->kind = Operand::kReg;
      op->index = it->second;
      return true;
    }
    auto e = ext_of.find(r.storage.get());
    if (e == ext_of.end()) {
      e = ext_of.emplace(r.storage.get(), static_cast<int>(externals.size())).first;
      externals.push_back(mem.tensor(r));
    }
    op->kind = Operand::kExternal;
    op->index = e->second;
    return true;
  };

  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    const auto& schema = n.op.schema();
    if (schema.is_mutable() || n.outputs.size() != 1 || n.outputs[0].dtype != at::kFloat) return false;
    const TensorRef& out = n.outputs[0];
    if (!shape) shape = &out.sizes;
    if (out.sizes != *shape || out.offset != 0 || !is_contiguous(out.sizes, out.strides)) return false;
    const std::string name = schema.name().substr(6);
    const std::string& overload = schema.overload_name();
    // Arguments by position: tensors come from n.inputs, the rest from n.args.
    auto operand = [&](int arg, Operand* op) -> bool {
      for (const auto& in : n.inputs)
        if (in.arg == arg && in.elem < 0) return tensor_operand(in.ref, op);
      return scalar_operand(n.args[arg], op);
    };
    Instr ins;
    if (name == "add" || name == "sub" || name == "mul" || name == "div") {
      if (overload != "Tensor" && overload != "Scalar") return false;
      if (!operand(0, &ins.a) || !operand(1, &ins.b) || ins.a.kind == Operand::kConst) return false;
      ins.fn = name == "mul" ? Fn::kMul : name == "div" ? Fn::kDiv : Fn::kAdd;
      if (name == "add" || name == "sub") {
        Operand alpha;
        if (!scalar_operand(n.args[2], &alpha)) return false;
        ins.alpha = name == "sub" ? -alpha.value : alpha.value;
      }
    } else if (overload.empty() && unary_fn(name, &ins.fn)) {
      if (!operand(0, &ins.a) || ins.a.kind == Operand::kConst) return false;
    } else {
      return false;
    }
    ins.dst = regs++;
    reg_of[out.storage.get()] = ins.dst;
    if (region.materialize[p][0]) {
      ins.out = static_cast<int>(outputs.size());
      outputs.emplace_back(out, ins.dst);
    }
    program.push_back(ins);
  }

  // Device pointers of the materialized outputs (fresh, contiguous, offset 0).
  std::vector<float*> out_ptr;
  for (auto& o : outputs) {
    DeferredStorage* s = o.first.storage.get();
    out_ptr.push_back(static_cast<float*>(mem.device_buffer(s).mutable_data()));
    s->error = nullptr;
  }
  std::vector<const float*> ext_ptr;
  for (auto& e : externals) ext_ptr.push_back(e.data_ptr<float>());

  int64_t numel = 1;
  for (auto s : *shape) numel *= s;
  constexpr int64_t kTile = 1024;  // 4 KB per register: a region's registers stay in L1/L2
  const int64_t tiles = (numel + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(static_cast<size_t>(regs) * kTile);
    auto src = [&](const Operand& o, int64_t base) -> const float* {
      if (o.kind == Operand::kReg) return scratch.data() + o.index * kTile;
      if (o.kind == Operand::kExternal) return ext_ptr[o.index] + base;
      return nullptr;
    };
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t base = t * kTile, len = std::min(kTile, numel - base);
      for (const Instr& in : program) {
        float* d = scratch.data() + in.dst * kTile;
        run_instr(in, d, src(in.a, base), in.fn <= Fn::kDiv ? src(in.b, base) : nullptr, len);
        if (in.out >= 0) std::memcpy(out_ptr[in.out] + base, d, static_cast<size_t>(len) * sizeof(float));
      }
    }
  });

  for (auto& e : externals) stats.bytes_read += e.numel() * 4;
  stats.bytes_written += static_cast<int64_t>(outputs.size()) * numel * 4;
  return true;
}

}  // namespace tpu
}  // namespace tpu_eager
