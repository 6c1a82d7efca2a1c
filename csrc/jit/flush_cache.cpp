// The flush cache (flush_cache.h): flush structures and a bounded LRU of plans.
#include "jit/flush_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "device/env.h"
#include "device/spin_lock.h"
#include "jit/dynamic_shapes.h"

namespace tpu_eager {
namespace jit {
namespace {

// The words of a flush's structure, written through a cursor into a buffer
// that keeps its size between flushes: room() grows it ahead of a write (the
// per-word capacity checks of push_back, and clearing the buffer each flush,
// were most of this pass's cost).
struct Words {
  std::vector<uint64_t>& buf;
  size_t n = 0;
  void room(size_t extra) {
    if (n + extra > buf.size()) buf.resize(std::max(2 * buf.size(), n + extra + 256));
  }
  void put(uint64_t v) { buf[n++] = v; }  // after room()
};

// The words of the common argument kinds (a tensor slot, None, float, int,
// bool) at `p` (room for two words); returns the end, or null for any other
// kind (push_rare_arg writes those). Structural values exactly, a float by
// whether it overflows float only (a runtime parameter: the fused loop's
// acceptance of the op depends on that).
inline uint64_t* write_common_arg(uint64_t* __restrict p, const c10::IValue& a) {
  if (a.isTensor()) {
    // The slot a recorded tensor left (undefined), or a wrapped number (CPU 0-dim tensor): its dtype and rank.
    const at::Tensor& t = a.toTensor();
    *p = t.defined() ? 9 | static_cast<uint64_t>(t.scalar_type()) << 8 | static_cast<uint64_t>(t.dim()) << 16 : 10;
  } else if (a.isNone()) {
    *p = 1;
  } else if (a.isDouble()) {
    const double d = a.toDouble();
    *p = std::isfinite(d) && std::isinf(static_cast<float>(d)) ? 6 : 5;
  } else if (a.isInt()) {
    p[0] = 2;
    p[1] = static_cast<uint64_t>(a.toInt());
    return p + 2;
  } else if (a.isBool()) {
    *p = a.toBool() ? 4 : 3;
  } else {
    return nullptr;
  }
  return p + 1;
}

// (push_arg, below, is declared first: a list's elements recurse into it.)
inline bool push_arg(Words& w, const c10::IValue& a);

// push_arg's kinds other than the common ones write_common_arg writes (None, float,
// int, wrapped number, bool): lists, complex, strings, devices, generators.
// Out of line: rare, and recursive for lists.
bool push_rare_arg(Words& w, const c10::IValue& a) {
  w.room(2);
  if (a.isList()) {
    if (a.isIntList()) {
      const auto list = a.toIntList();
      w.room(1 + list.size());
      w.put(8 | static_cast<uint64_t>(list.size()) << 8);
      for (auto x : list) w.put(static_cast<uint64_t>(x));
    } else if (a.isDoubleList()) {
      const auto list = a.toDoubleList();
      w.room(1 + list.size());
      w.put(14 | static_cast<uint64_t>(list.size()) << 8);
      for (double x : list) {
        uint64_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        w.put(bits);
      }
    } else if (a.isBoolList()) {
      const auto list = a.toBoolList();
      w.room(1 + list.size());
      w.put(15 | static_cast<uint64_t>(list.size()) << 8);
      for (bool x : list) w.put(x);
    } else {
      // Any other list (optional ints, tensors replaced by None): its elements.
      const auto list = a.toListRef();
      w.put(16 | static_cast<uint64_t>(list.size()) << 8);
      for (const c10::IValue& x : list)
        if (!push_arg(w, x)) return false;
    }
  } else if (a.isComplexDouble()) {
    w.put(7);
  } else if (a.isString()) {
    const std::string& str = a.toStringRef();
    w.room(1 + (str.size() + 7) / 8);
    w.put(11 | static_cast<uint64_t>(str.size()) << 8);
    for (size_t i = 0; i < str.size(); i += 8) {
      uint64_t v = 0;
      std::memcpy(&v, str.data() + i, std::min<size_t>(8, str.size() - i));
      w.put(v);
    }
  } else if (a.isDevice()) {
    const c10::Device d = a.toDevice();
    w.put(12 | static_cast<uint64_t>(d.type()) << 8 | static_cast<uint64_t>(d.index() + 1) << 24);
  } else if (a.isGenerator()) {
    w.put(13);  // the node's random stream was reserved at record time (Node::rng_seed)
  } else {
    return false;
  }
  return true;
}

// Appends a non-tensor argument as the structural key and the fusion rules
// see it (partition.cpp mix_ivalue, fused_elementwise.cpp acceptance_key):
// structural values exactly, runtime scalars by kind. False for a kind
// neither describes. (The common kinds are tested first.)
inline bool push_arg(Words& w, const c10::IValue& a) {
  w.room(2);
  if (uint64_t* end = write_common_arg(w.buf.data() + w.n, a)) {
    w.n = static_cast<size_t>(end - w.buf.data());
    return true;
  }
  return push_rare_arg(w, a);
}

// A hash of `n` words: four independent multiply-xor lanes (a quarter of the
// loop overhead of one), then folded.
uint64_t hash_words(const uint64_t* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  uint64_t h0 = 0xCBF29CE484222325ULL ^ n, h1 = 0x84222325CBF29CE4ULL, h2 = 0x2545F4914F6CDD1DULL, h3 = kMul;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    h0 = (h0 ^ p[i]) * kMul;
    h1 = (h1 ^ p[i + 1]) * kMul;
    h2 = (h2 ^ p[i + 2]) * kMul;
    h3 = (h3 ^ p[i + 3]) * kMul;
  }
  for (; i < n; ++i) h0 = (h0 ^ p[i]) * kMul;
  uint64_t h = h0;
  h = (h ^ (h1 >> 29 | h1 << 35)) * kMul;
  h = (h ^ (h2 >> 17 | h2 << 47)) * kMul;
  h = (h ^ (h3 >> 41 | h3 << 23)) * kMul;
  return h ^ (h >> 31);
}

struct Cache {
  // A spin lock (device/spin_lock.h): a cache-hit flush takes it once to move
  // its plan to the LRU front; a std::mutex pair was ~55 instructions.
  SpinLock mu;
  std::list<std::shared_ptr<const FlushPlan>> lru;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<std::shared_ptr<const FlushPlan>>::iterator> index;
  size_t limit = [] {
    const int64_t n = env::get_int("TORCH_TPU_FLUSH_CACHE_SIZE");
    TORCH_CHECK_VALUE(n >= 1, "environment variable TORCH_TPU_FLUSH_CACHE_SIZE=", n, ": expected at least 1");
    return static_cast<size_t>(n);
  }();

  void trim() {
    while (lru.size() > limit) {
      auto last = std::prev(lru.end());
      auto [lo, hi] = index.equal_range((*last)->hash);
      for (auto it = lo; it != hi; ++it) {
        if (it->second == last) {
          index.erase(it);
          break;
        }
      }
      lru.pop_back();
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: kernels may outlive static destructors' order
  return *c;
}

}  // namespace

namespace {

// The words of a tensor reference at `p`: its storage number, dtype, conj /
// neg bits, `flags`, rank, offset, sizes and strides. Returns the end.
inline uint64_t* write_ref(uint64_t* __restrict p, const TensorRef& r, int32_t number, uint64_t flags) {
  const size_t rank = r.dim();
  p[0] = static_cast<uint64_t>(static_cast<uint32_t>(number)) | static_cast<uint64_t>(r.dtype) << 32 |
         uint64_t{r.conj} << 40 | uint64_t{r.neg} << 41 | flags << 42 | uint64_t{rank} << 56;
  p[1] = static_cast<uint64_t>(r.offset);
  const int64_t* sizes = r.sizes().data();
  const int64_t* strides = r.strides().data();
  for (size_t d = 0; d < rank; ++d) {  // ranks are small: no memcpy call
    p[2 + d] = static_cast<uint64_t>(sizes[d]);
    p[2 + rank + d] = static_cast<uint64_t>(strides[d]);
  }
  return p + 2 + 2 * rank;
}

// The words node `n` writes before its arguments of rare kinds, at most.
size_t node_bound(const Node& n) {
  size_t bound = 3 + n.returns.size() + n.list_lens.size() + 2 * n.args.size();
  for (const auto& in : n.inputs) bound += 3 + 2 * in.ref.dim();
  for (const auto& o : n.outputs) bound += 2 + 2 * o.dim();
  return bound;
}

// Room for `extra` more words after the cursor `p` (which may move: the buffer may grow).
uint64_t* make_room(Words& w, uint64_t* p, size_t extra) {
  w.n = static_cast<size_t>(p - w.buf.data());
  w.room(extra);
  return w.buf.data() + w.n;
}

}  // namespace

void flush_structure(const std::vector<Node>& g, FlushStorages& fs, FlushKey* key) {
  // The words go through a local cursor into room made once per node (its
  // words' upper bound); only an argument of a rare kind goes through Words
  // (push_arg). A per-word room check and a cursor kept in memory were most
  // of this pass's ~5 K instructions for a 16-op flush. The storages are
  // numbered as their references are written (one walk over the references,
  // not a numbering pass and then this one).
  Words w{key->buf};
  bool cacheable = true;
  const uint64_t stamp = begin_flush_storages(g, fs);
  int32_t* numbers = fs.numbers.data();
  for (const Node& node : g) {
    if (node.meta_id != 0) {
      // A node with an interned meta key: its id stands for the operator,
      // every reference's dtype, conj / neg bits, offset, sizes and strides,
      // the written flags, the returns and the structural arguments (exactly;
      // Scalars by kind and value class); beside it only what the key does not
      // hold: the storage numbers, two to a word (their count follows from the
      // id). Its first word is odd; a full node's (a schema address) even.
      const size_t nrefs = node.inputs.size() + node.outputs.size();
      w.room(1 + (nrefs + 1) / 2);
      uint64_t* p = w.buf.data() + w.n;
      *p++ = node.meta_id << 16 | static_cast<uint64_t>(node.kind) << 8 | uint64_t{node.checks_values} << 1 | 1;
      uint64_t pair = 0;
      bool half = false;
      auto put_number = [&](DeferredStorage* s) {
        const uint64_t k = static_cast<uint32_t>(number_storage(fs, s, stamp, numbers++));
        if (half) *p++ = pair | k << 32;
        pair = k;
        half = !half;
      };
      for (const auto& in : node.inputs) put_number(in.ref.storage.get());
      for (const auto& o : node.outputs) put_number(o.storage.get());
      if (half) *p++ = pair;
      w.n = static_cast<size_t>(p - w.buf.data());
      continue;
    }
    // Room for the node's words with its references at up to TensorRef::kInline
    // dims each (a loop over the references for their ranks first was ~0.4 K
    // instructions of a 16-op flush); a reference of more dims makes room
    // for the whole node (node_bound) before its words.
    const size_t nrefs = node.inputs.size() + node.outputs.size();
    w.room(3 + node.returns.size() + node.list_lens.size() + 2 * node.args.size() +
           (3 + 2 * TensorRef::kInline) * nrefs);
    uint64_t* p = w.buf.data() + w.n;
    *p++ = reinterpret_cast<uintptr_t>(&node.op.schema());
    *p++ = static_cast<uint64_t>(node.kind) | uint64_t{node.rng} << 8 | uint64_t{node.inputs.size()} << 16 |
           uint64_t{node.outputs.size()} << 32 | uint64_t{node.args.size()} << 48;
    for (const auto& in : node.inputs) {
      if (C10_UNLIKELY(in.ref.dim() > TensorRef::kInline)) p = make_room(w, p, node_bound(node));
      p = write_ref(p, in.ref, number_storage(fs, in.ref.storage.get(), stamp, numbers++), uint64_t{in.written});
      *p++ = static_cast<uint64_t>(static_cast<uint32_t>(in.arg)) |
             static_cast<uint64_t>(static_cast<uint32_t>(in.elem + 1)) << 32;
    }
    for (const auto& o : node.outputs) {
      if (C10_UNLIKELY(o.dim() > TensorRef::kInline)) p = make_room(w, p, node_bound(node));
      p = write_ref(p, o, number_storage(fs, o.storage.get(), stamp, numbers++), 0);
    }
    *p++ = static_cast<uint64_t>(node.returns.size()) | static_cast<uint64_t>(node.list_lens.size()) << 32;
    for (int r : node.returns) *p++ = static_cast<uint64_t>(static_cast<int64_t>(r));
    for (int l : node.list_lens) *p++ = static_cast<uint64_t>(static_cast<int64_t>(l));
    const size_t nargs = node.args.size();
    for (size_t a = 0; a < nargs; ++a) {
      const c10::IValue& arg = node.args[a];
      if (is_wrapped_arg(node, a)) {
        // A wrapped number kept as its Scalar: the words its tensor had (dtype, rank 0).
        *p++ = 9 | static_cast<uint64_t>(wrapped_number_dtype(arg)) << 8;
      } else if (uint64_t* next = write_common_arg(p, arg)) {
        p = next;
      } else {
        // A rare kind: through Words, which may grow the buffer; then room for the rest.
        w.n = static_cast<size_t>(p - w.buf.data());
        if (!push_rare_arg(w, arg)) cacheable = false;
        w.room(2 * (nargs - a));
        p = w.buf.data() + w.n;
      }
    }
    w.n = static_cast<size_t>(p - w.buf.data());
  }
  end_flush_storages(g, fs);
  const size_t nstorages = fs.storages.size();
  w.room(2 * nstorages);
  const bool marks = any_dynamic_marks();  // else every hash is 0: no call per storage
  // Through a local cursor, as the nodes' words (Words::put kept the count in memory).
  uint64_t* __restrict p = w.buf.data() + w.n;
  DeferredStorage* const* storages = fs.storages.data();
  const char* observed = fs.observed.data();
  for (size_t k = 0; k < nstorages; ++k) {
    const DeferredStorage* s = storages[k];
    p[0] = static_cast<uint64_t>(s->nbytes) << 1 | uint64_t{observed[k] != 0};
    p[1] = marks ? dynamic_marks_hash(s) : 0;
    p += 2;
  }
  w.n = static_cast<size_t>(p - w.buf.data());
  key->n = w.n;
  key->cacheable = cacheable;
  key->hashed = false;
}

uint64_t flush_key_hash(FlushKey* key) {
  if (!key->hashed) {
    key->hash = hash_words(key->buf.data(), key->n);
    key->hashed = true;
  }
  return key->hash;
}

namespace {

// The plans this thread found or inserted last, most recent first, with
// their word counts (compared before anything else). Weak: the cache alone
// keeps plans alive, and a plan found here is used only while the cache
// still holds it (flush_cache_clear, eviction).
struct RecentPlan {
  std::weak_ptr<const FlushPlan> plan;
  size_t n = 0;
};
constexpr size_t kRecentPlans = 8;
thread_local RecentPlan t_recent[kRecentPlans];

// Makes `plan` this thread's most recent plan.
void note_recent(const std::shared_ptr<const FlushPlan>& plan) {
  size_t at = 0;
  while (at + 1 < kRecentPlans && t_recent[at].n != 0 && t_recent[at].plan.lock() != plan) ++at;
  for (size_t k = at; k > 0; --k) t_recent[k] = std::move(t_recent[k - 1]);
  t_recent[0] = {plan, plan->words.size()};
}

// Moves the index entry of `plan` to the front of the LRU order; false when
// the cache no longer holds it. Under c.mu.
bool touch_locked(Cache& c, const FlushPlan* plan) {
  if (!c.lru.empty() && c.lru.front().get() == plan) return true;  // already first (a flush repeated)
  auto [lo, hi] = c.index.equal_range(plan->hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second->get() != plan) continue;
    c.lru.splice(c.lru.begin(), c.lru, it->second);
    return true;
  }
  return false;
}

}  // namespace

std::shared_ptr<const FlushPlan> flush_cache_find(FlushKey* key) {
  Cache& c = cache();
  const size_t bytes = key->n * sizeof(uint64_t);
  for (size_t k = 0; k < kRecentPlans && t_recent[k].n != 0; ++k) {
    if (t_recent[k].n != key->n) continue;
    std::shared_ptr<const FlushPlan> plan = t_recent[k].plan.lock();
    if (!plan || std::memcmp(plan->words.data(), key->buf.data(), bytes) != 0) continue;
    bool held;
    {
      std::lock_guard<SpinLock> lock(c.mu);
      held = touch_locked(c, plan.get());
    }
    if (!held) break;  // evicted or cleared: the index decides
    if (k > 0) note_recent(plan);
    return plan;
  }
  const uint64_t hash = flush_key_hash(key);
  std::shared_ptr<const FlushPlan> found;
  {
    std::lock_guard<SpinLock> lock(c.mu);
    auto [lo, hi] = c.index.equal_range(hash);
    for (auto it = lo; it != hi; ++it) {
      const std::vector<uint64_t>& words = (*it->second)->words;
      if (words.size() != key->n || std::memcmp(words.data(), key->buf.data(), bytes) != 0) continue;
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      found = *it->second;
      break;
    }
  }
  if (found) note_recent(found);
  return found;
}

void flush_cache_insert(std::shared_ptr<const FlushPlan> plan) {
  note_recent(plan);
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  const uint64_t hash = plan->hash;
  c.lru.push_front(std::move(plan));
  c.index.emplace(hash, c.lru.begin());
  c.trim();
}

void flush_cache_clear() {
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  c.index.clear();
  c.lru.clear();
}

size_t flush_cache_size() {
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  return c.lru.size();
}

size_t flush_cache_limit() {
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  return c.limit;
}

void set_flush_cache_limit(size_t limit) {
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  c.limit = std::max<size_t>(1, limit);
  c.trim();
}

}  // namespace jit
}  // namespace tpu_eager
