// Compiled regions in the on-disk cache (disk_cache.h): encoding and checks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executors/executor.h"

namespace tpu_eager {
namespace jit {

// The on-disk key of region `r`: its stable structural key and the target name.
std::string region_disk_key(const std::vector<Node>& g, const Region& r, const std::string& target);

// The region stored under `disk_key`, with `key` (the in-memory key) set, or
// nullptr when absent or when the stored entry does not describe `r` (its
// op count and primitive kinds must match).
std::shared_ptr<CompiledRegion> load_region(const std::string& disk_key, uint64_t key, const std::vector<Node>& g,
                                            const Region& r);

// Appends `c` under `disk_key`; true when written.
bool store_region(const std::string& disk_key, const CompiledRegion& c);

}  // namespace jit
}  // namespace tpu_eager
