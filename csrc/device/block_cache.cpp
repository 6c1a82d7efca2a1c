// Host blocks with a cache of freed large blocks (see block_cache.h).
#include "device/block_cache.h"
#include "device/fork.h"
#include "device/spin_lock.h"

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace tpu_eager {
namespace {

constexpr size_t kCachedMin = size_t{64} << 10;     // blocks from here on: by rounded size, in `free_blocks`
constexpr size_t kSmallMax = kCachedMin - 64;       // blocks up to here: by 64-byte granule, in `small`
constexpr int64_t kSmallLimit = int64_t{16} << 20;  // bytes of cached small blocks
// DeferredStorage memories kept with cached small blocks (~200 bytes each):
// a flush of ~4,000 ops gives all its intermediates' back.
constexpr int64_t kMaxCompanions = 4096;
constexpr size_t kGranule = size_t{4} << 10;         // cache buckets: whole pages
constexpr int64_t kCacheLimit = int64_t{512} << 20;  // bounded: a shape storm must not hoard memory

struct Cached {
  void* ptr;
  int device;  // the chip that freed it (its memory_reserved counts it)
  // The memory of the DeferredStorage that held a small block when the flush
  // freed both (block_free_paired), or nullptr: the next storage of that size
  // takes both in one pop (block_alloc_paired).
  void* companion = nullptr;
};

// Per-chip counters have one more slot: the host temporaries' (counted to no chip).
constexpr int kHostSlot = kMaxBlockDevices;

struct Cache {
  SpinLock mu;  // taken once an op (a fresh result's small block): see SpinLock
  std::unordered_map<size_t, std::vector<Cached>> free_blocks;  // rounded size -> blocks
  // Small blocks (a scalar, a bias, an optimizer's step count, a small
  // model's activations): one bucket per 64-byte size. A fresh 64-byte-aligned
  // block from the C library costs ~500-1,200 instructions (aligned_alloc's
  // memalign path) and its free ~300-700; the record path allocates one per
  // fresh result, the flush one per temporary (docs/performance.md). Up to
  // 4 KiB only, the 2-layer llama's 8-32 KiB activations took ~220 of them a step.
  // Each bucket a list threaded through its blocks' first bytes (a block is
  // at least 64 bytes): a push or pop is a few loads and stores, where a
  // vector's push_back was an out-of-line call (~25 instructions a block).
  struct FreeNode {
    FreeNode* next;
    void* companion;  // see Cached
    int device;
  };
  FreeNode* small[kSmallMax / 64 + 1] = {};
  void push_small(size_t size, void* ptr, int device, void* companion) {
    auto* node = static_cast<FreeNode*>(ptr);
    node->next = small[size / 64];
    node->companion = companion;
    node->device = device;
    small[size / 64] = node;
  }
  int64_t small_bytes = 0;
  // Companions of small blocks that a plain block_alloc took (a host
  // temporary): block_alloc_paired pairs them with companion-less blocks.
  std::vector<void*> spare_companions;
  int64_t companions = 0;  // kept, with blocks or spare (at most kMaxCompanions)
  // Written under `mu`; read without it (block_cache_bytes: every device
  // allocation updates the chip's reserved peak, and a lock there cost the
  // record path ~100 instructions an op).
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> device_bytes[kMaxBlockDevices + 1] = {};
};

int slot(int device) { return device >= 0 && device < kMaxBlockDevices ? device : 0; }

Cache& cache() {
  static auto* c = new Cache();  // never destroyed: storages may die after static destructors
  return *c;
}

// Blocks of 4 MiB or more are 2 MiB-aligned multiples of 2 MiB and ask the
// kernel for transparent huge pages (MADV_HUGEPAGE; Linux grants them in its
// "madvise" mode, which this machine runs): a 16 MiB buffer then needs 8 TLB
// entries instead of 4,096. A row loop over two 16 MiB buffers ran 5-15%
// faster on them in a standalone test on this machine. At most 2 MiB per
// block is padding; below 4 MiB it could be half the block.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = size_t{4} << 20;

size_t rounded(size_t nbytes) {
  if (nbytes >= kHugeMin) return (nbytes + kHugePage - 1) / kHugePage * kHugePage;
  return nbytes >= kCachedMin ? (nbytes + kGranule - 1) / kGranule * kGranule : (nbytes + 63) / 64 * 64;
}

void* fresh_block(size_t size) {
  if (size < kHugeMin) return std::aligned_alloc(64, size);
  void* p = std::aligned_alloc(kHugePage, size);
  if (p) madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages the block still works
  return p;
}

std::atomic<int64_t> g_live_padding[kMaxBlockDevices + 1] = {};  // rounded minus requested bytes of blocks in use

// A cached block of `nbytes`, else a fresh one. `companion`: where to put
// the DeferredStorage memory that came with a small block (else, or when
// none did, a spare one; nullptr if none is kept), or nullptr: the caller
// wants none (its companion is kept for a later paired take). `device`: the
// chip asking; `*reused_same` is set when the block came from the cache and
// was that chip's (its memory_reserved does not change).
void* take_block(size_t nbytes, int device, void** companion, bool* reused_same) {
  const size_t size = rounded(nbytes);
  if (size <= kSmallMax) {
    Cache& c = cache();
    std::lock_guard<SpinLock> lock(c.mu);
    if (Cache::FreeNode* node = c.small[size / 64]) {
      c.small[size / 64] = node->next;
      // The next take of this size reads that block's link first: a block
      // freed a flush ago is out of the data cache by then, and that load
      // stalled this pop (docs/performance.md, section llama21).
      if (node->next != nullptr) __builtin_prefetch(node->next, 1);
      const Cached b{node, node->device, node->companion};
      // The caller builds its storage in the companion next: fetched from here
      // on, before the counters' atomic updates, which wait for memory.
      if (b.companion != nullptr && companion != nullptr) __builtin_prefetch(b.companion, 1);
      c.small_bytes -= static_cast<int64_t>(size);
      add_locked(c.bytes, -static_cast<int64_t>(size));
      add_locked(c.device_bytes[b.device], -static_cast<int64_t>(size));
      *reused_same = b.device == device;
      if (companion == nullptr) {
        if (b.companion != nullptr) c.spare_companions.push_back(b.companion);
      } else if (b.companion != nullptr) {
        *companion = b.companion;
        --c.companions;
      } else if (!c.spare_companions.empty()) {
        *companion = c.spare_companions.back();
        c.spare_companions.pop_back();
        --c.companions;
      }
      return b.ptr;
    }
  } else if (size >= kCachedMin) {
    Cache& c = cache();
    std::lock_guard<SpinLock> lock(c.mu);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      const Cached b = it->second.back();
      it->second.pop_back();
      add_locked(c.bytes, -static_cast<int64_t>(size));
      add_locked(c.device_bytes[b.device], -static_cast<int64_t>(size));
      *reused_same = b.device == device;
      return b.ptr;
    }
  }
  return fresh_block(size);
}

void* alloc_in(size_t nbytes, int s, void** companion, bool* reused_same) {
  void* p = take_block(nbytes, s, companion, reused_same);
  // Most blocks are whole 64-byte multiples: no padding, no locked add.
  const auto pad = static_cast<int64_t>(rounded(nbytes) - nbytes);
  if (p && pad != 0) g_live_padding[s].fetch_add(pad);
  return p;
}

// The small blocks freed while a BlockFreeBatch is alive, by the thread that
// made it (`owner`; one thread at a time, in practice the flushing one). A
// global rather than a thread_local: this library's thread_locals cost a
// __tls_get_addr call (~30 instructions) per access, pthread_self() a load.
struct FreeBatch {
  static constexpr int kCap = 64;
  std::atomic<pthread_t> owner{0};  // 0: none
  int depth = 0;                    // the owner's BlockFreeBatch scopes; the fields below are the owner's
  int n = 0;
  // The DeferredStorage memory that block_free_paired took last: its
  // operator delete, which runs next, leaves it to the batch (block_companion_kept).
  std::atomic<void*> kept{nullptr};
  struct Item {
    void* ptr;
    size_t size;  // rounded
    int device;
    void* companion;  // see Cached
  } items[kCap];
};
FreeBatch g_batch;

// Returns the batch's blocks to the cache under one lock (those past the
// small-block limit to the C library, after it).
void drain(FreeBatch& b) {
  if (b.n == 0) return;
  Cache& c = cache();
  int spill = 0;  // items[0, spill): over the limit
  {
    std::lock_guard<SpinLock> lock(c.mu);
    for (int i = 0; i < b.n; ++i) {
      const FreeBatch::Item it = b.items[i];
      if (c.small_bytes + static_cast<int64_t>(it.size) > kSmallLimit) {
        b.items[spill++] = it;
        continue;
      }
      void* companion = it.companion;
      if (companion != nullptr) {
        if (c.companions < kMaxCompanions) {
          ++c.companions;
        } else {
          b.items[spill++] = {nullptr, 0, 0, companion};  // freed below, unlocked
          companion = nullptr;
        }
      }
      c.push_small(it.size, it.ptr, it.device, companion);
      c.small_bytes += static_cast<int64_t>(it.size);
      add_locked(c.bytes, static_cast<int64_t>(it.size));
      add_locked(c.device_bytes[it.device], static_cast<int64_t>(it.size));
    }
  }
  for (int i = 0; i < spill; ++i) {
    std::free(b.items[i].ptr);  // (nullptr: a companion alone)
    if (b.items[i].companion != nullptr) ::operator delete(b.items[i].companion);
  }
  b.n = 0;
}

void free_in(void* ptr, size_t nbytes, int device) {
  if (!ptr || in_bad_fork()) return;  // a bad fork leaks: the cache lock may be a dead thread's
  const size_t size = rounded(nbytes);
  if (size != nbytes) g_live_padding[device].fetch_sub(static_cast<int64_t>(size - nbytes));
  if (size == 0) {  // no room for a bucket's link
    std::free(ptr);
    return;
  }
  if (size <= kSmallMax) {
    FreeBatch& b = g_batch;
    if (b.owner.load(std::memory_order_relaxed) == pthread_self()) {
      if (b.n == FreeBatch::kCap) drain(b);
      b.items[b.n++] = {ptr, size, device, nullptr};
      return;
    }
    Cache& c = cache();
    std::lock_guard<SpinLock> lock(c.mu);
    if (c.small_bytes + static_cast<int64_t>(size) <= kSmallLimit) {
      c.push_small(size, ptr, device, nullptr);
      c.small_bytes += static_cast<int64_t>(size);
      add_locked(c.bytes, static_cast<int64_t>(size));
      add_locked(c.device_bytes[device], static_cast<int64_t>(size));
      return;
    }
  } else if (size >= kCachedMin) {
    Cache& c = cache();
    std::lock_guard<SpinLock> lock(c.mu);
    if (c.bytes + static_cast<int64_t>(size) <= kCacheLimit) {
      c.free_blocks[size].push_back({ptr, device});
      add_locked(c.bytes, static_cast<int64_t>(size));
      add_locked(c.device_bytes[device], static_cast<int64_t>(size));
      return;
    }
  }
  std::free(ptr);
}

}  // namespace

BlockFreeBatch::BlockFreeBatch() {
  FreeBatch& b = g_batch;
  const pthread_t self = pthread_self();
  pthread_t none = 0;
  if (b.owner.load(std::memory_order_relaxed) == self || b.owner.compare_exchange_strong(none, self)) {
    ++b.depth;
    active_ = true;
  }
}

BlockFreeBatch::~BlockFreeBatch() {
  if (!active_) return;
  FreeBatch& b = g_batch;
  if (--b.depth > 0) return;
  if (!in_bad_fork()) drain(b);
  b.n = 0;
  b.kept.store(nullptr, std::memory_order_relaxed);
  b.owner.store(0, std::memory_order_release);
}

void* block_alloc(size_t nbytes, int device) {
  bool reused_same = false;
  return alloc_in(nbytes, slot(device), nullptr, &reused_same);
}
void* block_alloc_paired(size_t nbytes, int device, void** companion, bool* reused_same) {
  *companion = nullptr;
  *reused_same = false;
  return alloc_in(nbytes, slot(device), companion, reused_same);
}
void block_free(void* ptr, size_t nbytes, int device) { free_in(ptr, nbytes, slot(device)); }

bool block_free_paired(void* ptr, size_t nbytes, int device, void* companion) {
  FreeBatch& b = g_batch;
  // Small blocks only (rounded to 64 bytes); the caller checked in_bad_fork.
  if (ptr == nullptr || nbytes == 0 || nbytes > kSmallMax || b.owner.load(std::memory_order_relaxed) != pthread_self())
    return false;
  const size_t size = (nbytes + 63) & ~size_t{63};
  const int s = slot(device);
  if (size != nbytes) g_live_padding[s].fetch_sub(static_cast<int64_t>(size - nbytes), std::memory_order_relaxed);
  if (b.n == FreeBatch::kCap) drain(b);
  b.items[b.n++] = {ptr, size, s, companion};
  b.kept.store(companion, std::memory_order_relaxed);
  return true;
}

// Only the owner sets `kept`, to the storage it is freeing; another thread
// deleting a storage cannot hold that address, so no owner check is needed.
bool block_companion_kept(void* p) {
  FreeBatch& b = g_batch;
  if (b.kept.load(std::memory_order_relaxed) != p) return false;
  b.kept.store(nullptr, std::memory_order_relaxed);
  return true;
}

void* host_block_alloc(size_t nbytes) {
  bool reused_same = false;
  return alloc_in(nbytes, kHostSlot, nullptr, &reused_same);
}
void host_block_free(void* ptr, size_t nbytes) { free_in(ptr, nbytes, kHostSlot); }

void block_cache_release() {
  Cache& c = cache();
  std::lock_guard<SpinLock> lock(c.mu);
  for (auto& [size, blocks] : c.free_blocks)
    for (const Cached& b : blocks) std::free(b.ptr);
  c.free_blocks.clear();
  for (auto& bucket : c.small) {
    while (Cache::FreeNode* node = bucket) {
      bucket = node->next;
      if (node->companion != nullptr) ::operator delete(node->companion);
      std::free(node);
    }
  }
  for (void* m : c.spare_companions) ::operator delete(m);
  c.spare_companions.clear();
  c.companions = 0;
  c.small_bytes = 0;
  c.bytes = 0;
  for (auto& b : c.device_bytes) b.store(0);
}

int64_t block_live_padding(int device) {
  if (device >= 0) return g_live_padding[slot(device)].load();
  int64_t sum = 0;
  for (const auto& p : g_live_padding) sum += p.load();
  return sum;
}

int64_t block_cache_bytes(int device) {
  const Cache& c = cache();
  return device >= 0 ? c.device_bytes[slot(device)].load(std::memory_order_relaxed)
                     : c.bytes.load(std::memory_order_relaxed);
}

}  // namespace tpu_eager
