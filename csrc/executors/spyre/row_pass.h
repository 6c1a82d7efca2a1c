// The KTIR interpreter's float32 row pass: a program that is one softmax,
// log_softmax or layer_norm over the last dim(s) of float32 HBM views runs
// each core's rows of each tile step with CPU's row kernel of the op, read
// from the input view and written to the output view in place, instead of a
// gathered LX tile, one ATen call per step, a fresh result and its copies
// back (docs/ktir.md, "The row pass").
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "executors/spyre/ktir_ir.h"

namespace tpu_eager {
namespace spyre {

// Runs `p` as a row pass when it qualifies, and returns true; returns false
// (nothing run, nothing written) when it does not, and the caller runs the
// program op by op. It qualifies when: the program is one op, `_softmax` /
// `_log_softmax` over the last dim (half_to_float false) or
// `native_layer_norm` (weight and bias float32 HBM views of the normalized
// elements, or None); its input and output are float32 HBM views of the same
// sizes (at least one element), contiguous, of different arguments; layer_norm's
// mean / rstd are LX views (not stored) or HBM views of one float per row; a
// tiled plan runs the op per tile step (no ring op) and its split rows hold
// whole rows of the op; CPU's kernel of the op runs vectors here
// (tpu::run_cpu_rows); and the op's hooks.before_op passes (an operand's
// earlier error: the op by op path reports it).
//
// Values: CPU's float32 kernel of the op on each row (the op's rows are
// independent, so a core's rows computed apart equal the whole tensor's),
// bit for bit. Tile steps are walked as the plan's (walk->tile_steps as the
// op by op path counts them), each core's run of rows one call.
bool ktir_row_pass(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks,
                   const KtirTilePlan* plan, KtirWalk* walk);

}  // namespace spyre
}  // namespace tpu_eager
