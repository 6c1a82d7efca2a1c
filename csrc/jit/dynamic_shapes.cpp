// Size buckets for the structural cache key.
#include "jit/dynamic_shapes.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace tpu_eager {
namespace jit {
namespace {

struct Range {
  int64_t ndim, dim, lower, upper;
  int64_t base;    // the marked tensor's size at `dim` when marked
  int64_t stride;  // and its stride there
};

// Bucket tags: a whole mark_dynamic range, and a size following a marked
// one (size_buckets with RegionMarks). Sizes below 2^62 never carry them.
constexpr uint64_t kRangeTag = uint64_t(1) << 63;
constexpr uint64_t kFollowTag = uint64_t(1) << 62;

std::mutex g_mu;
// Keyed by DeferredStorage id (ids are never reused, so a freed storage's
// marks can only go stale, never apply to another tensor).
std::unordered_map<uint64_t, std::vector<Range>> g_ranges;
std::set<std::tuple<uint64_t, int64_t, int64_t>> g_warned;

uint64_t pow2_bucket(int64_t n) {
  if (n <= 1) return static_cast<uint64_t>(n);
  uint64_t b = 1;
  while (b < static_cast<uint64_t>(n)) b <<= 1;
  return b;
}

// The dim of `r` that mark `m` applies to: m.dim when r keeps the marked
// stride there (the tensor itself, a slice), else r's one dim of more than
// one element with that stride (a transposed or permuted view: d.t() holds
// d's dim 0 at dim 1); m.dim when no dim or several have it (a step slice
// changes the stride). -1 when r's rank is not the marked tensor's.
int64_t view_dim(const Range& m, const TensorRef& r) {
  const auto nd = static_cast<int64_t>(r.sizes.size());
  if (m.ndim != nd) return -1;
  if (static_cast<int64_t>(r.strides.size()) != nd || r.strides[m.dim] == m.stride) return m.dim;
  int64_t found = -1;
  for (int64_t j = 0; j < nd; ++j) {
    if (r.strides[j] != m.stride || r.sizes[j] <= 1) continue;
    if (found >= 0) return m.dim;
    found = j;
  }
  return found >= 0 ? found : m.dim;
}

// The key word of a size n that follows marked[i] (n = m + c with
// 2|c| <= m, exact first, or n = k*m for 2 <= k <= 255): its tag and i, not
// the relation, so a size near a marked one by chance shares one key
// across the range instead of one per relation (the kernel plans again for
// each exact layout). 0 when it follows none. The first marked size that
// fits is taken: the region's structure fixes their order.
uint64_t follow_word(int64_t n, const c10::SmallVector<int64_t, 8>& marked) {
  if (n <= 1) return 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t i = 0; i < marked.size(); ++i) {
      const int64_t m = marked[i];
      if (m <= 1) continue;
      const int64_t c = n - m;
      if ((pass == 0 && c == 0) || (pass == 1 && 2 * std::abs(c) <= m) ||
          (pass == 2 && n % m == 0 && n / m >= 2 && n / m <= 255))
        return kFollowTag | uint64_t(i);
    }
  }
  return 0;
}

}  // namespace

void mark_dynamic(const DeferredStorage* storage, int64_t ndim, int64_t dim, int64_t lower, int64_t upper, int64_t base,
                  int64_t stride) {
  std::lock_guard<std::mutex> lock(g_mu);
  detail::g_any_dynamic_marks.store(true, std::memory_order_release);
  auto& v = g_ranges[storage->id];
  for (auto& r : v) {
    if (r.ndim == ndim && r.dim == dim) {
      r.lower = lower;
      r.upper = upper;
      r.base = base;
      r.stride = stride;
      return;
    }
  }
  v.push_back(Range{ndim, dim, lower, upper, base, stride});
}

SizeBuckets size_buckets(const TensorRef& r) {
  SizeBuckets out;
  for (auto s : r.sizes) out.push_back(pow2_bucket(s));
  if (!any_dynamic_marks()) return out;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ranges.empty()) return out;
  auto it = g_ranges.find(r.storage->id);
  if (it == g_ranges.end()) return out;
  for (const Range& m : it->second) {
    const int64_t d = view_dim(m, r);
    if (d < 0) continue;
    const int64_t n = r.sizes[d];
    if (n >= m.lower && n <= m.upper) {
      // One bucket for the range, distinct from every power of two.
      out[d] = kRangeTag | static_cast<uint64_t>(m.upper);
    } else if (g_warned.emplace(r.storage->id, m.dim, n).second) {
      TORCH_WARN_ONCE("tpu: size ", n, " of dim ", m.dim, " is outside its mark_dynamic range [", m.lower, ", ",
                      m.upper, "]; regions reading it recompile for its power-of-two bucket");
    }
  }
  return out;
}

std::vector<DynamicDim> dynamic_dims(const TensorRef& r) {
  std::vector<DynamicDim> out;
  if (!any_dynamic_marks()) return out;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ranges.find(r.storage->id);
  if (it == g_ranges.end()) return out;
  for (const Range& m : it->second) {
    const int64_t d = view_dim(m, r);
    if (d < 0) continue;
    const int64_t n = r.sizes[d];
    if (n >= m.lower && n <= m.upper) out.push_back(DynamicDim{d, n, m.base, m.lower, m.upper});
  }
  return out;
}

RegionMarks region_marks(const std::vector<Node>& g, const std::vector<int>& nodes) {
  RegionMarks marks;
  if (!any_dynamic_marks()) return marks;
  for (int i : nodes)
    for (const auto& in : g[i].inputs) {
      for (const DynamicDim& d : dynamic_dims(in.ref)) marks.sizes.push_back(d.size);
      if (in.written) marks.written.push_back(in.ref.storage.get());
    }
  return marks;
}

SizeBuckets size_buckets(const TensorRef& r, const RegionMarks& marks) {
  SizeBuckets out = size_buckets(r);
  const DeferredStorage* s = r.storage.get();
  if (marks.sizes.empty() || std::find(marks.written.begin(), marks.written.end(), s) == marks.written.end())
    return out;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_ranges.count(s->id)) return out;  // a marked storage keeps its own marks
  }
  for (size_t d = 0; d < out.size(); ++d)
    if (const uint64_t w = follow_word(r.sizes[d], marks.sizes)) out[d] = w;
  return out;
}

uint64_t dynamic_marks_hash(const DeferredStorage* storage) {
  if (!any_dynamic_marks()) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ranges.find(storage->id);
  if (it == g_ranges.end()) return 0;
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const Range& m : it->second)
    for (int64_t v : {m.ndim, m.dim, m.lower, m.upper, m.stride}) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL;
  return h | 1;
}

}  // namespace jit
}  // namespace tpu_eager
