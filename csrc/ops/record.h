// The generic record kernel and the eager (run-at-record-time) path.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/op_table.h"
#include "ops/scalar_checks.h"

namespace tpu_eager {

// What recording needs to know about an op's schema, worked out once per op:
// walking the schema and comparing names on every call cost ~0.1 us an op.
struct OpPlan {
  uint64_t writes = 0;        // bit i: argument i is written (schema alias info | OpEntry::extra_writes)
  uint64_t scalar_args = 0;   // bit i: argument i is a Scalar (Scalar?, Scalar[]): keyed by type, not value
  bool float_values = false;  // range factories: Scalar values size the result, so key them by value
  uint64_t traits = 0;        // OpEntry::traits (OpTrait bits): per-op corrections and CPU call-time checks
  int alpha_arg = -1;         // position of an `alpha` argument (CPU's alpha_check), or -1
  int values_arg = -1;        // positions of kwarg-only written `values` / `indices` (sort's out=), or -1
  int indices_arg = -1;
  int index_arg = -1;  // positions of an `index` tensor and its `dim` (OpTrait kCheckIndexValues), or -1
  int dim_arg = -1;
  // positions of `self`, a class `target` and `ignore_index` (OpTrait kCheckTargetValues), or -1
  int self_arg = -1;
  int target_arg = -1;
  int ignore_index_arg = -1;
  std::vector<int> aliased;              // per return: the argument it aliases, or -1
  std::vector<bool> list_return;         // per return: a Tensor[] result
  ScalarConversions scalar_conversions;  // Scalars CPU converts with an overflow check (scalar_checks.h)
  // ATen's C++ meta kernel when a Python meta kernel shadows it (cpu_meta.h):
  // shape/dtype inference runs it, so CPU's call-time checks hold at the call.
  std::optional<c10::KernelFunction> cpp_meta;
  // cpp_meta gives CPU's geometry and errors (OpTrait kCppMetaIsCpu): it alone
  // infers the result, and no Python meta kernel runs.
  bool cpp_meta_only = false;
  mutable std::atomic<bool> has_meta{false};  // a meta kernel was found (kernels are never removed)
  // A custom op's registration (custom_ops.h), else 0: its meta results are
  // cached under this id (never under a schema address a redefined op may
  // reuse, never on disk), and its fake impl's errors are its call-time errors.
  int64_t custom_id = 0;
};

// The plan of `op` recorded with `entry`. Arguments past the 64th are keyed by
// value (always correct, only less cache reuse).
OpPlan* plan_op(const c10::OperatorHandle& op, const OpEntry& entry);

// Tensor arguments put on a stack without taking a reference (the caller's
// reference keeps them alive for the call). Taking one costs two GIL round
// trips per tensor that Python holds: since PyTorch 2.10 a TensorImpl whose
// count goes 1 -> 2 increfs its PyObject (and decrefs it on 2 -> 1), and the
// op bindings have released the GIL by then. Unboxed record kernels
// (device_kernels.cpp) use it; record_op makes the entries owned before any
// path that may keep or drop them, and clears them before dropping the
// arguments. On an exception the destructor clears the entries still borrowed.
class BorrowedArgs {
 public:
  static constexpr int kMax = 4;
  // Pushes `t` onto `stack` without a reference; at most kMax per object, all on one stack.
  void push(torch::jit::Stack* stack, const at::Tensor& t);
  // Replaces the borrowed entries by owned references.
  void own();
  // Clears the borrowed entries to None (before the arguments are dropped).
  void release();
  ~BorrowedArgs() { release(); }

 private:
  torch::jit::Stack* stack_ = nullptr;
  size_t slots_[kMax] = {};  // stack positions of the borrowed entries
  int n_ = 0;
};

// The calling thread's record state, reached through one TLS lookup: this
// library's thread_locals are dynamic TLS (a __tls_get_addr call each; the
// library's TLS is too large for the initial-exec model), and the record path
// used ~13 of them an op for these fields alone (the unboxed kernels' pooled
// stacks, their depth and thread-exit flags with their guards, the meta-key
// buffer's guard, the meta cache's memo, the record timer's counter). Plain
// data: zero-initialized, no destructor, so no guard per use. The heap parts
// (`stacks`, `key`) are made by the thread's first record and freed at its exit;
// they are nullptr before that first call returns and after the exit released
// them (a record from another thread_local's destructor then uses its own).
struct RecordThread {
  static constexpr int kStackDepth =
      4;  // nesting depth with a pooled stack (a record inside a record: a meta kernel's)
  static constexpr int kMemoSlots = 256;
  // A recent hit of the meta cache (its key and outcome live in the cache's map
  // until the map is cleared, which bumps the cache's generation).
  struct MetaMemo {
    const std::vector<int64_t>* key;
    const void* outcome;
    uint64_t generation;
  };
  torch::jit::Stack* stacks;  // kStackDepth argument stacks of the unboxed record kernels
  std::vector<int64_t>* key;  // the meta-key buffer, reused by the thread's next op
  int depth;                  // unboxed record kernels active on this thread
  uint32_t ops;               // ops recorded (the record timer samples 1 in 64)
  bool armed;                 // the heap parts were made and their release at thread exit registered
  MetaMemo memo[kMemoSlots];
};
// The calling thread's RecordThread (one TLS lookup; makes the heap parts on
// first use). Out of line, so callers hold the reference: inlined, GCC
// re-derived the thread_local's address (a __tls_get_addr call) after each call.
RecordThread& record_thread();

// Records `op` (arguments on `stack`) into the queue: shape/dtype inference
// with the op's meta kernel (same call-time errors as CPU), one Node, fresh
// "tpu" outputs. Ops whose output shape depends on data, or that have no meta
// kernel, run through run_eager. `plan` is plan_op(op, entry). `borrowed`
// names stack entries that hold no reference (nullptr: none do); with it, a
// result that is a top-level tensor argument (in place, out=) is left as None
// on the stack when recorded: the unboxed caller returns its own argument.
// `rt`: the calling thread's record_thread(), when the caller has it (nullptr: looked up).
void record_op(const c10::OperatorHandle& op, const OpEntry& entry, const OpPlan& plan, torch::jit::Stack* stack,
               BorrowedArgs* borrowed = nullptr, RecordThread* rt = nullptr);

// An op's plan, made by its first call (plan_op) and read without a lock
// after it. std::call_once costs two thread_local writes (libstdc++'s
// __once_callable / __once_call: two __tls_get_addr calls) on every call.
class PlanOnce {
 public:
  const OpPlan& get(const c10::OperatorHandle& op, const OpEntry& entry) {
    const OpPlan* p = plan_.load(std::memory_order_acquire);
    return p != nullptr ? *p : make(op, entry);
  }

 private:
  const OpPlan& make(const c10::OperatorHandle& op, const OpEntry& entry) {
    std::call_once(once_, [&] { plan_.store(plan_op(op, entry), std::memory_order_release); });
    return *plan_.load(std::memory_order_acquire);
  }
  std::once_flag once_;
  std::atomic<const OpPlan*> plan_{nullptr};
};

// The meta cache: outcomes of shape/dtype inference by exact meta key, each
// entry with its interned id (Node::meta_id). Bounded: when it holds `limit`
// entries, the next new key empties it (its ids are never given again).
struct MetaCacheStats {
  size_t entries = 0;
  uint64_t last_id = 0;  // ids given so far
  size_t limit = 0;
};
MetaCacheStats meta_cache_stats();
// Sets the bound (at least 1; 65,536 by default), emptying the cache when it holds more.
void set_meta_cache_limit(size_t limit);

// Calls whose shapes were inferred by CPU's kernel on zero-filled CPU twins (OpTrait
// kInferOnCpu), in this process: a first-step cost (twins, kernel run, fresh results).
int64_t twin_inference_count();

// Flushes the queue and runs `op` with its CPU kernel on the host buffers,
// writing results back to "tpu" tensors. Used for data-dependent shapes and
// for the CPU fallback (fallback == true counts it as such).
// `plan`: the op's OpPlan when recorded through the op table (its writes
// include OpEntry::extra_writes); nullptr: the schema says what is written.
void run_eager(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool random, bool fallback,
               const OpPlan* plan = nullptr);

// Records dst.copy_(src) between "tpu" tensors of one chip (broadcast and
// dtype conversion happen in the executor, as CPU's copy_ does them); returns
// `dst`. Defined in device_kernels.cpp.
at::Tensor record_copy(const at::Tensor& dst, const at::Tensor& src, bool non_blocking);

// Raises the error CPU/CUDA raise when a tensor of another device is mixed in.
[[noreturn]] void raise_device_mismatch(const at::Tensor& other);

// CUDA's device rule for one call, checked before anything is recorded or
// written: every tensor argument is on the device of the first tpu tensor,
// except a CPU tensor that is only read and is 0-dim (a scalar, as
// TensorIterator's allow_cpu_scalars admits) or an entry of an `indices` list
// (`t[cpu_index]`). Written arguments (`writes`, bit per argument: out=,
// in-place self, extra writes) are never exempt. Raises RuntimeError
// "Expected all tensors to be on the same device, but found at least two
// devices, tpu:0 and cpu!". Arguments: the op's schema and its arguments at
// stack[first, first + schema.arguments().size()).
void check_same_device(const c10::FunctionSchema& schema, uint64_t writes, torch::jit::Stack& stack, size_t first);

}  // namespace tpu_eager
