// Bounded dynamism (DESIGN §5): which sizes share a compiled region.
//
// Policy for a size n of a region input's dimension:
//  - inside a range declared with mark_dynamic(tensor, dim, lower, upper) for
//    the tensor being read: one bucket for the whole range [lower, upper]
//    (a view's dims are matched to the marked dims through their strides, so
//    a transposed view keeps each mark on the dim it belongs to);
//  - a buffer the region writes, on a storage of no mark, whose size
//    follows a size m of an input inside a range (a pad's or cat(out=)'s
//    buffer, created at its own size: n = m + c with 2|c| <= m, n = k*m, or
//    n = m + m' of two marked sizes, a cat of two marked tensors):
//    one bucket "follows m", so one region serves every m of the range;
//    a size near m or a multiple of it that is also a size of a weight the
//    region reads (a whole storage only read, of no mark) is that fixed
//    size (mm(x, w)'s 256 columns at n = 16 are w's, not 16n);
//  - a buffer a region creates or writes whole (a result, a pad's buffer),
//    whose size follows a marked size of that region, carries the relation
//    as a mark of its own (carry_marks), so a later region that only reads
//    it keys that dim by the range too;
//  - a view of another rank (unsqueeze, flatten, reshape) takes a mark on
//    the dim that keeps the marked stride, on the dim that merges the
//    marked dim with fixed ones (size k * base: keyed by the range and k),
//    or on both parts of a split of the marked dim into two (sizes a and
//    base / a: both keyed by the range, whichever of them is fixed), or of
//    one of q equal parts of it (q.view(b, -1, 64) of qkv's q, base / q),
//    or of a slice of it from a start (x[:, 1:].view(b, -1, 64));
//  - a step slice to the end of the marked dim (d[:, 1::3], or
//    k.t()[:, ::2] of a transposed view, whose dims keep no marked stride):
//    the dim of stride step * the marked one, keyed by the range and step;
//  - a slice of a storage of no mark, only read, cut to a size equal to a
//    marked one (cos[:n] of a rotary table, a causal mask's mask[:n, :n]):
//    "follows" that size, as a created buffer's;
//  - which dims of a buffer follow the marks, when two or more do by value
//    (p @ v of (4, n, n) and (4, n, 16) at n = 16 is (4, 16, 16)), the size
//    probe decides: the region's ops rerun on meta tensors with every marked
//    dim grown, and a dim that does not grow keeps its power of two;
//  - otherwise: n itself for 0 and 1, else the next power of two. A size that
//    grows by one per step (a generation loop) therefore compiles a region
//    kind at most ceil(log2(range)) + 1 times.
// A size outside its declared range falls back to the power-of-two bucket
// (a recompile) with a one-time warning; it never fails.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include <c10/util/SmallVector.h>

#include "lazy/queue.h"

namespace tpu_eager {
namespace jit {

// Declares dim `dim` of tensors viewing `storage` with rank `ndim` dynamic in
// [lower, upper]; `base` is the marked tensor's size there (a view's size
// there, e.g. n - 1 of d[:, 1:], is then base + an offset) and `stride` its
// stride there (a view's dim of that stride is the marked one: dim 1 of
// d.t() for a mark of d's dim 0). Validated by the caller (Python API).
void mark_dynamic(const DeferredStorage* storage, int64_t ndim, int64_t dim, int64_t lower, int64_t upper, int64_t base,
                  int64_t stride);

// The dims of `r` whose size lies in its storage's mark_dynamic range;
// `dim` is r's dim (the marked dim, mapped through r's strides). `scale` > 1:
// a dim of another rank that merges the marked dim with fixed ones, of size
// scale * base (a flatten of the marked tensor); `divisor` > 1: one part of
// a split of the marked dim into two, of size base / divisor, the other
// part (of size divisor) listed too: view(16, 4, n / 4), view(16, n / 4, 4)
// of (16, n), view(b, n / 64, 64) of (b, n) (which part is fixed, one
// launch cannot tell: both follow the range). For both, lower/upper stay
// the marked dim's. `part` > 1: the dim (or the split's two parts together)
// is one of `part` equal parts of the marked dim, base / part elements
// (chunk(3) or split(n / 3) of qkv, 2 <= part <= 16), at part number
// `index` (its start along the marked dim / its size: 0 for q, 1 for k, 2
// for v); a split of such a part (q.view(b, -1, 64)) has size * divisor *
// part == base. `step` > 1: a step slice of the marked dim to its end
// (d[:, ::2], or k.t()[:, 1::2] of a transposed view), from element
// `start`: size ceil((base - start) / step). `trim` > 0: the split is of a
// slice near the whole (x[:, 1:].view(b, -1, 64)): size * divisor == base -
// trim, 2 * trim <= base.
struct DynamicDim {
  int64_t dim, size, base, lower, upper, scale = 1, divisor = 1, part = 1, index = 0, step = 1, start = 0, trim = 0;
};
std::vector<DynamicDim> dynamic_dims(const TensorRef& r);

// The bucket of each size of `r` (its dims, in order). Held inline: a
// structural key computes one per region input at every flush.
using SizeBuckets = c10::SmallVector<uint64_t, 6>;
SizeBuckets size_buckets(const TensorRef& r);

// Of a region (the inputs of its nodes `nodes` of `g`): the sizes that lie
// in mark_dynamic ranges, in the order it reads them, and the storages it
// writes. Empty, without a lock, until some mark was declared.
struct RegionMarks {
  c10::SmallVector<int64_t, 8> sizes;
  c10::SmallVector<int64_t, 8> dims;                        // the dim of the view each size is
  c10::SmallVector<std::pair<int64_t, int64_t>, 8> ranges;  // [lower, upper] of each size
  c10::SmallVector<const DeferredStorage*, 4> written;
  // The sizes of the weights (whole storages only read, made outside the
  // region, of no mark): a size near or a multiple of a marked one that is
  // also one of these is that fixed size (a mm result's columns, w's).
  c10::SmallVector<int64_t, 8> fixed;
  // Of a written buffer of no mark with two or more dims that follow marked
  // sizes by value: which of them grow with the marks (the size probe,
  // carry_marks): the others keep their power of two (the 64 of x.float()'s
  // (16, 64) buffer at n = 16 is no 4n).
  c10::SmallVector<std::pair<const DeferredStorage*, std::vector<char>>, 2> varying;
};
RegionMarks region_marks(const std::vector<Node>& g, const std::vector<int>& nodes);
// size_buckets(r); when r's storage has no mark and the region writes it,
// each size that follows one of `marks.sizes` (m + c with 2|c| <= m, k*m
// for 2 <= k <= 255, or else m + m' of two distinct ones) is keyed as
// following it instead of its power of two:
// a created buffer's dim inherits the mark of the size it was made from.
// Only written buffers: a weight's fixed 8 columns near a marked n by
// chance keep their power of two.
SizeBuckets size_buckets(const TensorRef& r, const RegionMarks& marks);

// After the region of nodes `nodes` ran (or was keyed): each buffer it
// creates or writes whole (a node's result; a written view that covers its
// storage, as a pad's buffer) on a storage of no mark_dynamic range takes a
// mark on each dim whose size follows a marked size of the region (as
// size_buckets with RegionMarks: m + c, 2|c| <= m, range [lower + c, upper
// + c]; k*m, range [k*lower, k*upper]; m + m', the sum of their ranges),
// its own size the base. A later
// region that only reads the buffer then keys and binds it by that range.
// When two or more dims of a buffer follow marked sizes, only those the
// size probe finds growing with the marks carry one (a (4, 16, 16) result
// of p @ v at n = 16 carries its rows' mark, not the head dim's); results
// of ops the probe cannot run (no meta kernel, a split or step slice read)
// keep the rules above. At most 4096 such marks are kept (the oldest
// dropped: its buffer then keys by its power of two again, never wrongly).
// No-op without marks.
void carry_marks(const std::vector<Node>& g, const std::vector<int>& nodes);

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
