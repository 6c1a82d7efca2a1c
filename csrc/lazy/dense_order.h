// Whether a strided layout is one dense block in some order of its dims.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

namespace tpu_eager {

// True when the view of `sizes` / `strides` (elements) holds every element of
// one contiguous block exactly once, in some order of its dims (row-major,
// transposed, channels_last): sorted by stride, each dim longer than 1 has the
// product of the sizes before it as its stride. Size-1 dims may have any stride.
inline bool dense_in_some_order(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of dims longer than 1
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != 1) dims.emplace_back(strides[d], sizes[d]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

}  // namespace tpu_eager
