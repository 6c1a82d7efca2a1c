// The region verifier (see verify.h).
#include "jit/verify.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "jit/lowering.h"
#include "jit/partition.h"
#include "lazy/debug_report.h"

namespace tpu_eager {
namespace jit {
namespace {

std::atomic<bool> g_verify{false};
std::atomic<int> g_break{0};

std::string where(size_t ri, int node) {
  return "region " + std::to_string(ri) + ", node " + std::to_string(node) + ": ";
}

// The anchor of region `r` against its ops' kinds; "" when consistent.
std::string check_anchor(const std::vector<Node>& g, const Region& r) {
  int library = 0, matmul = 0, reduction = 0, other = 0;
  for (int i : r.nodes) {
    switch (static_cast<PrimKind>(g[i].kind)) {
      case PrimKind::kLibrary:
        ++library;
        break;
      case PrimKind::kMatmul:
        ++matmul;
        break;
      case PrimKind::kReduction:
        ++reduction;
        break;
      case PrimKind::kElementwise:
      case PrimKind::kData:
      case PrimKind::kRandom:
        break;
      default:
        ++other;  // views and sync ops are never recorded into a flush
    }
  }
  if (other) return "holds an op of a kind that is never recorded";
  switch (r.anchor) {
    case PrimKind::kLibrary:
      if (library && r.nodes.size() != 1) return "a library call shares its region";
      if (matmul) return "an op-by-op region holds a matmul";
      return "";
    case PrimKind::kMatmul:
      if (matmul != 1 || static_cast<PrimKind>(g[r.nodes[0]].kind) != PrimKind::kMatmul)
        return "a matmul region does not start with its one matmul";
      // Its epilogue: elementwise ops, the last of them possibly a row
      // normalization over their shape (partition's matmul-epilogue rule).
      for (size_t p = 1; p < r.nodes.size(); ++p) {
        const auto k = static_cast<PrimKind>(g[r.nodes[p]].kind);
        if (k != PrimKind::kElementwise && !(k == PrimKind::kReduction && p + 1 == r.nodes.size() && p > 1))
          return "a matmul region's epilogue holds a non-elementwise op";
      }
      return "";
    case PrimKind::kReduction:
      if (library || matmul) return "a reduction region holds a library call or a matmul";
      if (!reduction) return "a reduction region holds no reduction";
      return "";
    case PrimKind::kElementwise:
      if (library || matmul || reduction) return "an elementwise region holds a library call, matmul or reduction";
      return "";
    default:
      return "anchor of kind " + std::string(prim_kind_name(r.anchor));
  }
}

// The shape a loop running `n` iterates over (partition's).
c10::OptionalIntArrayRef loop_shape_of(const Node& n) { return loop_shape(n); }

// Region::loop of `r` and the matmul epilogue's shape; "" when consistent:
// loop ids 0 .. L-1 each used, each loop over one shape, a reduction the
// last op of its loop; a value made or written by one loop is touched by no
// other, except that a later loop may read a fresh output of an earlier one
// that nothing in the region writes in place, not 0-dim, materialized, or a
// storage the region did not make that one earlier loop writes in place; a
// matmul's epilogue iterates over the product's shape.
std::string check_loops(const std::vector<Node>& g, const Region& r) {
  if (r.anchor == PrimKind::kMatmul) {
    // Every epilogue op over one shape: the product's, or (a one-shape-loop
    // target) a reshape of it with as many elements.
    const c10::OptionalIntArrayRef product = loop_shape_of(g[r.nodes[0]]);
    const c10::OptionalIntArrayRef first = r.nodes.size() > 1 ? loop_shape_of(g[r.nodes[1]]) : std::nullopt;
    for (size_t p = 1; p < r.nodes.size(); ++p) {
      const c10::OptionalIntArrayRef s = loop_shape_of(g[r.nodes[p]]);
      if (!product || !s || *s != *first || c10::multiply_integers(*s) != c10::multiply_integers(*product))
        return "a matmul epilogue op does not iterate over the product's shape";
    }
  }
  if (r.loop.empty()) return "";
  if (r.loop.size() != r.nodes.size()) return "loop ids sized wrong";
  if (r.anchor != PrimKind::kElementwise && r.anchor != PrimKind::kReduction)
    return "loops in a region that is not fused";
  const int count = *std::max_element(r.loop.begin(), r.loop.end()) + 1;
  std::vector<c10::OptionalIntArrayRef> shape(count);
  std::vector<int> last(count, -1);  // per loop: its last position so far
  for (size_t p = 0; p < r.nodes.size(); ++p) {
    const int l = r.loop[p];
    if (l < 0) return "a negative loop id";
    const c10::OptionalIntArrayRef s = loop_shape_of(g[r.nodes[p]]);
    if (last[l] < 0) shape[l] = s;
    if (!s || !shape[l] || *s != *shape[l]) return "loop " + std::to_string(l) + " iterates over two shapes";
    // (cross-entropy's second op follows the first in its row loop: partition.cpp, cross_entropy_pair;
    // the residual gradient's add a layer_norm backward: residual_gradient_add)
    const LossRow loss = lowering_of(g[r.nodes[p]].op).loss;
    const bool pair = loss == LossRow::kNllLoss || loss == LossRow::kLogSoftmaxBackward ||
                      (last[l] >= 0 && lowering_of(g[r.nodes[last[l]]].op).host == DirectImpl::kLayerNormBackward);
    if (last[l] >= 0 && static_cast<PrimKind>(g[r.nodes[last[l]]].kind) == PrimKind::kReduction && !pair)
      return "loop " + std::to_string(l) + " goes on after its reduction";
    last[l] = static_cast<int>(p);
  }
  for (int l = 0; l < count; ++l)
    if (last[l] < 0) return "loop " + std::to_string(l) + " has no op";
  // storage -> (loop, position, output) that made it fresh / loop that wrote it in place
  StorageMap<std::pair<int, std::pair<size_t, size_t>>> made(2 * r.nodes.size());
  StorageMap<int> written(2 * r.nodes.size());
  for (size_t p = 0; p < r.nodes.size(); ++p) {
    const Node& n = g[r.nodes[p]];
    for (size_t j = 0; j < n.outputs.size(); ++j) made[n.outputs[j].storage.get()] = {r.loop[p], {p, j}};
    for (const auto& in : n.inputs) {
      if (!in.written) continue;
      const int* w = written.find(in.ref.storage.get());
      if (w && *w != r.loop[p])
        return "loops " + std::to_string(*w) + " and " + std::to_string(r.loop[p]) + " write one storage";
      written[in.ref.storage.get()] = r.loop[p];
    }
  }
  for (size_t p = 0; p < r.nodes.size(); ++p) {
    for (const auto& in : g[r.nodes[p]].inputs) {
      const DeferredStorage* st = in.ref.storage.get();
      const int* w = written.find(st);
      const auto* m = made.find(st);
      const int l = r.loop[p];
      // nll_loss_backward reads its loss gradient from an earlier loop when bound (partition.cpp, join_of).
      const bool loss_gradient = in.arg == 0 && lowering_of(g[r.nodes[p]].op).loss == LossRow::kNllLossBackward;
      if (loss_gradient && !in.written && ((m && m->first < l) || (w && *w < l))) continue;
      // (a later loop may read a storage one earlier loop writes in place: partition orders them)
      if (w && *w != l && (in.written || *w > l || (m && m->first != *w)))
        return "loop " + std::to_string(l) + " touches a storage loop " + std::to_string(*w) + " writes in place";
      if (!m || m->first == l) continue;
      if (in.written || w || in.ref.dim() == 0 || m->first > l || !r.materialize[m->second.first][m->second.second])
        return "loop " + std::to_string(l) + " reads a value of loop " + std::to_string(m->first) +
               " that is not an earlier loop's stored fresh output";
    }
  }
  return "";
}

}  // namespace

std::string verify_regions(const std::vector<Node>& g, const std::vector<char>& live, const StorageSet& observed,
                           const std::vector<Region>& regions) {
  // graph index -> (region, position)
  std::vector<std::pair<int, int>> at(g.size(), {-1, -1});
  for (size_t ri = 0; ri < regions.size(); ++ri) {
    const Region& r = regions[ri];
    if (r.nodes.empty()) return "region " + std::to_string(ri) + " is empty";
    if (r.nodes.size() > kMaxRegionOps) return "region " + std::to_string(ri) + " holds more than kMaxRegionOps ops";
    if (r.materialize.size() != r.nodes.size())
      return "region " + std::to_string(ri) + ": materialize flags for " + std::to_string(r.materialize.size()) +
             " nodes, it has " + std::to_string(r.nodes.size());
    for (size_t p = 0; p < r.nodes.size(); ++p) {
      const int i = r.nodes[p];
      if (i < 0 || i >= static_cast<int>(g.size())) return where(ri, i) + "not in the graph";
      if (!live[i]) return where(ri, i) + "a dead node";
      if (at[i].first >= 0) return where(ri, i) + "also in region " + std::to_string(at[i].first);
      if (p > 0 && r.nodes[p - 1] >= i) return where(ri, i) + "out of program order";
      if (r.materialize[p].size() != g[i].outputs.size()) return where(ri, i) + "materialize flags sized wrong";
      at[i] = {static_cast<int>(ri), static_cast<int>(p)};
    }
    const std::string anchor = check_anchor(g, r);
    if (!anchor.empty()) return "region " + std::to_string(ri) + ": " + anchor;
    const std::string loops = check_loops(g, r);
    if (!loops.empty()) return "region " + std::to_string(ri) + ": " + loops;
  }
  // In program order: a read comes after the last write of the storage, a
  // write after its last access, in the same or a later region; a value read
  // from another region (or observed after the flush) is materialized.
  StorageMap<int> last_write(2 * g.size()), last_access(2 * g.size());
  StorageMap<std::pair<int, int>> made(g.size());  // storage -> (graph index, output) that created it
  for (int i = 0; i < static_cast<int>(g.size()); ++i) {
    if (!live[i]) continue;
    const int ri = at[i].first;
    if (ri < 0) return "node " + std::to_string(i) + " is live but in no region";
    const Node& n = g[i];
    for (const auto& in : n.inputs) {
      const DeferredStorage* s = in.ref.storage.get();
      const int* w = last_write.find(s);
      if (w && *w > ri) return where(ri, i) + "reads a value a later region writes first";
      const int* a = last_access.find(s);
      if (in.written && a && *a > ri) return where(ri, i) + "writes a storage a later region used first";
      const std::pair<int, int>* m = made.find(s);
      if (m) {
        const auto [pr, pp] = at[m->first];
        if (pr != ri && !regions[pr].materialize[pp][m->second])
          return where(ri, i) + "reads output " + std::to_string(m->second) + " of node " + std::to_string(m->first) +
                 " from another region, not materialized";
      }
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const DeferredStorage* s = n.outputs[j].storage.get();
      if (made.contains(s)) return where(ri, i) + "defines a value twice";
      made[s] = {i, static_cast<int>(j)};
      if (observed.contains(s) && !regions[ri].materialize[at[i].second][j])
        return where(ri, i) + "output " + std::to_string(j) + " is observed after the flush, not materialized";
    }
    for_each_written_storage(n, [&](const DeferredStorage* s) {
      last_write[s] = std::max(last_write.get_or(s, ri), ri);
      last_access[s] = std::max(last_access.get_or(s, ri), ri);
    });
    for (const auto& in : n.inputs)
      last_access[in.ref.storage.get()] = std::max(last_access.get_or(in.ref.storage.get(), ri), ri);
  }
  return "";
}

bool verify_enabled() {
#ifdef TORCH_TPU_DEBUG_BUILD
  return true;
#else
  return g_verify.load(std::memory_order_relaxed) || debug::level() >= 2;
#endif
}

void set_verify(bool on) { g_verify.store(on); }

void set_break_next_partition(int mode) { g_break.store(mode); }

bool test_break_pending() { return g_break.load() != 0; }

void apply_test_break(std::vector<Region>& regions) {
  const int mode = g_break.exchange(0);
  if (mode == 0) return;
  if (mode == 1) {
    for (auto& r : regions) {
      if (r.nodes.size() < 2) continue;
      std::swap(r.nodes[0], r.nodes[1]);
      std::swap(r.materialize[0], r.materialize[1]);
      return;
    }
  } else if (mode == 2) {
    for (auto& r : regions)
      for (auto& flags : r.materialize)
        for (auto& f : flags)
          if (f) {
            f = 0;
            return;
          }
  } else if (mode == 3 && !regions.empty()) {
    regions[0].anchor = PrimKind::kMatmul;
  } else if (mode == 4) {
    // A second loop for the last op of a one-loop region (it shares a value with the others).
    for (auto& r : regions)
      if (r.loop.size() >= 2 && r.loop.back() == 0) {
        r.loop.back() = 1;
        return;
      }
  }
}

}  // namespace jit
}  // namespace tpu_eager
