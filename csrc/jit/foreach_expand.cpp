// Expansion of foreach nodes into per-tensor nodes (see foreach_expand.h).
#include "jit/foreach_expand.h"

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include "ops/foreach_rules.h"
#include "ops/op_table.h"

namespace tpu_eager {
namespace jit {
namespace {

// Per-tensor nodes written whole / refreshed (per_tensor_nodes_written, _refreshed).
std::atomic<int64_t> g_written{0};
std::atomic<int64_t> g_refreshed{0};

// What building a per-tensor node needs of its op.
struct PerTensorOp {
  const ForeachRule* rule = nullptr;
  c10::OperatorHandle op;
  PrimKind kind = PrimKind::kElementwise;
  bool checks_values = false;
  std::vector<char> tensor_arg;       // per argument: a Tensor
  std::vector<char> written;          // per argument: the op writes it
  std::vector<c10::IValue> defaults;  // per argument: its default value (None without one)
  int aliased = -1;                   // the argument its return aliases; -1: a fresh result
};

PerTensorOp make_per_tensor_op(const ForeachRule& rule) {
  const std::string qualified = "aten::" + std::string(rule.name);
  const std::string overload(rule.overload);
  auto handle = c10::Dispatcher::singleton().findSchema({qualified.c_str(), overload.c_str()});
  TORCH_INTERNAL_ASSERT(handle.has_value(), "foreach expansion: no operator ", qualified, ".", overload);
  PerTensorOp p{&rule, *handle};
  const std::string full = std::string(rule.name) + (overload.empty() ? "" : ".") + overload;
  for (const OpEntry& e : op_table()) {
    if (full == e.name) {
      p.kind = e.kind;
      p.checks_values = (e.traits & kChecksValues) != 0;
    }
  }
  const auto& schema = handle->schema();
  TORCH_INTERNAL_ASSERT(schema.arguments().size() == static_cast<size_t>(rule.nargs), "foreach expansion: ", full,
                        " takes ", schema.arguments().size(), " arguments");
  for (const auto& a : schema.arguments()) {
    p.tensor_arg.push_back(a.type()->kind() == c10::TypeKind::TensorType);
    p.written.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
    p.defaults.push_back(a.default_value().has_value() ? *a.default_value() : c10::IValue());
    if (p.written.back() && !schema.returns().empty() && schema.returns()[0].alias_info() != nullptr)
      p.aliased = static_cast<int>(p.written.size()) - 1;
  }
  return p;
}

// The per-tensor op of a foreach operator (built once per operator).
const PerTensorOp& per_tensor_op(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static auto& table =
      *new std::unordered_map<const c10::FunctionSchema*, PerTensorOp>();  // never destroyed: flushes may run at exit
  std::lock_guard<std::mutex> lock(mu);
  const c10::FunctionSchema* key = &op.schema();
  auto it = table.find(key);
  if (it != table.end()) return it->second;
  const ForeachRule* rule = foreach_rule(op.schema());
  TORCH_INTERNAL_ASSERT(rule != nullptr, "foreach expansion: no rule for ", op.schema().name(), ".",
                        op.schema().overload_name());
  return table.emplace(key, make_per_tensor_op(*rule)).first->second;
}

// Node `at` of `out` made ready for op `op`: a new one past the end, the kept one when it
// is of `op` (its lists keep their room; every field is written by the caller), else a fresh
// one written over it.
Node& node_at(std::vector<Node>& out, size_t at, const c10::OperatorHandle& op) {
  if (at == out.size()) return out.emplace_back(op);
  Node& m = out[at];
  if (!(m.op == op)) m = Node(op);
  return m;
}

// The next input slot of `m` (`*used` of them written so far): a kept one, else a new one.
InputSlot& next_input(Node& m, size_t* used) {
  return (*used)++ < m.inputs.size() ? m.inputs[*used - 1] : m.inputs.emplace_back();
}

// The per-tensor nodes of foreach node `n`, from `out[*at]` on, written again over kept nodes
// of the same structure (ExpandedGraph's `plan`): only the storages, argument values,
// location and sequence number change between flushes of one structure.
void refresh_node(const Node& n, const PerTensorOp& p, const c10::SmallVector<int, 64>& slot_of, std::vector<Node>& out,
                  size_t* at) {
  const size_t count = n.args[0].toListRef().size();
  const size_t nfargs = n.args.size();
  const size_t nargs = p.tensor_arg.size();
  for (size_t i = 0; i < count; ++i) {
    Node& m = out[(*at)++];
    m.where = n.where;
    m.seq = n.seq;
    size_t inputs = 0;
    for (size_t a = 0; a < nargs; ++a) {
      const int f = p.rule->args[a];
      if (f < 0) continue;  // its default, kept
      const c10::IValue& v = n.args[static_cast<size_t>(f)];
      const c10::IValue& e = v.isList() ? v.toListRef()[i] : v;
      if (!e.isTensor() || e.toTensor().defined()) m.args[a] = e;  // a recorded tensor's slot stays undefined
      const int s = slot_of[i * nfargs + static_cast<size_t>(f)];
      if (s >= 0 && p.tensor_arg[a]) m.inputs[inputs++].ref.storage = n.inputs[static_cast<size_t>(s)].ref.storage;
    }
    if (p.aliased < 0) m.outputs[0].storage = n.outputs[i].storage;
  }
}

// Writes foreach node `n`'s per-tensor nodes into `out` from index `*at` on (kept nodes
// written over, node_at), advancing `*at`; with `refresh`, over kept nodes of the same
// structure (refresh_node).
void expand_node(const Node& n, std::vector<Node>& out, size_t* at, bool refresh) {
  const PerTensorOp& p = per_tensor_op(n.op);
  const size_t count = n.args[0].toListRef().size();
  // The input slot of each foreach argument at each index (-1: none, a host tensor's).
  const size_t nfargs = n.args.size();
  c10::SmallVector<int, 64> slot_of(count * nfargs, -1);
  for (size_t s = 0; s < n.inputs.size(); ++s) {
    const InputSlot& in = n.inputs[s];
    const auto a = static_cast<size_t>(in.arg);
    if (in.elem >= 0) {
      slot_of[static_cast<size_t>(in.elem) * nfargs + a] = static_cast<int>(s);
    } else {
      for (size_t i = 0; i < count; ++i) slot_of[i * nfargs + a] = static_cast<int>(s);
    }
  }
  (refresh ? g_refreshed : g_written).fetch_add(static_cast<int64_t>(count), std::memory_order_relaxed);
  if (refresh) {
    refresh_node(n, p, slot_of, out, at);
    return;
  }
  const size_t nargs = p.tensor_arg.size();
  for (size_t i = 0; i < count; ++i) {
    Node& m = node_at(out, (*at)++, p.op);
    m.kind = static_cast<int>(p.kind);
    m.checks_values = p.checks_values;
    m.where = n.where;
    m.seq = n.seq;
    m.wrapped = 0;
    m.rng = false;
    m.expands = false;
    m.warned_at_call = false;  // a kept node may be a recorded one moved back (restore)
    m.meta_id = 0;
    m.rng_seed = 0;
    m.args.resize(nargs);
    size_t inputs = 0;
    for (size_t a = 0; a < nargs; ++a) {
      const int f = p.rule->args[a];
      if (f < 0) {
        m.args[a] = p.defaults[a];
        continue;
      }
      const c10::IValue& v = n.args[static_cast<size_t>(f)];
      // A Tensor[] element (undefined when recorded), a Scalar[] element, or the argument itself.
      const c10::IValue& e = v.isList() ? v.toListRef()[i] : v;
      m.args[a] = e;
      const bool scalar = !e.isTensor() && !e.isNone();
      if ((scalar && p.tensor_arg[a]) || is_wrapped_arg(n, static_cast<size_t>(f))) m.wrapped |= 1u << a;
      const int s = slot_of[i * nfargs + static_cast<size_t>(f)];
      if (s < 0 || !p.tensor_arg[a]) continue;
      InputSlot& t = next_input(m, &inputs);
      t.elem = -1;
      t.arg = static_cast<int16_t>(a);
      t.ref = n.inputs[static_cast<size_t>(s)].ref;
      t.written = p.written[a] != 0;
    }
    m.inputs.resize(inputs);
    m.returns.clear();
    m.list_lens.clear();
    if (p.aliased >= 0) {
      int slot = -1;
      for (size_t s = 0; s < m.inputs.size(); ++s)
        if (m.inputs[s].arg == p.aliased) slot = static_cast<int>(s);
      TORCH_INTERNAL_ASSERT(slot >= 0, "foreach expansion: no slot for the written argument");
      m.outputs.clear();
      m.returns.push_back(slot);
    } else {
      TORCH_INTERNAL_ASSERT(n.outputs.size() == count, "foreach expansion: ", n.outputs.size(), " results for ", count,
                            " tensors");
      m.outputs.resize(1);
      m.outputs[0] = n.outputs[i];
      m.returns.push_back(-1);
    }
    m.list_lens.push_back(0);  // one per return, as the record kernel writes them
  }
}

}  // namespace

int64_t per_tensor_nodes_written() { return g_written.load(std::memory_order_relaxed); }
int64_t per_tensor_nodes_refreshed() { return g_refreshed.load(std::memory_order_relaxed); }

struct ExpandedGraph::Kept {
  std::vector<Node> nodes;
  bool busy = false;
  // The flush plan whose structure `nodes` has (ExpandedGraph::set_plan); empty when unknown.
  // Weak: the flush cache alone keeps plans (and their kernels) alive, also at exit; while
  // this holds the plan's control block, no other plan can have it.
  std::weak_ptr<const FlushPlan> plan;
};

bool has_foreach_nodes(const std::vector<Node>& g) {
  for (const Node& n : g)
    if (n.expands) return true;
  return false;
}

namespace {
// The thread's kept expansion when no expansion uses it, else null.
ExpandedGraph::Kept* thread_kept() {
  thread_local ExpandedGraph::Kept kept;
  return kept.busy ? nullptr : &kept;
}
}  // namespace

ExpandedGraph::ExpandedGraph(std::vector<Node>& g, std::shared_ptr<const FlushPlan> plan)
    : kept_(thread_kept()),
      own_(kept_ ? nullptr : std::make_unique<Kept>()),
      g_(g),
      nodes((kept_ ? kept_ : (kept_ = own_.get()))->nodes) {
  kept_->busy = true;
  // Known until written: a failed expansion leaves the kept nodes of no plan.
  const bool refresh = plan != nullptr && !kept_->plan.owner_before(plan) && !plan.owner_before(kept_->plan);
  kept_->plan.reset();
  size_t total = 0;
  for (const Node& n : g) total += n.expands ? n.args[0].toListRef().size() : 1;
  nodes.reserve(total);
  moved_.reserve(g.size());
  size_t at = 0;
  try {
    for (size_t k = 0; k < g.size(); ++k) {
      if (g[k].expands) {
        expand_node(g[k], nodes, &at, refresh);
      } else {
        moved_.emplace_back(k, at);
        if (at == nodes.size())
          nodes.push_back(std::move(g[k]));
        else
          nodes[at] = std::move(g[k]);
        ++at;
      }
    }
    // Kept nodes past this flush's (an earlier flush had more) go.
    nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(at), nodes.end());
  } catch (...) {
    restore();  // the recorded nodes go back to the queue
    throw;
  }
  kept_->plan = std::move(plan);
}

void ExpandedGraph::set_plan(std::shared_ptr<const FlushPlan> plan) { kept_->plan = std::move(plan); }

void ExpandedGraph::restore() {
  for (const auto& [from, to] : moved_) g_[from] = std::move(nodes[to]);
  moved_.clear();
  // The kept per-tensor nodes hold no storage (nor a host tensor) past the flush.
  for (Node& m : nodes) {
    for (InputSlot& in : m.inputs) in.ref.storage.reset();
    for (TensorRef& out : m.outputs) out.storage.reset();
    for (c10::IValue& a : m.args)
      if (a.isTensor() && a.toTensor().defined()) a = c10::IValue();
  }
  kept_->busy = false;
}

ExpandedGraph::~ExpandedGraph() { restore(); }

}  // namespace jit
}  // namespace tpu_eager
