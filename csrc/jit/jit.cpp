// JIT v1: dead-code elimination, partition into fused regions, structural
// cache, execution through the active executor.
#include "device/env.h"
#include "device/kineto_profiler.h"
#include "lazy/debug_report.h"
#include "jit/jit.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <c10/util/SmallVector.h>

#include "executors/executor.h"
#include "jit/disk_cache.h"
#include "jit/dynamic_shapes.h"
#include "jit/flush_cache.h"
#include "jit/foreach_expand.h"
#include "jit/kernel_trace.h"
#include "jit/partition.h"
#include "jit/region_disk_cache.h"
#include "jit/verify.h"
#include "ops/custom_ops.h"

namespace tpu_eager {

const char* prim_kind_name(PrimKind k) {
  switch (k) {
    case PrimKind::kLibrary:
      return "library";
    case PrimKind::kElementwise:
      return "elementwise";
    case PrimKind::kReduction:
      return "reduction";
    case PrimKind::kMatmul:
      return "matmul";
    case PrimKind::kData:
      return "data";
    case PrimKind::kRandom:
      return "random";
    case PrimKind::kView:
      return "view";
    case PrimKind::kSync:
      return "sync";
  }
  return "?";
}

namespace jit {
namespace {

// The kernel cache: kernels by structural key, least recently used first
// out once it holds `g_limit` kernels. A lookup compares the key's words
// (full equality), not only its hash.
struct CacheEntry {
  uint64_t hash = 0;
  std::vector<uint64_t> words;
  std::shared_ptr<Kernel> kernel;
};
std::mutex g_cache_mu;
// Never destroyed (leaked on the heap): a daemon thread's flush may still use it while
// the exiting thread runs the static destructors (a SIGSEGV at exit, docs/newcomer_review.md).
std::list<CacheEntry>& g_lru = *new std::list<CacheEntry>();  // most recently used first
auto& g_index = *new std::unordered_multimap<uint64_t, std::list<CacheEntry>::iterator>();
size_t g_limit = [] {
  const int64_t n = env::get_int("TORCH_TPU_KERNEL_CACHE_SIZE");
  TORCH_CHECK_VALUE(n >= 1, "environment variable TORCH_TPU_KERNEL_CACHE_SIZE=", n, ": expected at least 1");
  return static_cast<size_t>(n);
}();
int64_t g_evictions = 0;

// The cached kernel of a key (moved to the front), or null. Caller holds g_cache_mu.
std::shared_ptr<Kernel> cache_find(uint64_t hash, const std::vector<uint64_t>& words) {
  auto [lo, hi] = g_index.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second->words != words) continue;
    g_lru.splice(g_lru.begin(), g_lru, it->second);
    return it->second->kernel;
  }
  return nullptr;
}

// Drops least recently used kernels until at most `limit` remain; returns how many.
int64_t cache_trim(size_t limit) {
  int64_t dropped = 0;
  while (g_lru.size() > limit) {
    auto last = std::prev(g_lru.end());
    auto [lo, hi] = g_index.equal_range(last->hash);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == last) {
        g_index.erase(it);
        break;
      }
    }
    g_lru.pop_back();
    ++dropped;
  }
  g_evictions += dropped;
  return dropped;
}

// Adds a kernel (caller holds g_cache_mu); returns the evictions it caused.
int64_t cache_insert(uint64_t hash, std::vector<uint64_t> words, std::shared_ptr<Kernel> kernel) {
  g_lru.push_front(CacheEntry{hash, std::move(words), std::move(kernel)});
  g_index.emplace(hash, g_lru.begin());
  return cache_trim(g_limit);
}

// Marks live nodes: a node is live when it writes a storage whose value is
// observed later (by a live node, or after the flush: `observed`), or when its
// CPU kernel raises on the values it reads (Node::checks_values: an index out of
// range must raise whether or not the result is used, as on CPU and CUDA).
std::vector<char> live_nodes(const std::vector<Node>& g, const StorageSet& observed) {
  StorageSet needed(observed);
  std::vector<char> live(g.size(), 0);
  for (size_t i = g.size(); i-- > 0;) {
    const Node& n = g[i];
    bool l = false;
    for_each_written_storage(n, [&](const DeferredStorage* s) { l = l || needed.contains(s); });
    if (!l && !n.checks_values) continue;
    live[i] = 1;
    for (const auto& in : n.inputs) needed.insert(in.ref.storage.get());
  }
  return live;
}

std::string region_name(const CompiledRegion& c, const std::vector<Node>& g, const Region& r) {
  // A custom op alone is its author's kernel: named by its qualified name.
  if (r.nodes.size() == 1 && g[r.nodes[0]].op.schema().name().rfind("aten::", 0) != 0)
    return g[r.nodes[0]].op.schema().name();
  std::string name = r.nodes.size() > 1 ? "fused" : "kernel";
  for (size_t k = 0; k < r.nodes.size() && k < 6; ++k) {
    name += "_";
    name += op_short_name(g[r.nodes[k]].op.schema());  // "add" for aten::add
  }
  if (r.nodes.size() > 6) name += "_etc";
  return name;
}

std::shared_ptr<CompiledRegion> describe(uint64_t key, const std::vector<Node>& g, const Region& r) {
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
    rec.ops.push_back(op_short_name(schema) + (schema.overload_name().empty() ? "" : "." + schema.overload_name()));
    std::vector<std::vector<int64_t>> in, out;
    for (const auto& slot : n.inputs) in.push_back(slot.ref.sizes().vec());
    for (const auto& o : n.outputs) out.push_back(o.sizes().vec());
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

// Hashes of region `r` for recompile detection (debug::on_compile): its
// structure without sizes or argument values, the size buckets of its inputs
// from outside the region, and a hash of its int/float/bool/list argument values.
// Compile path only.
void note_compile(const std::vector<Node>& g, const Region& r, const std::string& name) {
  auto mix = [](uint64_t& h, uint64_t v) { h = (h ^ v) * 0x100000001B3ULL; };
  uint64_t structure = 0xCBF29CE484222325ULL, args = structure;
  std::vector<uint64_t> dims;
  std::unordered_map<const void*, int> made;  // storages created in the region
  SourceLocation where;
  const RegionMarks marks = region_marks(g, r.nodes);  // as region_key (partition.cpp)
  for (size_t p = 0; p < r.nodes.size(); ++p) {
    const Node& n = g[r.nodes[p]];
    if (where.empty()) where = n.where;
    mix(structure, reinterpret_cast<uintptr_t>(&n.op.schema()));
    for (const auto& in : n.inputs) {
      const bool local = made.count(in.ref.storage.get()) != 0;
      mix(structure, static_cast<uint64_t>(in.arg) * 131 + static_cast<uint64_t>(in.elem + 1));
      mix(structure, local);
      mix(structure, static_cast<uint64_t>(in.ref.dtype));
      mix(structure, in.ref.dim());
      for (auto st : in.ref.strides()) mix(structure, st == 0 ? 0 : st == 1 ? 1 : 2);
      mix(structure, in.written);
      if (!local)
        for (auto b : size_buckets(in.ref, marks)) dims.push_back(b);
    }
    for (size_t i = 0; i < n.args.size(); ++i) {
      const c10::IValue& a = n.args[i];
      if (is_wrapped_arg(n, i)) {
        mix(structure, 6);  // a wrapped number: a runtime value, as its tensor was
      } else if (a.isInt()) {
        mix(structure, 1);
        mix(args, static_cast<uint64_t>(a.toInt()));
      } else if (a.isDouble()) {
        mix(structure, 2);
        const double d = a.toDouble();
        uint64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        mix(args, bits);
      } else if (a.isBool()) {
        mix(structure, 3);
        mix(args, a.toBool());
      } else if (a.isIntList()) {
        mix(structure, 4);
        mix(structure, a.toIntList().size());  // the list's length is the rank: structural
        for (auto x : a.toIntList()) mix(args, static_cast<uint64_t>(x));
      } else {
        mix(structure, a.isNone() ? 5 : 6);
      }
    }
    for (const auto& o : n.outputs) {
      made.emplace(o.storage.get(), 0);
      mix(structure, static_cast<uint64_t>(o.dtype));
    }
  }
  debug::on_compile(structure, dims, args, where, name);
}

}  // namespace

namespace {

// Index into fs.numbers of each node's first reference (and one past the last node's last).
std::vector<size_t> first_refs(const std::vector<Node>& g) {
  std::vector<size_t> first_ref(g.size() + 1, 0);
  for (size_t i = 0; i < g.size(); ++i) first_ref[i + 1] = first_ref[i] + g[i].inputs.size() + g[i].outputs.size();
  return first_ref;
}

// Each region's Region::storage_numbers, from the flush's numbering.
void number_regions(const std::vector<Node>& g, const FlushStorages& fs, std::vector<Region>& regions) {
  const std::vector<size_t> first_ref = first_refs(g);
  for (Region& r : regions) {
    r.storage_numbers.clear();
    for (int i : r.nodes)
      r.storage_numbers.insert(r.storage_numbers.end(), fs.numbers.begin() + static_cast<std::ptrdiff_t>(first_ref[i]),
                               fs.numbers.begin() + static_cast<std::ptrdiff_t>(first_ref[i + 1]));
  }
}

// The flush-local memory schedule of `plan` (regions, live set): storages a
// live node of this flush creates and nothing observes after it hold values
// only between its regions: flush-local memory, freed after the last region
// that uses them (host_runtime.h, HostMemory::set_transient). A storage made earlier
// keeps its device buffer: that holds its value. Storages by number.
void plan_transients(const std::vector<Node>& g, const FlushStorages& fs, FlushPlan& plan) {
  const std::vector<size_t> first_ref = first_refs(g);  // index into fs.numbers of each node's first reference
  std::vector<char> made(fs.storages.size(), 0);
  for (size_t i = 0; i < g.size(); ++i) {
    if (!plan.live[i]) continue;
    for (size_t j = 0; j < g[i].outputs.size(); ++j) {
      const int32_t k = fs.numbers[first_ref[i] + g[i].inputs.size() + j];
      if (!fs.observed[k]) made[k] = 1;
    }
  }
  std::vector<int32_t> last_region(fs.storages.size(), -1);
  for (size_t ri = 0; ri < plan.regions.size(); ++ri)
    for (int i : plan.regions[ri].nodes)
      for (size_t r = first_ref[i]; r < first_ref[i + 1]; ++r)
        if (made[fs.numbers[r]]) last_region[fs.numbers[r]] = static_cast<int32_t>(ri);
  plan.release_after.assign(plan.regions.size(), {});
  for (size_t k = 0; k < made.size(); ++k)
    if (made[k] && last_region[k] >= 0) plan.release_after[last_region[k]].push_back(static_cast<int32_t>(k));
  plan.transient = std::move(made);
}

// Whether the inputs of a flush's next region may hold an earlier failure
// (HostMemory::inputs_may_hold_errors): not when none of the flush's storages
// held one at its start and no error was set on any storage since (a failed
// region of this flush, a flush nested in its run). One pass over the
// flush's storages, which its numbering has just read, instead of every
// input's storage read again as each region starts. Sets it back to true at
// the end of the flush.
class FailedInputs {
 public:
  FailedInputs(const FlushStorages& fs, host::HostMemory& mem)
      : mem_(mem), errors_set_(g_storage_errors_set.load(std::memory_order_relaxed)) {
    for (const DeferredStorage* s : fs.storages)
      if (s->error) {
        clean_ = false;
        break;
      }
  }
  ~FailedInputs() { mem_.set_inputs_may_hold_errors(true); }
  FailedInputs(const FailedInputs&) = delete;
  FailedInputs& operator=(const FailedInputs&) = delete;
  void before_region() {
    clean_ = clean_ && g_storage_errors_set.load(std::memory_order_relaxed) == errors_set_;
    mem_.set_inputs_may_hold_errors(!clean_);
  }

 private:
  host::HostMemory& mem_;
  const uint64_t errors_set_;
  bool clean_ = true;
};

// The layout object of a region of `plan` that `kernel` runs with layout `sig`: an
// earlier region's when the same kernel runs it with an equal layout (a step's flush runs
// one kernel in many regions: a bias gradient's sum per layer, ten steps' forwards), so
// the kernel, which keeps the object of its last run, finds its plan by the pointer
// instead of comparing the words (TpuKernel::same_layout). Plan-building path only.
std::shared_ptr<const std::vector<int64_t>> shared_layout(const FlushPlan& plan, const Kernel* kernel,
                                                          std::vector<int64_t> sig) {
  for (size_t j = 0; kernel != nullptr && j < plan.layouts.size(); ++j)
    if (plan.kernels[j].get() == kernel && *plan.layouts[j] == sig) return plan.layouts[j];
  return std::make_shared<const std::vector<int64_t>>(std::move(sig));
}

// Storages' `error` fields read by the regions' runs since the process started (flush_work_counts).
std::atomic<int64_t> g_error_reads{0};

// Runs the regions of `plan` on this flush's graph. `building` (the plan
// itself, on a flush-cache miss) gets each region's key, kernel and layout as
// it is looked up or compiled; false in `*complete` when some region has no
// kernel (its compile failed: the plan is not kept).
std::exception_ptr run_regions(std::vector<Node>& g, const FlushStorages& fs, const FlushPlan& plan,
                               FlushPlan* building, bool* complete, host::HostMemory& mem, Metrics& m) {
  Executor& ex = active_executor();
  // Flush-local storages by number: no set of them to fill and empty each flush.
  mem.set_transient(fs.stamp, plan.transient.data(), plan.transient.size());
  mem.set_numbered(fs.storages.data(), fs.storages.size());
  // Every target starts a new flush, so inspection of "the last flush" of an
  // inactive target (e.g. Spyre's schedule after a TPU flush) is empty. An
  // executor's last-flush state is written only by the flushes it runs (its
  // compile and run are called from here alone, and a target switch clears
  // the caches that hold its kernels), so the inactive one is emptied at the
  // first flush after a switch only: Spyre's three locks were ~0.4 K
  // instructions of every TPU flush. Under the flush lock (lazy/queue.cpp).
  static Executor* last_active = nullptr;
  ex.begin_flush();
  if (last_active != &ex) (&ex == &tpu_executor() ? spyre_executor() : tpu_executor()).begin_flush();
  last_active = &ex;
  std::exception_ptr first_error;
  std::vector<uint64_t> words;
  FailedInputs failed_inputs(fs, mem);
  // The regions' run times, given to the "region_run" timer at the end: its
  // lock once per flush, not once per region.
  c10::SmallVector<double, 64> run_seconds;
  const int64_t error_reads_before = mem.error_reads();
  for (size_t ri = 0; ri < plan.regions.size(); ++ri) {
    const Region& r = plan.regions[ri];
    uint64_t key;
    // The plan's kernel (the plan holds it: no reference count taken per
    // region), or the one found or compiled here while building.
    Kernel* kernel = nullptr;
    std::shared_ptr<Kernel> found;
    bool cache_hit = false;
    if (!building) {
      key = plan.keys[ri];
      kernel = plan.kernels[ri].get();
      cache_hit = true;
      m.cache_hits++;
    } else {
      key = structural_key(g, r, &words);
      std::lock_guard<std::mutex> lock(g_cache_mu);
      found = cache_find(key, words);
      kernel = found.get();
      if (kernel) {
        m.cache_hits++;
        cache_hit = true;
      }
    }
    RegionStats st;
    bool failed = false;
    std::shared_ptr<CompiledRegion> info;
    try {
      if (!kernel) {
        // Not in memory: the on-disk cache (TORCH_TPU_CACHE_DIR) for its
        // description, then compile: the executor plans the region.
        std::string disk_key;
        if (disk_cache::enabled()) {
          disk_key = region_disk_key(g, r, ex.target());
          info = load_region(disk_key, key, g, r);
          (info ? m.disk_cache_hits : m.disk_cache_misses)++;
        }
        auto t0 = std::chrono::steady_clock::now();
        const bool from_disk = info != nullptr;
        if (!info) info = describe(key, g, r);
        found = ex.compile(*info, r, g);
        kernel = found.get();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        m.compile_time_s += seconds;
        if (debug::level() >= 1)
          std::fprintf(stderr, "[tpu debug] compile: region %s (%zu ops), %.3f ms\n", kernel->info().name.c_str(),
                       r.nodes.size(), seconds * 1e3);
        if (!from_disk) {
          m.compiles++;  // (a disk hit still plans: plans_built)
          note_compile(g, r, kernel->info().name);
        }
        m.plans_built++;
        if (!from_disk && !disk_key.empty() && store_region(disk_key, *info)) m.disk_cache_writes++;
        std::lock_guard<std::mutex> lock(g_cache_mu);
        m.kernel_cache_evictions += cache_insert(key, words, found);
      }
    } catch (...) {
      std::exception_ptr err = std::current_exception();
      poison(g, r, 0, err);
      if (!first_error) first_error = err;
      failed = true;
    }
    if (building) {
      building->keys.push_back(key);
      building->kernels.push_back(found);
      building->layouts.push_back(shared_layout(*building, found.get(), layout_signature(r, g)));
      *complete = *complete && kernel != nullptr;
    }
    if (!kernel && !info) info = describe(key, g, r);
    const CompiledRegion& compiled = kernel ? kernel->info() : *info;
    static const bool log_regions = env::get_bool("TORCH_TPU_LOG_REGIONS") || debug::level() >= 2;
    if (log_regions)
      std::fprintf(stderr, "[tpu] region %s (%zu ops, key %016llx, %s)\n", compiled.name.c_str(), r.nodes.size(),
                   static_cast<unsigned long long>(key), cache_hit ? "cache hit" : "compiled or loaded");
    if (!failed) {
      try {
        // Timed for metrics_report() ("region_run": two clock reads a region).
        failed_inputs.before_region();
        const auto run_start = std::chrono::steady_clock::now();
        kernel->run_with_layout(r, g, mem, st, plan.layouts[ri]);
        run_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count());
      } catch (...) {
        std::exception_ptr err = std::current_exception();
        if (!st.errors_marked) poison(g, r, st.failed_at, err);
        if (!first_error) first_error = err;
        failed = true;
      }
    }
    if (trace_active()) trace_region(compiled, g, r, st, cache_hit, failed, ex.target());
    if (kineto::recording()) {  // on the simulated clock, after the flush's previous kernels (FlushLane)
      std::string ops;
      std::vector<uint64_t> seqs;  // the kernel links to the op that recorded the first of them
      for (int i : r.nodes) {
        ops += (ops.empty() ? "" : ",") + g[i].op.schema().name().substr(6);
        seqs.push_back(g[i].seq);
      }
      kineto::record_kernel(compiled.name, ops, st.sim_time_s, static_cast<double>(st.flops),
                            static_cast<double>(st.bytes_read + st.bytes_written), seqs);
    }
    // The buffers it made carry the marks of the sizes they follow, so the
    // regions after it (this flush's keys are made in order) key them by range.
    if (any_dynamic_marks()) carry_marks(g, r.nodes);
    for (int32_t k : plan.release_after[ri]) mem.release(fs.storages[k]);
    m.regions_run++;
    m.ops_executed += static_cast<int64_t>(r.nodes.size());
    m.bytes_read += st.bytes_read;
    m.bytes_materialized += st.bytes_written;
    m.padding_bytes += st.padding_bytes;
    m.flops += st.flops;
    m.sim_time_s += st.sim_time_s;
    m.schedule_time_s += st.schedule_time_s;
    m.library_calls += st.library_calls;
    m.output_copies += st.output_copies;
    m.plans_built += st.plans_built;
  }
  debug::time_all("region_run", run_seconds.data(), run_seconds.size());
  g_error_reads.fetch_add(mem.error_reads() - error_reads_before, std::memory_order_relaxed);
  return first_error;
}

// A partition bug found by the verifier: nothing of the flush runs; what its
// live nodes write holds the error.
std::exception_ptr verifier_error(std::vector<Node>& g, const std::vector<char>& live, const std::string& bad) {
  std::exception_ptr err;
  try {
    TORCH_CHECK(false, "region verifier: ", bad, " (a partition bug; please report it)");
  } catch (...) {
    err = std::current_exception();
  }
  for (size_t i = 0; i < g.size(); ++i)
    if (live[i]) for_each_written_storage(g[i], [&](DeferredStorage* s) { s->set_error(err); });
  return err;
}

// The words of the last cacheable flush's structure (flush_work_counts).
std::atomic<int64_t> g_structure_words{0};

// What a flush fills and drops every time: the storage numbering and the
// HostMemory of its regions. One per thread, reused (their vectors and maps
// keep their room: allocating, growing and freeing them was ~1.5 K
// instructions of a cache-hit flush); a flush nested in another on the same
// thread gets its own.
struct FlushScratch {
  FlushStorages fs;
  host::HostMemory mem;
  bool busy = false;
};

// The storage number of each reference of `g`, a flush's graph with its foreach nodes
// expanded, into fs.numbers (what planning reads), in the numbering the recorded graph's
// pass (flush_structure) gave: every storage of a per-tensor node is one of its foreach
// node's. The plan names storages by those numbers, so a flush that finds its plan
// numbers nothing again; the observed bits are that pass's, which counted uses as the
// queue counts them (a tensor a foreach node reads at every index, `_foreach_mul_(ts, t)`,
// is one pending use, not one per index).
void number_expanded(const std::vector<Node>& g, FlushStorages& fs) {
  size_t nrefs = 0;
  for (const Node& n : g) nrefs += n.inputs.size() + n.outputs.size();
  fs.numbers.resize(nrefs);
  int32_t* number = fs.numbers.data();
  auto put = [&](const DeferredStorage* s) {
    TORCH_INTERNAL_ASSERT(s->index_stamp == fs.stamp, "foreach expansion: a storage its foreach node does not hold");
    *number++ = s->index_number;
  };
  for (const Node& n : g) {
    for (const auto& in : n.inputs) put(in.ref.storage.get());
    for (const auto& out : n.outputs) put(out.storage.get());
  }
}

// This thread's FlushScratch for one flush, or a fresh one when it is in use.
// Its HostMemory is emptied at the end (what held the values is freed then,
// as the HostMemory's destruction freed it).
class ScratchLease {
 public:
  ScratchLease() {
    thread_local FlushScratch t_scratch;
    if (!t_scratch.busy) {
      s_ = &t_scratch;
    } else {
      own_ = std::make_unique<FlushScratch>();
      s_ = own_.get();
    }
    s_->busy = true;
  }
  ~ScratchLease() {
    s_->mem.clear(s_->fs.storages.size());
    s_->busy = false;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  FlushScratch* operator->() const { return s_; }

 private:
  FlushScratch* s_ = nullptr;
  std::unique_ptr<FlushScratch> own_;
};

}  // namespace

std::exception_ptr run_graph(std::vector<Node>& recorded, Metrics& m) {
  ScratchLease scratch;
  const FlushStorages& fs = scratch->fs;
  // The flush's structure, looked up in the flush cache (flush_cache.h); the
  // pass numbers the flush's storages too. A pending test break of the
  // partition bypasses it (the flush must partition). The structure is the
  // recorded graph's: a foreach node's per-tensor nodes follow from its words
  // (expand_node reads nothing else), so they need not be written and compared.
  thread_local FlushKey key;
  bool cacheable = !test_break_pending();
  if (cacheable) {
    flush_structure(recorded, scratch->fs, &key);
    cacheable = key.cacheable;
    g_structure_words.store(static_cast<int64_t>(key.n), std::memory_order_relaxed);
  }
  std::shared_ptr<const FlushPlan> plan = cacheable ? flush_cache_find(&key) : nullptr;
  // Foreach nodes become their per-tensor nodes: everything below sees those,
  // their storages numbered as the recorded graph's pass numbered them.
  std::optional<ExpandedGraph> expanded;
  if (has_foreach_nodes(recorded)) expanded.emplace(recorded, plan);
  if (!cacheable) index_flush_storages(expanded ? expanded->nodes : recorded, scratch->fs);
  std::vector<Node>& g = expanded ? expanded->nodes : recorded;
  if (plan) {
    m.flush_cache_hits++;
    m.ops_eliminated += static_cast<int64_t>(g.size()) - plan->n_live;
    if (verify_enabled()) {
      const std::string bad = verify_regions(g, plan->live, fs.observed_set(), plan->regions);
      if (!bad.empty()) return verifier_error(g, plan->live, bad);
    }
    return run_regions(g, fs, *plan, nullptr, nullptr, scratch->mem, m);
  }

  if (expanded && cacheable) number_expanded(g, scratch->fs);
  auto built = std::make_shared<FlushPlan>();
  if (cacheable) {  // copied now: a flush nested in this one's run reuses the thread's key
    built->hash = flush_key_hash(&key);
    built->words.assign(key.buf.begin(), key.buf.begin() + static_cast<std::ptrdiff_t>(key.n));
  }
  const StorageSet observed = fs.observed_set();
  built->live = live_nodes(g, observed);
  for (char l : built->live) built->n_live += l;
  m.ops_eliminated += static_cast<int64_t>(g.size()) - built->n_live;
  built->regions = partition(g, built->live, observed, &active_executor());
  apply_test_break(built->regions);
  if (verify_enabled()) {
    const std::string bad = verify_regions(g, built->live, observed, built->regions);
    if (!bad.empty()) return verifier_error(g, built->live, bad);
  }
  plan_transients(g, fs, *built);
  number_regions(g, fs, built->regions);
  bool complete = true;
  std::exception_ptr err = run_regions(g, fs, *built, built.get(), &complete, scratch->mem, m);
  if (cacheable && complete) {
    if (expanded) expanded->set_plan(built);
    flush_cache_insert(std::move(built));
  }
  return err;
}

FlushWorkCounts flush_work_counts() {
  FlushWorkCounts c;
  c.structure_words = g_structure_words.load(std::memory_order_relaxed);
  c.per_tensor_nodes_written = per_tensor_nodes_written();
  c.per_tensor_nodes_refreshed = per_tensor_nodes_refreshed();
  c.storage_error_reads = g_error_reads.load(std::memory_order_relaxed);
  return c;
}

void clear_cache() {
  flush_cache_clear();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_lru.clear();
  g_index.clear();
}

size_t cache_size() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_lru.size();
}

size_t cache_limit() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_limit;
}

void set_cache_limit(size_t limit) {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_limit = std::max<size_t>(1, limit);
  cache_trim(g_limit);
}

int64_t cache_evictions() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_evictions;
}

}  // namespace jit
}  // namespace tpu_eager
