// The op table: every ATen overload the device records, with its primitive
// kind. Generated data (op_table.inc, tools/gen_op_table.py).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "jit/ir.h"

namespace tpu_eager {

// What the record kernel knows of an overload beyond its schema (OpEntry::traits bits).
enum OpTrait : uint64_t {
  // The C++ meta kernel gives CPU's result geometry and call-time errors: a
  // structured kernel's meta function (the code CPU runs first: shapes, dtypes,
  // strides, checks), or an in-place op's hand-written one (fill_, zero_).
  // Shape/dtype inference runs it instead of the Python meta kernel that shadows
  // it (tools/gen_op_table.py, cpp_meta_is_cpu_overloads).
  kCppMetaIsCpu = 1u << 0,
  // Where a meta kernel's result differs from CPU's kernel, the record kernel
  // corrects it (record.cpp correct_meta_outcome, memory_format.cpp); each bit
  // names one correction. The ops carrying each: tools/gen_op_table.py OP_TRAITS
  // (the convolution bits: the device's own convolution entries, device_kernels.cpp).
  kRangeFactory = 1u << 1,           // Scalar values size the result (keyed by value); out= keeps a fitting geometry
  kWarnsOnOutResize = 1u << 2,       // CPU warns when it resizes a non-empty out= tensor (arange)
  kNormStatsInInputDtype = 1u << 3,  // 16-bit input: mean/rstd in its dtype unless a parameter is float32;
                                     // backward: grad_input in input's dtype, grad_weight/bias in weight's
  kBoolPowKeepsBool = 1u << 4,       // bool tensor ** bool is bool (meta: int64)
  kContiguousGradient = 1u << 5,     // the result is contiguous (meta: grad_output's strides)
  kEvalEmptySaveStats = 1u << 6,     // batch norm in eval mode: save_mean / save_invstd are empty
  kOutKeepsGivenStrides = 1u << 7,   // out= tensors of the right shape keep their strides
  kNoUnrequestedWeights = 1u << 8,   // need_weights=False: the weights are undefined (None)
  kPreservesSelfStrides = 1u << 9,   // result in empty_like(self, Preserve): a dense self's strides exactly
  kContiguousResult = 1u << 10,      // result contiguous, size-1 dims included
  kRollFormat = 1u << 11,            // roll: the format of cat of self's two pieces
  kInputFormatResult = 1u << 12,     // result in input.suggest_memory_format() (any rank)
  kSelfFormatResult = 1u << 13,      // result in self.suggest_memory_format() (4-d / 5-d)
  kOutResizedContiguous = 1u << 14,  // the out= kernel resizes out and copies: a resized out is contiguous
  kConvolutionFormat = 1u << 15,     // convolution: ATen's backend choice decides the result's format
  kConvolutionBackwardFormat = 1u << 16,  // convolution_backward: the same for grad_input / grad_weight
  // CPU call-time checks the meta kernels do not make (record.cpp cpu_checks_at_call_time and
  // record_op): a call that fails one runs eagerly, so CPU's kernel raises its own error.
  kCheckPowTensorScalar = 1u << 17,   // int tensor ** negative int
  kCheckPowScalarInPlace = 1u << 18,  // int tensor **= negative int
  kCheckSubBool = 1u << 19,           // sub / rsub of a bool operand
  kCheckInPlaceCast = 1u << 20,       // add_ / sub_ / mul_ whose result type cannot be cast to self's
  kCheckIndexPut = 1u << 21,          // index_put: what CPU's kernel decides at the call
  kCheckMaskedScatter = 1u << 22,     // mask broadcast and source size
  kCheckIndexBounds = 1u << 23,       // index / index_put: indices in range
  kCheckSameDtypePair = 1u << 24,     // complex / polar: both arguments of one dtype
  kCheckRandperm = 1u << 25,          // randperm(n) into a dtype that cannot hold n
  kCheckNormalStd = 1u << 26,         // normal with a std tensor: std >= 0
  kCheckIndexDevices = 1u << 27,      // index: indices on CPU or self's device
  // Result layouts of CPU kernels that are not structured (no C++ meta function to read them
  // from; memory_format.cpp apply_cpu_result_layout), for fresh results and resized out= tensors.
  kIteratorLayout = 1u << 28,   // CPU's TensorIterator over the tensor arguments, in schema order
  kEmptyLikeSelf = 1u << 29,    // CPU allocates empty_like(self) (Preserve), then iterates into it
  kOtherContiguous = 1u << 30,  // with kIteratorLayout: `other` enters as a contiguous tensor of its shape
  // Shape inference by CPU's own kernel on zero-filled CPU twins of the arguments
  // (record.cpp, cpu_twins): for ops whose result geometry and call-time errors depend
  // on argument metadata only, and whose Python meta kernel is a decomposition into
  // dozens of reference ops (1-5 ms a call, most of a training program's first step).
  kInferOnCpu = 1u << 31,
  // CPU's kernel raises on the values it reads, not only on shapes and dtypes (an
  // index or target out of range, a Scalar from a tensor that does not fit the
  // result's dtype): the node runs even when nothing reads its result (jit
  // live_nodes, Node::checks_values), so its error reaches the user
  // (lazy/async_errors.h), as a CUDA kernel's device-side assert fires whether
  // or not its output is used. tools/gen_op_table.py VALUE_CHECKS.
  kChecksValues = 1ull << 32,
  // CPU's kernel reads torch.use_deterministic_algorithms when it runs (index
  // writes, max_unpool): while the mode is on the op runs at the call, under the
  // mode of the call (record.cpp); a mode change first runs the queued ops
  // (torch_tpu_eager/_deterministic.py). tools/gen_op_table.py OP_TRAITS.
  kReadsDeterministicMode = 1ull << 33,
  // More CPU call-time checks (see kCheckPowTensorScalar): a call that fails one runs eagerly.
  kCheckReductionDims = 1ull << 34,     // nansum: an empty dim list (CPU: every dim; meta: none) or > 64 dims
  kCheckBoundaries1d = 1ull << 35,      // bucketize: boundaries not 1-D (CPU raises; the meta kernel does not check)
  kCheckSearchSide = 1ull << 36,        // searchsorted: `side` other than "left" / "right" (likewise)
  kCheckDegreesOfFreedom = 1ull << 37,  // var / std (_mean): correction >= elements reduced (CPU warns at the call)
  kCheckIndexValues = 1ull << 38,       // index_select / index_add / scatter / gather / put / take: host-held
                                        // `index` values outside [0, size) (CPU raises or wraps at the call)
  // CPU's kernel has float32 and float64 loops: a call whose floating tensors are
  // all float32 or all float64 (and whose other tensors are int64 indices) skips
  // the dtype probe (ops/cpu_probe.h, probe_needless), which on a model's first
  // step ran CPU's kernels on twins (oneDNN's setup for a convolution's 1x1 twins).
  kFloatLoops = 1ull << 39,
  // fmod / remainder / floor_divide / div with a rounding mode on integers: CPU's kernel raises
  // "ZeroDivisionError" for a zero divisor. A Scalar zero or a host-held divisor tensor with a
  // zero runs CPU's kernel at the call; a divisor computed on the device is checked when the op
  // runs, which it then does even when nothing reads its result (Node::checks_values).
  kCheckIntegerDivisor = 1ull << 40,
  // A foreach op recorded as one node over all its tensors (Node::expands); the flush expands it
  // into the per-tensor ops CPU's kernel calls, in its order (jit/foreach_expand.h). Written
  // tensors are checked for overlap with the other tensors of their own index only, as each
  // per-tensor op checks its arguments. tools/gen_op_table.py FOREACH_EXPANDED.
  kExpandsPerTensor = 1ull << 41,
  // More CPU call-time checks (see kCheckPowTensorScalar): a call that fails one runs eagerly.
  kCheckGeluApproximate = 1ull << 42,  // gelu (_backward): `approximate` other than "none" / "tanh"
  kCheckMultinomial = 1ull << 43,      // multinomial: input dtype, out dtype, sample and category counts
  // CPU's kernel returns before its dtype dispatch when a dim has one element (pdist's
  // n <= 1 rows: an empty result; flip's copy), so the dtype probe's twins keep sizes up to 2, not 1
  // (ops/cpu_probe.h), and float16 pdist raises CPU's NotImplementedError at the call.
  kProbeTwinsOfTwo = 1ull << 44,
  // CPU's kernel has no float16 / bfloat16 loop and the dtype probe's size-1 twins fail on
  // their shapes first (avg_pool3d's window needs room): a 16-bit call of at most 1 MiB is
  // probed on full-size twins, as bool, integer and complex calls are (ops/cpu_probe.h).
  kProbeFull16Bit = 1ull << 45,
  kCheckTargetValues = 1ull << 46,  // nll_loss (2d) / multi_margin_loss: host-held class `target` values
                                    // outside [0, classes) other than ignore_index (CPU raises at the call)
  // CPU's kernel refuses bool, then returns clamp_min(self, 0) (relu): shape inference runs
  // clamp_min's C++ meta function on meta twins (record.cpp infer_as_clamp_min_zero), not
  // CPU's kernel on zero-filled twins (kInferOnCpu), whose twin and fresh result were
  // most of a first relu's record (page faults).
  kInferAsClampMinZero = 1ull << 47,
  // Shape inference by a small rule of the op's own (shape_rules.h), on meta twins, for the
  // calls it covers: CPU's result geometry without CPU's kernel on zero-filled twins, whose
  // twins, kernel runs and results were ~350 page faults and 2.4 M instructions of a CNN's
  // first step (docs/performance.md, "thr23"). A call the rule declines is inferred as
  // kInferOnCpu says (the op carries that bit too), so CPU's own errors are raised.
  kShapeRuleBatchNorm = 1ull << 48,          // native_batch_norm, _native_batch_norm_legit, _batch_norm_with_update
  kShapeRuleBatchNormBackward = 1ull << 49,  // native_batch_norm_backward
  // The foreach ops recorded whole (kExpandsPerTensor): each per-tensor op's C++ meta function
  // on meta twins (shape_rules.h infer_foreach), not CPU's foreach kernel on zero-filled twins,
  // whose zero-filling and kernel runs were half the instructions of the MLP + Adam first step
  // (docs/performance.md, "cold25").
  kShapeRuleForeach = 1ull << 50,
  kShapeRules = kShapeRuleBatchNorm | kShapeRuleBatchNormBackward | kShapeRuleForeach,
};

struct OpEntry {
  const char* name;  // "add.Tensor"
  PrimKind kind;
  uint32_t extra_writes;  // bit i: argument i is written though its schema does not say so
  uint64_t traits = 0;    // OpTrait bits
};

const std::vector<OpEntry>& op_table();

// Registers the record kernel for every row of the table and the device's own
// kernels (empty, copies, scalar reads, resize_, set_, views). Called once at
// import; returns the number of overloads registered.
int64_t register_device_kernels();

// Overloads registered with a kernel of their own instead of the op table's
// record kernel (device_kernels.cpp, model_kernels.cpp), after
// register_device_kernels().
const std::unordered_set<std::string>& hand_written_kernels();

}  // namespace tpu_eager
