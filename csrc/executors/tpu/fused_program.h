// The register program of a fused elementwise region, and its tile loop
// compiled once per instruction set (fused_kernels_avx2.cpp, _avx512.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace tpu_eager {
namespace tpu {
namespace fused {

// kFma: a * b + c with one rounding (addcmul: CPU's kernel computes
// self + value * t1 * t2 as fma(value * t1, t2, self), its compiler having
// contracted the multiply and add; measured bit-equal on torch 2.13).
// kWhere: b != 0 ? alpha : a (masked_fill with a Scalar value: b the mask as 0 / 1).
// The functions after kWhere (the wider vocabulary, lowered per op by the
// table in fused_elementwise.cpp) compute what CPU's vector kernel of the op
// computes, in float32 (see fused_kernels.inc, apply):
//   kSelect           a != 0 ? b : c (where.self: a the condition as 0 / 1)
//   kEq .. kGe        1.0f when a OP b holds, else 0.0f (a bool result)
//   kMaximum/kMinimum at::vec::maximum / minimum (NaN from either operand)
//   kClampMin/Max     at::vec::clamp_min(a, b) / clamp_max(a, b) (NaN of a propagates)
//   kThresholdBwd     b <= alpha ? 0 : a (threshold_backward: a the gradient, b self)
//   kSigmoidBwd       a * (1 - b) * b, kTanhBwd a * (1 - b * b) (b the forward result)
//   kGelu, kGeluTanh  gelu(a), approximate 'none' / 'tanh'
//   kGeluBwd, kGeluTanhBwd  gelu_backward(grad a, self b)
//   kSilu             a / (1 + exp(-a)), kErf erf(a), kSign sign(a)
//   kSiluBwd          silu_backward(grad a, self b): a * s * (1 + b * (1 - s)), s = 1 / (1 + exp(-b))
enum class Fn : uint8_t {
  kAdd,
  kMul,
  kDiv,
  kNeg,
  kAbs,
  kRelu,
  kExp,
  kLog,
  kSin,
  kCos,
  kTanh,
  kSigmoid,
  kSqrt,
  kRsqrt,
  kReciprocal,
  kFma,
  kWhere,
  kSelect,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kMaximum,
  kMinimum,
  kClampMin,
  kClampMax,
  kThresholdBwd,
  kSigmoidBwd,
  kTanhBwd,
  kGelu,
  kGeluTanh,
  kGeluBwd,
  kGeluTanhBwd,
  kSilu,
  kErf,
  kSign,
  kSiluBwd
};

// The element type of a buffer a loop reads or writes. Loop values are
// float32; a kBool buffer holds one byte per element (read as 0.0f / 1.0f,
// written as value != 0), kBFloat16 / kHalf buffers are widened to float32
// on read (exact) and rounded to nearest even on write, as c10::BFloat16 /
// c10::Half convert.
// kInt32 / kInt64: only an external that a cast (copy_ into a float32
// tensor) reads; staged as floats, each converted as static_cast<float>
// (to nearest even, as CPU's copy kernel converts).
enum class Elem : uint8_t { kFloat, kBool, kBFloat16, kHalf, kInt32, kInt64 };

// Conversions of n values for the tiles (fused_convert.cpp; AVX2 + F16C):
// bfloat16 / float16 bits widened to float (exact); floats rounded to
// bfloat16 / float16 (to nearest even, as CPU's vector kernels convert:
// at::vec::convert); floats rounded to the type in place, kept as float.
void widen_reduced(const uint16_t* src, float* dst, int64_t n, Elem t);
void narrow_reduced(const float* src, void* dst, int64_t n, Elem t);
void round_reduced(float* v, int64_t n, Elem t);

// An operand: a tile register, an external (device) buffer read, a
// materialized output already written by an earlier instruction, or a constant.
struct Operand {
  enum Kind : uint8_t { kReg, kExternal, kOutput, kConst } kind = kConst;
  int index = 0;       // register, external or output index
  float value = 0.0f;  // constant
};

struct Instr {
  Fn fn;
  int dst = -1;  // register written, when out < 0
  Operand a, b;
  Operand c;           // kFma's addend
  float alpha = 1.0f;  // add/sub: a + alpha * b (one rounding, like CPU's fused multiply-add); kWhere's fill value
  int out = -1;        // index of the materialized output it writes (directly, no register), or -1
  // kBFloat16 / kHalf: the value is rounded to that type (and kept as the
  // float32 it rounds to), as CPU's kernel of a bfloat16 / float16 op rounds
  // its result (or an intermediate it computes in that type); kFloat: none.
  Elem round = Elem::kFloat;
  // How CPU's kernel of the op iterated, set by plan_loop for the elements
  // CPU computes with its scalar function (for_each_cpu_tail):
  // given_out: the op wrote a tensor it was given (out=, in place), whose
  // strides order CPU's loop (a fresh result follows its input's instead);
  // cpu_op: gelu / gelu_backward (approximate='none') that the loop runs by
  // calling CPU's op per tile: where CPU's op ran oneDNN's kernel (its self
  // contiguous, of more than one element, float32 or bfloat16) and for a
  // bfloat16 / float16 gelu_backward; otherwise ATen's formula and its libm tail.
  bool given_out = false;
  bool cpu_op = false;
};

// A float32 external read through strides (Program::strided): loop element
// i, at index (i_0, ..., i_{n-1}) of the loop's shape `sizes` in row-major
// order, reads buffer element offset + sum_d i_d * strides[d] (stride 0: a
// broadcast dim). `sizes` empty: not a strided read. At most kMaxDims dims;
// `extent` is one past the largest element it reads (bind checks the buffer
// holds it).
struct StridedRead {
  static constexpr size_t kMaxDims = 8;
  int64_t offset = 0;
  int64_t extent = 0;
  std::vector<int64_t> sizes, strides;
};

// The program and where its operands live.
struct Program {
  std::vector<Instr> instrs;
  int regs = 0;
  int64_t numel = 0;
  std::vector<const void*> externals;  // contiguous device buffers read
  // Per external: a broadcast operand (its shape the loop's last dims, the
  // leading ones size 1 or absent) has `period` < numel elements, element i of
  // the loop reading element i % period; 0 when it has numel elements. An
  // external of another type than float (`ext_type`: a bool mask, bfloat16,
  // float16) is converted to float. Both are staged into a tile register of
  // floats before the tile's instructions run.
  std::vector<int64_t> period;
  std::vector<Elem> ext_type;
  // Per external (may be empty: none): a per-row value broadcast along the
  // loop's last dim (an RMSNorm's rstd of shape [..., 1] read by the
  // [..., cols] scaling) has `repeat` = cols > 0, element i of the loop
  // reading element i / repeat; staged like a broadcast operand. 0: none.
  std::vector<int64_t> repeat;
  // Per external (may be empty: none): a float32 view read through its
  // strides (StridedRead: a transposed or sliced tensor, a column half of
  // a row, a broadcast along any dim); staged like a broadcast operand.
  std::vector<StridedRead> strided;
  std::vector<void*> outputs;  // device buffers written (contiguous unless out_strided says otherwise)
  // Per output (may be empty: none): an output written through strides
  // (StridedRead's layout: loop element i goes to buffer element offset +
  // sum_d i_d * strides[d]); `sizes` empty: written densely. cat's inputs
  // land at their offsets along the cat dim this way. Computed into a
  // scratch slot, then scattered.
  std::vector<StridedRead> out_strided;
  // Per output: its element type; a value stored to an output of another
  // type than float is computed into a scratch slot, then converted.
  std::vector<Elem> out_type;
  // Write `outputs` (and a RowAnchor's `out`) with non-temporal stores: each
  // value is computed into a cache-resident tile, then streamed to memory.
  // In a softmax region only for rows of up to kSoftmaxExpRowFloats, whose
  // exp values stay in a row of their own (fused_elementwise.cpp).
  bool stream = false;
  // The run's compiled form (fused_kernels.inc: tile functions, instruction
  // groups, scratch slots), built by the first run and kept with the program
  // (its kernel's plan), so a later run only refreshes the constants it
  // copied. Not copied with the program.
  struct CompiledCache {
    std::shared_ptr<void> p;
    CompiledCache() = default;
    CompiledCache(const CompiledCache&) {}
    CompiledCache& operator=(const CompiledCache&) {
      p.reset();
      return *this;
    }
    CompiledCache(CompiledCache&&) = default;
    CompiledCache& operator=(CompiledCache&&) = default;
  };
  mutable CompiledCache compiled;
};

// Bytes a fused region must touch (inputs read + outputs written) before its
// outputs are written with non-temporal stores: when the working set exceeds
// the last-level cache, ordinary stores first read each output line from
// memory (write-allocate) and evict lines the loop still needs, so streaming
// them saves that traffic (layer_norm 4096x1024 f32, one thread: 1.28 ->
// 0.68 ms in a standalone AVX512 loop on this machine). Default: 3/4 of CPU
// 0's L3 size as Linux's sysfs gives it (/sys/devices/system/cpu/cpu0/cache;
// 32 MiB on this AMD EPYC, so 24 MiB), as glibc's memcpy starts non-temporal
// stores at 3/4 of the shared cache; 24 MiB when sysfs has no L3.
int64_t stream_store_threshold();
// Sets the threshold in bytes (tests lower it to stream small tensors); a
// negative value restores the default. Process-wide.
void set_stream_store_threshold(int64_t bytes);

// Which routines fused loops use for float32 exp, log, sin, cos, tanh and
// sqrt. kSleef: ATen's vectorized routines for log, sin and cos (at::vec:
// SLEEF's u10 log, error bound 1.0 ulp, and u35 sin and cos, 3.5 ulp, per
// SLEEF's documentation), the correctly rounded sqrt instruction (CPU's MKL
// sqrt is within 1 ulp of it), and our own
// inlined exp and tanh (exp_inline, tanh_via_exp in fused_kernels.inc; each
// within 1 ulp of CPU's). kCpu:
// the routines CPU's unary kernels call (at::vml: MKL's VML in torch's x86-64
// wheels, cpu_vml.h), so each fused value equals torch.exp(x) etc. bit for
// bit, at about twice the cost on a transcendental-heavy chain. Process-wide.
// The same choice covers float32 erf (VML's under kCpu, at::vec's under
// kSleef: within 8 float32 eps) and gelu / gelu_backward with
// approximate='none' in every type: CPU runs them through oneDNN's kernels
// for contiguous tensors, so kCpu calls CPU's op on each tile (bit-equal;
// a library call per tile), kSleef computes ATen's own at::vec formula
// (what CPU runs without oneDNN): within 16 float32 eps absolute (times
// |grad| for the backward) and one ulp in bfloat16 / float16; oneDNN also
// flushes subnormal results to zero and gives NaN for gelu(+inf), which
// kSleef does not (tests/executors/tpu/test_fused_vocab.py).
enum class MathRoutines : uint8_t { kSleef, kCpu };
void set_math_routines(MathRoutines m);
MathRoutines math_routines();

// Renames the program's registers (numbered one per value when planned) so
// that a register is reused once its value is dead; `extra_use` (may be null)
// is an operand read after the last instruction. Returns the register count.
// Fewer registers keep a tile's working set in L1 (32 KB L1d per core on this
// machine's AMD EPYC, lscpu).
int assign_registers(std::vector<Instr>& instrs, Operand* extra_use);

// The renaming of assign_registers for any program whose instructions have
// operands a, b, c (kind kReg: a register `index`), a destination register
// `dst` and an output `out` (>= 0: stored). `stored_in_register`: a stored
// value also takes a register (the integer loop computes into one, then
// stores it); otherwise it has none. Returns the register count.
template <typename I, typename O>
int rename_registers(std::vector<I>& instrs, O* extra_use, bool stored_in_register) {
  auto has_dst = [&](const I& in) { return stored_in_register || in.out < 0; };
  int planned = 0;  // last reader of each planned register (instrs.size() for extra_use)
  for (const I& in : instrs)
    if (has_dst(in)) planned = std::max(planned, in.dst + 1);
  std::vector<int> last_use(planned, -1);
  const int n = static_cast<int>(instrs.size());
  for (int i = 0; i < n; ++i)
    for (const O* o : {&instrs[i].a, &instrs[i].b, &instrs[i].c})
      if (o->kind == O::kReg) last_use[o->index] = i;
  if (extra_use && extra_use->kind == O::kReg) last_use[extra_use->index] = n;

  std::vector<int> phys(planned, -1), free_regs;
  int count = 0;
  for (int i = 0; i < n; ++i) {
    I& in = instrs[i];
    for (O* o : {&in.a, &in.b, &in.c}) {
      if (o->kind != O::kReg) continue;
      const int v = o->index;
      o->index = phys[v];
      // Freed before the destination is chosen: an elementwise pass may write
      // the register it reads (each element is read before it is written).
      if (last_use[v] == i && phys[v] >= 0) {
        free_regs.push_back(phys[v]);
        phys[v] = -1 - phys[v];  // keep it resolvable for the second operand (a * a)
      }
    }
    for (O* o : {&in.a, &in.b, &in.c})
      if (o->kind == O::kReg && o->index < 0) o->index = -1 - o->index;
    if (!has_dst(in)) continue;
    const int v = in.dst;
    if (free_regs.empty()) {
      in.dst = count++;
    } else {
      in.dst = free_regs.back();
      free_regs.pop_back();
    }
    phys[v] = in.dst;
    if (last_use[v] < 0) {  // never read: its register is free again at once
      free_regs.push_back(in.dst);
      phys[v] = -1 - in.dst;
    }
  }
  if (extra_use && extra_use->kind == O::kReg) {
    const int p = phys[extra_use->index];
    extra_use->index = p >= 0 ? p : -1 - p;
  }
  return count;
}

// Longest row whose exp values softmax_row keeps apart from y: x, the next
// row, the exp values and y's row then take at most 24 KB of the 48 KB L1d.
// Such a row's y is written once, by the scaling pass, so it can stream.
constexpr int64_t kSoftmaxExpRowFloats = 1536;

// Rows whose moments a LayerNormRowFn call takes at once, their Welford chains side by
// side (each row's values unchanged), when its block has that many rows of
// whole vectors. run_rows gives layer_norm such blocks when input and output
// fit kLayerNormMomentRowsBytes (always for rows of up to 256 floats): beyond,
// the rows' several read streams wait on memory (docs/performance.md, rows23).
constexpr int64_t kLayerNormMomentRows = 4;
constexpr int64_t kLayerNormMomentRowsBytes = int64_t{4} << 20;
// Whether run_rows gives a layer_norm of rows x cols blocks of kLayerNormMomentRows rows.
inline bool layer_norm_moment_rows(int64_t rows, int64_t cols) {
  return rows * cols * static_cast<int64_t>(2 * sizeof(float)) <= kLayerNormMomentRowsBytes;
}
// `rows` consecutive rows of native_layer_norm with the arithmetic of CPU's
// LayerNormKernel of one capability (layer_norm_row.inc): per row of `n`
// floats, y = (x - mean) * rstd * gamma + beta, (mean, var) from ATen's
// RowwiseMoments, rstd = 1 / sqrt(var + eps). x and y hold rows x n
// contiguous floats; gamma / beta (`n` floats) may be null; mean_out /
// rstd_out (`rows` floats each) may be null; `stream` writes y with
// non-temporal stores. `ahead`: rows after these that x also holds and a
// later call of this thread reads (0 when none, or when x is not the region's
// input buffer); a loop may prefetch them, or (streamed: they come from memory)
// read x in order. One call per block of rows (run_rows).
using LayerNormRowFn = void (*)(const float* x, float* y, int64_t rows, int64_t n, const float* gamma,
                                const float* beta, float eps, float* mean_out, float* rstd_out, bool stream,
                                int64_t ahead);
void layer_norm_row_avx2(const float* x, float* y, int64_t rows, int64_t n, const float* gamma, const float* beta,
                         float eps, float* mean_out, float* rstd_out, bool stream, int64_t ahead);
void layer_norm_row_avx512(const float* x, float* y, int64_t rows, int64_t n, const float* gamma, const float* beta,
                           float eps, float* mean_out, float* rstd_out, bool stream, int64_t ahead);
// CPU's AVX2 kernel's values with AVX-512 instructions (torch runs its AVX2
// layer_norm kernel on AVX-512 machines): same arguments and results as layer_norm_row_avx2.
void layer_norm_row_avx2_on_avx512(const float* x, float* y, int64_t rows, int64_t n, const float* gamma,
                                   const float* beta, float eps, float* mean_out, float* rstd_out, bool stream,
                                   int64_t ahead);

// A row reduction over the last dim that ends a region, fed by the program
// (its input is a register, an external buffer or a materialized output of
// `rows` x `cols` floats).
enum class RowOp : uint8_t {
  kSoftmax,
  kLogSoftmax,
  kLayerNorm,  // native_layer_norm over the last dims flattened to `cols`
  kLogSumExp,
  kSum,   // sum over the last dim (sum.dim_IntList): one value per row, in CPU's order
  kMean,  // mean over the last dim (mean.dim): CPU's sum, then divided by cols
};
struct RowAnchor {
  RowOp op = RowOp::kSoftmax;
  int64_t rows = 0, cols = 0;
  Operand in;
  float* out = nullptr;  // contiguous rows x cols (kLogSumExp: rows)
  // kLayerNorm: the row kernel of the capability CPU's LayerNormKernel stub
  // dispatches to (its own, not the producers'), weight / bias (`cols`
  // floats, null when None), eps rounded to float as CPU's kernel does, and
  // the per-row mean / rstd outputs (`rows` floats, null when the region does
  // not materialize them).
  LayerNormRowFn ln_row = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float eps = 0.0f;
  float* mean = nullptr;
  float* rstd = nullptr;
};

// Cross-entropy's backward as one row loop: nll_loss_backward's gradient of
// the log-probabilities (zero but at each row's target) and
// _log_softmax_backward_data on it, float32, with CPU's arithmetic:
//   g = weight[t] * grad (mean / sum; grad = -(gout / total_weight) or -gout),
//       (-weight[t]) * gout[r] (none; weight 1 without one), 0 for an ignored row;
//   sum = the row's sum of that gradient (g, +0.0 for g = -0.0 when cols > 1);
//   grad_input[r][c] = x - exp(out[r][c]) * sum, x = g at c = t, else 0,
// with SLEEF's exp (exp_as_sleef) in vectors as CPU's kernel. The mostly-zero
// gradient of the log-probabilities is never stored.
struct CrossEntropyBackward {
  int64_t rows = 0, cols = 0;
  const float* out = nullptr;       // log_softmax's result, rows x cols contiguous
  const int64_t* target = nullptr;  // rows class indices (checked in range or ignore_index when bound)
  const float* weight = nullptr;    // cols class weights, null for none
  int64_t ignore_index = -100;
  float grad = 0.0f;                 // mean / sum: -(gout / total_weight) or -gout
  const float* grad_rows = nullptr;  // none: each row's loss gradient (rows floats); null otherwise
  float* grad_input = nullptr;       // rows x cols contiguous
};
void ce_backward_avx2(const CrossEntropyBackward& a);
void ce_backward_avx512(const CrossEntropyBackward& a);

// native_layer_norm_backward (float32; weight and bias given, every
// gradient wanted) over `rows` rows of `cols`, and optionally the residual
// gradient's add after it (sum = dx + residual), as CPU's kernel computes
// them (layer_norm_backward_row.inc). All rows x cols / rows / cols
// contiguous floats; dx null when only the sum is stored.
struct LayerNormBackward {
  int64_t rows = 0, cols = 0;
  const float* dy = nullptr;
  const float* x = nullptr;
  const float* mean = nullptr;   // rows
  const float* rstd = nullptr;   // rows
  const float* gamma = nullptr;  // cols
  float* dx = nullptr;
  const float* residual = nullptr;  // the add's other operand; null: no add
  float* sum = nullptr;             // dx + residual; null: no add
  float* dgamma = nullptr;          // cols
  float* dbeta = nullptr;           // cols
};
void ln_backward_avx2(const LayerNormBackward& a);
void ln_backward_avx512(const LayerNormBackward& a);

// Runs the program over tiles of at most 1,024 floats (fewer when many
// registers are live, so that a tile's registers, inputs and outputs stay in
// L1), split across torch's intra-op threads (at::parallel_for). Each
// instruction is one pass over the tile, together with the cheap ops after it
// that read only its value (fused_kernels.inc, group_posts); a program that
// ends in Adam's / AdamW's per-parameter update runs that update as one pass
// with its intermediates in vector registers (match_adam); materialized
// values are stored by their instruction into the output (streamed when
// Program::stream).
void run_avx2(const Program& p);
void run_avx512(const Program& p);
// Runs the program over blocks of whole rows (about 32 KB per register), then
// the row reduction on each row of the block while it is still in cache: one
// pass over memory for producers + softmax / layer_norm / logsumexp instead of one per op.
void run_rows_avx2(const Program& p, const RowAnchor& a);
void run_rows_avx512(const Program& p, const RowAnchor& a);

}  // namespace fused
}  // namespace tpu
}  // namespace tpu_eager
