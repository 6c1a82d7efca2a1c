// What shape/dtype inference (a meta kernel) decided for one call, and its
// encoding for the on-disk cache (jit/disk_cache.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

namespace tpu_eager {

// A tensor's geometry: sizes and strides (elements), storage offset (elements), dtype.
struct Geometry {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool defined = false;
};

// What the meta kernel produced: per return, the result geometries; and the
// geometry of each written single-tensor argument after the call.
struct MetaOutcome {
  std::vector<std::vector<Geometry>> returns;  // one entry per return (a list for Tensor[])
  std::vector<std::pair<int, Geometry>> written;
  std::vector<std::pair<int, std::vector<Geometry>>> written_lists;
  // The interned id of the meta key this outcome is cached under (record.cpp
  // MetaCache, Node::meta_id); 0 when not cached. Not encoded.
  uint64_t id = 0;
  // Every Scalar CPU converts with an overflow check (scalar_checks.h) was an
  // int, bool or None, which the meta key holds by value, and fit the result
  // dtype: a call with the same key needs no check. Not encoded (a decoded
  // outcome checks).
  bool scalars_fit = false;
};

// `o` as bytes (int64 words, native byte order: the cache is per machine build).
std::string encode_outcome(const MetaOutcome& o);

// Decodes `bytes` into `o` for an op with `nargs` arguments whose returns
// alias the arguments `aliased` (one per return, -1 for none). Returns false,
// never throws, when the bytes are malformed or do not fit the op (wrong
// return count, an aliased argument without its written geometry).
bool decode_outcome(const std::string& bytes, size_t nargs, const std::vector<int>& aliased, MetaOutcome* o);

}  // namespace tpu_eager
