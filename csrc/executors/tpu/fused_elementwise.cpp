// Fused elementwise regions: planning the register program of a region
// (the tile loops are in fused_kernels_*.cpp, one per instruction set).
#include "executors/tpu/fused_elementwise.h"

#include <ATen/Version.h>
#include <c10/util/accumulate.h>

#include "executors/direct_kernels.h"
#include "executors/tpu/cpu_vml.h"
#include "executors/tpu/fused_program.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>


namespace tpu_eager {
namespace tpu {
namespace {

using fused::Fn;
using fused::Instr;
using fused::Operand;

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
    op->kind = Operand::kConst;
    op->value = as_float(v.toTensor().item());
    return true;
  }
  return false;
}

// _softmax / _log_softmax / logsumexp over the last dim of a float32 tensor of
// shape `sizes`, as CPU computes them.
bool row_anchor(const std::string& name, const Node& n, c10::IntArrayRef sizes, fused::RowOp* op) {
  int64_t dim = 0;
  if (name == "_softmax" || name == "_log_softmax") {
    if (!n.args[1].isInt() || !n.args[2].isBool() || n.args[2].toBool()) return false;
    *op = name == "_softmax" ? fused::RowOp::kSoftmax : fused::RowOp::kLogSoftmax;
    dim = n.args[1].toInt();
  } else if (name == "logsumexp") {
    if (!tpu::vml::available() || !n.args[1].isIntList() || n.args[1].toIntList().size() != 1) return false;
    *op = fused::RowOp::kLogSumExp;
    dim = n.args[1].toIntList().get(0);
    // A single row of at least GRAIN_SIZE (32,768) floats: CPU's sum splits it
    // between threads (two-pass reduction), an order the row loop does not follow.
    if (!sizes.empty() && sizes.back() >= 32768 && c10::multiply_integers(sizes) == sizes.back()) return false;
  } else {
    return false;
  }
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  return ndim > 0 && (dim == ndim - 1 || dim == -1);
}

// native_layer_norm's normalized_shape as `cols`, the product of the trailing
// dims of `shape` it must equal (false otherwise: CPU's path raises or runs it).
bool layer_norm_cols(const Node& n, c10::IntArrayRef shape, int64_t* cols) {
  if (!n.op.schema().overload_name().empty() || n.outputs.size() != 3 || !n.args[1].isIntList() ||
      !n.args[4].isDouble())
    return false;
  const auto normalized = n.args[1].toIntVector();
  if (normalized.empty() || normalized.size() > shape.size()) return false;
  if (!std::equal(normalized.begin(), normalized.end(), shape.end() - normalized.size())) return false;
  *cols = c10::multiply_integers(normalized);
  for (const auto& o : n.outputs)
    if (o.dtype != at::kFloat || o.offset != 0 || !o.is_dense()) return false;
  return true;
}

}  // namespace

bool run_fused_elementwise(const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                           RegionStats& stats) {
  // The loops match CPU's kernels of the same capability: use the one ATen uses.
  static const bool cpu_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // The capability ATen runs (the CPU's best unless ATEN_CPU_CAPABILITY asks for less).
  static const std::string aten_cap = at::get_cpu_capability();  // "AVX512", "AVX2" or "DEFAULT"
  static const bool use_avx512 = aten_cap == "AVX512";
  // At DEFAULT, CPU's softmax kernels compute lane by lane with libm: only the
  // AVX2 / AVX512 row loops are theirs.
  static const bool vector_softmax = aten_cap == "AVX2" || aten_cap == "AVX512";
  if (!cpu_ok || region.nodes.empty()) return false;
  // An input that failed earlier: op by op (run_ops), where only the ops that
  // read it fail.
  for (int i : region.nodes)
    for (const auto& in : graph[i].inputs)
      if (in.ref.storage->error) return false;
  // A single elementwise op gains nothing from the loop (CPU's kernel writes
  // the device buffer directly); a single row reduction still runs here.
  if (region.nodes.size() == 1 && static_cast<PrimKind>(graph[region.nodes[0]].kind) != PrimKind::kReduction)
    return false;
  const Dims* shape = nullptr;
  std::unordered_map<const DeferredStorage*, Operand> reg_of;  // region value -> register or output
  std::vector<at::Tensor> externals;
  std::unordered_map<const DeferredStorage*, int> ext_of;
  std::vector<Instr> program;
  std::vector<TensorRef> outputs;  // materialized outputs, in instruction order
  int regs = 0;  // one per non-materialized value until assign_registers renames them

  auto tensor_operand = [&](const TensorRef& r, Operand* op) -> bool {
    if (r.dtype != at::kFloat || r.conj || r.neg) return false;
    auto it = reg_of.find(r.storage.get());
    if (r.sizes.empty() && it == reg_of.end()) {  // a 0-dim device tensor: a runtime constant
      op->kind = Operand::kConst;
      op->value = mem.tensor(r).item<float>();
      return true;
    }
    if (r.sizes != *shape || r.offset != 0 || !r.is_dense()) return false;
    if (it != reg_of.end()) {
      *op = it->second;
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

  bool has_anchor = false;
  fused::RowAnchor anchor;
  std::vector<at::Tensor> ln_params;  // layer_norm's weight / bias
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    const auto& schema = n.op.schema();
    if (p + 1 == region.nodes.size() && schema.name() == "aten::native_layer_norm") {
      // The region's last op normalizes rows of the program's last value (or of an input).
      if (!shape) shape = &n.outputs[0].sizes;
      // The row kernel of the capability CPU's layer_norm runs (none for DEFAULT).
      static const std::string cap = host::layer_norm_kernel_capability();
      anchor.ln_row = cap == "AVX512" ? &fused::layer_norm_row_avx512
                      : cap == "AVX2" ? &fused::layer_norm_row_avx2
                                      : nullptr;
      if (!anchor.ln_row || !region.materialize[p][0]) return false;
      if (n.outputs[0].sizes != *shape || !layer_norm_cols(n, *shape, &anchor.cols)) return false;
      for (const auto& in : n.inputs) {
        if (in.elem >= 0) return false;
        if (in.arg == 0) {
          if (!tensor_operand(in.ref, &anchor.in) || anchor.in.kind == Operand::kConst) return false;
          continue;
        }
        const TensorRef& r = in.ref;
        if ((in.arg != 2 && in.arg != 3) || r.dtype != at::kFloat || r.conj || r.neg || !r.is_dense() ||
            c10::multiply_integers(r.sizes) != anchor.cols || reg_of.count(r.storage.get()))
          return false;
        ln_params.push_back(mem.tensor(r));
        (in.arg == 2 ? anchor.gamma : anchor.beta) = ln_params.back().data_ptr<float>();
      }
      if (anchor.in.kind == Operand::kConst) return false;  // no input slot
      // Alone with weight and bias it is CPU's own kernel that the existing
      // path calls (direct_kernels), ~8% faster than this loop on 4096x1024,
      // unless this loop streams its output (Program::stream), which CPU's
      // kernel does not; without them CPU's kernel takes a scalar loop and
      // this one is ~1.7x faster.
      if (program.empty() && anchor.gamma && anchor.beta &&
          2 * c10::multiply_integers(*shape) * static_cast<int64_t>(sizeof(float)) < fused::stream_store_threshold())
        return false;
      anchor.op = fused::RowOp::kLayerNorm;
      anchor.eps = static_cast<float>(n.args[4].toDouble());  // CPU's kernel takes eps as the input's type
      anchor.rows = anchor.cols ? c10::multiply_integers(*shape) / anchor.cols : 0;
      has_anchor = true;
      break;
    }
    if (schema.is_mutable() || n.outputs.size() != 1 || n.outputs[0].dtype != at::kFloat) return false;
    const TensorRef& out = n.outputs[0];
    const std::string name = schema.name().substr(6);
    // The shape the op iterates over: logsumexp's input (its output has one value per row).
    const auto& sizes = name == "logsumexp" && n.inputs.size() == 1 ? n.inputs[0].ref.sizes : out.sizes;
    if (!shape) shape = &sizes;
    if (sizes != *shape || out.offset != 0 || !out.is_dense()) return false;
    const std::string& overload = schema.overload_name();
    if (p + 1 == region.nodes.size() && row_anchor(name, n, sizes, &anchor.op)) {
      // The region's last op reduces rows of the program's last value (or of an input).
      if (!region.materialize[p][0] || n.inputs.size() != 1 || n.inputs[0].arg != 0) return false;
      if (!vector_softmax && (anchor.op == fused::RowOp::kSoftmax || anchor.op == fused::RowOp::kLogSoftmax))
        return false;
      if (!tensor_operand(n.inputs[0].ref, &anchor.in) || anchor.in.kind == Operand::kConst) return false;
      anchor.cols = shape->back();
      anchor.rows = anchor.cols ? c10::multiply_integers(*shape) / anchor.cols : 0;
      has_anchor = true;
      break;
    }
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
    Operand value;
    if (region.materialize[p][0]) {  // written straight into its device buffer
      ins.out = static_cast<int>(outputs.size());
      outputs.push_back(out);
      value.kind = Operand::kOutput;
      value.index = ins.out;
    } else {
      ins.dst = regs++;
      value.kind = Operand::kReg;
      value.index = ins.dst;
    }
    reg_of[out.storage.get()] = value;
    program.push_back(ins);
  }

  // Device pointers of the materialized outputs (fresh, contiguous, offset 0).
  std::vector<float*> out_ptr;
  for (auto& o : outputs) {
    DeferredStorage* s = o.storage.get();
    out_ptr.push_back(static_cast<float*>(mem.device_buffer(s).mutable_data()));
    s->error = nullptr;
  }
  std::vector<const float*> ext_ptr;
  for (auto& e : externals) ext_ptr.push_back(e.data_ptr<float>());

  if (!has_anchor && program.empty()) return false;
  if (has_anchor && anchor.rows * anchor.cols == 0) return false;
  const int64_t numel = c10::multiply_integers(*shape);
  if (has_anchor) {
    DeferredStorage* s = graph[region.nodes.back()].outputs[0].storage.get();
    anchor.out = static_cast<float*>(mem.device_buffer(s).mutable_data());
    s->error = nullptr;
  }
  int64_t stat_bytes = 0;  // layer_norm's materialized mean / rstd
  if (has_anchor && anchor.op == fused::RowOp::kLayerNorm) {
    const Node& n = graph[region.nodes.back()];
    for (int j = 1; j <= 2; ++j) {
      if (!region.materialize[region.nodes.size() - 1][j]) continue;
      DeferredStorage* s = n.outputs[j].storage.get();
      (j == 1 ? anchor.mean : anchor.rstd) = static_cast<float*>(mem.device_buffer(s).mutable_data());
      s->error = nullptr;
      stat_bytes += anchor.rows * 4;
    }
  }
  // Bytes the loop reads and writes: the counters, and whether it streams its outputs.
  int64_t read = 0, written = static_cast<int64_t>(outputs.size()) * numel * 4 + stat_bytes;
  for (auto& e : externals) read += e.numel() * 4;
  for (auto& e : ln_params) read += e.numel() * 4;
  if (has_anchor) written += (anchor.op == fused::RowOp::kLogSumExp ? anchor.rows : numel) * 4;
  fused::Program prog;
  prog.stream = read + written >= fused::stream_store_threshold();
  prog.regs = fused::assign_registers(program, has_anchor ? &anchor.in : nullptr);
  prog.instrs = std::move(program);
  prog.numel = numel;
  prog.externals = std::move(ext_ptr);
  prog.outputs = std::move(out_ptr);
  if (has_anchor) {
    if (use_avx512) {
      fused::run_rows_avx512(prog, anchor);
    } else {
      fused::run_rows_avx2(prog, anchor);
    }
  } else if (use_avx512) {
    fused::run_avx512(prog);
  } else {
    fused::run_avx2(prog);
  }

  stats.bytes_read += read;
  stats.bytes_written += written;
  return true;
}

}  // namespace tpu
}  // namespace tpu_eager
