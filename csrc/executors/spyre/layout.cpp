// Region layout on the simulated Spyre (see layout.h).
#include "executors/spyre/layout.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "executors/region_runner.h"
#include "jit/dynamic_shapes.h"

namespace tpu_eager {
namespace spyre {

bool reduces_all_but_dim(const std::string& base) { return base == "renorm" || base == "renorm_"; }

namespace {

RegionLayout::Key key_of(const TensorRef& r) {
  return {r.storage.get(), r.offset, r.sizes().vec(), r.strides().vec(), static_cast<int>(r.dtype)};
}

// Dims of its first input that reduction `n` reduces; empty when it does not
// name them and keeps the input's rank (layer_norm over trailing dims; over
// every dim it reduces them all).
std::set<int64_t> reduced_dims(const Node& n) {
  std::set<int64_t> dims;
  if (n.inputs.empty()) return dims;
  const int64_t rank = static_cast<int64_t>(n.inputs[0].ref.sizes().size());
  auto all = [&] {
    for (int64_t d = 0; d < rank; ++d) dims.insert(d);
  };
  const auto& args = n.op.schema().arguments();
  for (size_t a = 0; a < args.size() && a < n.args.size(); ++a) {
    if (args[a].name() != "dim") continue;
    const c10::IValue& v = n.args[a];
    if (v.isNone())
      all();
    else if (v.isInt())
      dims.insert(v.toInt() < 0 ? v.toInt() + rank : v.toInt());
    else if (v.isIntList()) {
      const auto l = v.toIntList();
      if (l.empty()) all();
      for (int64_t d : l) dims.insert(d < 0 ? d + rank : d);
    }
    if (reduces_all_but_dim(n.op.schema().name().substr(n.op.schema().name().find("::") + 2))) {
      std::set<int64_t> others;  // renorm: every dim but the named one
      for (int64_t d = 0; d < rank; ++d)
        if (!dims.count(d)) others.insert(d);
      return others;
    }
    return dims;
  }
  // layer_norm over every dim (normalized_shape as long as the input's rank).
  for (size_t a = 0; a < args.size() && a < n.args.size(); ++a)
    if (args[a].name() == "normalized_shape" && n.args[a].isIntList() &&
        static_cast<int64_t>(n.args[a].toIntList().size()) >= rank && rank > 0) {
      all();
      return dims;
    }
  // No dim argument: a full reduction when the result has rank 0.
  if (!n.outputs.empty() && n.outputs[0].sizes().empty()) all();
  return dims;
}

// Under mark_dynamic rows (dim 0 of a split view in a range): a weight (a
// view of a whole storage the region only reads, neither makes nor writes,
// with no mark; not a slice, as bias[:T, :T]) whose dim 0 equals the rows
// by chance (w (64, 256) of x @ w at n = 64) is replicated, as at every
// other n, so that launch binds the others' program (ktir_match compares
// the tiles).
void keep_weights_whole(RegionLayout& L, const std::unordered_set<const DeferredStorage*>& produced) {
  bool marked_rows = false;
  std::unordered_set<const DeferredStorage*> written(produced);
  for (const auto& v : L.views) {
    if (v.stored) written.insert(v.ref->storage.get());
    if (!v.split || !v.loaded) continue;
    for (const jit::DynamicDim& d : jit::dynamic_dims(*v.ref)) marked_rows |= d.dim == 0;
  }
  if (!marked_rows) return;
  for (auto& v : L.views)
    if (v.split && v.loaded && !v.lx && v.ref->covers_storage() && !written.count(v.ref->storage.get()) &&
        jit::dynamic_marks_hash(v.ref->storage.get()) == 0)
      v.split = false;
}

}  // namespace

int RegionLayout::id(const TensorRef& r) const { return ids.at(key_of(r)); }

RegionLayout region_layout(const Region& region, const std::vector<Node>& graph, const CardParams& card) {
  RegionLayout L;
  std::unordered_set<const DeferredStorage*> temps, produced;
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    for (size_t j = 0; j < n.outputs.size(); ++j)
      if (!region.materialize[p][j]) temps.insert(n.outputs[j].storage.get());
  }
  auto add = [&](const TensorRef& r) -> LayoutView& {
    auto [it, fresh] = L.ids.emplace(key_of(r), static_cast<int>(L.views.size()));
    if (fresh) {
      LayoutView v;
      v.ref = &r;
      v.lx = temps.count(r.storage.get()) > 0;
      L.views.push_back(v);
    }
    return L.views[it->second];
  };
  for (size_t p = 0; p < region.nodes.size(); ++p) {
    const Node& n = graph[region.nodes[p]];
    const auto& schema = n.op.schema();
    for (const auto& in : n.inputs) {
      LayoutView& v = add(in.ref);
      const bool out_arg = in.arg < static_cast<int>(schema.arguments().size()) && schema.arguments()[in.arg].is_out();
      const bool overwrites = in.written && (out_arg || !host::reads_written_value(n, in));
      if (!v.lx && !produced.count(in.ref.storage.get()) && !overwrites) v.loaded = true;
      if (!v.lx && in.written) v.stored = true;
      // A whole storage overwritten (zero_, fill_, out=) is a value the region creates.
      if (overwrites && in.ref.offset == 0 &&
          in.ref.numel() * static_cast<int64_t>(c10::elementSize(in.ref.dtype)) ==
              static_cast<int64_t>(in.ref.storage->nbytes) &&
          in.ref.is_dense())
        produced.insert(in.ref.storage.get());
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      LayoutView& v = add(n.outputs[j]);
      if (region.materialize[p][j]) v.stored = true;
      produced.insert(n.outputs[j].storage.get());
    }
  }

  // The grid.
  c10::OptionalIntArrayRef anchor;
  for (auto it = region.nodes.rbegin(); it != region.nodes.rend(); ++it) {
    const Node& n = graph[*it];
    if (static_cast<PrimKind>(n.kind) != PrimKind::kReduction || n.inputs.empty()) continue;
    const TensorRef& in = n.inputs[0].ref;
    const std::set<int64_t> dims = reduced_dims(n);
    if (!in.sizes().empty() && in.sizes()[0] > 1 && dims.count(0)) {
      anchor = in.sizes();
      L.ring_reduce = true;
      L.partial_sizes = in.sizes().vec();
      for (int64_t d : dims)
        if (d >= 0 && d < static_cast<int64_t>(in.sizes().size())) L.partial_sizes[d] = 1;
      L.partial_dtype = n.outputs.empty() ? in.dtype : n.outputs[0].dtype;
    }
    break;  // only the last reduction anchors the grid
  }
  const Node& last_node = graph[region.nodes.back()];
  if (!anchor && !last_node.outputs.empty()) anchor = last_node.outputs[0].sizes();
  for (const auto& in : last_node.inputs)
    if (!anchor && in.written) anchor = in.ref.sizes();
  L.rows = anchor && !anchor->empty() ? (*anchor)[0] : 0;
  L.cores = std::max<int64_t>(1, card.cores);
  L.rows_per_core = L.rows > 0 ? (L.rows + L.cores - 1) / L.cores : 1;
  L.cores_used = L.rows > 0 ? (L.rows + L.rows_per_core - 1) / L.rows_per_core : 1;
  for (auto& v : L.views) v.split = L.rows > 0 && !v.ref->sizes().empty() && v.ref->sizes()[0] == L.rows;
  if (jit::any_dynamic_marks()) keep_weights_whole(L, produced);
  return L;
}

std::string device_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "f32";
    case c10::kHalf:
    case c10::kBFloat16:
      return "df16";
    case c10::kLong:
      return "i32";
    default:
      return c10::toString(t);
  }
}

}  // namespace spyre
}  // namespace tpu_eager
