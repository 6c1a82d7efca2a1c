// JIT v1: dead-code elimination, partition into fused regions, structural
// cache, execution through the active executor.
#include "device/env.h"
#include "lazy/debug_report.h"
#include "jit/jit.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "executors/executor.h"
#include "jit/disk_cache.h"
#include "jit/kernel_trace.h"
#include "jit/partition.h"
#include "jit/region_disk_cache.h"

namespace tpu_eager {

const char* prim_kind_name(PrimKind k) {
  switch (k) {
    case PrimKind::kLibrary: return "library";
    case PrimKind::kElementwise: return "elementwise";
    case PrimKind::kReduction: return "reduction";
    case PrimKind::kMatmul: return "matmul";
    case PrimKind::kData: return "data";
    case PrimKind::kRandom: return "random";
    case PrimKind::kView: return "view";
    case PrimKind::kSync: return "sync";
  }
  return "?";
}

namespace jit {
namespace {

std::mutex g_cache_mu;
std::unordered_map<uint64_t, std::shared_ptr<CompiledRegion>> g_cache;

// Marks live nodes: a node is live when it writes a storage whose value is
// observed later (by a live node, or after the flush: `observed`).
std::vector<char> live_nodes(const std::vector<Node>& g, const StorageSet& observed) {
  StorageSet needed(observed);
  std::vector<char> live(g.size(), 0);
  for (size_t i = g.size(); i-- > 0;) {
    const Node& n = g[i];
    bool l = false;
    for_each_written_storage(n, [&](const DeferredStorage* s) { l = l || needed.contains(s); });
    if (!l) continue;
    live[i] = 1;
    for (const auto& in : n.inputs) needed.insert(in.ref.storage.get());
  }
  return live;
}

std::string region_name(const CompiledRegion& c, const std::vector<Node>& g, const Region& r) {
  std::string name = r.nodes.size() > 1 ? "fused" : "kernel";
  for (size_t k = 0; k < r.nodes.size() && k < 6; ++k) {
    name += "_";
    name += g[r.nodes[k]].op.schema().name().substr(6);  // drop "aten::"
  }
  if (r.nodes.size() > 6) name += "_etc";
  return name;
}

std::shared_ptr<CompiledRegion> compile(uint64_t key, const std::vector<Node>& g, const Region& r) {
  auto c = std::make_shared<CompiledRegion>();
  c->key = key;
  for (int i : r.nodes) c->kinds.push_back(static_cast<PrimKind>(g[i].kind));
  c->num_ops = static_cast<int64_t>(r.nodes.size());
  c->name = region_name(*c, g, r);
  return c;
}

// Appends region `r`'s run to the profiler's trace.
void trace_region(const CompiledRegion& c, const std::vector<Node>& g, const Region& r, const RegionStats& st,
                  bool cache_hit, bool failed, const std::string& target) {
  KernelRecord rec;
  rec.name = c.name;
  rec.target = target;
  rec.stats = st;
  rec.cache_hit = cache_hit;
  rec.failed = failed;
  for (int i : r.nodes) {
    const Node& n = g[i];
    const auto& schema = n.op.schema();
    rec.ops.push_back(schema.name().substr(6) + (schema.overload_name().empty() ? "" : "." + schema.overload_name()));
    std::vector<std::vector<int64_t>> in, out;
    for (const auto& slot : n.inputs) in.push_back(slot.ref.sizes);
    for (const auto& o : n.outputs) out.push_back(o.sizes);
    rec.shapes.push_back(std::move(in));
    rec.output_shapes.push_back(std::move(out));
  }
  trace_record(std::move(rec));
}

// Marks what the failed op and the ops after it in its region should have
// written (ops before it completed).
void poison(const std::vector<Node>& g, const Region& r, int from, const std::exception_ptr& err) {
  for (size_t p = static_cast<size_t>(std::max(from, 0)); p < r.nodes.size(); ++p) {
    for_each_written_storage(g[r.nodes[p]], [&](DeferredStorage* s) { s->set_error(err); });
  }
}

}  // namespace

std::exception_ptr run_graph(std::vector<Node>& g, Metrics& m) {
  const StorageSet observed = observed_after_flush(g);
  std::vector<char> live = live_nodes(g, observed);
  int64_t n_live = 0;
  for (char l : live) n_live += l;
  m.ops_eliminated += static_cast<int64_t>(g.size()) - n_live;

  std::vector<Region> regions = partition(g, live, observed);
  host::HostMemory mem;
  // Storages a live node of this flush creates and nothing observes after it
  // hold values only between its regions: flush-local memory, freed after the
  // last region that uses them (host_runtime.h, set_transient). A storage made
  // earlier keeps its device buffer: that holds its value.
  std::vector<std::vector<DeferredStorage*>> release_after(regions.size());
  {
    StorageSet made(g.size());
    for (size_t i = 0; i < g.size(); ++i)
      if (live[i])
        for (const auto& o : g[i].outputs)
          if (!observed.contains(o.storage.get())) made.insert(o.storage.get());
    StorageMap<size_t> last_region(made.size());
    for (size_t ri = 0; ri < regions.size(); ++ri) {
      for (int i : regions[ri].nodes) {
        for (const auto& in : g[i].inputs)
          if (made.contains(in.ref.storage.get())) last_region[in.ref.storage.get()] = ri;
        for (const auto& o : g[i].outputs)
          if (made.contains(o.storage.get())) last_region[o.storage.get()] = ri;
      }
    }
    last_region.for_each([&](const DeferredStorage* st, size_t ri) {
      release_after[ri].push_back(const_cast<DeferredStorage*>(st));
    });
    mem.set_transient(std::move(made));
  }
  Executor& ex = active_executor();
  // Every target starts a new flush, so inspection of "the last flush" of an
  // inactive target (e.g. Spyre's schedule after a TPU flush) is empty.
  tpu_executor().begin_flush();
  spyre_executor().begin_flush();
  std::exception_ptr first_error;
  for (const Region& r : regions) {
    uint64_t key = structural_key(g, r);
    std::shared_ptr<CompiledRegion> compiled;
    bool cache_hit = false;
    {
      std::lock_guard<std::mutex> lock(g_cache_mu);
      auto it = g_cache.find(key);
      if (it != g_cache.end()) {
        compiled = it->second;
        m.cache_hits++;
        cache_hit = true;
      }
    }
    if (!compiled) {
      // Not in memory: the on-disk cache (TORCH_TPU_CACHE_DIR), then compile.
      std::string disk_key;
      if (disk_cache::enabled()) {
        disk_key = region_disk_key(g, r, ex.target());
        compiled = load_region(disk_key, key, g, r);
        (compiled ? m.disk_cache_hits : m.disk_cache_misses)++;
      }
      if (!compiled) {
        auto t0 = std::chrono::steady_clock::now();
        compiled = compile(key, g, r);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        m.compile_time_s += seconds;
        if (debug::level() >= 1)
          std::fprintf(stderr, "[tpu debug] compile: region %s (%zu ops), %.3f ms\n", compiled->name.c_str(),
                       r.nodes.size(), seconds * 1e3);
        m.compiles++;
        if (!disk_key.empty() && store_region(disk_key, *compiled)) m.disk_cache_writes++;
      }
      std::lock_guard<std::mutex> lock(g_cache_mu);
      g_cache.emplace(key, compiled);
    }
    static const bool log_regions = env::get_bool("TORCH_TPU_LOG_REGIONS") || debug::level() >= 2;
    if (log_regions)
      std::fprintf(stderr, "[tpu] region %s (%zu ops, key %016llx, %s)\n", compiled->name.c_str(), r.nodes.size(),
                   static_cast<unsigned long long>(key), cache_hit ? "cache hit" : "compiled or loaded");
    RegionStats st;
    bool failed = false;
    try {
      ex.run_region(*compiled, r, g, mem, st);
    } catch (...) {
      std::exception_ptr err = std::current_exception();
      if (!st.errors_marked) poison(g, r, st.failed_at, err);
      if (!first_error) first_error = err;
      failed = true;
    }
    if (trace_active()) trace_region(*compiled, g, r, st, cache_hit, failed, ex.target());
    for (DeferredStorage* done : release_after[&r - regions.data()]) mem.release(done);
    m.regions_run++;
    m.ops_executed += static_cast<int64_t>(r.nodes.size());
    m.bytes_read += st.bytes_read;
    m.bytes_materialized += st.bytes_written;
    m.padding_bytes += st.padding_bytes;
    m.flops += st.flops;
    m.sim_time_s += st.sim_time_s;
    m.library_calls += st.library_calls;
  }
  return first_error;
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_cache.clear();
}

size_t cache_size() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_cache.size();
}

}  // namespace jit
}  // namespace tpu_eager
