// The KTIR interpreter's fused elementwise chain pass: a program whose ops
// are all elementwise ops of the pass's vocabulary runs as one pass over
// blocks of elements (inputs read once, each op computed in float32 and
// rounded once, the written HBM views stored once) instead of one ATen call
// per op and tile step with LX tiles in between (docs/ktir.md, "The chain
// pass").
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "executors/spyre/ktir_ir.h"

namespace tpu_eager {
namespace spyre {

// Runs `p` as one chain pass when it qualifies, and returns true; returns
// false (nothing run, nothing written) when it does not, and the caller runs
// the program op by op. It qualifies when: every op is one of add / sub
// (.Tensor, .Scalar; alpha), mul, div (.Tensor, .Scalar, no rounding mode),
// neg, abs, relu, sigmoid, silu, with one result; every operand is a view or
// a float literal; every view has one dtype (float32, bfloat16 or float16),
// the same sizes (at least one element) and contiguous strides; all views of
// one storage are the same view; no view is read before it is written unless
// it is an HBM view of an in / inout argument; a tiled plan has no ring op;
// and every op's hooks.before_op passes (an operand's earlier error: the op
// by op path reports it).
//
// Values (docs/ktir.md, "Numerics"): each op computes the float32 value of
// CPU's float32 kernel of the op (sigmoid and silu: its vector formula with
// SLEEF's expf, and its scalar formula with the C library's expf on the
// elements CPU's kernel leaves to its scalar tail over the whole view, at
// this process's thread count), then a bfloat16 / float16 program rounds it
// once to df16 and holds it as its dtype. The AVX-512, AVX2 + FMA + F16C and
// baseline builds give the same bits (cpu::has picks one per call), and all
// three take sigmoid / silu (CPU's kernels must run SLEEF's expf: ATen's
// AVX2 or AVX512 capability). Tile steps are walked as the plan's
// (walk->tile_steps as the op by op path counts them), each core's rows of a
// step in blocks; a block runs all ops over a few vectors at a time with the
// chain's value in registers (a block holding elements of CPU's scalar tails
// runs one loop per op).
bool ktir_chain_pass(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks,
                     const KtirTilePlan* plan, KtirWalk* walk);

}  // namespace spyre
}  // namespace tpu_eager
