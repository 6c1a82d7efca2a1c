// The flush cache (flush_cache.h): flush structures and a bounded LRU of plans.
#include "jit/flush_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "device/env.h"
#include "jit/dynamic_shapes.h"

namespace tpu_eager {
namespace jit {
namespace {

// Appends a non-tensor argument as the structural key and the fusion rules
// see it (partition.cpp mix_ivalue, fused_elementwise.cpp acceptance_key):
// structural values exactly, runtime scalars by kind. False for a kind
// neither describes.
bool push_arg(std::vector<uint64_t>& w, const c10::IValue& a) {
  if (a.isNone()) {
    w.push_back(1);
  } else if (a.isInt()) {
    w.push_back(2);
    w.push_back(static_cast<uint64_t>(a.toInt()));
  } else if (a.isBool()) {
    w.push_back(a.toBool() ? 4 : 3);
  } else if (a.isDouble()) {
    // A runtime parameter: only whether a finite value overflows float
    // (the fused loop's acceptance of the op depends on that).
    const double d = a.toDouble();
    w.push_back(std::isfinite(d) && std::isinf(static_cast<float>(d)) ? 6 : 5);
  } else if (a.isComplexDouble()) {
    w.push_back(7);
  } else if (a.isIntList()) {
    const auto list = a.toIntList();
    w.push_back(8 | static_cast<uint64_t>(list.size()) << 8);
    for (auto x : list) w.push_back(static_cast<uint64_t>(x));
  } else if (a.isTensor()) {
    // A wrapped number (CPU 0-dim tensor): its dtype and rank.
    const at::Tensor& t = a.toTensor();
    w.push_back(t.defined() ? 9 | static_cast<uint64_t>(t.scalar_type()) << 8 | static_cast<uint64_t>(t.dim()) << 16
                            : 10);
  } else if (a.isString()) {
    const std::string& str = a.toStringRef();
    w.push_back(11 | static_cast<uint64_t>(str.size()) << 8);
    for (size_t i = 0; i < str.size(); i += 8) {
      uint64_t v = 0;
      std::memcpy(&v, str.data() + i, std::min<size_t>(8, str.size() - i));
      w.push_back(v);
    }
  } else if (a.isDevice()) {
    const c10::Device d = a.toDevice();
    w.push_back(12 | static_cast<uint64_t>(d.type()) << 8 | static_cast<uint64_t>(d.index() + 1) << 24);
  } else if (a.isGenerator()) {
    w.push_back(13);  // the node's random stream was reserved at record time (Node::rng_seed)
  } else if (a.isDoubleList()) {
    const auto list = a.toDoubleList();
    w.push_back(14 | static_cast<uint64_t>(list.size()) << 8);
    for (double x : list) {
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      w.push_back(bits);
    }
  } else if (a.isBoolList()) {
    const auto list = a.toBoolList();
    w.push_back(15 | static_cast<uint64_t>(list.size()) << 8);
    for (bool x : list) w.push_back(x);
  } else if (a.isList()) {
    // Any other list (optional ints, tensors replaced by None): its elements.
    const auto list = a.toListRef();
    w.push_back(16 | static_cast<uint64_t>(list.size()) << 8);
    for (const c10::IValue& x : list)
      if (!push_arg(w, x)) return false;
  } else {
    return false;
  }
  return true;
}

struct Cache {
  std::mutex mu;
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

uint64_t flush_structure(const std::vector<Node>& g, const FlushStorages& fs, std::vector<uint64_t>* words,
                         bool* cacheable) {
  std::vector<uint64_t>& w = *words;
  *cacheable = true;
  // Written through a cursor into a buffer grown ahead of each node (the
  // per-word capacity checks of push_back were most of this pass's cost).
  size_t n = 0;
  auto room = [&](size_t extra) {
    if (n + extra > w.size()) w.resize(std::max(2 * w.size(), n + extra));
  };
  auto put_ref = [&](const TensorRef& r, int32_t number, uint64_t flags) {
    uint64_t* p = w.data() + n;
    const size_t rank = r.sizes.size();
    p[0] = static_cast<uint64_t>(static_cast<uint32_t>(number)) | static_cast<uint64_t>(r.dtype) << 32 |
           uint64_t{r.conj} << 40 | uint64_t{r.neg} << 41 | flags << 42 | uint64_t{rank} << 56;
    p[1] = static_cast<uint64_t>(r.offset);
    for (size_t d = 0; d < rank; ++d) {  // ranks are small: no memcpy call
      p[2 + d] = static_cast<uint64_t>(r.sizes[d]);
      p[2 + rank + d] = static_cast<uint64_t>(r.strides[d]);
    }
    n += 2 + 2 * rank;
  };
  size_t ref = 0;                                     // index into fs.numbers
  thread_local std::vector<uint64_t> kept_arg_words;  // kept: no allocation per flush
  std::vector<uint64_t>& arg_words = kept_arg_words;  // (one thread-local lookup)
  for (const Node& node : g) {
    size_t bound = 3 + node.returns.size() + node.list_lens.size();
    for (const auto& in : node.inputs) bound += 3 + 2 * in.ref.sizes.size();
    for (const auto& o : node.outputs) bound += 2 + 2 * o.sizes.size();
    room(bound);
    w[n++] = reinterpret_cast<uintptr_t>(&node.op.schema());
    w[n++] = static_cast<uint64_t>(node.kind) | uint64_t{node.rng} << 8 | uint64_t{node.inputs.size()} << 16 |
             uint64_t{node.outputs.size()} << 32 | uint64_t{node.args.size()} << 48;
    for (const auto& in : node.inputs) {
      put_ref(in.ref, fs.numbers[ref++], uint64_t{in.written});
      w[n++] = static_cast<uint64_t>(static_cast<uint32_t>(in.arg)) |
               static_cast<uint64_t>(static_cast<uint32_t>(in.elem + 1)) << 32;
    }
    for (const auto& o : node.outputs) put_ref(o, fs.numbers[ref++], 0);
    w[n++] = static_cast<uint64_t>(node.returns.size()) | static_cast<uint64_t>(node.list_lens.size()) << 32;
    for (int r : node.returns) w[n++] = static_cast<uint64_t>(static_cast<int64_t>(r));
    for (int l : node.list_lens) w[n++] = static_cast<uint64_t>(static_cast<int64_t>(l));
    arg_words.clear();
    for (const auto& a : node.args)
      if (!push_arg(arg_words, a)) *cacheable = false;
    room(arg_words.size());
    std::memcpy(w.data() + n, arg_words.data(), arg_words.size() * sizeof(uint64_t));
    n += arg_words.size();
  }
  room(2 * fs.storages.size());
  for (size_t k = 0; k < fs.storages.size(); ++k) {
    const DeferredStorage* s = fs.storages[k];
    w[n++] = static_cast<uint64_t>(s->nbytes) << 1 | uint64_t{fs.observed[k] != 0};
    w[n++] = dynamic_marks_hash(s);
  }
  w.resize(n);
  uint64_t h = 0xCBF29CE484222325ULL ^ n;
  for (uint64_t v : w) h = (h ^ v) * 0x9E3779B97F4A7C15ULL;
  return h ^ (h >> 31);
}

std::shared_ptr<const FlushPlan> flush_cache_find(uint64_t hash, const std::vector<uint64_t>& words) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto [lo, hi] = c.index.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    if ((*it->second)->words != words) continue;
    c.lru.splice(c.lru.begin(), c.lru, it->second);
    return *it->second;
  }
  return nullptr;
}

void flush_cache_insert(std::shared_ptr<const FlushPlan> plan) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const uint64_t hash = plan->hash;
  c.lru.push_front(std::move(plan));
  c.index.emplace(hash, c.lru.begin());
  c.trim();
}

void flush_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.index.clear();
  c.lru.clear();
}

size_t flush_cache_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.lru.size();
}

size_t flush_cache_limit() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.limit;
}

void set_flush_cache_limit(size_t limit) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.limit = std::max<size_t>(1, limit);
  c.trim();
}

}  // namespace jit
}  // namespace tpu_eager
