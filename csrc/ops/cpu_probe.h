// Dtype checks that only CPU's kernel makes: a probe of the kernel on tiny CPU twins.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tpu_eager {

// Whether CPU's kernel of `op` rejects the dtypes of this call (arguments at
// stack[first, first + nargs)), which the meta kernel accepted.
//
// Why: CPU's kernels pick their loop by dtype (AT_DISPATCH_*) after the
// structured meta function ran, and raise there for a dtype they have no loop
// for — `float & float`: NotImplementedError "\"bitwise_and_cpu\" not
// implemented for 'Float'". The meta kernels check shapes and type promotion
// only, so a recorded call would raise that error at the flush, when a result
// is read, instead of at the call.
//
// How: once per key — the op, the default dtype, and per argument its dtype,
// rank, emptiness and device for tensors, its type for Scalars, its value for
// other non-tensor arguments — CPU's kernel runs on twins of the arguments:
// zero-filled CPU tensors of the same dtype and rank with every size clamped
// to `tiny_cap` (sizes 0 stay 0: some kernels return before their dtype
// dispatch on no elements), an int-list "size" argument clamped the same way,
// "tpu" devices made CPU. `tiny_cap` is 1, or 2 for an op whose kernel also
// returns before its dtype dispatch when a dim has one element (OpTrait
// kProbeTwinsOfTwo: pdist's n <= 1 rows).
// A NotImplementedError from the probe, or an error that names one of the
// call's dtypes ("expected scalar type Float but found Bool"), is the verdict
// "rejects"; any other error is the twins' doing (their shapes: glu halves an
// even dim, a pool's kernel needs room). Then, when the call's tensors hold at
// most 1 MiB and one is bool, integer or complex (or float16 / bfloat16, for
// an op with `full_16bit`: OpTrait kProbeFull16Bit, avg_pool3d's), the probe
// runs again on zero-filled twins of their full sizes; else no verdict is kept
// and the next miss probes again. (Full-size probes of every float call would
// cost every model's first step CPU's kernel setup.) The verdict is cached: later
// calls with the key pay one hash lookup, and only on a meta-cache miss (the
// record path's hit path never calls this).
//
// A "rejects" verdict is a reason to run CPU's kernel on the real values now
// (run_eager), which raises CPU's exact error at the call; if instead it
// computes, the caller reports cpu_probe_misled(key) and the key's verdict
// becomes "accepts". Random ops (the probe would draw from CPU's generator)
// and custom ops are never probed (false).
//
// `key` receives the verdict's key (for cpu_probe_misled).
struct ProbeTwins {
  int64_t tiny_cap = 1;     // the first probe's twins: sizes clamped to this
  bool full_16bit = false;  // float16 / bfloat16 calls get the full-size probe too
};
bool cpu_kernel_rejects_dtypes(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                               size_t nargs, ProbeTwins twins, std::vector<int64_t>* key);

// Whether the probe can tell nothing for a call of an op whose CPU kernel has
// float32 and float64 loops (OpTrait kFloatLoops): its floating tensors (arguments
// at stack[first, first + nargs)) are all float32 or all float64, and its other
// tensors are int64 arguments named indices, index or target (the dtype those
// kernels read them in). Any other dtype (bool, integer, 16-bit or complex
// operands, a float32 / float64 mix) is probed as before.
bool probe_needless(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first, size_t nargs);

// CPU's kernel computed a call whose key the probe said it rejects (the twins
// hit a dtype path the real arguments do not): the key's verdict becomes "accepts".
void cpu_probe_misled(const std::vector<int64_t>& key);

// Whether `a` is a Generator or Generator? argument (the probe gives each one a
// CPU generator of its own; the host runtime finds a random op's generator by it).
bool is_generator_arg(const c10::Argument& a);

// Probe statistics since start: {probes run, verdicts "rejects", probes misled}.
std::vector<int64_t> cpu_probe_counts();

}  // namespace tpu_eager
