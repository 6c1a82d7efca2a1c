// Size buckets for the structural cache key.
#include "jit/dynamic_shapes.h"

#include <atomic>
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
  int64_t base;  // the marked tensor's size at `dim` when marked
};

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

}  // namespace

void mark_dynamic(const DeferredStorage* storage, int64_t ndim, int64_t dim, int64_t lower, int64_t upper,
                  int64_t base) {
  std::lock_guard<std::mutex> lock(g_mu);
  detail::g_any_dynamic_marks.store(true, std::memory_order_release);
  auto& v = g_ranges[storage->id];
  for (auto& r : v) {
    if (r.ndim == ndim && r.dim == dim) {
      r.lower = lower;
      r.upper = upper;
      r.base = base;
      return;
    }
  }
  v.push_back(Range{ndim, dim, lower, upper, base});
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
    if (m.ndim != static_cast<int64_t>(r.sizes.size())) continue;
    const int64_t n = r.sizes[m.dim];
    if (n >= m.lower && n <= m.upper) {
      // One bucket for the range, distinct from every power of two.
      out[m.dim] = (uint64_t(1) << 63) | static_cast<uint64_t>(m.upper);
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
    if (m.ndim != static_cast<int64_t>(r.sizes.size())) continue;
    const int64_t n = r.sizes[m.dim];
    if (n >= m.lower && n <= m.upper) out.push_back(DynamicDim{m.dim, n, m.base, m.lower, m.upper});
  }
  return out;
}

uint64_t dynamic_marks_hash(const DeferredStorage* storage) {
  if (!any_dynamic_marks()) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ranges.find(storage->id);
  if (it == g_ranges.end()) return 0;
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const Range& m : it->second)
    for (int64_t v : {m.ndim, m.dim, m.lower, m.upper}) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL;
  return h | 1;
}

}  // namespace jit
}  // namespace tpu_eager
