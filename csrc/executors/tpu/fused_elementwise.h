// Fused loops for elementwise regions (DESIGN §5): the region's ops run tile
// by tile over cache-resident buffers, and only materialized outputs reach
// device memory.
//
// Compile / run split: plan_loop() builds a loop's register program from
// the region's structure and exact layout only (no buffer, no runtime
// scalar); the TPU kernel caches it. Each run, bind_loop() fills in this
// flush's buffer addresses and runtime scalars (learning rates, 0-dim
// tensors) and checks the plan's guards; run_loop() runs it.
#pragma once

#include <string_view>
#include <vector>

#include "executors/executor.h"
#include "executors/tpu/fused_int.h"
#include "executors/tpu/fused_program.h"
#include "lazy/storage_map.h"

namespace tpu_eager {
namespace tpu {

// A tensor of a region, by position: inputs[input] (or outputs[output]) of
// the node at region position `pos`.
struct Slot {
  int pos = -1;
  int input = -1;
  int output = -1;
  // Its reference's index in Region::storage_numbers (number_slots), or -1.
  int ref = -1;
  bool valid() const { return pos >= 0; }
};

// A runtime scalar of a loop: a Scalar argument (`arg`) or a 0-dim float
// device tensor (`input`) of the node at `pos`, as the float the loop uses.
struct Param {
  enum class Transform : uint8_t { kNone, kNeg, kMinusOne };
  int pos = -1;
  int arg = -1;
  int input = -1;
  Transform transform = Transform::kNone;
  bool check_overflow = false;  // a finite Scalar that overflows float: CPU raises, the loop must not run
  int8_t abs_lt_half = -1;      // guard: |argument| < 0.5 must be (1) true, (0) false, (-1) no guard
  // The value is rounded to this type after the transform (a Scalar of a
  // bfloat16 / float16 op that CPU casts to the op's type); kFloat: none.
  fused::Elem round = fused::Elem::kFloat;
  int8_t is_one = -1;       // guard: the transformed value == 1 must be (1) true, (0) false, (-1) none
  int8_t abs_one = -1;      // guard: |transformed value| == 1 must be (1) true, (0) false, (-1) none
  bool reject_nan = false;  // guard: the value must not be NaN (a clamp bound: CPU fills NaN)
  bool has_equals = false;  // guard: the value must equal `equals` (pow's exponent)
  float equals = 0.0f;
};

struct CrossEntropyLoop;       // fused_cross_entropy.cpp
struct LayerNormBackwardLoop;  // fused_layer_norm_backward.cpp

// One fused loop of a region, planned (see plan_loop). The program's
// pointers and the constants that come from Params are set by bind_loop.
struct LoopPlan {
  std::vector<size_t> pos;  // the region positions it runs
  fused::Program prog;
  bool has_anchor = false;
  fused::RowAnchor anchor;
  std::vector<Slot> externals;  // per Program::externals: the tensor read
  std::vector<Slot> outputs;    // per Program::outputs: the tensor written
  Slot anchor_out, gamma, beta, mean, rstd;
  std::vector<Param> params;  // a kConst operand with index k > 0 takes params[k - 1]
  // The operands that take a param (kConst, index > 0), as (instruction, 0 / 1 / 2 for its
  // a / b / c), made at the first bind: a run writes these only, not every operand tested.
  std::vector<std::pair<uint32_t, uint8_t>> param_operands;
  bool param_operands_made = false;
  std::vector<std::pair<int, int>> alpha_params;  // (instruction, param): Instr::alpha
  int eps_param = -1;                             // anchor.eps
  std::vector<Slot> written_inputs;     // tensors from outside the loop it writes (must not be flush temporaries)
  int64_t read = 0, written_bytes = 0;  // bytes the loop reads and writes
  // Bound by bind_loop, for one run.
  std::vector<DeferredStorage*> written;  // storages whose device buffers the loop writes
  std::vector<at::Tensor> keep_alive;     // layer_norm's weight / bias
  // Set when the loop computes in integers (fused_int.h): it runs that
  // program instead of `prog` (externals, outputs, written_inputs and the
  // byte counts above are shared).
  std::shared_ptr<IntLoop> int_loop;
  // Set when the loop is cross-entropy's (plan_cross_entropy_loop): the
  // forward runs `prog` and its log_softmax row op, then the loss from its
  // result; the backward runs only this (no program).
  std::shared_ptr<CrossEntropyLoop> ce;
  // Set when the loop is layer_norm backward's (plan_ln_backward_loop): it runs only this.
  std::shared_ptr<LayerNormBackwardLoop> lnb;
};

// Helpers shared by the float32 and integer planners (fused_int.cpp).
// The elements per repetition of a row-major tensor of `sizes` broadcast to
// `shape` along leading dims only; 0 when it is not such a broadcast.
int64_t broadcast_period(c10::IntArrayRef sizes, c10::IntArrayRef shape);
// The tensor an op writes in place or as its out= argument; null for a
// functional op and for one that writes more than one tensor.
const InputSlot* written_slot(const Node& n);
// The form a loop can take op `n` in: its ATen name without "aten::" and
// without the in-place '_' (`name`), the tensor it writes in place or through
// out= (`w`, null for a functional op) and whether that is out= (`is_out`).
// False for a functional op without exactly one output and for a mutable op
// that writes more than one tensor, one element of a list, or self of an op
// whose name does not end in '_'.
bool loop_op_form(const Node& n, std::string_view* name, const InputSlot** w, bool* is_out);
// The input index of `r` in `n.inputs` (r is one of them), or -1.
int input_index(const Node& n, const TensorRef& r);
// Whether `overload` is one of the comma-separated `list` ("" an entry too).
bool overload_in_list(std::string_view list, std::string_view overload);
// The row of a planner's lowering table (rows with `name`, `overloads` and
// `out_overloads`) for op `name` (no in-place '_') at `overload`, or null.
template <typename Row, size_t N>
const Row* find_lowering(const Row (&table)[N], std::string_view name, std::string_view overload, bool is_out) {
  for (const Row& l : table)
    if (l.name == name) return overload_in_list(is_out ? l.out_overloads : l.overloads, overload) ? &l : nullptr;
  return nullptr;
}
// The index of the external read `e` in `ext` (compared with ==); a new one
// is appended, with its slot in `slots`: input `r` of node `n` at region
// position `pos`. -1 when r is not one of n's inputs.
template <typename E>
int external_index(std::vector<E>& ext, const E& e, const Node& n, const TensorRef& r, size_t pos,
                   std::vector<Slot>& slots) {
  for (size_t i = 0; i < ext.size(); ++i)
    if (ext[i] == e) return static_cast<int>(i);
  const int in = input_index(n, r);
  if (in < 0) return -1;
  ext.push_back(e);
  slots.push_back(Slot{static_cast<int>(pos), in, -1});
  return static_cast<int>(ext.size()) - 1;
}
// The storage of slot `s` of `region`.
DeferredStorage* slot_storage(const Slot& s, const Region& region, const std::vector<Node>& graph);
// The same for a run binding its buffers: through the region's storage
// numbers and the flush's storages by number when the JIT gave them (a run
// of a flush plan's region), else through the node's reference.
inline DeferredStorage* slot_storage(const Slot& s, const Region& region, const std::vector<Node>& graph,
                                     const host::HostMemory& mem) {
  if (s.ref >= 0 && !region.storage_numbers.empty() && mem.has_numbered())
    return mem.numbered(region.storage_numbers[s.ref]);
  return slot_storage(s, region, graph);
}
// Sets Slot::ref of the tensor slots of `plan` (planned on `region`): its
// buffers then bind through Region::storage_numbers.
void number_slots(LoopPlan& plan, const Region& region, const std::vector<Node>& graph);
// The float32 data a loop reads for input slot `s`, at its offset (bound per run).
// A layer_norm's `normalized` shape as `cols`, the product of the trailing
// dims of `shape` it must equal (false otherwise: CPU's path raises or runs it).
bool normalized_cols(c10::IntArrayRef normalized, c10::IntArrayRef shape, int64_t* cols);
const float* slot_in_data(const Slot& s, const Region& region, const std::vector<Node>& graph, host::HostMemory& mem);
// The device buffer a loop writes for slot `s`, at an input slot's offset;
// records its storage in plan.written.
float* slot_out_data(const Slot& s, const Region& region, std::vector<Node>& graph, host::HostMemory& mem,
                     LoopPlan& plan);
// Per storage a loop over the region positions `ps` writes: its last writer
// (an index into ps), whether the loop creates it (`made`) and whether it must
// then be stored (`kept`: a materialized fresh output).
struct LoopWrite {
  size_t last = 0;
  bool made = false, kept = false;
};
StorageMap<LoopWrite> loop_writes(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph);

// True when fused loops can run on this CPU (AVX2 + FMA, as CPU's kernels).
bool fused_loops_available();

// The row kernel matching CPU's native_layer_norm at this process's ATen
// capability (layer_norm_row.inc builds), or null (DEFAULT: CPU's loop is scalar).
fused::LayerNormRowFn cpu_layer_norm_row();
// Whether CPU's _softmax / _log_softmax kernels run at::vec vectors (AVX2,
// AVX512 capability; at DEFAULT they are lane by lane with libm).
bool cpu_softmax_vectorized();

// One float32 row op over the last dim, alone: `a.rows` x `a.cols`
// contiguous floats at `x` to `a.out` (contiguous), with the arithmetic of
// CPU's kernel of the op at this process's ATen capability (fused_kernels.inc:
// softmax_row, log_softmax_row; layer_norm_row.inc), so its values are CPU's
// bit for bit. a.op: kSoftmax, kLogSoftmax or kLayerNorm (a.gamma / a.beta:
// `cols` floats or null; a.eps: eps as a float; a.mean / a.rstd: `rows`
// floats or null); a.in and a.ln_row are set here. Returns false, writing
// nothing, when no such kernel runs here (fused_loops_available, the
// capability). Rows may split over the intra-op threads (run_rows). The entry
// for another executor's row ops (spyre/row_pass.cpp).
bool run_cpu_rows(fused::RowAnchor a, const float* x);

// Plans the ops at positions `ps` of `region` (ascending) as one loop over
// one contiguous shape: the elementwise ops of the lowering table
// (kLowerings in fused_elementwise.cpp: arithmetic, comparisons, where,
// masked_fill, clamp, pow by 2 / 3, activations and their backward formulas,
// lerp, addcmul, addcdiv; functional, in-place or out= overloads) in
// float32, and those CPU computes in float32 and rounds per op also in
// bfloat16 / float16 (with bool results and masks), 0-dim tensors and
// Python scalars as runtime parameters, optionally ending with _softmax /
// _log_softmax / logsumexp / sum / mean over the last dim or native_layer_norm, run then
// as one loop over blocks of rows. Uses only the region's structure and
// exact layout. False when an op is not supported.
bool plan_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph, LoopPlan* plan);

// Whether a fused loop takes graph[i] (plan_loop's own acceptance of the op
// alone, for its dtypes, layout and the kinds of its scalar arguments):
// kElementwise as a loop op, kRowAnchor as the row reduction that ends a
// loop, kRowValue as a row reduction to one value per row (sum / mean over
// the last dim) whose consumers may run in later loops of the same region,
// kNo not at all (it runs through its CPU kernel). The TPU's answer to
// partition's fusion query; memoized per op and layout, so it costs one hash
// lookup per op per flush.
enum class LoopAccept : uint8_t { kNo, kElementwise, kRowAnchor, kRowValue };
LoopAccept loop_accepts(const std::vector<Node>& graph, int i);
// Whether the op of `n` has a fused-loop lowering (an entry of the lowering
// table for its name and overload, and its result type among that entry's
// types); one query for deciding fusion. An op that lowers may still not
// plan in a given region (layout, broadcasting, scalar guards).
bool has_fused_lowering(const Node& n);

// Cross-entropy's fused loops (fused_cross_entropy.cpp; partition.cpp,
// cross_entropy_pair, puts each pair in one loop), float32 only, 2-D input
// [N, C] (C the class dim), int64 targets, optional float32 class weights,
// reduction none / mean / sum, any ignore_index:
// - forward: producers + _log_softmax over rows, then nll_loss_forward on
//   its result (CPU's serial cascade of row losses);
// - backward: nll_loss_backward + _log_softmax_backward_data as one row loop
//   (fused_program.h, CrossEntropyBackward) when the former's [N, C] result
//   is not materialized.
// Whether op `n` (Lowering::loss set) qualifies alone: its dtypes, shapes and layout.
bool cross_entropy_op_qualifies(const Node& n);
// Plans the loop `ps` of `region` ending in a cross-entropy op; false when it is not such a pair.
bool plan_cross_entropy_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph,
                             LoopPlan* plan);
// Binds plan.ce (after the forward's program is bound); false (op by op, where CPU raises) when a
// target is neither in [0, C) nor ignore_index.
bool bind_cross_entropy(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem);
// Runs the backward loop, or the forward's loss after its row loop ran.
void run_cross_entropy(LoopPlan& plan, RegionStats& stats);

// native_layer_norm_backward's fused row loop (fused_layer_norm_backward.cpp;
// partition.cpp, residual_gradient_add, gives it its loop), float32 with
// weight and bias given and every gradient wanted, on the capabilities whose
// CPU kernel is vectorized: the op alone, or with the residual gradient's
// add.Tensor / add_.Tensor (alpha 1) of its input gradient and a tensor of
// that shape, the add done on each row while in cache. CPU's values bit for bit.
bool ln_backward_op_qualifies(const Node& n);
bool plan_ln_backward_loop(const Region& region, const std::vector<size_t>& ps, const std::vector<Node>& graph,
                           LoopPlan* plan);
bool bind_ln_backward(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem);
void run_ln_backward(LoopPlan& plan, RegionStats& stats);

// Binds `plan` to this run's buffers and runtime scalars; false (nothing
// run, the ops must run op by op) when a guard fails.
bool bind_loop(LoopPlan& plan, const Region& region, std::vector<Node>& graph, host::HostMemory& mem);

// Runs a bound loop and counts its bytes into `stats`.
void run_loop(LoopPlan& plan, RegionStats& stats);

}  // namespace tpu
}  // namespace tpu_eager
