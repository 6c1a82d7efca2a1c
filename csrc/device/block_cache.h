// Host memory blocks behind device storages, with a cache of freed blocks
// (as CUDA's caching allocator keeps freed device memory, small blocks
// included): a
// fresh block from the C library is new pages, and first-touching them costs
// ~0.25 us per 4 KiB page (a 16 MiB result paid ~1 ms a flush in faults).
// Handing blocks back to the C library also made it trim the top of its heap
// and grow it again every training step (brk): the CNN step of
// benchmarks/run_all.py took ~450 page faults and 0.3-0.6 ms of system time a
// step, where CPU eager took ~1 (docs/performance.md, 2026-12-04). Small
// blocks are cached because every recorded op's fresh result takes one, and a
// 64-byte-aligned block from the C library cost ~800 instructions to allocate
// and free, a tenth of the record path (docs/performance.md, 2026-12-05).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpu_eager {

// A 64-byte-aligned block of at least `nbytes`; nullptr when out of memory.
// Blocks of 64 KiB or more come from the cache when one of the same rounded
// size (4 KiB granularity; 2 MiB from 4 MiB on, on transparent huge pages)
// was freed; smaller blocks when one of the same 64-byte multiple was (up to
// 16 MiB of them are kept).
// `device` is the simulated chip the block is accounted to (its padding, and
// its cached bytes once freed): the cache itself is one pool of host memory,
// and a block freed by one chip may be reused by another.
void* block_alloc(size_t nbytes, int device = 0);
// Returns a block of `block_alloc(nbytes)` to the cache (large blocks, while
// the cache holds at most 512 MiB; small ones, while it holds at most 16 MiB
// of them) or to the C library.
void block_free(void* ptr, size_t nbytes, int device = 0);
// A storage's block with the memory for its DeferredStorage: a flush's
// dying intermediate gives both back (block_free_paired) and the next fresh
// result of that size class takes both in one pop under the cache's lock,
// without the DeferredStorage's own free list (a thread_local: a
// __tls_get_addr call each way). `*companion`: that memory (sizeof
// DeferredStorage bytes from ::operator new), or nullptr when none was kept.
// `*reused_same`: the block came from the cache, freed by this `device`, so
// the chip's memory_reserved did not change.
void* block_alloc_paired(size_t nbytes, int device, void** companion, bool* reused_same);
// Frees `ptr` (a block_alloc of `nbytes`) and keeps `companion`, the memory
// of the DeferredStorage being destroyed, with it, when this thread holds the
// BlockFreeBatch and the block is small; false (nothing done) otherwise. On
// true, that DeferredStorage's operator delete must leave its memory alone:
// block_companion_kept(p) says so (and is true once per such free).
bool block_free_paired(void* ptr, size_t nbytes, int device, void* companion);
bool block_companion_kept(void* p);
// While one is alive on a thread, the small blocks (below 64 KiB) that
// thread frees wait in a batch and go back to the cache together, under one
// lock, when the outermost one ends (or the batch is full): a flush frees its
// dying intermediates' blocks in one go instead of taking the cache's mutex
// for each (~150 instructions a block). One thread batches at a time (the
// flush lock's holder, in practice); on any other thread, meanwhile, the
// scope does nothing and blocks are freed one by one.
class BlockFreeBatch {
 public:
  BlockFreeBatch();
  ~BlockFreeBatch();
  BlockFreeBatch(const BlockFreeBatch&) = delete;
  BlockFreeBatch& operator=(const BlockFreeBatch&) = delete;

 private:
  bool active_ = false;  // this scope joined or started the batch
};
// The same for a flush's host temporaries (values that never reach device
// memory: executors/host_runtime.h, scratch_storage): one cache with the
// device blocks, counted to no chip.
void* host_block_alloc(size_t nbytes);
void host_block_free(void* ptr, size_t nbytes);
// Frees every cached block (torch.tpu.empty_cache).
void block_cache_release();
// Bytes held in the cache (torch.tpu.memory_reserved adds them); with a
// device >= 0, the bytes of the blocks that chip freed.
int64_t block_cache_bytes(int device = -1);
// Bytes by which the blocks in use exceed the sizes asked for (rounding to
// 64 B, 4 KiB or 2 MiB); torch.tpu.memory_reserved adds them too. With a
// device >= 0, those of that chip's blocks.
int64_t block_live_padding(int device = -1);
// Chips the per-device counters above can tell apart.
constexpr int kMaxBlockDevices = 16;

}  // namespace tpu_eager
