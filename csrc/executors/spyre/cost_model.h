// The simulated Spyre's cost model (issue 6, constants in targets/spyre.json):
// per region, C = matmul MACs / (sustained MAC rate x cores) + vector elements
// / (vector rate x cores), M = device bytes moved (read + written, padded to
// whole 128-byte sticks) / the mixed read/write DRAM bandwidth, and
// T = C + M - overlap * min(C, M) (compute and memory overlap partly).
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "executors/spyre/card.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace spyre {

// Bytes of one element on the device: float16/bfloat16 are held as df16 (2),
// int64 as int32 (4); other dtypes keep their size.
int64_t device_itemsize(c10::ScalarType dtype);
// Device bytes of a value: numel * device_itemsize (unpadded).
int64_t device_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype);
// Device bytes with the innermost dimension padded to whole sticks (a rank-0
// value takes one stick).
int64_t stick_bytes(c10::IntArrayRef sizes, c10::ScalarType dtype, const CardParams& card);
// Elements per stick for dtype (64 for 16-bit floats, 32 for float32).
int64_t stick_elems(c10::ScalarType dtype, const CardParams& card);

struct OpCost {
  double flops = 0;         // useful operations: matmul 2*B*M*K*N, others one per element
  double macs = 0;          // matmul MACs on stick-padded K and N
  double vector_elems = 0;  // vector-unit elements, stick-padded
  double seconds(const CardParams& card) const;
};
// Work of node `n` (matmul family by its products, reductions by their
// largest input, other ops by their results or written arguments).
OpCost op_cost(const Node& n, const CardParams& card);

// T = C + M - overlap * min(C, M).
double region_seconds(double compute_s, double memory_s, const CardParams& card);

}  // namespace spyre
}  // namespace tpu_eager
