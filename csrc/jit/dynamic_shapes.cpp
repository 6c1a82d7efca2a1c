// Size buckets for the structural cache key.
#include "jit/dynamic_shapes.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
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
// The three never destroyed (leaked on the heap): a daemon thread's flush may still use
// them while the exiting thread runs the static destructors (docs/newcomer_review.md).
auto& g_ranges = *new std::unordered_map<uint64_t, std::vector<Range>>();
auto& g_carried = *new std::deque<uint64_t>();  // ids with carried marks, oldest first
auto& g_warned = *new std::set<std::tuple<uint64_t, int64_t, int64_t>>();

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

// The dims of `r`, a read view of a storage of no mark, that a slice cut
// short (their extent, size * stride, below the next larger stride, or the
// storage's elements for the largest) to a size equal to a marked size of
// the region: the rows of cos[:n] of a (1024, 16) table, both dims of a
// causal mask's mask[:n, :n]. Bit d for dim d; 0 when none (the 16 columns
// of cos[:n] are whole: no slice).
uint64_t sliced_to_a_mark(const TensorRef& r, const RegionMarks& marks) {
  const auto nd = r.sizes().size();
  if (marks.sizes.empty() || nd > 64 || r.strides().size() != nd || !r.storage || r.covers_storage()) return 0;
  const auto elems = static_cast<int64_t>(r.storage->nbytes / std::max<size_t>(1, c10::elementSize(r.dtype)));
  uint64_t bits = 0;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t n = r.sizes()[d], st = r.strides()[d];
    if (n <= 1 || st <= 0 || std::find(marks.sizes.begin(), marks.sizes.end(), n) == marks.sizes.end()) continue;
    int64_t next = elems;
    for (size_t e = 0; e < nd; ++e)
      if (r.strides()[e] > st && r.strides()[e] < next) next = r.strides()[e];
    if (n * st < next) bits |= uint64_t(1) << d;
  }
  return bits;
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

// ---- The size probe of carry_marks: which dims of a region's results follow
// its marked sizes (a result with two dims equal to one marked size, p @ v
// of (4, n, n) and (4, n, 16) at n = 16, holds one by chance).

// Each buffer the region makes (a node's result) or writes (an in-place or
// out= argument), keyed by slot_key: a flag per dim, set when the dim's size
// changes as every marked dim of the region's inputs grows by kGrowth.
using VaryingDims = std::unordered_map<int64_t, std::vector<char>>;
// Result j of the region's node at position p, or (written) its input j.
int64_t slot_key(size_t p, size_t j, bool written) {
  return static_cast<int64_t>(p) * 2048 + (written ? 1024 : 0) + static_cast<int64_t>(j);
}
constexpr int64_t kGrowth = 7;

// Sets element `elem` of a Tensor[] / Tensor?[] argument (or the argument
// itself, elem < 0) of a stack the probe owns.
void set_slot(c10::IValue& slot, int elem, at::Tensor t) {
  if (elem < 0) {
    slot = std::move(t);
  } else if (slot.isTensorList()) {
    auto list = std::move(slot).toTensorList().copy();
    list.set(elem, std::move(t));
    slot = std::move(list);
  } else {
    auto list = c10::impl::toTypedList<std::optional<at::Tensor>>(std::move(slot).toList()).copy();
    list.set(elem, std::optional<at::Tensor>(std::move(t)));
    slot = std::move(list);
  }
}

// `made` (a probed result, of the sizes and strides of `out`) as read
// through `r`: the result itself, or a permutation of its dims (a
// transpose); undefined otherwise (a slice or a reshape of it: its grown
// sizes are not known).
at::Tensor as_read(const at::Tensor& made, const TensorRef& out, const TensorRef& r) {
  if (r.offset != out.offset || r.sizes().size() != out.sizes().size()) return {};
  if (r.sizes().equals(out.sizes()) && r.strides().equals(out.strides())) return made;
  std::vector<int64_t> perm;
  std::vector<char> used(out.sizes().size(), 0);
  for (size_t d = 0; d < r.sizes().size(); ++d) {
    size_t j = 0;
    while (j < used.size() &&
           (used[j] || out.strides()[j] != r.strides()[d] || out.sizes()[j] != r.sizes()[d] || out.sizes()[j] <= 1))
      ++j;
    if (j == used.size()) return {};
    used[j] = 1;
    perm.push_back(static_cast<int64_t>(j));
  }
  return made.permute(perm);
}

// The input `in` of a node on meta tensors, its marked dims grown: a
// region input (dynamic_dims: a split, an equal part, a step slice or a
// merged dim grows otherwise, so none), or a buffer an earlier node made.
at::Tensor probe_input(
    const InputSlot& in, const c10::Argument& arg, const RegionMarks& marks,
    const std::unordered_map<const DeferredStorage*, std::pair<const TensorRef*, at::Tensor>>& made) {
  const auto opts = at::TensorOptions().dtype(in.ref.dtype).device(c10::kMeta);
  if (in.written && arg.is_out()) return at::empty({0}, opts);  // sized by the op from its grown operands
  if (auto it = made.find(in.ref.storage.get()); it != made.end())
    return as_read(it->second.second, *it->second.first, in.ref);
  std::vector<int64_t> sizes(in.ref.sizes().begin(), in.ref.sizes().end());
  const std::vector<DynamicDim> dims = dynamic_dims(in.ref);
  for (const DynamicDim& d : dims) {
    if (d.scale != 1 || d.divisor != 1 || d.part != 1 || d.step != 1 || d.trim != 0) return {};
    sizes[static_cast<size_t>(d.dim)] += kGrowth;
  }
  // A slice of a storage of no mark cut to a marked size grows with it (as
  // size_buckets keys it).
  const uint64_t sliced = dims.empty() && !in.written ? sliced_to_a_mark(in.ref, marks) : 0;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sliced >> d & 1) sizes[d] += kGrowth;
  return at::empty(sizes, opts);
}

// VaryingDims of the region's nodes: each node reruns on meta tensors in
// order; a node whose inputs cannot be grown (probe_input), that has no
// meta kernel or rejects the grown sizes leaves its results out.
VaryingDims probe_varying(const std::vector<Node>& g, const std::vector<int>& nodes, const RegionMarks& marks) {
  struct DropWarnings : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } drop;
  c10::WarningUtils::WarningHandlerGuard quiet(&drop);
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  std::unordered_map<const DeferredStorage*, std::pair<const TensorRef*, at::Tensor>> made;
  std::unordered_set<const DeferredStorage*> unknown;  // written in place, sizes not known grown
  VaryingDims out;
  auto note = [&](int64_t key, const TensorRef& ref, const at::Tensor& t) {
    if (!t.defined() || t.dim() != static_cast<int64_t>(ref.sizes().size())) return;
    made[ref.storage.get()] = {&ref, t};
    std::vector<char> v(ref.sizes().size());
    for (size_t d = 0; d < v.size(); ++d) v[d] = t.size(static_cast<int64_t>(d)) != ref.sizes()[d];
    out[key] = std::move(v);
  };
  for (size_t p = 0; p < nodes.size(); ++p) {
    const Node& n = g[nodes[p]];
    const auto& schema = n.op.schema();
    torch::jit::Stack stack(n.args.begin(), n.args.end());
    for (uint32_t w = n.wrapped; w != 0; w &= w - 1) {
      const int a = __builtin_ctz(w);
      at::Tensor t = at::scalar_to_tensor(stack[a].toScalar());
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      stack[a] = std::move(t);
    }
    // A buffer of no mark made outside the region that the node writes in
    // place (copy_ into `empty`'s buffer: x.float()) keeps its sizes, so
    // which of them grow is not known from its operands: the probe tries
    // its dims that follow marked sizes grown together, then fewer (the most
    // that the op accepts: copy_ of a grown (23, 64) source takes a (23, 64)
    // buffer, not (23, 71), so the 64 of a (16, 64) one is no 4n).
    int open = -1;
    std::vector<size_t> candidates;
    // Not a random op (its meta kernel must not touch a generator) nor a
    // custom one (a Python fake impl would need the GIL on the flush's thread).
    bool ok = !n.rng && schema.name().rfind("aten::", 0) == 0;
    for (size_t k = 0; ok && k < n.inputs.size(); ++k) {
      const InputSlot& in = n.inputs[k];
      ok = in.arg < static_cast<int>(schema.arguments().size()) && !unknown.count(in.ref.storage.get());
      if (!ok) break;
      if (in.written && !schema.arguments()[in.arg].is_out() && !made.count(in.ref.storage.get()) &&
          dynamic_dims(in.ref).empty()) {
        ok = open < 0;
        open = static_cast<int>(k);
        for (size_t d = 0; d < in.ref.sizes().size(); ++d)
          if (follows(in.ref.sizes()[d], marks).i >= 0) candidates.push_back(d);
        ok = ok && candidates.size() <= 4;
        continue;
      }
      at::Tensor t = probe_input(in, schema.arguments()[in.arg], marks, made);
      ok = t.defined();
      if (ok) set_slot(stack[in.arg], in.elem, std::move(t));
    }
    // A node the probe cannot run leaves what it writes unknown.
    auto skip = [&] {
      for (const auto& in : n.inputs)
        if (in.written) unknown.insert(in.ref.storage.get()), made.erase(in.ref.storage.get());
    };
    if (!ok) {
      skip();
      continue;
    }
    // The subsets of the candidates, the largest first.
    std::vector<uint32_t> subsets;
    for (uint32_t m = 0; m < (1u << candidates.size()); ++m) subsets.push_back(m);
    std::stable_sort(subsets.begin(), subsets.end(),
                     [](uint32_t a, uint32_t b) { return __builtin_popcount(a) > __builtin_popcount(b); });
    torch::jit::Stack ran;
    std::vector<at::Tensor> written;  // kept: an in-place or out= argument is its result
    bool done = false;
    for (uint32_t m : open < 0 ? std::vector<uint32_t>{0} : subsets) {
      torch::jit::Stack trial = stack;
      if (open >= 0) {
        const InputSlot& in = n.inputs[static_cast<size_t>(open)];
        std::vector<int64_t> sizes(in.ref.sizes().begin(), in.ref.sizes().end());
        for (size_t c = 0; c < candidates.size(); ++c)
          if (m >> c & 1) sizes[candidates[c]] += kGrowth;
        set_slot(trial[in.arg], in.elem, at::empty(sizes, at::TensorOptions().dtype(in.ref.dtype).device(c10::kMeta)));
      }
      written.clear();
      for (const auto& in : n.inputs)
        written.push_back(in.written && trial[in.arg].isTensor() ? trial[in.arg].toTensor() : at::Tensor());
      try {
        n.op.callBoxed(trial);
      } catch (...) {
        continue;
      }
      ran = std::move(trial);
      done = true;
      break;
    }
    if (!done) {
      skip();
      continue;
    }
    stack = std::move(ran);
    size_t j = 0;
    for (size_t k = 0; k < n.returns.size() && k < stack.size(); ++k) {
      if (n.returns[k] == -1 && j < n.outputs.size()) {
        note(slot_key(p, j, false), n.outputs[j], stack[k].isTensor() ? stack[k].toTensor() : at::Tensor());
        ++j;
      } else if (n.returns[k] == -2 && stack[k].isTensorList()) {
        for (const auto& t : stack[k].toTensorList())
          if (j < n.outputs.size()) note(slot_key(p, j, false), n.outputs[j], t), ++j;
      }
    }
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k].written && n.inputs[k].ref.covers_storage())
        note(slot_key(p, k, true), n.inputs[k].ref, written[k]);
  }
  return out;
}

// probe_varying, kept per region structure: the nodes' meta ids (each the
// op and its operands' sizes, strides and dtypes), which of their inputs an
// earlier node made, and each other input's marked and sliced dims. 0: not
// cacheable (a node without a meta id).
uint64_t probe_key(const std::vector<Node>& g, const std::vector<int>& nodes, const RegionMarks& marks) {
  uint64_t h = 0xCBF29CE484222325ULL;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001B3ULL; };
  std::unordered_map<const DeferredStorage*, uint64_t> made;
  for (int i : nodes) {
    const Node& n = g[i];
    if (n.meta_id == 0) return 0;
    mix(n.meta_id);
    for (const auto& in : n.inputs) {
      mix(static_cast<uint64_t>(in.ref.offset));
      if (auto it = made.find(in.ref.storage.get()); it != made.end()) {
        mix(it->second);
        continue;
      }
      mix(sliced_to_a_mark(in.ref, marks));
      for (const DynamicDim& d : dynamic_dims(in.ref))
        for (int64_t x : {d.dim, d.scale, d.divisor, d.part, d.step, d.trim}) mix(static_cast<uint64_t>(x));
    }
    for (const auto& o : n.outputs) made.emplace(o.storage.get(), made.size() + 1);
  }
  return h | 1;
}

// At most this many probed region structures are kept (then all dropped).
constexpr size_t kMaxProbes = 1024;
std::mutex g_probe_mu;
auto& g_probes = *new std::unordered_map<uint64_t, VaryingDims>();  // never destroyed, as g_ranges

VaryingDims cached_probe(const std::vector<Node>& g, const std::vector<int>& nodes, const RegionMarks& marks) {
  const uint64_t key = probe_key(g, nodes, marks);
  if (key != 0) {
    std::lock_guard<std::mutex> lock(g_probe_mu);
    if (auto it = g_probes.find(key); it != g_probes.end()) return it->second;
  }
  VaryingDims v = probe_varying(g, nodes, marks);
  if (key != 0) {
    std::lock_guard<std::mutex> lock(g_probe_mu);
    if (g_probes.size() >= kMaxProbes) g_probes.clear();
    g_probes.emplace(key, v);
  }
  return v;
}

// Marks for buffer `r` (no marks of its own) from the region's `marks`:
// one per dim that follows a marked size (only exact and multiple ones when
// some dim is exact) and that the size probe, when `varying` holds it,
// found to vary. Empty when none does.
std::vector<Range> carried_marks(const TensorRef& r, const RegionMarks& marks, const std::vector<char>* varying) {
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
    if (varying && varying->size() == static_cast<size_t>(nd) && !(*varying)[static_cast<size_t>(d)]) continue;
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
  // The written buffers of no mark (made outside the region) with two or
  // more dims that follow marked sizes: the size probe says which grow.
  std::optional<VaryingDims> probed;
  std::unordered_set<const DeferredStorage*> outputs;
  for (size_t p = 0; p < nodes.size(); ++p) {
    const Node& n = g[nodes[p]];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const InputSlot& in = n.inputs[k];
      const DeferredStorage* s = in.ref.storage.get();
      if (!in.written || !s || outputs.count(s) ||
          std::any_of(marks.varying.begin(), marks.varying.end(), [&](const auto& v) { return v.first == s; }))
        continue;
      int following = 0;
      for (int64_t x : in.ref.sizes()) following += follow_word(x, marks) != 0;
      if (following < 2) continue;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        if (g_ranges.count(s->id)) continue;
      }
      if (!probed) probed = cached_probe(g, nodes, marks);
      if (auto it = probed->find(slot_key(p, k, true)); it != probed->end()) marks.varying.emplace_back(s, it->second);
    }
    for (const auto& o : n.outputs) outputs.insert(o.storage.get());
  }
  return marks;
}

SizeBuckets size_buckets(const TensorRef& r, const RegionMarks& marks) {
  SizeBuckets out = size_buckets(r);
  const DeferredStorage* s = r.storage.get();
  if (marks.sizes.empty() || !s) return out;
  const bool written = std::find(marks.written.begin(), marks.written.end(), s) != marks.written.end();
  const uint64_t sliced = written ? 0 : sliced_to_a_mark(r, marks);
  if (!written && sliced == 0) return out;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_ranges.count(s->id)) return out;  // a marked storage keeps its own marks
  }
  const std::vector<char>* varying = nullptr;
  for (const auto& [buffer, v] : marks.varying)
    if (buffer == s && v.size() == out.size()) varying = &v;
  for (size_t d = 0; d < out.size(); ++d)
    if ((written && (!varying || (*varying)[d])) || (sliced >> d & 1))
      if (const uint64_t w = follow_word(r.sizes()[d], marks)) out[d] = w;
  return out;
}

void carry_marks(const std::vector<Node>& g, const std::vector<int>& nodes) {
  if (!any_dynamic_marks()) return;
  const RegionMarks marks = region_marks(g, nodes);
  if (marks.sizes.empty()) return;
  // The size probe runs once some buffer to carry has two or more dims that
  // follow marked sizes by value (p @ v of (4, n, n) and (4, n, 16) at n =
  // 16; silu(a) * b of (n, 256) at n = 16, 16n), for the whole region (a
  // result's dims follow its operands', made by the nodes before it); it
  // drops the dims that do not grow with the marks.
  std::optional<VaryingDims> varying;
  auto carry = [&](const TensorRef& r, int64_t key) {
    if (!r.storage || !r.covers_storage()) return;
    const uint64_t id = r.storage->id;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_ranges.count(id)) return;  // its own marks, or carried already
    }
    std::vector<Range> ranges = carried_marks(r, marks, nullptr);
    const std::vector<char>* v = nullptr;
    if (ranges.size() >= 2) {
      if (!varying) varying = cached_probe(g, nodes, marks);
      if (auto it = varying->find(key); it != varying->end()) v = &it->second;
      if (v) ranges = carried_marks(r, marks, v);
    }
    if (ranges.empty()) return;
    std::lock_guard<std::mutex> lock(g_mu);
    g_ranges.emplace(id, std::move(ranges));
    g_carried.push_back(id);
    if (g_carried.size() <= kMaxCarried) return;
    auto old = g_ranges.find(g_carried.front());
    g_carried.pop_front();
    if (old == g_ranges.end()) return;
    auto& w = old->second;
    w.erase(std::remove_if(w.begin(), w.end(), [](const Range& x) { return x.carried; }), w.end());
    if (w.empty()) g_ranges.erase(old);
  };
  for (size_t p = 0; p < nodes.size(); ++p) {
    const Node& n = g[nodes[p]];
    for (size_t j = 0; j < n.outputs.size(); ++j) carry(n.outputs[j], slot_key(p, j, false));
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k].written) carry(n.inputs[k].ref, slot_key(p, k, true));
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
