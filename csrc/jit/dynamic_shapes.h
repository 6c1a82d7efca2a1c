// Bounded dynamism (DESIGN §5): which sizes share a compiled region.
//
// Policy for a size n of a region input's dimension:
//  - inside a range declared with mark_dynamic(tensor, dim, lower, upper) for
//    the tensor being read: one bucket for the whole range [lower, upper];
//  - otherwise: n itself for 0 and 1, else the next power of two. A size that
//    grows by one per step (a generation loop) therefore compiles a region
//    kind at most ceil(log2(range)) + 1 times.
// A size outside its declared range falls back to the power-of-two bucket
// (a recompile) with a one-time warning; it never fails.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include <c10/util/SmallVector.h>

#include "lazy/queue.h"

namespace tpu_eager {
namespace jit {

// Declares dim `dim` of tensors viewing `storage` with rank `ndim` dynamic in
// [lower, upper]; `base` is the marked tensor's size there (a view's size
// there, e.g. n - 1 of d[:, 1:], is then base + an offset). Validated by the
// caller (Python API).
void mark_dynamic(const DeferredStorage* storage, int64_t ndim, int64_t dim, int64_t lower, int64_t upper,
                  int64_t base);

// The dims of `r` whose size lies in its storage's mark_dynamic range.
struct DynamicDim {
  int64_t dim, size, base, lower, upper;
};
std::vector<DynamicDim> dynamic_dims(const TensorRef& r);

// The bucket of each size of `r` (its dims, in order). Held inline: a
// structural key computes one per region input at every flush.
using SizeBuckets = c10::SmallVector<uint64_t, 6>;
SizeBuckets size_buckets(const TensorRef& r);

namespace detail {
// Set by the first mark_dynamic; never cleared.
inline std::atomic<bool> g_any_dynamic_marks{false};
}  // namespace detail

// Whether any storage was ever marked (mark_dynamic): until then every
// dynamic_marks_hash is 0 and size_buckets takes no lock. Inline: the
// early-out of both, and of a flush structure's loop over its storages.
inline bool any_dynamic_marks() { return detail::g_any_dynamic_marks.load(std::memory_order_acquire); }

// A hash of the mark_dynamic ranges declared for `storage` (0: none; no lock
// taken until some range was declared): part of a flush's structure (flush_cache.h).
uint64_t dynamic_marks_hash(const DeferredStorage* storage);

}  // namespace jit
}  // namespace tpu_eager
