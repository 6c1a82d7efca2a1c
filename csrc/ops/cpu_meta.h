// CPU's own call-time checks at record time: the C++ meta kernels of ATen's
// structured ops, which torch._meta_registrations shadows.
#pragma once

#include <optional>

#include <ATen/core/dispatch/Dispatcher.h>

namespace tpu_eager {

// The C++ Meta kernel ATen generated for `op` (RegisterMeta*.cpp) when a later
// registration — torch._meta_registrations' Python meta kernel, registered at
// `import torch` — shadows it; nullopt when `op` has none or nothing shadows it.
//
// Why: a structured op's C++ meta function is the very code CPU's kernel runs
// before it computes (TensorIterator's broadcast and in-place shape checks,
// out= dtype and resize checks, mem-overlap checks); the Python kernels that
// shadow it are decompositions (torch._refs) that accept more (they cast an
// out= of another dtype, resize an in-place self to the broadcast shape).
// Inferring with the C++ kernel raises CPU's errors at the call, with CPU's
// messages, and gives CPU's output strides.
//
// The dispatcher keeps shadowed kernels but has no public accessor for them;
// this reads OperatorEntry's kernel list (pinned torch headers, see cpu_meta.cpp).
std::optional<c10::KernelFunction> shadowed_cpp_meta_kernel(const c10::OperatorHandle& op);

}  // namespace tpu_eager
