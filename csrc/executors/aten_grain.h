#pragma once
// ATen's threshold for splitting elementwise ops and reductions between
// threads, mirrored for the host kernels that must split work as CPU does.

#include <cstdint>

namespace tpu_eager {

// at::internal::GRAIN_SIZE (ATen/TensorIterator.h, elements). That header is
// heavy for one constant; executors/spyre/ktir_ir.cpp includes it and checks
// the two are equal.
inline constexpr int64_t kAtenGrainSize = 32768;

}  // namespace tpu_eager
