// Ops whose CPU kernel raises on the values it reads (tools/gen_op_table.py VALUE_CHECKS).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace tpu_eager {

// Whether `op`'s CPU kernel raises on values it reads, not only on shapes and
// dtypes (an index or target out of range, a Scalar from a tensor that does not
// fit the result's dtype). Such an op runs even when nothing reads its result
// (jit live_nodes), so its error reaches the user (lazy/async_errors.h), as a
// CUDA kernel's device-side assert fires whether or not its output is used.
// A lookup in a set built on first use from csrc/ops/value_checks.inc.
bool op_checks_values(const c10::OperatorHandle& op);

}  // namespace tpu_eager
