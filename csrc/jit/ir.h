// Primitive IR of the JIT: what kind of primitive each recorded ATen op lowers to.
#pragma once

#include <cstdint>

namespace tpu_eager {

// The primitive an ATen op lowers to. Lowered kinds fuse (DESIGN §5);
// kLibrary runs the op's CPU ATen kernel on host buffers as one kernel.
enum class PrimKind : int {
  kLibrary = 0,  // library call: not lowered
  kElementwise,  // unary/binary/ternary math, comparisons, casts, where, fills
  kReduction,    // reductions and row-wise normalizations (softmax, layer_norm)
  kMatmul,       // MXU ops: matmul family, convolution
  kData,         // data movement: gather/scatter, concat, pad, copies, index
  kRandom,       // RNG: consumes one random stream reserved at record time
  kView,         // view: metadata only, never recorded
  kSync,         // output shape or result depends on data: runs at record time
};

const char* prim_kind_name(PrimKind k);
inline bool is_lowered(PrimKind k) {
  return k == PrimKind::kElementwise || k == PrimKind::kReduction || k == PrimKind::kMatmul || k == PrimKind::kData ||
         k == PrimKind::kRandom;
}

}  // namespace tpu_eager
