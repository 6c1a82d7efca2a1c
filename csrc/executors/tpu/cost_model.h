// The simulated TPU's cost model: tiled HBM layouts (padding) and the work of
// one recorded op on the MXUs (padded matmul passes) or the vector unit.
// A kernel's time is max(compute, memory) + the chip's launch cost, where
// memory = HBM bytes (read + written + layout padding) / HBM bandwidth.
#pragma once

#include <cstdint>

#include <ATen/Context.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "executors/matmul_shapes.h"
#include "executors/tpu/chip.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace tpu {

// Rows of one layout tile for `dtype`: 8 for 32-bit (and wider) types, 16 for
// 16-bit, 32 for 8-bit, i.e. one (8,128) tile of 32-bit words with narrower
// types packed along the rows. Source: JAX Pallas TPU docs ("Writing TPU
// kernels with Pallas": (8,128) tiles, 16-bit values packed (16,128)) and
// jax/_src/tpu_info.py. 64-bit types have no TPU layout of their own; they
// are costed as (8,128) tiles of 8-byte elements (a simulator choice).
int64_t sublane_tile(c10::ScalarType dtype, const ChipParams& chip);

// Bytes a value of shape `sizes` and `dtype` occupies in HBM under the tiled
// layout: the last two dims padded to (sublane_tile, lanes). A rank-1 value is
// padded to a multiple of lanes * (4 / itemsize) elements (the 1-D tiling of
// jax/_src/tpu_info.py infer_tiling, TPU v4 and later); a rank-0 value is not
// padded (scalars live in scalar memory).
int64_t tiled_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype, const ChipParams& chip);

// bf16 MXU passes per matmul tile for operands of these dtypes. 16-bit float
// and 8-bit operands: 1. float32: by torch.get_float32_matmul_precision():
// "medium" 1 (BF16_BF16_F32), "high" 3 (BF16_BF16_F32_X3), "highest" 6
// (BF16_BF16_F32_X6, how XLA reaches f32 accuracy on the MXU). Source: XLA
// PrecisionConfig.Algorithm in xla_data.proto, where _X<n> is the number of
// bf16 MXU operations per tile. Other dtypes (f64, wide ints): 6 (a simulator
// choice; TPUs have no native mode for them).
int mxu_passes(c10::ScalarType a, c10::ScalarType b, at::Float32MatmulPrecision prec);

// The work of one op.
struct OpCost {
  double flops = 0;      // useful FLOPs: matmul 2*B*M*N*K (unpadded); other ops one per element
  double mxu_flops = 0;  // FLOPs the MXUs spend: padded shapes times passes
  double vpu_elems = 0;  // vector-unit element operations, padded to whole (sublane, lane) tiles
  // Seconds of compute on `chip`: mxu_flops / peak + vpu_elems / VPU rate.
  double seconds(const ChipParams& chip) const;
};

// Work of node `n`. The matmul family (mm, addmm, bmm, baddbmm, addbmm, mv,
// addmv, dot, vdot, addr) is costed as B products (M,K)x(K,N), and
// convolution / convolution_backward as their implicit GEMMs (matmul_shapes.h
// conv_gemms_of), with M padded to the sublanes and K, N to the MXU size (a
// bias epilogue is free; a grad_bias costs its elements on the vector unit).
// Other ops use the VPU rule: reductions cost their largest input's padded
// elements, other ops their results' padded elements.
OpCost op_cost(const Node& n, const ChipParams& chip, at::Float32MatmulPrecision prec);

// Adds one product `g` run `passes` times on the MXUs to `c` (useful FLOPs
// 2*B*M*K*N; MXU FLOPs on M padded to the sublanes, K and N to the MXU size).
void add_gemm_cost(const Gemm& g, double passes, const ChipParams& chip, OpCost& c);

}  // namespace tpu
}  // namespace tpu_eager
