// Loops over n values in fixed-size blocks: a fixed trip count is what lets
// GCC's -O2 (very cheap) vectorizer take a loop, so the Spyre executor's
// array loops (df16.cpp, ring_softmax.cpp) are written in this form.
#pragma once

#include <cstdint>

namespace tpu_eager {
namespace spyre {

// Values per long block, and per short one (one AVX2 vector of floats).
constexpr int64_t kLoopBlock = 64;
constexpr int64_t kLoopShort = 8;

// f(j) for j < n: blocks of kLoopBlock, then of kLoopShort (most of a row's
// tail), then one by one. Inlined into each caller, so it takes the caller's
// target (an AVX2 clone vectorizes it).
template <typename F>
__attribute__((always_inline)) inline void blocked(int64_t n, F f) {
  int64_t j = 0;
  for (; j + kLoopBlock <= n; j += kLoopBlock)
    for (int64_t k = 0; k < kLoopBlock; ++k) f(j + k);
  for (; j + kLoopShort <= n; j += kLoopShort)
    for (int64_t k = 0; k < kLoopShort; ++k) f(j + k);
  for (; j < n; ++j) f(j);
}

}  // namespace spyre
}  // namespace tpu_eager
