// Compiled regions in the on-disk cache.
#include "jit/region_disk_cache.h"

#include <cstring>

#include "jit/disk_cache.h"
#include "jit/partition.h"

namespace tpu_eager {
namespace jit {
namespace {

// Every field of CompiledRegion is encoded below: a new field must be added
// to encode/decode (and disk_cache.cpp's kFormatVersion bumped) before this holds again.
static_assert(sizeof(CompiledRegion) ==
                  sizeof(uint64_t) + sizeof(std::vector<PrimKind>) + sizeof(std::string) + sizeof(int64_t),
              "CompiledRegion changed: update region_disk_cache.cpp encode/decode and bump kFormatVersion");

void put(std::string& b, int64_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof(v)); }

bool get(const std::string& b, size_t& pos, int64_t* v) {
  if (pos > b.size() || b.size() - pos < sizeof(*v)) return false;
  std::memcpy(v, b.data() + pos, sizeof(*v));
  pos += sizeof(*v);
  return true;
}

}  // namespace

std::string region_disk_key(const std::vector<Node>& g, const Region& r, const std::string& target) {
  std::string k;
  put(k, static_cast<int64_t>(stable_structural_key(g, r)));
  return k + target;
}

std::shared_ptr<CompiledRegion> load_region(const std::string& disk_key, uint64_t key, const std::vector<Node>& g,
                                            const Region& r) {
  std::string b;
  if (!disk_cache::lookup(disk_cache::Table::kRegions, disk_key, &b)) return nullptr;
  auto c = std::make_shared<CompiledRegion>();
  c->key = key;
  size_t pos = 0;
  int64_t num_ops = 0, name_len = 0;
  // A stored entry that does not describe `r`: rejected with a warning (the caller recompiles).
  auto mismatch = [&](const char* why) {
    disk_cache::reject(disk_cache::Table::kRegions, why);
    return nullptr;
  };
  if (!get(b, pos, &num_ops) || num_ops != static_cast<int64_t>(r.nodes.size()))
    return mismatch("op count of the region");
  c->num_ops = num_ops;
  for (int i : r.nodes) {
    int64_t kind = 0;
    if (!get(b, pos, &kind) || kind != g[i].kind) return mismatch("primitive kinds of the region's ops");
    c->kinds.push_back(static_cast<PrimKind>(kind));
  }
  if (!get(b, pos, &name_len) || name_len <= 0 || static_cast<size_t>(name_len) != b.size() - pos)
    return mismatch("kernel name");
  c->name = b.substr(pos);
  return c;
}

bool store_region(const std::string& disk_key, const CompiledRegion& c) {
  std::string b;
  put(b, c.num_ops);
  for (PrimKind k : c.kinds) put(b, static_cast<int64_t>(k));
  put(b, static_cast<int64_t>(c.name.size()));
  b += c.name;
  return disk_cache::store(disk_cache::Table::kRegions, disk_key, b);
}

}  // namespace jit
}  // namespace tpu_eager
