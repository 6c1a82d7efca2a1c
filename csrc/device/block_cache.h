// Host memory blocks behind device storages, with a cache of freed large
// blocks (as CUDA's caching allocator keeps freed device memory): a fresh
// block from the C library is new pages, and first-touching them costs
// ~0.25 us per 4 KiB page (a 16 MiB result paid ~1 ms a flush in faults).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpu_eager {

// A 64-byte-aligned block of at least `nbytes`; nullptr when out of memory.
// Blocks of 1 MiB or more come from the cache when one of the same rounded
// size (4 KiB granularity; 2 MiB from 4 MiB on, on transparent huge pages)
// was freed.
void* block_alloc(size_t nbytes);
// Returns a block of `block_alloc(nbytes)` to the cache (large blocks, while
// the cache holds at most 512 MiB) or to the C library.
void block_free(void* ptr, size_t nbytes);
// Frees every cached block (torch.tpu.empty_cache).
void block_cache_release();
// Bytes held in the cache (torch.tpu.memory_reserved adds them).
int64_t block_cache_bytes();
// Bytes by which the blocks in use exceed the sizes asked for (rounding to
// 64 B, 4 KiB or 2 MiB); torch.tpu.memory_reserved adds them too.
int64_t block_live_padding();

}  // namespace tpu_eager
