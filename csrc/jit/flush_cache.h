// The flush cache: what the JIT decided for a flush, reused by a later flush
// of the same structure (a training step's flushes recur every step).
//
// A flush's structure is its graph with storages replaced by their numbers
// (lazy/queue.h FlushStorages): per op, the operator, its primitive kind and
// random-stream use, its tensor arguments (argument position, storage number,
// dtype, conj / neg bits, exact offset, sizes and strides, whether written),
// its fresh outputs (the same), its non-tensor arguments as the structural
// key takes them (ints, bools, int lists, strings exactly; Python scalars
// and wrapped-number tensors by kind only: runtime parameters), and per
// storage whether it is observed after the flush, its size in bytes and its
// mark_dynamic ranges. A node recorded with an interned meta key
// (Node::meta_id) is written as that id and its storage numbers only: the id
// names one exact key, from which the rest follows. Two flushes of equal structure get the same liveness,
// partition, structural keys, layout signatures and flush-local memory
// schedule; a hit reuses them with the earlier flush's kernels, so the flush
// only binds this flush's buffers and scalars and runs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "jit/region.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace jit {

// What run_graph decided for a flush of one structure. Storages are named by
// their FlushStorages numbers.
struct FlushPlan {
  uint64_t hash = 0;
  std::vector<uint64_t> words;  // the structure (full equality on lookup)
  std::vector<char> live;       // per node: not dead code
  int64_t n_live = 0;
  std::vector<Region> regions;
  std::vector<uint64_t> keys;                    // per region: structural key
  std::vector<std::shared_ptr<Kernel>> kernels;  // per region
  // Per region: its layout_signature, one object the kernels that run it keep (Kernel::run_with_layout).
  std::vector<std::shared_ptr<const std::vector<int64_t>>> layouts;
  std::vector<std::vector<int32_t>> release_after;  // per region: flush-local storages freed after it
  std::vector<char> transient;                      // per storage number: flush-local (HostMemory::set_transient)
};

// A flush's structure as flush_structure writes it: the first `n` words of
// `buf` (which keeps its size from flush to flush: no allocation or clearing
// per flush), their hash (computed by flush_cache_find when it needs it),
// and whether the flush may use the cache.
struct FlushKey {
  std::vector<uint64_t> buf;
  size_t n = 0;
  uint64_t hash = 0;
  bool hashed = false;    // `hash` is the hash of the words
  bool cacheable = true;  // false when an argument has a kind the structure does not describe
};

// The structure of `g` into `key` (not hashed), numbering its storages into
// `fs` as it goes (what index_flush_storages, lazy/queue.h, gives). Under the
// flush lock, as index_flush_storages.
void flush_structure(const std::vector<Node>& g, FlushStorages& fs, FlushKey* key);

// The hash of `key`'s words (computed once; FlushPlan::hash of a plan built for it).
uint64_t flush_key_hash(FlushKey* key);

// The plan of an earlier flush with this structure (moved to the front of
// the LRU order), or null. Full equality of the words, not the hash alone.
// The plans this thread used last are compared first (their word counts,
// then their words): a step's flushes recur in order, so a hit usually
// needs no hash of the words and no index lookup.
std::shared_ptr<const FlushPlan> flush_cache_find(FlushKey* key);
// Adds a plan; drops least recently used plans past the limit.
void flush_cache_insert(std::shared_ptr<const FlushPlan> plan);
// Drops every plan (with the kernel cache: a target switch).
void flush_cache_clear();
// Plans held; at most flush_cache_limit().
size_t flush_cache_size();
// The bound: TORCH_TPU_FLUSH_CACHE_SIZE, else 256 plans. Setting it (at
// least 1) drops plans down to it at once.
size_t flush_cache_limit();
void set_flush_cache_limit(size_t limit);

}  // namespace jit
}  // namespace tpu_eager
