// Size buckets for the structural cache key.
#include "jit/dynamic_shapes.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <c10/util/Exception.h>

namespace tpu_eager {
namespace jit {
namespace {

struct Range {
  int64_t ndim, dim, lower, upper;
  int64_t base;    // the marked tensor's size at `dim` when marked
  int64_t stride;  // and its stride there
  // Carried by carry_marks from a marked size of the region that made the
  // buffer; keyed by that mark's upper bound (`key_upper`), so a size near
  // a marked one by chance (its range shifted by a relation that changes
  // with the size) keys alike for every size of the range.
  bool carried = false;
  int64_t key_upper = 0;
};

// Bucket tags: a whole mark_dynamic range, and a size following a marked
// one (size_buckets with RegionMarks). Sizes below 2^62 never carry them.
// A range word holds the merged dim's scale or a step slice's step (bits
// 48-55, dynamic_dims; bit 57 for a step), or bit 56 for the parts of a
// split, and the upper bound's low 48 bits.
constexpr uint64_t kRangeTag = uint64_t(1) << 63;
constexpr uint64_t kFollowTag = uint64_t(1) << 62;
constexpr uint64_t kStepTag = uint64_t(1) << 57;
constexpr uint64_t kDividedTag = uint64_t(1) << 56;
constexpr uint64_t kUpperBits = (uint64_t(1) << 48) - 1;
// Carried marks kept at most (the oldest dropped first).
constexpr size_t kMaxCarried = 4096;
// The most equal parts a marked dim is taken to be cut into (qkv's 3, a
// GLU's 2, an LSTM's 4 gates): a fixed slice that divides the size by
// chance is an equal part less often.
constexpr int64_t kMaxParts = 16;
// The largest step of a step slice of the marked dim (x[::2], a dilation).
constexpr int64_t kMaxStep = 255;

std::mutex g_mu;
// Keyed by DeferredStorage id (ids are never reused, so a freed storage's
// marks can only go stale, never apply to another tensor).
std::unordered_map<uint64_t, std::vector<Range>> g_ranges;
std::deque<uint64_t> g_carried;  // ids with carried marks, oldest first
std::set<std::tuple<uint64_t, int64_t, int64_t>> g_warned;

uint64_t pow2_bucket(int64_t n) {
  if (n <= 1) return static_cast<uint64_t>(n);
  uint64_t b = 1;
  while (b < static_cast<uint64_t>(n)) b <<= 1;
  return b;
}

// Where `r` starts along mark m's dim, in its elements: the offset's
// component along the marked stride (the marked tensor is dense: its outer
// strides are multiples of base * stride, its inner ones below stride).
int64_t start_along(const Range& m, const TensorRef& r) {
  return m.stride > 0 && m.base > 0 ? (r.offset / m.stride) % m.base : 0;
}

// r's one dim that is a step slice of mark m's dim to its end (d[:, ::2],
// d.t()[:, 1::2]: stride k * S for a step 2 <= k <= kMaxStep, S the marked
// stride, size ceil((base - start) / k)), as {dim, k}; {-1, 1} when none
// or several.
std::pair<int64_t, int64_t> step_dim(const Range& m, const TensorRef& r) {
  const auto nd = static_cast<int64_t>(r.sizes().size());
  if (m.stride <= 0 || m.base <= 1) return {-1, 1};
  const int64_t rest = m.base - start_along(m, r);
  std::pair<int64_t, int64_t> found{-1, 1};
  for (int64_t j = 0; j < nd; ++j) {
    const int64_t st = r.strides()[j], n = r.sizes()[j];
    if (n <= 1 || st <= m.stride || st % m.stride != 0) continue;
    const int64_t k = st / m.stride;
    if (k > kMaxStep || n != (rest + k - 1) / k) continue;
    if (found.first >= 0) return {-1, 1};
    found = {j, k};
  }
  return found;
}

// The dim of `r` that mark `m` applies to, and its step: m.dim when r keeps
// the marked stride there (the tensor itself, a slice), else r's one dim
// of more than one element with that stride (a transposed or permuted
// view: d.t() holds d's dim 0 at dim 1), else r's one step slice of it
// (step_dim: d.t()[:, ::2] holds d's dim 0 at dim 1 with step 2); m.dim
// when no dim or several have it. -1 when r's rank is not the marked
// tensor's.
std::pair<int64_t, int64_t> view_dim(const Range& m, const TensorRef& r) {
  const auto nd = static_cast<int64_t>(r.sizes().size());
  if (m.ndim != nd) return {-1, 1};
  if (static_cast<int64_t>(r.strides().size()) != nd || r.strides()[m.dim] == m.stride) return {m.dim, 1};
  int64_t found = -1;
  for (int64_t j = 0; j < nd; ++j) {
    if (r.strides()[j] != m.stride || r.sizes()[j] <= 1) continue;
    if (found >= 0) return {m.dim, 1};
    found = j;
  }
  if (found >= 0) return {found, 1};
  if (const auto step = step_dim(m, r); step.first >= 0) return step;
  return {m.dim, 1};
}

// Where mark `m` lies in `r`: its dim (-1: none) and scale. The same rank:
// view_dim, scale 1. Another rank (unsqueeze, flatten, reshape): r's one
// dim of more than one element with the marked stride, scale 1 (the
// marked dim kept whole or sliced); or a dim of size k * base (2 <= k <=
// 255) whose stride divides the marked one and whose span holds the marked
// dim, scale k (the marked dim merged with fixed ones: flatten of (16, n)
// or (n, 16) is 16*n); the two parts of a split of the marked dim first
// (split_mark: `dim` and `pair`). None when several dims fit.
struct ViewMark {
  int64_t dim = -1, scale = 1, divisor = 1;
  int64_t pair = -1;            // a split's other part (its size `divisor`), else -1
  int64_t part = 1, index = 0;  // one of `part` equal parts of the marked dim, number `index`
  int64_t step = 1;             // a step slice of the marked dim (step_dim)
  int64_t trim = 0;             // a split of a slice: base - its elements (split_mark)
};

// `size` elements from `start` of mark m's dim as one of q equal parts
// (chunk(q), split(base / q)): base = q * size, 2 <= q <= kMaxParts, the
// start a whole number of parts. {1, 0} when not.
std::pair<int64_t, int64_t> equal_part(const Range& m, int64_t size, int64_t start) {
  if (size <= 0 || m.base % size != 0) return {1, 0};
  const int64_t q = m.base / size;
  if (q < 2 || q > kMaxParts || start % size != 0) return {1, 0};
  return {q, start / size};
}

// The two parts of a split of mark m's dim in r (a view of another rank):
// dims o and i of sizes a and b, both >= 2, the smaller at most 255,
// covering the marked dim, or one of its equal parts (equal_part), as (a,
// b) with strides (b*S, S), S the marked stride: view(16, 4, n / 4),
// view(16, n / 4, 4), the heads split view(b, n / 64, 64) of (b, n), or
// q.view(b, -1, 64) of q = qkv.chunk(3, 1)[0] (a * b = base / 3). One
// launch cannot tell which factor is the fixed one ((4, 10) is also 10 rows
// of 4), so both parts follow the range: dim o, its divisor b, its pair i.
// Equal factors ((64, 64) of n = 4096) are a split too: keyed as every
// other size of the range (the compiler makes them one symbol). None when
// several pairs fit. base % (a * b) == 0 is the divisibility guard: a size
// that does not divide is no split.
ViewMark split_mark(const Range& m, const TensorRef& r) {
  const auto nd = static_cast<int64_t>(r.sizes().size());
  const int64_t start = start_along(m, r);
  ViewMark found;
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t b = r.sizes()[i];
    if (b <= 1 || r.strides()[i] != m.stride) continue;
    for (int64_t o = 0; o < nd; ++o) {
      const int64_t a = r.sizes()[o];
      if (o == i || a < 2 || std::min(a, b) > 255 || r.strides()[o] != b * m.stride) continue;
      const auto [part, index] =
          a * b == m.base || m.base % (a * b) != 0 ? std::pair<int64_t, int64_t>{1, 0} : equal_part(m, a * b, start);
      // A split of a slice near the whole from a start (x[:, 1:].view(b, -1,
      // 64), a CLS token dropped): a * b elements from start > 0, the rest
      // (`trim`) at most half of the base. Not from 0: d[:, :n // 64 * 64]
      // trims a remainder that changes with n (no split, as before).
      const int64_t trim = part == 1 ? m.base - a * b : 0;
      if (trim != 0 && (trim < 0 || start == 0 || 2 * trim > m.base || start + a * b > m.base)) continue;
      if (found.dim >= 0) return {};
      found = {o, 1, b, i, part, index};
      found.trim = trim;
    }
  }
  return found;
}

ViewMark view_mark(const Range& m, const TensorRef& r) {
  const auto nd = static_cast<int64_t>(r.sizes().size());
  if (m.ndim == nd) {
    ViewMark v;
    std::tie(v.dim, v.step) = view_dim(m, r);
    if (v.dim >= 0 && v.step == 1 && r.strides().size() == r.sizes().size() && r.strides()[v.dim] == m.stride)
      std::tie(v.part, v.index) = equal_part(m, r.sizes()[v.dim], start_along(m, r));
    return v;
  }
  if (static_cast<int64_t>(r.strides().size()) != nd || m.base <= 1 || m.stride <= 0) return {};
  if (const ViewMark split = split_mark(m, r); split.dim >= 0) return split;
  ViewMark found;
  for (int64_t j = 0; j < nd; ++j) {
    const int64_t n = r.sizes()[j], st = r.strides()[j];
    if (n <= 1 || st <= 0 || st > m.stride || m.stride % st != 0) continue;
    const int64_t k = n % m.base == 0 ? n / m.base : 0;
    ViewMark here;
    if (k >= 2 && k <= 255 && n / m.base * st >= m.stride)
      here = {j, k};
    else if (st == m.stride)
      here = {j, 1};
    else
      continue;
    if (found.dim >= 0) return {};
    found = here;
  }
  return found;
}

// The size whose range holds n: the base for a merged or split dim or a
// step slice.
bool in_range(const Range& m, const ViewMark& v, int64_t n) {
  const int64_t x = v.scale > 1 || v.divisor > 1 || v.step > 1 ? m.base : n;
  return x >= m.lower && x <= m.upper;
}

// How a size n follows marked[i]: n = m + c with 2|c| <= m (exact first),
// or n = k*m for 2 <= k <= 255, or, when none of these fits, n = m +
// marked[j] of two distinct marked sizes (a cat of two marked tensors);
// i = -1 when it follows none. The first marked size that fits is taken:
// the region's structure fixes their order.
struct Follow {
  int i = -1, j = -1;  // j: the second size of a sum, else -1
  int64_t c = 0, k = 1;
};
Follow follows(int64_t n, const c10::SmallVector<int64_t, 8>& marked) {
  if (n <= 1) return {};
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t i = 0; i < marked.size(); ++i) {
      const int64_t m = marked[i];
      if (m <= 1) continue;
      const int64_t c = n - m;
      if ((pass == 0 && c == 0) || (pass == 1 && 2 * std::abs(c) <= m)) return {static_cast<int>(i), -1, c, 1};
      if (pass == 2 && n % m == 0 && n / m >= 2 && n / m <= 255) return {static_cast<int>(i), -1, 0, n / m};
    }
  }
  for (size_t i = 0; i < marked.size(); ++i)
    for (size_t j = i + 1; j < marked.size(); ++j)
      if (marked[i] > 1 && marked[j] > 1 && marked[i] != marked[j] && marked[i] + marked[j] == n)
        return {static_cast<int>(i), static_cast<int>(j), 0, 1};
  return {};
}

// follows(n, marks.sizes), except that a size near a marked one or a
// multiple of it (not equal: an elementwise result's) that is also a size of
// a weight the region reads (marks.fixed) is that fixed size: the 256
// columns of mm(x, w) with w (64, 256) are no 16 * n at n = 16.
Follow follows(int64_t n, const RegionMarks& marks) {
  const Follow f = follows(n, marks.sizes);
  const bool exact = f.i >= 0 && f.j < 0 && f.c == 0 && f.k == 1;
  if (f.i < 0 || exact || std::find(marks.fixed.begin(), marks.fixed.end(), n) == marks.fixed.end()) return f;
  return {};
}

// The key word of a size n that follows a marked size: its tag, i and j, not
// the relation, so a size near a marked one by chance shares one key
// across the range instead of one per relation (the kernel plans again for
// each exact layout). 0 when it follows none.
uint64_t follow_word(int64_t n, const RegionMarks& marks) {
  const Follow f = follows(n, marks);
  return f.i < 0 ? 0 : kFollowTag | uint64_t(f.i) | uint64_t(f.j + 1) << 16;
}

// The bucket word of a dim in a range (distinct from every power of two).
uint64_t range_word(const Range& m, const ViewMark& v) {
  const auto upper = static_cast<uint64_t>(m.carried ? m.key_upper : m.upper);
  // Not the divisor: it changes with the size for the fixed part of a split
  // (the 64 of n / 64 rows of 64), which keys as its other part does.
  // A split of a slice keys by its trim's low 8 bits (a trim that changes
  // with the size, n // 64 * 64 of n, keys apart more often than not).
  const uint64_t factor = v.divisor > 1 ? kDividedTag | static_cast<uint64_t>(v.trim & 0xFF) << 48
                          : v.step > 1  ? kStepTag | static_cast<uint64_t>(v.step) << 48
                                        : static_cast<uint64_t>(v.scale) << 48;
  return kRangeTag | (m.carried ? kFollowTag : 0) | factor | (upper & kUpperBits);
}

int64_t saturate_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}
int64_t saturate_mul(int64_t k, int64_t a) {  // k > 0
  int64_t r;
  return __builtin_mul_overflow(k, a, &r) ? (a > 0 ? INT64_MAX : INT64_MIN) : r;
}

// Marks for buffer `r` (no marks of its own) from the region's `marks`:
// one per dim that follows a marked size (only exact and multiple ones when
// some dim is exact). Empty when none does.
std::vector<Range> carried_marks(const TensorRef& r, const RegionMarks& marks) {
  std::vector<Range> out;
  const auto nd = static_cast<int64_t>(r.sizes().size());
  if (static_cast<int64_t>(r.strides().size()) != nd) return out;
  // A dim equal to a marked size is that size's dim (an elementwise
  // result's): the others' nearness is then chance (the 3 columns of a
  // (6, 3) result), so they carry only exact multiples.
  // Two or more dims equal to a marked size that is also a weight's size
  // (x @ w of x (64, 64) marked at dim 0, w (64, 64)): only those at a
  // marked dim's position of that size follow it (the rows), the others are
  // the weight's (all, when none is at such a position).
  bool exact = false;
  c10::SmallVector<int64_t, 6> ambiguous;
  for (int64_t d = 0; d < nd; ++d) {
    const Follow f = follows(r.sizes()[d], marks);
    const bool e = f.i >= 0 && f.j < 0 && f.c == 0 && f.k == 1;
    exact |= e;
    if (e && std::find(marks.fixed.begin(), marks.fixed.end(), r.sizes()[d]) != marks.fixed.end())
      ambiguous.push_back(d);
  }
  auto at_marked_dim = [&](int64_t d) {
    for (size_t i = 0; i < marks.sizes.size(); ++i)
      if (marks.sizes[i] == r.sizes()[d] && marks.dims[i] == d) return true;
    return false;
  };
  const bool pick = ambiguous.size() >= 2 && std::any_of(ambiguous.begin(), ambiguous.end(), at_marked_dim);
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t n = r.sizes()[d];
    const Follow f = follows(n, marks);
    if (f.i < 0 || (exact && f.c != 0)) continue;
    if (pick && std::find(ambiguous.begin(), ambiguous.end(), d) != ambiguous.end() && !at_marked_dim(d)) continue;
    const auto [lo, hi] = marks.ranges[static_cast<size_t>(f.i)];
    // Saturated: a range declared up to the int64 limit stays there.
    int64_t lower = f.k > 1 ? saturate_mul(f.k, lo) : std::max<int64_t>(0, saturate_add(lo, f.c));
    int64_t upper = f.k > 1 ? saturate_mul(f.k, hi) : saturate_add(hi, f.c), key = hi;
    if (f.j >= 0) {  // a sum of two marked sizes: the sum of their ranges
      const auto [lo2, hi2] = marks.ranges[static_cast<size_t>(f.j)];
      lower = saturate_add(lo, lo2), upper = saturate_add(hi, hi2), key = upper;
    }
    out.push_back(Range{nd, d, lower, upper, n, r.strides()[d], true, key});
  }
  return out;
}

}  // namespace

void mark_dynamic(const DeferredStorage* storage, int64_t ndim, int64_t dim, int64_t lower, int64_t upper, int64_t base,
                  int64_t stride) {
  std::lock_guard<std::mutex> lock(g_mu);
  detail::g_any_dynamic_marks.store(true, std::memory_order_release);
  auto& v = g_ranges[storage->id];
  // A mark the user declares replaces those carried from another region.
  v.erase(std::remove_if(v.begin(), v.end(), [](const Range& r) { return r.carried; }), v.end());
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
  for (auto s : r.sizes()) out.push_back(pow2_bucket(s));
  if (!any_dynamic_marks()) return out;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ranges.empty()) return out;
  auto it = g_ranges.find(r.storage->id);
  if (it == g_ranges.end()) return out;
  for (const Range& m : it->second) {
    const ViewMark v = view_mark(m, r);
    if (v.dim < 0) continue;
    const int64_t n = r.sizes()[v.dim];
    if (in_range(m, v, n)) {
      // One bucket for the range, distinct from every power of two (both
      // parts of a split).
      out[v.dim] = range_word(m, v);
      if (v.pair >= 0) out[v.pair] = out[v.dim];
    } else if (!m.carried && g_warned.emplace(r.storage->id, m.dim, n).second) {
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
    const ViewMark v = view_mark(m, r);
    if (v.dim < 0) continue;
    const int64_t n = r.sizes()[v.dim];
    if (!in_range(m, v, n)) continue;
    out.push_back(DynamicDim{v.dim, n, m.base, m.lower, m.upper, v.scale, v.divisor, v.part, v.index, v.step,
                             v.step > 1 ? start_along(m, r) : 0, v.trim});
    if (v.pair >= 0)
      out.push_back(DynamicDim{v.pair, v.divisor, m.base, m.lower, m.upper, 1, n, v.part, v.index, 1, 0, v.trim});
  }
  return out;
}

RegionMarks region_marks(const std::vector<Node>& g, const std::vector<int>& nodes) {
  RegionMarks marks;
  if (!any_dynamic_marks()) return marks;
  for (int i : nodes)
    for (const auto& in : g[i].inputs) {
      for (const DynamicDim& d : dynamic_dims(in.ref)) {
        marks.sizes.push_back(d.size);
        marks.dims.push_back(d.dim);
        // A split's part: 2 up to half the range's upper bound (the same
        // for both parts and every split, so a buffer that carries it keys
        // alike at every size).
        if (d.divisor > 1)
          marks.ranges.emplace_back(2, d.upper / 2);
        else if (d.step > 1)  // a step slice: the marked range divided by the step
          marks.ranges.emplace_back(d.lower / d.step, (d.upper + d.step - 1) / d.step);
        else
          marks.ranges.emplace_back(saturate_mul(d.scale, d.lower), saturate_mul(d.scale, d.upper));
      }
      if (in.written) marks.written.push_back(in.ref.storage.get());
    }
  if (marks.sizes.empty()) return marks;
  // The weights: whole storages the region only reads, made outside it, of
  // no mark (a slice, bias[:T, :T], may follow a marked size).
  std::unordered_set<const DeferredStorage*> made(marks.written.begin(), marks.written.end());
  for (int i : nodes) {
    for (const auto& in : g[i].inputs) {
      const DeferredStorage* s = in.ref.storage.get();
      if (!s || made.count(s) || !in.ref.covers_storage()) continue;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        if (g_ranges.count(s->id)) continue;
      }
      for (int64_t x : in.ref.sizes())
        if (x > 1) marks.fixed.push_back(x);
    }
    for (const auto& o : g[i].outputs) made.insert(o.storage.get());
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
    if (const uint64_t w = follow_word(r.sizes()[d], marks)) out[d] = w;
  return out;
}

void carry_marks(const std::vector<Node>& g, const std::vector<int>& nodes) {
  if (!any_dynamic_marks()) return;
  const RegionMarks marks = region_marks(g, nodes);
  if (marks.sizes.empty()) return;
  auto carry = [&](const TensorRef& r) {
    if (!r.storage || !r.covers_storage()) return;
    const uint64_t id = r.storage->id;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_ranges.count(id)) return;  // its own marks, or carried already
    }
    std::vector<Range> v = carried_marks(r, marks);
    if (v.empty()) return;
    std::lock_guard<std::mutex> lock(g_mu);
    g_ranges.emplace(id, std::move(v));
    g_carried.push_back(id);
    if (g_carried.size() <= kMaxCarried) return;
    auto old = g_ranges.find(g_carried.front());
    g_carried.pop_front();
    if (old == g_ranges.end()) return;
    auto& w = old->second;
    w.erase(std::remove_if(w.begin(), w.end(), [](const Range& x) { return x.carried; }), w.end());
    if (w.empty()) g_ranges.erase(old);
  };
  for (int i : nodes) {
    for (const auto& o : g[i].outputs) carry(o);
    for (const auto& in : g[i].inputs)
      if (in.written) carry(in.ref);
  }
}

uint64_t dynamic_marks_hash(const DeferredStorage* storage) {
  if (!any_dynamic_marks()) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ranges.find(storage->id);
  if (it == g_ranges.end()) return 0;
  uint64_t h = 0xCBF29CE484222325ULL;
  // A carried mark hashes its key bound, not its range (which a chance
  // relation shifts with the size): as its bucket word.
  for (const Range& m : it->second)
    for (int64_t v : {m.ndim, m.dim, m.carried ? -1 : m.lower, m.carried ? m.key_upper : m.upper, m.stride})
      h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL;
  return h | 1;
}

}  // namespace jit
}  // namespace tpu_eager
