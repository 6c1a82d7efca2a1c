// The generic record kernel and the eager (run-at-record-time) path.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/op_table.h"

namespace tpu_eager {

// Records `op` (arguments on `stack`) into the queue: shape/dtype inference
// with the op's meta kernel (same call-time errors as CPU), one Node, fresh
// "tpu" outputs. Ops whose output shape depends on data, or that have no meta
// kernel, run through run_eager.
void record_op(const c10::OperatorHandle& op, const OpEntry& entry, torch::jit::Stack* stack);

// Flushes the queue and runs `op` with its CPU kernel on the host buffers,
// writing results back to "tpu" tensors. Used for data-dependent shapes and
// for the CPU fallback (fallback == true counts it as such).
// `extra_writes`: bit i set when argument i is written though its schema does
// not say so (OpEntry::extra_writes).
void run_eager(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool random, bool fallback,
               uint64_t extra_writes = 0);

// Raises the error CPU/CUDA raise when a tensor of another device is mixed in.
[[noreturn]] void raise_device_mismatch(const at::Tensor& other);

}  // namespace tpu_eager
