// The products of a matmul-family op, shared by the targets' cost models.
#pragma once

#include <vector>

#include <c10/core/ScalarType.h>

#include "lazy/queue.h"

namespace tpu_eager {

// One product (M,K)x(K,N) repeated `batch` times.
struct Gemm {
  double batch, m, k, n;
};

// The tensor argument at schema position `arg` (not a list element), or null.
const TensorRef* arg_ref(const Node& n, int arg);

// The products of node `n` when it is one of mm, addmm, bmm, baddbmm, addbmm,
// mv, addmv, dot, vdot, addr (and their in-place forms), with its operand
// dtypes in `ta`, `tb`. False for any other op (its cost is then a vector rule).
bool gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb);

}  // namespace tpu_eager
