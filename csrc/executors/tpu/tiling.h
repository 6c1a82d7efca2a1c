// VMEM tiling of a fused region on the simulated TPU: the Pallas-style
// blocking (a grid over blocks, each operand's block double-buffered in VMEM
// while the next one is fetched from HBM) that the region would run with, and
// the extra HBM traffic that blocking implies.
//
// Policy (a simulator choice, documented in docs/tpu_target.md):
// - vector regions (elementwise, reductions, data movement): one grid over
//   the largest operand seen as 2-D (rows = elements / last dim, cols = last
//   dim; a 1-D operand folded into rows of `lanes`); a block of (br, bc) with
//   br a multiple of the largest sublane tile of the operands' dtypes (8, 16
//   or 32) and bc a multiple of the lanes (128); the largest such block,
//   lane dimension first, whose VMEM footprint fits. Operands smaller than
//   the grid (broadcast, reduced) hold their own shape clipped to the block.
// - matmul regions (the matmul family, convolutions as implicit GEMMs):
//   blocks (bm, bk, bn), bm a multiple of the sublane tile of the lhs / output
//   dtype, bk and bn multiples of the MXU size, with an f32 accumulator of
//   (bm, bn) in VMEM; the block minimizing HBM traffic (then grid steps)
//   among power-of-two multiples of the alignment and the whole padded dims,
//   over both grid orders (m, n, k) and (n, m, k), k innermost.
//   As in a Pallas pipeline an operand block is fetched again only when its
//   block index changes between consecutive steps: order (m, n, k) reads the
//   lhs once when K is one block (else N/bn times) and the rhs once when N
//   and K are one block each (else M/bm times); (n, m, k) symmetrically.
// VMEM footprint: HBM operands 2 buffers, the accumulator and in-region
// temporaries 1 buffer, each block padded to whole (sublane tile, 128) tiles.
// Rank-0 operands live in scalar memory (SMEM) and take no VMEM.
// Budget: the chip's VMEM per TensorCore (ChipParams::vmem_bytes; on
// megacore chips each core holds its own blocks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "executors/executor.h"
#include "executors/matmul_shapes.h"
#include "executors/tpu/chip.h"
#include "jit/kernel_trace.h"

namespace tpu_eager {
namespace tpu {

// One operand of a plan and its VMEM block.
struct BlockSpec {
  std::string role;  // "input", "output", "temporary"; matmul: "lhs", "rhs", "out", "acc"
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;  // the operand as a 2-D (rows, cols) array, or the GEMM matrix
  std::vector<int64_t> block;  // its block, (rows, cols)
  int buffers = 2;             // 2: double-buffered HBM operand; 1: lives in VMEM only
  int64_t vmem_bytes = 0;      // buffers x block bytes padded to (sublane tile, 128) tiles
};

// The tiling of one region.
struct TilingPlan {
  std::string kind;            // "vector" or "matmul"; empty: nothing to tile
  std::string order;           // matmul grid order, "mnk" or "nmk" (k innermost)
  std::vector<int64_t> grid;   // vector: (row blocks, col blocks); matmul: (batch, M/bm, N/bn, K/bk)
  std::vector<int64_t> block;  // vector: (br, bc); matmul: (bm, bk, bn)
  std::vector<BlockSpec> blocks;
  int64_t vmem_bytes = 0;         // total VMEM footprint, bytes
  int64_t vmem_budget_bytes = 0;  // the chip's VMEM per TensorCore, bytes
  int64_t hbm_reread_bytes = 0;   // HBM bytes read again because of the blocking (all matmuls of the region)
  double useful_macs = 0;         // matmul: B*M*K*N summed over the region's products
  double padded_macs = 0;         // the same on shapes padded to (sublanes, MXU, MXU) tiles
  // Useful / padded MACs (1 for a perfectly aligned product); -1 for vector plans.
  double mxu_utilization() const { return padded_macs > 0 ? useful_macs / padded_macs : -1.0; }
  bool fits() const { return vmem_bytes <= vmem_budget_bytes; }
};

// An operand of a vector plan (also the extra operands of a matmul region).
struct PlanOperand {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::kFloat;
  std::string role;  // "input", "output", "temporary"
};

// VMEM bytes of a (rows, cols) block of `dtype`, padded to whole tiles.
int64_t block_bytes(int64_t rows, int64_t cols, c10::ScalarType dtype, const ChipParams& chip);

// Plan of a vector region over `operands` (rank-0 and empty ones are skipped).
// Never throws: when not even the minimum block fits, the minimum block is
// returned and fits() is false.
TilingPlan plan_vector(const std::vector<PlanOperand>& operands, const ChipParams& chip);

// One product of a matmul region with the HBM bytes of its operands
// (a_bytes / b_bytes: the lhs / rhs as stored, tiled; for a convolution the
// input and the weight) and the region's other operands, held as blocks
// clipped to (bm, bn).
struct MatmulProblem {
  Gemm gemm{1, 1, 1, 1};
  c10::ScalarType ta = c10::kFloat, tb = c10::kFloat, tout = c10::kFloat;
  int64_t a_bytes = 0, b_bytes = 0;
  std::vector<PlanOperand> extras;
};

// Plan of one product (see the policy above). Never throws.
TilingPlan plan_matmul(const MatmulProblem& p, const ChipParams& chip);

// The plan of `region` of `graph` on `chip`: a matmul plan of its largest
// product when it holds matmul-family ops or convolutions (re-reads and MACs
// summed over all of them), a vector plan otherwise.
TilingPlan plan_region(const Region& region, const std::vector<Node>& graph, const ChipParams& chip);

// The plan as the profiler reports it.
jit::TilingRecord tiling_record(const TilingPlan& plan);

}  // namespace tpu
}  // namespace tpu_eager
