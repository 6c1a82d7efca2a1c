// Encoding of meta-inference outcomes for the on-disk cache.
#include "ops/meta_outcome.h"

#include <climits>
#include <cstring>

namespace tpu_eager {
namespace {

void encode_geometry(std::vector<int64_t>& w, const Geometry& g) {
  w.push_back(g.defined);
  w.push_back(static_cast<int64_t>(g.dtype));
  w.push_back(static_cast<int64_t>(g.sizes.size()));
  w.insert(w.end(), g.sizes.begin(), g.sizes.end());
  w.insert(w.end(), g.strides.begin(), g.strides.end());
  w.push_back(g.offset);
}

struct WordReader {
  const int64_t* p;
  size_t n, pos = 0;
  bool ok = true;
  int64_t next(int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
    if (pos >= n) ok = false;
    const int64_t v = ok ? p[pos++] : 0;
    if (v < lo || v > hi) ok = false;
    return ok ? v : 0;
  }
  Geometry geometry() {
    Geometry g;
    g.defined = next(0, 1) != 0;
    g.dtype = static_cast<c10::ScalarType>(next(0, static_cast<int64_t>(c10::ScalarType::Undefined)));
    const int64_t ndim = next(0, 64);
    for (int64_t i = 0; i < ndim; ++i) g.sizes.push_back(next(0));
    for (int64_t i = 0; i < ndim; ++i) g.strides.push_back(next());
    g.offset = next(0);
    return g;
  }
};

}  // namespace

std::string encode_outcome(const MetaOutcome& o) {
  std::vector<int64_t> w;
  w.push_back(static_cast<int64_t>(o.returns.size()));
  for (const auto& geoms : o.returns) {
    w.push_back(static_cast<int64_t>(geoms.size()));
    for (const auto& g : geoms) encode_geometry(w, g);
  }
  w.push_back(static_cast<int64_t>(o.written.size()));
  for (const auto& [a, g] : o.written) {
    w.push_back(a);
    encode_geometry(w, g);
  }
  w.push_back(static_cast<int64_t>(o.written_lists.size()));
  for (const auto& [a, geoms] : o.written_lists) {
    w.push_back(a);
    w.push_back(static_cast<int64_t>(geoms.size()));
    for (const auto& g : geoms) encode_geometry(w, g);
  }
  return std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(int64_t));
}

bool decode_outcome(const std::string& bytes, size_t nargs_u, const std::vector<int>& aliased, MetaOutcome* o) {
  if (bytes.size() % sizeof(int64_t)) return false;
  std::vector<int64_t> words(bytes.size() / sizeof(int64_t));
  std::memcpy(words.data(), bytes.data(), bytes.size());
  WordReader r{words.data(), words.size()};
  const int64_t kMaxCount = 1 << 16;
  o->returns.resize(r.next(0, kMaxCount));
  for (auto& geoms : o->returns) {
    geoms.resize(r.next(0, kMaxCount));
    for (auto& g : geoms) g = r.geometry();
  }
  const int64_t nargs = static_cast<int64_t>(nargs_u);
  o->written.resize(r.next(0, kMaxCount));
  for (auto& [a, g] : o->written) {
    a = static_cast<int>(r.next(0, nargs - 1));
    g = r.geometry();
  }
  o->written_lists.resize(r.next(0, kMaxCount));
  for (auto& [a, geoms] : o->written_lists) {
    a = static_cast<int>(r.next(0, nargs - 1));
    geoms.resize(r.next(0, kMaxCount));
    for (auto& g : geoms) g = r.geometry();
  }
  if (!r.ok || r.pos != r.n || o->returns.size() != aliased.size()) return false;
  for (size_t k = 0; k < o->returns.size(); ++k) {
    const int a = aliased[k];
    if (a < 0) continue;
    bool found = false;
    for (const auto& w : o->written) found = found || w.first == a;
    for (const auto& w : o->written_lists) found = found || w.first == a;
    if (!found) return false;
  }
  return true;
}

}  // namespace tpu_eager
