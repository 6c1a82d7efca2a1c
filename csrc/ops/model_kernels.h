// Device kernels for ops that real models reach and that are not plain rows of
// the op table: integer histc (CUDA's semantics, as CPU has no integer kernel),
// the scaled-dot-product-attention entry points PyTorch expects a
// PrivateUse1 device to provide (_fused_sdp_choice and the "overrideable"
// fused attention, forward and backward) and slice_backward (a cat the fused
// loops take, instead of CPU's zeros + copy_ into a slice). Each one records
// ordinary nodes: library calls of CPU kernels, the device's own host op
// (tpu_eager::), or ATen ops.
#pragma once

#include <string>
#include <unordered_set>

#include <torch/library.h>

#include "ops/op_table.h"

namespace tpu_eager {

// Registers on `lib` (aten, PrivateUse1) the kernels of this file for the ops
// that are not rows of the op table. Returns their overload names.
std::unordered_set<std::string> register_model_kernels(torch::Library& lib);

// Registers the kernel of this file for op-table row `e` when it has one
// (histc, histc.out: integer inputs take CUDA's semantics); returns false
// (nothing registered) for every other row.
bool register_model_row_kernel(torch::Library& lib, const OpEntry& e);

// Registers (aten, AutogradPrivateUse1) kernels for CompositeImplicitAutograd ops
// whose composite takes one branch on CPU and another on every other device, so
// that "tpu" takes CPU's: max_pool1d (no gradient needed: CPU's floating-only loop
// and a contiguous, non-view result).
void register_cpu_branch_kernels();

}  // namespace tpu_eager
