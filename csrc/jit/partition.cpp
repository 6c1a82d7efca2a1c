// Fusion rules and structural keys.
#include "jit/partition.h"

#include "jit/dynamic_shapes.h"
#include "jit/lowering.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace tpu_eager {
namespace jit {
namespace {

inline void mix(uint64_t& h, uint64_t v) { h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2); }

// A key being built: its hash and, when `words` is set, every value mixed
// in (for a full equality check).
struct KeyBuilder {
  uint64_t h;
  std::vector<uint64_t>* words;
};
inline void mix(KeyBuilder& k, uint64_t v) {
  mix(k.h, v);
  if (k.words) k.words->push_back(v);
}

// The kind of an argument (IValue's tag, which is private; tagKind() builds a string).
uint64_t ivalue_kind(const c10::IValue& v) {
  if (v.isTensor()) return 1;
  if (v.isInt()) return 2;
  if (v.isDouble()) return 3;
  if (v.isBool()) return 4;
  if (v.isNone()) return 5;
  if (v.isIntList()) return 6;
  if (v.isTensorList()) return 7;
  if (v.isList()) return 8;
  if (v.isString()) return 9;
  if (v.isDevice()) return 10;
  if (v.isGenerator()) return 11;
  if (v.isComplexDouble()) return 12;
  return 16 + v.tagKind().size();
}

void mix_ivalue(KeyBuilder& h, const c10::IValue& v) {
  mix(h, ivalue_kind(v));
  if (v.isInt()) {
    mix(h, static_cast<uint64_t>(v.toInt()));  // dims, sizes, reduction kinds: structural
  } else if (v.isBool()) {
    mix(h, v.toBool());
  } else if (v.isIntList()) {
    mix(h, v.toIntList().size());
    for (auto x : v.toIntList()) mix(h, static_cast<uint64_t>(x));
  } else if (v.isString()) {
    const std::string& str = v.toStringRef();
    mix(h, std::hash<std::string>()(str));
    if (h.words) {
      mix(h, str.size());
      for (size_t i = 0; i < str.size(); i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, str.data() + i, std::min<size_t>(8, str.size() - i));
        h.words->push_back(w);
      }
    }
  } else if (v.isScalar()) {
    // Runtime parameter: only whether it is integral, floating or boolean.
    auto s = v.toScalar();
    mix(h, s.isIntegral(false) ? 1 : s.isFloatingPoint() ? 2 : 3);
  } else if (v.isNone()) {
    mix(h, 7);
  }
}

// The shape an op iterates over: its first fresh output, else its first written argument.
c10::OptionalIntArrayRef iteration_shape(const Node& n) {
  if (!n.outputs.empty()) return n.outputs[0].sizes();
  for (const auto& in : n.inputs)
    if (in.written) return in.ref.sizes();
  return std::nullopt;
}

}  // namespace

// (partition.h)
c10::OptionalIntArrayRef loop_shape(const Node& n) {
  // nll_loss_backward iterates over its gradient (its first input is the loss's gradient, 0-dim or per row).
  if (lowering_of(n.op).loss == LossRow::kNllLossBackward && !n.outputs.empty()) return n.outputs[0].sizes();
  if (static_cast<PrimKind>(n.kind) == PrimKind::kReduction && !n.inputs.empty()) return n.inputs[0].ref.sizes();
  if (lowering_of(n.op).concat) {  // cat: over its inputs' shape (Lowering::concat)
    for (const auto& in : n.inputs)
      if (!(in.ref.dim() == 1 && in.ref.sizes()[0] == 0)) return in.ref.sizes();
  }
  return iteration_shape(n);
}

namespace {

// The key of the loop a fused op runs in (`*key`; false when it iterates
// over no shape): its loop shape, and when the tensor it iterates over is
// not row-major, -1 and that tensor's offset and strides (0 on size-1
// dims): a target's loop iterates in its outputs' memory order, so ops of
// one shape written in different layouts (q * cos keeping a transposed q's
// layout, a product of the row-major rotate_half) run in different loops.
bool loop_key(const Node& n, Dims* key) {
  const c10::OptionalIntArrayRef s = loop_shape(n);
  if (!s) return false;
  key->set(*s);
  if (static_cast<PrimKind>(n.kind) == PrimKind::kReduction || lowering_of(n.op).concat) return true;
  const TensorRef* it = n.outputs.empty() ? nullptr : &n.outputs[0];
  for (const auto& in : n.inputs)
    if (!it && in.written) it = &in.ref;
  if (!it || (it->offset == 0 && it->is_dense())) return true;
  key->push_back(-1);
  key->push_back(it->offset);
  for (size_t d = 0; d < it->dim(); ++d) key->push_back(it->sizes()[d] == 1 ? 0 : it->strides()[d]);
  return true;
}

// The latest region that touched a storage, and in it the loop (a group of
// partition's union-find) that did: -1 none (not a fused region), -2 read
// by loops of different shapes (only reads may follow). `written`: made or
// written in that region; `maker`: the loop that made it there as a fresh
// output (-1: none), `inplace`: an op of that region wrote it in place.
struct Touch {
  int region = -1;
  int group = -1;
  bool written = false;
  int maker = -1;
  bool inplace = false;
};

// The loops of the fused regions of one flush (targets whose loops iterate
// over one shape each, FusionRules::loops_of_one_shape): a union-find over
// groups of ops, each with its loop shape. A loop whose fresh value a loop
// of another shape reads (an attention mask `tril == 0` of shape [1, 1, T,
// T] read by the masked_fill of the scores [B, H, T, T]) is sealed: it takes
// no more ops, runs before its readers and stores that value.
struct Loops {
  std::vector<int> parent;
  std::vector<Dims> shape;  // per group: its loop_key
  std::vector<int> domain;  // FusionRules::loop_domain of its ops (2 while it has only ops of either kind)
  std::vector<char> sealed;
  std::vector<std::pair<int, int>> edges;  // (maker, reader) groups of cross-loop reads
  int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  int add(const Dims& s, int d) {
    const int g = static_cast<int>(parent.size());
    parent.push_back(g);
    shape.push_back(s);
    domain.push_back(d);
    sealed.push_back(0);
    return g;
  }
  // Whether loop group `g` can take an op of domain `d` (see loop_domain).
  bool same_kind(int g, int d) const { return domain[g] == 2 || d == 2 || domain[g] == d; }
  // The domain of loop groups `groups` merged with an op of domain `d`.
  int merged_domain(const std::vector<int>& groups, int d) {
    for (int g : groups)
      if (domain[find(g)] != 2) d = domain[find(g)];
    return d;
  }
  // The groups of region `r` that `n` must (or, reading the same region
  // input in the same shape, may) join into `join`, and those whose fresh
  // values it reads in another shape into `reads`; false when `n` cannot
  // run in a loop of `r`: it writes a value of a loop of another shape or
  // of a sealed one, reads a 0-dim value or one written in place of another
  // loop, or touches a storage a later region touched (not tracked here).
  // `dom`: the op's FusionRules::loop_domain; it joins only loops of its kind.
  bool join_of(int r, const Node& n, int dom, const StorageMap<Touch>& touch, std::vector<int>* join,
               std::vector<int>* reads) {
    join->clear();
    reads->clear();
    Dims key;
    const bool has_key = loop_key(n, &key);
    // cat writes its output through strides in any loop order: it joins a
    // loop of its inputs' shape in any layout.
    const bool any_layout = lowering_of(n.op).concat;
    auto same_key = [&](const Dims& k) {
      if (!any_layout || k.size() <= key.size()) return k == key;
      return k[key.size()] == -1 && std::equal(key.begin(), key.end(), k.begin());
    };
    auto joinable = [&](int g) {
      if (!has_key || !same_key(shape[g]) || sealed[g] || !same_kind(g, dom)) return false;
      if (domain[g] != 2) dom = domain[g];
      return true;
    };
    for (const auto& in : n.inputs) {
      const Touch* t = touch.find(in.ref.storage.get());
      if (!t || t->region < r) continue;
      if (t->region > r || t->group == -1) return false;
      if (t->written || in.written) {
        if (t->group >= 0) {
          const int g = find(t->group);
          if (joinable(g)) {
            join->push_back(g);
            continue;
          }
        }
        if (!in.written && t->maker >= 0 && !t->inplace && in.ref.dim() != 0) {
          reads->push_back(find(t->maker));
          continue;
        }
        if (!in.written && t->maker < 0 && t->inplace && t->group >= 0 && in.ref.dim() != 0) {
          reads->push_back(find(t->group));  // written in place by one earlier loop, read after it
          continue;
        }
        return false;
      }
      if (t->group == -2) continue;  // a region input read by loops of several shapes
      const int g = find(t->group);
      if (joinable(g)) join->push_back(g);
    }
    for (int m : *reads)
      for (int j : *join)
        if (m == j) return false;
    return true;
  }
};

// What partition knows of a region while it grows.
struct Growing {
  Dims anchor_shape;        // the shape an anchored region's epilogue iterates over
  bool by_ops = false;      // a group of lowered ops the target runs op by op (anchor kLibrary)
  bool closed = false;      // ends with a row reduction that ends the target's loop: takes no consumers
  bool row_values = false;  // holds a kRowValue reduction: its consumers join in loops of their own
  int closer = -1;          // graph index of the op that closed it (closed)
  // Whether its ops run in loops of one shape each (Region::loop): a fused
  // elementwise or reduction region on a target that asks for them.
  bool loops(const Region& r, bool one_shape) const {
    return one_shape && !by_ops && (r.anchor == PrimKind::kElementwise || r.anchor == PrimKind::kReduction);
  }
};

// Whether `n` (fusion `f` on the target) may join region `r` under the fusion rules.
// `one_shape`: the target's loops iterate over one shape (FusionRules::loops_of_one_shape):
// the first op of a matmul's epilogue may then iterate over a reshape of the
// product (a linear layer on [B, T, C] makes its product [B * T, N] and reads
// it as [B, T, N]); the epilogue's later ops iterate over that shape.
// Row-value rule (OpFusion::kRowValue): a fused op after a per-row
// reduction joins its region whatever shape it iterates over: one of the
// reduction's output shape ([B, T, 1]: eps + rsqrt) or of its input's
// ([B, T, C]: x * rstd, * weight) runs in a later loop of that shape, which
// reads the per-row values the earlier loops stored (partition's Loops place
// it, or cut the region when no loop can take it). Only elementwise ops, and
// only on targets of one-shape loops.
bool row_value_consumer(const Region& r, const Growing& s, const Node& n, OpFusion f, bool one_shape) {
  return one_shape && s.row_values && r.anchor == PrimKind::kReduction &&
         static_cast<PrimKind>(n.kind) == PrimKind::kElementwise && f == OpFusion::kFuses;
}

// Row-value rule: a fused elementwise op with no producer in the flush may
// also join the previous region when that holds a per-row reduction (RMSNorm
// backward's rstd ** 3 beside the row sum it scales), in a loop of its own
// shape, as it joins the previous elementwise region (horizontal fusion).
bool row_values_take_independent(const Growing& last, const Node& n, OpFusion f) {
  return last.row_values && static_cast<PrimKind>(n.kind) == PrimKind::kElementwise && f == OpFusion::kFuses;
}

// Row-value rule: the region before an op-by-op group `last` when it holds a
// per-row reduction that takes `n` horizontally (the weight gradient's
// column sum of an RMSNorm backward runs op by op between the row sum and
// rstd ** 3); -1 otherwise. The caller checks that `n` reads nothing made or
// written after that region and writes nothing touched after it.
int row_values_before_ops(const std::vector<Growing>& growing, int last, const Node& n, OpFusion f) {
  if (last < 1 || !growing[last].by_ops) return -1;
  return row_values_take_independent(growing[last - 1], n, f) ? last - 1 : -1;
}

// Op-by-op rule: a reduction the target runs op by op joins the op-by-op group
// just before it (the last region), as an elementwise one does: the gradient
// clip's norms of weight gradients made by matmul regions (one each) run as
// one region instead of one region each. The last region runs last, so the
// op keeps its place in the flush's order.
bool op_by_op_reduction(const Growing& last, const Node& n, OpFusion f) {
  return last.by_ops && static_cast<PrimKind>(n.kind) == PrimKind::kReduction && f == OpFusion::kOpByOp;
}

// Horizontal rule: a cat the target fuses joins the previous elementwise
// region as an elementwise op does (the llama's value cache `cat((empty, v),
// -2)` of a projection's product beside the key's rotary loop): a loop of its
// own there instead of a region of one op, which runs CPU's cat.
bool horizontal_concat(const Node& n, OpFusion f) { return f == OpFusion::kFuses && lowering_of(n.op).concat; }

// Whether the region takes no more ops after `f` joined it (row-value rule:
// a kRowValue reduction leaves it open on targets of one-shape loops).
bool closes_region(OpFusion f, bool one_shape) {
  return f == OpFusion::kEndsLoop || (f == OpFusion::kRowValue && !one_shape);
}

// Whether cross-entropy's op `n` (Lowering::loss, fused on a target of
// one-shape loops) runs in a loop of its own kind: it then joins only the
// region `cross_entropy_pair` allows and closes it.
bool loss_row(const Node& n, OpFusion f, bool one_shape) {
  return one_shape && f == OpFusion::kFuses && lowering_of(n.op).loss != LossRow::kNone;
}

// Cross-entropy rule (loss_row ops): nll_loss_forward joins the closed
// region of the _log_softmax whose result it reads as its input (the row
// loop then gathers each row's target value; one region instead of two), and
// _log_softmax_backward_data the region nll_loss_backward started when it
// reads that op's gradient (one row loop makes the gradient of the logits
// without the mostly-zero [N, C] gradient of the log-probabilities). `c`: the
// op that closed the region.
bool cross_entropy_pair(const Node& c, const Node& n) {
  const Lowering& lc = lowering_of(c.op);
  const LossRow loss = lowering_of(n.op).loss;
  const bool pair = (loss == LossRow::kNllLoss && lc.row == RowReduce::kLogSoftmax) ||
                    (loss == LossRow::kLogSoftmaxBackward && lc.loss == LossRow::kNllLossBackward);
  if (!pair || c.outputs.empty()) return false;
  for (const auto& in : n.inputs)
    if (in.arg == 0 && in.elem < 0 && !in.written) return in.ref.storage == c.outputs[0].storage;
  return false;
}

// Layer-norm-backward rule: native_layer_norm_backward, fused on a target of
// one-shape loops (the target's row loop takes the call), starts a region of
// its own and closes it; only `residual_gradient_add` may join.
bool norm_backward_row(const Node& n, OpFusion f, bool one_shape) {
  return one_shape && f == OpFusion::kFuses && lowering_of(n.op).host == DirectImpl::kLayerNormBackward;
}

// Layer-norm-backward rule: a fused elementwise op of two operands of the
// input gradient's shape, one of them that gradient (autograd's sum of a
// pre-norm block's two gradients of its input: the residual's and the
// norm's), joins the region `c` (the backward) closed: the row loop adds
// each row while it is in cache instead of a second pass reading dx back.
// Whether it is an add the loop takes is the executor's to check.
bool residual_gradient_add(const Region& r, const Node& c, const Node& n, OpFusion f) {
  if (r.nodes.size() != 1 || lowering_of(c.op).host != DirectImpl::kLayerNormBackward || c.outputs.empty() ||
      static_cast<PrimKind>(n.kind) != PrimKind::kElementwise || f != OpFusion::kFuses || n.inputs.size() != 2)
    return false;
  bool reads_dx = false;
  for (const auto& in : n.inputs) {
    if (in.elem >= 0 || in.ref.sizes() != c.outputs[0].sizes()) return false;
    reads_dx = reads_dx || in.ref.storage == c.outputs[0].storage;
  }
  return reads_dx;
}

// Layer-norm-backward rule: an op the target runs op by op (the gradient
// clip's norms of the weight and bias gradients) joins the backward's closed
// region as a loop of its own, run op by op in its turn after the row loop
// whose values it reads (partition's Loops order them): one region, as when
// the backward itself ran op by op beside them.
// (It writes only fresh outputs; it is a loop of its own even when it
// iterates over the row loop's shape: the column sum of the input gradient.
// It reads nothing the region writes in place, e.g. the residual add's
// target: a storage written in place belongs to one loop, verify.cpp.)
bool norm_backward_by_op(const std::vector<Node>& g, const Region& r, const Node& c, const Node& n, OpFusion f) {
  if (f != OpFusion::kOpByOp || lowering_of(c.op).host != DirectImpl::kLayerNormBackward) return false;
  for (const auto& in : n.inputs) {
    if (in.written) return false;
    for (const int p : r.nodes)
      for (const auto& w : g[p].inputs)
        if (w.written && w.ref.storage == in.ref.storage) return false;
  }
  return true;
}

// Matmul-epilogue rule: on a target of one-shape loops, a layer_norm that
// ends its loop (OpFusion::kEndsLoop) and iterates over the epilogue's shape
// closes a matmul region that has an epilogue (a transformer's residual add
// after its out-projection, then the next layer_norm of that residual): the
// epilogue loop normalizes each block of rows it has just made, while they
// are in cache, instead of a second region reading the stored residual back.
bool epilogue_layer_norm(const Region& r, const Growing& s, const Node& n, OpFusion f, bool one_shape) {
  if (!one_shape || r.anchor != PrimKind::kMatmul || r.nodes.size() < 2 || f != OpFusion::kEndsLoop ||
      lowering_of(n.op).row != RowReduce::kLayerNorm)
    return false;
  const c10::OptionalIntArrayRef shape = iteration_shape(n);
  return shape && *shape == c10::IntArrayRef(s.anchor_shape);
}

bool fusible_into(const std::vector<Node>& g, const Region& r, const Growing& s, const Node& n, OpFusion f,
                  bool one_shape) {
  const auto k = static_cast<PrimKind>(n.kind);
  if (k == PrimKind::kLibrary || r.nodes.size() >= kMaxRegionOps) return false;
  if (s.by_ops) return f == OpFusion::kOpByOp;  // op-by-op groups take only such ops
  if (loss_row(n, f, one_shape)) return s.closed && s.closer >= 0 && cross_entropy_pair(g[s.closer], n);
  if (norm_backward_row(n, f, one_shape)) return false;
  if (r.anchor == PrimKind::kLibrary) return false;
  if (s.closed)
    return s.closer >= 0 &&
           (residual_gradient_add(r, g[s.closer], n, f) || norm_backward_by_op(g, r, g[s.closer], n, f));
  if (row_value_consumer(r, s, n, f, one_shape) || epilogue_layer_norm(r, s, n, f, one_shape)) return true;
  const bool anchored = r.anchor == PrimKind::kReduction || r.anchor == PrimKind::kMatmul;
  if (k == PrimKind::kElementwise) {
    const c10::OptionalIntArrayRef shape = iteration_shape(n);
    bool epilogue = shape && *shape == c10::IntArrayRef(s.anchor_shape);  // iterates over the anchor's output
    if (shape && !epilogue && one_shape && r.anchor == PrimKind::kMatmul && r.nodes.size() == 1)
      epilogue = c10::multiply_integers(*shape) == c10::multiply_integers(s.anchor_shape);
    // The MXU kernel's epilogue: the elementwise ops over its product the target fuses.
    if (r.anchor == PrimKind::kMatmul) return epilogue && f != OpFusion::kOpByOp;
    return f != OpFusion::kOpByOp && (!anchored || epilogue);
  }
  if (f == OpFusion::kOpByOp) return false;
  if (k == PrimKind::kData || k == PrimKind::kRandom || k == PrimKind::kReduction) return !anchored;
  return false;  // a matmul starts its own region
}

// Whether `n`, whose producer region `r` is a matmul's, stays out of that
// region's epilogue: it updates in place a tensor the region did not make
// (an optimizer state: exp_avg.lerp_(grad, 1 - beta1) over a weight
// gradient), and later ops of the flush use both that tensor and the value
// `n` reads from the region (the gradient: addcmul_). Those later ops load
// the value anyway; with `n` beside them (the optimizer's multi-tensor
// region) the whole update runs in one pass (Adam's, fused_kernels.inc)
// instead of storing the state here and loading it there. An update whose
// region value nothing reads later (acc.add_(x @ w)) stays in the epilogue.
// `last_use`: storage -> last live graph index reading or writing it;
// `writer`: storage -> latest region writing it.
bool defers_from_epilogue(const Region& r, int ri, const Node& n, int i, const StorageMap<int>& last_use,
                          const StorageMap<int>& writer) {
  if (r.anchor != PrimKind::kMatmul || static_cast<PrimKind>(n.kind) != PrimKind::kElementwise) return false;
  bool state_used_later = false, value_used_later = false;
  for (const auto& in : n.inputs) {
    const int* w = writer.find(in.ref.storage.get());
    const int* u = last_use.find(in.ref.storage.get());
    const bool made_here = w && *w == ri, used_later = u && *u > i;
    if (in.written && !made_here && used_later) state_used_later = true;
    if (!in.written && made_here && used_later) value_used_later = true;
  }
  return state_used_later && value_used_later;
}

// Cross-entropy rule: the op-by-op region of one op just before a
// cross-entropy backward loop (nll_loss_backward + _log_softmax_backward_data)
// that only writes that loop's loss gradient in place (autograd's fill_ of
// the seed gradient) becomes the loop region's first loop: it runs op by op
// there (loops run in turn, and nll_loss_backward reads the gradient when its
// loop is bound), one region instead of two.
void take_loss_gradient_fill(const std::vector<Node>& g, std::vector<Region>& regions, std::vector<Growing>& growing) {
  for (size_t ri = 1; ri < regions.size(); ++ri) {
    Region& r = regions[ri];
    Region& p = regions[ri - 1];
    if (!growing[ri - 1].by_ops || p.nodes.size() != 1 || r.nodes.size() != 2 || r.loop != std::vector<int>{0, 0})
      continue;
    const Node& nb = g[r.nodes[0]];
    const Node& fill = g[p.nodes[0]];
    if (lowering_of(nb.op).loss != LossRow::kNllLossBackward || !fill.outputs.empty() || fill.inputs.size() != 1 ||
        !fill.inputs[0].written || !lowering_of(fill.op).overwrites_self)
      continue;
    bool reads_it = false;
    for (const auto& in : nb.inputs)
      reads_it = reads_it || (in.arg == 0 && in.ref.storage == fill.inputs[0].ref.storage);
    if (!reads_it) continue;
    r.nodes.insert(r.nodes.begin(), p.nodes[0]);
    r.materialize.insert(r.materialize.begin(), std::move(p.materialize[0]));
    r.loop = {0, 1, 1};
    regions.erase(regions.begin() + static_cast<std::ptrdiff_t>(ri) - 1);
    growing.erase(growing.begin() + static_cast<std::ptrdiff_t>(ri) - 1);
    --ri;
  }
}

}  // namespace

std::vector<Region> partition(const std::vector<Node>& g, const std::vector<char>& live, const StorageSet& observed,
                              const FusionRules* rules) {
  static const FusionRules kDefaultRules;
  if (!rules) rules = &kDefaultRules;
  std::vector<Region> regions;
  std::vector<Growing> growing;
  // storage -> latest region that wrote it / that read or wrote it, in this flush
  StorageMap<int> writer(2 * g.size()), last_access(2 * g.size());
  // storage -> (graph index, output index) of the fresh output that created it
  StorageMap<std::pair<int, int>> producer(g.size());
  auto lookup = [](const StorageMap<int>& m, const DeferredStorage* s) {
    const int* v = m.find(s);
    return v ? *v : -1;
  };
  const bool one_shape = rules->loops_of_one_shape();
  Loops loops;
  StorageMap<Touch> touch(one_shape ? 2 * g.size() : 1);
  std::vector<int> group_of(one_shape ? g.size() : 0, -1);  // graph index -> loop group
  std::vector<int> join, reads;
  StorageMap<int> last_use(2 * g.size());  // storage -> last live graph index using it
  for (int i = 0; i < static_cast<int>(g.size()); ++i) {
    if (!live[i]) continue;
    for (const auto& in : g[i].inputs) last_use[in.ref.storage.get()] = i;
    for (const auto& o : g[i].outputs) last_use[o.storage.get()] = i;
  }
  // Whether `n` may join region `r`: the fusion rules, and on a target of
  // one-shape loops, a loop of `r` it can run in.
  auto may_join = [&](int r, const Node& n, OpFusion f) {
    if (!fusible_into(g, regions[r], growing[r], n, f, one_shape)) return false;
    if (!growing[r].loops(regions[r], one_shape)) return true;
    return loops.join_of(r, n, rules->loop_domain(g, static_cast<int>(&n - g.data())), touch, &join, &reads);
  };

  for (int i = 0; i < static_cast<int>(g.size()); ++i) {
    if (!live[i]) continue;
    const Node& n = g[i];
    const auto k = static_cast<PrimKind>(n.kind);
    const OpFusion f = k == PrimKind::kLibrary ? OpFusion::kOpByOp : rules->op_fusion(g, i);
    // The op may run in region R no earlier than the last region that wrote
    // one of its inputs, and only if no later region touches what it writes.
    int producer_region = -1, write_conflict = -1;
    for (const auto& in : n.inputs) {
      producer_region = std::max(producer_region, lookup(writer, in.ref.storage.get()));
      if (in.written) write_conflict = std::max(write_conflict, lookup(last_access, in.ref.storage.get()));
    }
    const int last = static_cast<int>(regions.size()) - 1;
    int target = -1;
    if (producer_region >= 0 && write_conflict <= producer_region &&
        !defers_from_epilogue(regions[producer_region], producer_region, n, i, last_use, writer) &&
        may_join(producer_region, n, f)) {
      target = producer_region;  // vertical fusion with the op's producer
    } else if (last >= 0 &&
               (((k == PrimKind::kElementwise || horizontal_concat(n, f)) &&
                 (regions[last].anchor == PrimKind::kElementwise || growing[last].by_ops ||
                  row_values_take_independent(growing[last], n, f))) ||
                op_by_op_reduction(growing[last], n, f)) &&
               may_join(last, n, f)) {
      // horizontal fusion of independent elementwise ops (multi-tensor kernels; in
      // an op-by-op group when the target runs them op by op), and of op-by-op
      // reductions into an op-by-op group
      target = last;
    } else if (const int rv = row_values_before_ops(growing, last, n, f);
               rv >= 0 && producer_region <= rv && write_conflict <= rv && may_join(rv, n, f)) {
      target = rv;  // horizontal fusion into a per-row reduction's region, over an op-by-op group
    }
    if (target < 0) {
      join.clear();
      reads.clear();
      Region r;
      Growing s;
      const c10::OptionalIntArrayRef shape = iteration_shape(n);
      s.anchor_shape = shape ? Dims(*shape) : Dims{};
      if (k == PrimKind::kLibrary || f == OpFusion::kOpByOp) {
        r.anchor = PrimKind::kLibrary;
        s.by_ops = k != PrimKind::kLibrary;  // a library op runs alone
      } else {
        r.anchor = (k == PrimKind::kReduction || k == PrimKind::kMatmul) ? k : PrimKind::kElementwise;
      }
      regions.push_back(std::move(r));
      growing.push_back(std::move(s));
      target = static_cast<int>(regions.size()) - 1;
    } else if (k == PrimKind::kReduction && !growing[target].by_ops && regions[target].anchor != PrimKind::kMatmul) {
      regions[target].anchor = k;
      const c10::OptionalIntArrayRef shape = iteration_shape(n);
      growing[target].anchor_shape = shape ? Dims(*shape) : Dims{};
    }
    if (closes_region(f, one_shape) || loss_row(n, f, one_shape) || norm_backward_row(n, f, one_shape)) {
      growing[target].closed = true;
      growing[target].closer = i;
    }
    if (f == OpFusion::kRowValue && one_shape) growing[target].row_values = true;
    if (regions[target].anchor == PrimKind::kMatmul && regions[target].nodes.size() == 1 && iteration_shape(n))
      growing[target].anchor_shape = Dims(*iteration_shape(n));  // the epilogue's shape (a reshape of the product)
    if (one_shape) {
      // The op's loop: the groups it joins merged, or a new one.
      int grp = -1;
      if (growing[target].loops(regions[target], true)) {
        const int dom = rules->loop_domain(g, i);
        // An op run op by op in a loop region (norm_backward_by_op) is a
        // loop of its own, after the loops whose values it reads.
        if (f == OpFusion::kOpByOp) {
          reads.insert(reads.end(), join.begin(), join.end());
          join.clear();
        }
        if (join.empty()) {
          Dims key;
          loop_key(n, &key);  // (empty when it has none)
          grp = loops.add(key, dom);
        } else {
          const int d = loops.merged_domain(join, dom);
          grp = loops.find(join[0]);
          for (int o : join) loops.parent[loops.find(o)] = grp;
          loops.domain[grp] = d;
        }
        for (int m : reads) {
          loops.sealed[m] = 1;
          loops.edges.emplace_back(m, grp);
        }
        group_of[i] = grp;
        // Row-value rule: the reduction is its loop's last op (its
        // consumers, even of the same shape, read its value in a later loop).
        if (f == OpFusion::kRowValue) loops.sealed[grp] = 1;
        // A clone (a cat of one tensor) writes its output through strides,
        // never read back in its loop: its consumers read it in later loops.
        if (lowering_of(n.op).concat && n.inputs.size() == 1) loops.sealed[grp] = 1;
      }
      auto touched = [&](const DeferredStorage* st, bool writes, bool inplace, bool fresh) {
        Touch& t = touch[st];
        // An op placed in an earlier region than the storage's latest (an
        // op-by-op group taking a later op) leaves the later region's record:
        // its loops must still see who read or wrote the storage.
        if (t.region > target) return;
        if (t.region != target || grp < 0) {
          t = Touch{target, grp, writes, fresh ? grp : -1, inplace};
        } else {
          if (t.group >= 0 && loops.find(t.group) != grp) t.group = -2;  // read by loops of different shapes
          t.written = t.written || writes;
          t.inplace = t.inplace || inplace;
        }
      };
      for (const auto& in : n.inputs) touched(in.ref.storage.get(), in.written, in.written, false);
      for (const auto& o : n.outputs) touched(o.storage.get(), true, false, true);
    }
    regions[target].nodes.push_back(i);
    regions[target].materialize.emplace_back(n.outputs.size(), 0);
    for (int j = 0; j < static_cast<int>(n.outputs.size()); ++j) {
      writer[n.outputs[j].storage.get()] = target;
      last_access[n.outputs[j].storage.get()] = target;
      producer[n.outputs[j].storage.get()] = {i, j};
    }
    for (const auto& in : n.inputs) {
      auto* st = in.ref.storage.get();
      last_access[st] = std::max(lookup(last_access, st), target);
      if (in.written) writer[st] = std::max(lookup(writer, st), target);
    }
  }

  // A fused region of one elementwise op gains nothing from a loop (its CPU
  // kernel writes the device buffer directly): next to an op-by-op group it
  // joins that group instead (one region fewer, and the group's inputs stay
  // the flush's own, whose mark_dynamic ranges key it). Adjacent regions run
  // one after the other, so the op may run at the start or, in program order,
  // inside its neighbour.
  for (size_t ri = 0; ri < regions.size(); ++ri) {
    Region& r = regions[ri];
    if (growing[ri].by_ops || r.anchor != PrimKind::kElementwise || r.nodes.size() != 1) continue;
    const int into = ri + 1 < regions.size() && growing[ri + 1].by_ops ? static_cast<int>(ri) + 1
                     : ri > 0 && growing[ri - 1].by_ops                ? static_cast<int>(ri) - 1
                                                                       : -1;
    if (into < 0 || regions[into].nodes.size() >= kMaxRegionOps) continue;
    Region& to = regions[into];
    const auto at = std::lower_bound(to.nodes.begin(), to.nodes.end(), r.nodes[0]) - to.nodes.begin();
    to.nodes.insert(to.nodes.begin() + at, r.nodes[0]);
    to.materialize.insert(to.materialize.begin() + at, std::move(r.materialize[0]));
    r.nodes.clear();
  }
  {
    size_t kept = 0;
    for (size_t ri = 0; ri < regions.size(); ++ri) {
      if (regions[ri].nodes.empty()) continue;
      if (kept != ri) {
        regions[kept] = std::move(regions[ri]);
        growing[kept] = std::move(growing[ri]);
      }
      ++kept;
    }
    regions.resize(kept);
    growing.resize(kept);
  }

  // Each fused region's loops, numbered in order of their first op.
  if (one_shape) {
    for (size_t ri = 0; ri < regions.size(); ++ri) {
      Region& r = regions[ri];
      if (!growing[ri].loops(r, true)) continue;
      // The region's groups in order of their first op, then numbered so
      // that a loop comes after those whose values it reads (Kahn's order,
      // the earliest first op first; sealed makers take no ops: no cycle).
      const int first_root = loops.find(group_of[r.nodes[0]]);
      bool one = true;
      for (int i : r.nodes) one = one && loops.find(group_of[i]) == first_root;
      if (one) {  // the common case: one loop
        r.loop.assign(r.nodes.size(), 0);
        continue;
      }
      std::vector<int> roots;
      for (int i : r.nodes) {
        const int root = loops.find(group_of[i]);
        if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
      }
      auto index_of = [&](int root) {
        return static_cast<int>(std::find(roots.begin(), roots.end(), root) - roots.begin());
      };
      const int count = static_cast<int>(roots.size());
      std::vector<int> waits(count, 0), number(count, -1);
      std::vector<std::pair<int, int>> deps;  // (maker, reader) as indices into roots
      for (const auto& [m, rd] : loops.edges) {
        const int a = index_of(loops.find(m)), b = index_of(loops.find(rd));
        if (a >= count || b >= count || a == b) continue;  // another region's groups
        deps.emplace_back(a, b);
        ++waits[b];
      }
      for (int next = 0; next < count; ++next) {
        int pick = 0;
        while (pick < count && (number[pick] >= 0 || waits[pick] > 0)) ++pick;
        if (pick == count) break;  // never: sealed makers form no cycle
        number[pick] = next;
        for (const auto& [a, b] : deps)
          if (a == pick) --waits[b];
      }
      r.loop.reserve(r.nodes.size());
      for (int i : r.nodes) r.loop.push_back(number[index_of(loops.find(group_of[i]))]);
    }
  }

  if (one_shape) take_loss_gradient_fill(g, regions, growing);

  // Materialize an output when something outside its region can observe it.
  // graph index -> (region, position); region -1 for a dead node
  std::vector<std::pair<int, int>> where(g.size(), {-1, -1});
  for (int ri = 0; ri < static_cast<int>(regions.size()); ++ri)
    for (int p = 0; p < static_cast<int>(regions[ri].nodes.size()); ++p) where[regions[ri].nodes[p]] = {ri, p};
  for (int ri = 0; ri < static_cast<int>(regions.size()); ++ri) {
    for (int i : regions[ri].nodes) {
      for (const auto& in : g[i].inputs) {
        const std::pair<int, int>* made = producer.find(in.ref.storage.get());
        if (!made) continue;
        const std::pair<int, int>& w = where[made->first];
        if (w.first >= 0 && w.first != ri) regions[w.first].materialize[w.second][made->second] = 1;
      }
    }
  }
  // ... and a fresh value one loop of a region reads from another (it is stored by its maker).
  for (auto& r : regions) {
    if (r.loop.empty()) continue;
    for (size_t p = 0; p < r.nodes.size(); ++p) {
      for (const auto& in : g[r.nodes[p]].inputs) {
        const std::pair<int, int>* made = producer.find(in.ref.storage.get());
        if (!made) continue;
        const std::pair<int, int>& w = where[made->first];
        if (w.first >= 0 && &regions[w.first] == &r && r.loop[w.second] != r.loop[p])
          r.materialize[w.second][made->second] = 1;
      }
    }
  }
  for (auto& r : regions)
    for (size_t p = 0; p < r.nodes.size(); ++p)
      for (size_t j = 0; j < g[r.nodes[p]].outputs.size(); ++j)
        if (observed.contains(g[r.nodes[p]].outputs[j].storage.get())) r.materialize[p][j] = 1;
  return regions;
}

namespace {

// `stable`: name ops by qualified name and overload instead of their schema's
// address, so the key means the same in every process (the on-disk cache).
uint64_t region_key(const std::vector<Node>& g, const Region& r, bool stable, std::vector<uint64_t>* words) {
  KeyBuilder h{0x51ED270B27A1ULL, words};
  if (words) words->clear();
  mix(h, static_cast<uint64_t>(r.anchor));  // how the target runs it (op by op or fused) follows from the partition
  // Which ops share a loop (several loops only; one loop or none adds nothing).
  int loops = 0;
  for (int l : r.loop) loops = std::max(loops, l + 1);
  if (loops > 1)
    for (int l : r.loop) mix(h, static_cast<uint64_t>(l));
  StorageMap<int> local(r.nodes.size());  // storages created in this region -> ordinal
  // Sizes in mark_dynamic ranges: a written buffer's size that follows one
  // (a pad's n + 2) is keyed as following it (dynamic_shapes.h).
  const RegionMarks marks = region_marks(g, r.nodes);
  for (size_t p = 0; p < r.nodes.size(); ++p) {
    const Node& n = g[r.nodes[p]];
    if (stable) {
      const auto& schema = n.op.schema();
      mix(h.h, std::hash<std::string>()(schema.name() + "." + schema.overload_name()));
    } else {
      mix(h, reinterpret_cast<uintptr_t>(&n.op.schema()));
    }
    for (const auto& in : n.inputs) {
      mix(h, static_cast<uint64_t>(in.arg) * 131 + static_cast<uint64_t>(in.elem + 1));
      const int* made = local.find(in.ref.storage.get());
      mix(h, made ? static_cast<uint64_t>(*made) : ~0ULL);
      mix(h, static_cast<uint64_t>(in.ref.dtype));
      mix(h, in.ref.dim());
      // A value made inside the region has sizes that follow from the region's
      // inputs: only the inputs' sizes (bucketed) are part of the key.
      if (!made)
        for (auto b : size_buckets(in.ref, marks)) mix(h, b);
      for (auto s : in.ref.strides()) mix(h, s == 0 ? 0 : s == 1 ? 1 : 2);
      mix(h, in.written);
    }
    for (size_t a = 0; a < n.args.size(); ++a) {
      if (is_wrapped_arg(n, a))
        mix(h, 1);  // a wrapped number kept as its Scalar: the kind its tensor had, a runtime value
      else
        mix_ivalue(h, n.args[a]);
    }
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      local.get_or(n.outputs[j].storage.get(), static_cast<int>(local.size()));
      mix(h, static_cast<uint64_t>(n.outputs[j].dtype));
      mix(h, static_cast<uint64_t>(r.materialize[p][j]));
    }
  }
  return h.h;
}

}  // namespace

uint64_t structural_key(const std::vector<Node>& g, const Region& r) { return region_key(g, r, false, nullptr); }

uint64_t structural_key(const std::vector<Node>& g, const Region& r, std::vector<uint64_t>* words) {
  return region_key(g, r, false, words);
}

}  // namespace jit

std::vector<int64_t> layout_signature(const Region& region, const std::vector<Node>& graph) {
  std::vector<int64_t> sig;
  sig.reserve(region.nodes.size() * 24);
  StorageMap<int> ordinal(2 * region.nodes.size() + 2);
  auto ref = [&](const TensorRef& r) {
    const int before = static_cast<int>(ordinal.size());
    sig.push_back(ordinal.get_or(r.storage.get(), before));
    sig.push_back(static_cast<int64_t>(r.dtype) | (int64_t{r.conj} << 8) | (int64_t{r.neg} << 9));
    sig.push_back(r.offset);
    sig.push_back(static_cast<int64_t>(r.dim()));
    const c10::IntArrayRef sizes = r.sizes();
    const c10::IntArrayRef strides = r.strides();
    sig.insert(sig.end(), sizes.begin(), sizes.end());
    sig.insert(sig.end(), strides.begin(), strides.end());
  };
  for (int i : region.nodes) {
    const Node& n = graph[i];
    sig.push_back(static_cast<int64_t>(n.inputs.size()) << 16 | static_cast<int64_t>(n.outputs.size()));
    for (const auto& in : n.inputs) ref(in.ref);
    for (const auto& o : n.outputs) ref(o);
  }
  return sig;
}

namespace jit {

uint64_t stable_structural_key(const std::vector<Node>& g, const Region& r) { return region_key(g, r, true, nullptr); }

}  // namespace jit
}  // namespace tpu_eager
