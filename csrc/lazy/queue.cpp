// The per-device DeferAndFuse queue and its flush.
#include "lazy/queue.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include <cstdlib>
#include <unordered_map>
#include <exception>

#include "device/block_cache.h"
#include "device/device.h"
#include "device/env.h"
#include "device/kineto_profiler.h"
#include "lazy/async_errors.h"
#include "lazy/debug_report.h"
#include "lazy/dense_order.h"
#include "device/fork.h"
#include "device/host_share.h"
#include "device/spin_lock.h"
#include "jit/jit.h"

namespace tpu_eager {
namespace {

// Defaults (device/env.cpp): 4096 pending ops bounds record-to-flush latency
// and the graph the JIT analyses; 1 GiB of pending fresh outputs bounds host
// memory held by values nobody has read yet (DESIGN §4). Both can be changed at
// run time.

// State shared by every chip: counters, mode, limits, and the run lock.
struct DeviceQueue {
  SpinLock mu;  // guards `metrics` (a few adds a flush: no std::mutex's two libc calls)
  // One graph runs in the JIT and the executors at a time, whatever its chip
  // (their caches and per-flush state are shared): ExecLock. Never waited for
  // while holding it: a thread that must wait for a chip's flush lock, or runs
  // host code inside a flush, lets go of it first (ExecRelease).
  std::mutex exec_mu;
  std::atomic<uint64_t> next_seq{0};
  Metrics metrics;
  // Read by every enqueue: atomics, not under `mu` (two mutexes per recorded
  // op were ~200 instructions of the record path). Metrics::ops_recorded is
  // the chips' ChipQueue::ops_recorded plus metrics.ops_recorded (always 0).
  std::atomic<int64_t> max_ops{env::get_int("TORCH_TPU_MAX_PENDING_OPS")};
  std::atomic<int64_t> max_bytes{env::get_int("TORCH_TPU_MAX_PENDING_BYTES")};
  std::atomic<EagerMode> mode{env::get_bool("TORCH_TPU_DEFER_AND_FUSE") ? EagerMode::kDeferAndFuse
                                                                        : EagerMode::kDeferNever};
  std::atomic<LocationHook> location{nullptr};
  std::atomic<LocationFormatter> formatter{nullptr};
};

DeviceQueue& Q() {
  // In a forked child the parent's other threads may have held these locks: raise instead (device/fork.h).
  check_not_in_bad_fork();
  static DeviceQueue* q = new DeviceQueue();  // never destroyed: storages may die after static destructors
  return *q;
}

// The most nodes whose room a chip keeps for its next queue after a flush:
// TORCH_TPU_MAX_PENDING_OPS's default (a Node is ~0.5 KB: ~2 MB a chip).
// Room for more nodes than this is freed at each flush; with 1,024 here, a
// flush of 2,000 nodes made glibc map fresh pages for the next queue (~240
// page faults a flush, ~0.13 us an op, until glibc's thresholds adapted).
constexpr size_t kKeptNodes = 4096;

// One queue per simulated chip: its pending nodes (every storage a node uses
// lives on that chip; ops mixing chips raise at record time and chip-to-chip
// copies go through the host) and its simulated clock.
struct ChipQueue {
  // One flush of the chip at a time, and a read of the chip waits for its
  // running flush (its nodes have left `nodes`, their values are not written
  // yet). Per chip: a thread reading or synchronizing another chip does not
  // wait for this one's flush (CUDA: devices are independent). Recursive: a
  // flush may flush its own chip again (a nested flush). Taken before exec_mu.
  std::recursive_mutex flush_mu;
  // Guards nodes, pending_bytes and pending_uses of the chip's storages. A
  // spin lock (device/spin_lock.h): taken by every recorded op and three
  // times a flush for a few loads and stores; a std::mutex's lock / unlock
  // pair was ~55 instructions of each.
  SpinLock mu;
  std::vector<Node> nodes;
  // An empty vector with room for the last flush's nodes: the next flush's
  // queue (allocating and freeing that room at every flush cost a small
  // flush ~7 K instructions in malloc). Only flush_device uses it, under the
  // flush lock (and `mu` where it swaps it with `nodes`).
  std::vector<Node> spare;
  int64_t pending_bytes = 0;
  // Ops recorded on the chip (Metrics::ops_recorded). Written under `mu` by a
  // load and a store: a locked add right after the node's move waited for
  // that move's stores to miss (docs/performance.md, sections llama21, llama23).
  // Atomic for the metrics' reads without `mu`.
  std::atomic<int64_t> ops_recorded{0};
  double sim_time_s = 0;  // simulated device time of every kernel run on the chip
  int64_t stream = 0;     // the stream of the pending nodes
  // The float32 matmul precision the pending nodes were recorded at (all the
  // same: an op recorded at another one flushes them first); their flush runs at it.
  int precision = 0;                                 // at::Float32MatmulPrecision as int (device.h)
  std::unordered_map<int64_t, double> stream_clock;  // stream id -> simulated end of its last kernel, s
  // The latest simulated time the host waited for (lazy/queue.h host_waited), s: no stream's
  // later work starts before it.
  double host_seen_s = 0;
};

ChipQueue& C(int device) {
  static ChipQueue* chips = new ChipQueue[kMaxDevices];  // never destroyed, as Q()
  return chips[device >= 0 && device < kMaxDevices ? device : 0];
}

int node_device(const Node& n) {
  if (!n.outputs.empty()) return n.outputs[0].storage->device;
  if (!n.inputs.empty()) return n.inputs[0].ref.storage->device;
  return 0;
}

// Inline: the flush calls it for every node (a call was ~8 of its ~30 instructions a node).
C10_ALWAYS_INLINE void touch(Node& n, int delta) {
  for (auto& in : n.inputs) in.ref.storage->pending_uses += delta;
  for (auto& out : n.outputs) out.storage->pending_uses += delta;
}

// Flushes whose caller waits for the results on the host (the others only launch work).
bool host_waits(FlushReason r) {
  return r == FlushReason::kHostRead || r == FlushReason::kItem || r == FlushReason::kSynchronize ||
         r == FlushReason::kDataDependent || r == FlushReason::kCpuFallback || r == FlushReason::kStorageResize;
}

}  // namespace

const char* flush_reason_name(FlushReason r) {
  switch (r) {
    case FlushReason::kHostRead:
      return "host_read";
    case FlushReason::kItem:
      return "item";
    case FlushReason::kSynchronize:
      return "synchronize";
    case FlushReason::kDataDependent:
      return "data_dependent_shape";
    case FlushReason::kCpuFallback:
      return "cpu_fallback";
    case FlushReason::kQueueLength:
      return "queue_length_limit";
    case FlushReason::kPendingBytes:
      return "pending_bytes_limit";
    case FlushReason::kStorageResize:
      return "storage_resize";
    case FlushReason::kDeferNever:
      return "defer_never";
    case FlushReason::kTargetSwitch:
      return "target_switch";
    case FlushReason::kStreamSwitch:
      return "stream_switch";
    case FlushReason::kEvent:
      return "event";
    case FlushReason::kCollective:
      return "collective";
    case FlushReason::kPrecisionSwitch:
      return "precision_switch";
    default:
      return "unknown";
  }
}

void Metrics::add(const Metrics& d) {
  ops_recorded += d.ops_recorded;
  ops_executed += d.ops_executed;
  ops_eliminated += d.ops_eliminated;
  eager_ops += d.eager_ops;
  fallback_ops += d.fallback_ops;
  flushes += d.flushes;
  for (int r = 0; r < static_cast<int>(FlushReason::kCount); ++r) flush_reasons[r] += d.flush_reasons[r];
  regions_run += d.regions_run;
  library_calls += d.library_calls;
  output_copies += d.output_copies;
  cache_hits += d.cache_hits;
  flush_cache_hits += d.flush_cache_hits;
  compiles += d.compiles;
  plans_built += d.plans_built;
  kernel_cache_evictions += d.kernel_cache_evictions;
  bytes_materialized += d.bytes_materialized;
  bytes_read += d.bytes_read;
  padding_bytes += d.padding_bytes;
  flops += d.flops;
  sim_time_s += d.sim_time_s;
  schedule_time_s += d.schedule_time_s;
  collectives += d.collectives;
  collective_time_s += d.collective_time_s;
  compile_time_s += d.compile_time_s;
  disk_cache_hits += d.disk_cache_hits;
  disk_cache_misses += d.disk_cache_misses;
  disk_cache_writes += d.disk_cache_writes;
}

TensorRef::TensorRef(const TensorRef& o)
    : storage(o.storage), offset(o.offset), dtype(o.dtype), conj(o.conj), neg(o.neg) {
  set_dims(o.sizes(), o.strides());
}

TensorRef& TensorRef::operator=(const TensorRef& o) {
  if (this != &o) {
    storage = o.storage;
    offset = o.offset;
    set_dims(o.sizes(), o.strides());
    dtype = o.dtype;
    conj = o.conj;
    neg = o.neg;
  }
  return *this;
}

TensorRef& TensorRef::operator=(TensorRef&& o) noexcept {
  if (this != &o) {
    release();
    storage = std::move(o.storage);
    offset = o.offset;
    dims_ = o.dims_;
    rank_ = o.rank_;
    o.rank_ = 0;
    dtype = o.dtype;
    conj = o.conj;
    neg = o.neg;
  }
  return *this;
}

void TensorRef::set_rank(size_t n) {
  if (n == rank_) return;
  release();
  if (n > kInline) {
    auto* p = static_cast<int64_t*>(std::malloc(2 * n * sizeof(int64_t)));
    if (p == nullptr) {
      rank_ = 0;
      throw std::bad_alloc();
    }
    dims_.heap = p;
  }
  rank_ = static_cast<uint32_t>(n);
}

void TensorRef::set_dims(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  TORCH_INTERNAL_ASSERT(sizes.size() == strides.size(), "tpu: a tensor reference's sizes and strides differ in rank");
  set_rank(sizes.size());
  int64_t* sz = mutable_sizes();
  int64_t* st = mutable_strides();
  for (size_t i = 0; i < sizes.size(); ++i) {
    sz[i] = sizes[i];
    st[i] = strides[i];
  }
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (auto s : sizes()) n *= s;
  return n;
}
bool TensorRef::is_dense() const {
  const int64_t* sz = sizes().data();
  const int64_t* st = strides().data();
  int64_t expected = 1;
  for (size_t d = rank_; d-- > 0;) {
    if (sz[d] != 1 && st[d] != expected) return false;
    expected *= sz[d];
  }
  return true;
}

int64_t TensorRef::nbytes() const { return numel() * static_cast<int64_t>(c10::elementSize(dtype)); }

bool TensorRef::covers_storage() const {
  if (offset != 0 || static_cast<size_t>(nbytes()) != storage->nbytes) return false;
  return dense_in_some_order(sizes(), strides());
}

namespace {

// The storage offset, in elements of `t`, at which an alias storage (see
// device_bytes_of) starts in the storage whose bytes it shares.
int64_t alias_element_offset(const DeviceBytes& bytes, const at::Tensor& t) {
  const auto itemsize = static_cast<int64_t>(t.itemsize());
  TORCH_CHECK(bytes.byte_offset % itemsize == 0, "tpu: a ", t.scalar_type(), " tensor over a storage that starts ",
              bytes.byte_offset, " bytes into a device buffer, which is not a multiple of its element size (", itemsize,
              " bytes), is not supported");
  return bytes.byte_offset / itemsize;
}

}  // namespace

void make_ref(const at::Tensor& t, TensorRef& r) {
  const DeviceBytes bytes = device_bytes_of(t.storage());
  r.storage = StoragePtr::reclaim_copy(bytes.storage);
  r.dtype = t.scalar_type();
  r.set_dims(t.sizes(), t.strides());
  r.offset = t.storage_offset();
  if (C10_UNLIKELY(bytes.byte_offset != 0)) r.offset += alias_element_offset(bytes, t);
  r.conj = t.is_conj();
  r.neg = t.is_neg();
}

TensorRef make_ref(const at::Tensor& t) {
  TensorRef r;
  make_ref(t, r);
  return r;
}

namespace {
thread_local const char* t_host_code = nullptr;  // HostCodeScope: host code running in a flush
// HostCodeScopes alive on any thread: while there are none (nearly always),
// enqueue and flush skip the thread_local's lookup (__tls_get_addr, ~30
// instructions of each recorded op).
std::atomic<int> g_host_code_scopes{0};
std::atomic<LockWaitHook> g_lock_wait_hook{nullptr};

void check_not_in_host_code() {
  if (C10_LIKELY(g_host_code_scopes.load(std::memory_order_relaxed) == 0)) return;
  TORCH_CHECK(t_host_code == nullptr, "tpu: ", t_host_code,
              " runs while the queue is flushed, on host (CPU) tensors that hold the device buffers; it cannot "
              "use 'tpu' tensors (record or read them). Compute on the tensors it receives.");
}
}  // namespace

HostCodeScope::HostCodeScope(const char* what) : prev_(t_host_code) {
  t_host_code = what;
  g_host_code_scopes.fetch_add(1);  // after the store: this thread's checks see both
}
HostCodeScope::~HostCodeScope() {
  t_host_code = prev_;
  g_host_code_scopes.fetch_sub(1);
}

void set_lock_wait_hook(LockWaitHook hook) { g_lock_wait_hook.store(hook); }

namespace {
// How many ExecLocks this thread holds (exec_mu is held while > 0).
thread_local int t_exec_depth = 0;

// Locks `lock` (a unique_lock not holding its mutex): at once when free, else
// waiting without the GIL (set_lock_wait_hook).
template <typename Lock>
void lock_waiting(Lock& lock) {
  if (lock.try_lock()) return;
  LockWaitHook hook = g_lock_wait_hook.load();
  if (hook) {
    hook([&] { lock.lock(); });
  } else {
    lock.lock();
  }
}

// Takes exec_mu for this thread (lock_waiting), left held: ExecLock and ExecRelease count the levels.
void lock_exec_mu() {
  std::unique_lock<std::mutex> lock(Q().exec_mu, std::defer_lock);
  lock_waiting(lock);
  lock.release();
}
}  // namespace

ExecLock::ExecLock() {
  if (t_exec_depth == 0) lock_exec_mu();
  ++t_exec_depth;
}
ExecLock::~ExecLock() {
  if (--t_exec_depth == 0) Q().exec_mu.unlock();
}

ExecRelease::ExecRelease() : depth_(t_exec_depth) {
  if (depth_ == 0) return;
  t_exec_depth = 0;
  Q().exec_mu.unlock();
}
ExecRelease::~ExecRelease() {
  if (depth_ == 0) return;
  lock_exec_mu();
  t_exec_depth = depth_;
}

namespace {
// Locks chip `c`'s flush lock; a wait lets go of this thread's ExecLock
// meanwhile, since the flush it waits for may need it (lock order: a chip's
// flush lock, then exec_mu).
void lock_chip(std::unique_lock<std::recursive_mutex>& lock) {
  if (lock.try_lock()) return;
  ExecRelease release;
  lock_waiting(lock);
}
}  // namespace

void with_chip_flush_lock(int device, c10::function_ref<void()> fn) {
  std::unique_lock<std::recursive_mutex> chip_lock(C(device).flush_mu, std::defer_lock);
  lock_chip(chip_lock);
  fn();
}

void enqueue(Node&& node, int64_t fresh_bytes) { enqueue(std::move(node), fresh_bytes, recording_precision()); }

void enqueue(Node&& node, int64_t fresh_bytes, int precision) {
  check_not_in_host_code();
  auto& q = Q();
  const int device = node_device(node);
  auto& c = C(device);
  const int64_t stream = current_stream_id(device);
  FlushReason reason = FlushReason::kCount;
  for (;;) {
    std::unique_lock<SpinLock> lock(c.mu);
    // Pending ops of another stream or precision run first. Checked again after
    // each flush, under the lock the push takes: another thread may have queued
    // ops of its own stream or precision in between.
    const bool other_precision = precision != kAnyPrecision && c.precision != kAnyPrecision && c.precision != precision;
    if (!c.nodes.empty() && (c.stream != stream || other_precision)) {
      const FlushReason why = c.stream != stream ? FlushReason::kStreamSwitch : FlushReason::kPrecisionSwitch;
      lock.unlock();
      (void)flush_device(device, why);  // errors of this flush stay with their tensors
      continue;
    }
    if (c.nodes.empty()) {
      c.stream = stream;
      c.precision = precision;
    } else if (c.precision == kAnyPrecision) {
      c.precision = precision;  // the first pending node that reads it
    }
    // A storage read to the host without a copy gets its own buffer before
    // this op can write it (copy-on-write, device/host_share.h). Under the
    // queue lock, so a share is installed either before (and seen here) or
    // after this node is pending (and then not installed: share_if_idle).
    for (const auto& in : node.inputs)
      if (in.written) unshare_for_write(in.ref.storage.get());
    node.seq = q.next_seq++;
    if (kineto::recording()) kineto::note_op(node.seq);
    touch(node, +1);
    c.nodes.push_back(std::move(node));
    // The next op's node goes to the slot after this one: its memory is asked
    // for now. A flush ago's nodes are out of the data cache by the next op,
    // and the atomic update below waited for this move's stores to miss
    // (docs/performance.md, section llama21). Inline: GCC emitted no
    // prefetch for a helper function holding this loop.
    if (c.nodes.size() < c.nodes.capacity()) {
      const char* next = reinterpret_cast<const char*>(c.nodes.data() + c.nodes.size());
      for (size_t b = 0; b < sizeof(Node); b += 64) __builtin_prefetch(next + b, 1);
    }
    c.pending_bytes += fresh_bytes;
    add_locked(c.ops_recorded, 1);
    if (q.mode.load(std::memory_order_relaxed) != EagerMode::kDeferAndFuse) {
      reason = FlushReason::kDeferNever;
    } else if (static_cast<int64_t>(c.nodes.size()) >= q.max_ops.load(std::memory_order_relaxed)) {
      reason = FlushReason::kQueueLength;
    } else if (c.pending_bytes >= q.max_bytes.load(std::memory_order_relaxed)) {
      reason = FlushReason::kPendingBytes;
    }
    break;
  }
  if (reason == FlushReason::kCount) return;
  const bool blocking = eager_mode() == EagerMode::kDeferNeverAndLaunchBlocking;
  std::exception_ptr error = flush_device(device, reason, blocking);
  if (error && blocking) std::rethrow_exception(error);
}

std::exception_ptr flush_all(FlushReason reason, bool reported) {
  std::exception_ptr first;
  for (int d = 0; d < device_count(); ++d) {
    std::exception_ptr e = flush_device(d, reason, reported);
    if (e && !first) first = e;
  }
  return first;
}

std::exception_ptr flush_device(int device, FlushReason reason, bool reported) {
  auto& q = Q();
  auto& c = C(device);
  check_not_in_host_code();
  // The chip's flush lock only: a flush of another chip does not hold it.
  std::unique_lock<std::recursive_mutex> chip_lock(c.flush_mu, std::defer_lock);
  lock_chip(chip_lock);
  std::vector<Node> nodes;
  int64_t stream;
  int precision;
  double start_s;  // the stream's clock: where the flush's first kernel starts
  {
    std::lock_guard<SpinLock> lock(c.mu);
    if (c.nodes.empty()) return nullptr;
    stream = c.stream;
    precision = c.precision;
    double& clock = c.stream_clock[stream];
    clock = std::max(clock, c.host_seen_s);
    start_s = clock;
    nodes.swap(c.nodes);
    // Room for as many nodes as this flush had: growing the vector node by node moved every node ~once more.
    c.nodes.swap(c.spare);
    c.nodes.reserve(std::min(nodes.size(), static_cast<size_t>(std::max<int64_t>(queue_limits().first, 1))));
    c.pending_bytes = 0;
  }
  ExecLock exec;  // the JIT's and executors' shared state, to the end of the flush
  Metrics delta;
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error;
  {
    ChipGuard chip(device);                   // storages the executor allocates belong to this chip
    kineto::FlushLane lane(stream, start_s);  // torch.profiler: the stream's track, from its clock
    RunPrecision run_at(precision);           // the precision the nodes were recorded at
    error = jit::run_graph(nodes, delta);
  }
  debug::on_flush(reason, nodes.size(), delta,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), current_location());
  note_flush_errors(device, nodes, error, reported);  // reported at the chip's next synchronizing call
  if (error && reported) {
    for (const auto& n : nodes)
      for_each_written_storage(n, [&](DeferredStorage* s) {
        if (s->error == error) s->mark_error_seen();
      });
  }
  {
    std::lock_guard<SpinLock> lock(c.mu);
    for (auto& n : nodes) touch(n, -1);
    c.sim_time_s += delta.sim_time_s;
    const double end_s = c.stream_clock[stream] += delta.sim_time_s;
    if (host_waits(reason)) c.host_seen_s = std::max(c.host_seen_s, end_s);
  }
  {
    std::lock_guard<SpinLock> lock(q.mu);
    auto& m = q.metrics;
    m.flushes++;
    m.flush_reasons[static_cast<int>(reason)]++;
    m.add(delta);
  }
  {
    BlockFreeBatch batch;  // the dying intermediates' blocks go back to the cache under one lock
    nodes.clear();         // drop storage references outside the lock
  }
  // Keeps the room (nodes is empty), up to kKeptNodes nodes' worth. Under the
  // chip's flush lock alone: no other thread uses `spare` meanwhile (a lock and
  // unlock of `mu` less per flush).
  if (c.spare.capacity() < nodes.capacity() && nodes.capacity() <= kKeptNodes) c.spare.swap(nodes);
  return error;
}

uint64_t begin_flush_storages(const std::vector<Node>& g, FlushStorages& f) {
  // Each pass has its own stamp; a storage whose stamp is not this pass's is
  // not numbered yet. Passes run one at a time (under the run lock, from
  // run_graph); a nested flush's pass starts after the outer one ended.
  static uint64_t last_stamp = 0;
  size_t nrefs = 0;
  for (const auto& n : g) nrefs += n.inputs.size() + n.outputs.size();
  f.numbers.resize(nrefs);
  f.storages.clear();
  f.storages.reserve(nrefs);
  f.stamp = ++last_stamp;
  return f.stamp;
}

void end_flush_storages(const std::vector<Node>& g, FlushStorages& f) {
  f.observed.resize(f.storages.size());
  if (g.empty()) return;
  std::lock_guard<SpinLock> lock(C(node_device(g.front())).mu);
  // external_alive first: a tensor that dies after recording a use of its
  // storage did so after that node's enqueue, which pending_uses then shows.
  for (size_t k = 0; k < f.storages.size(); ++k) {
    const DeferredStorage* s = f.storages[k];
    f.observed[k] = s->external_alive.load(std::memory_order_acquire) || s->pending_uses > s->index_uses;
  }
}

void index_flush_storages(const std::vector<Node>& g, FlushStorages& f) {
  const uint64_t stamp = begin_flush_storages(g, f);
  int32_t* number = f.numbers.data();
  for (const auto& n : g) {
    for (const auto& in : n.inputs) (void)number_storage(f, in.ref.storage.get(), stamp, number++);
    for (const auto& out : n.outputs) (void)number_storage(f, out.storage.get(), stamp, number++);
  }
  end_flush_storages(g, f);
}

StorageSet FlushStorages::observed_set() const {
  StorageSet set(storages.size());
  for (size_t k = 0; k < storages.size(); ++k)
    if (observed[k]) set.insert(storages[k]);
  return set;
}

bool run_if_idle(const DeferredStorage* s, c10::function_ref<void()> fn) {
  std::lock_guard<SpinLock> lock(C(s->device).mu);
  if (s->pending_uses > 0) return false;
  fn();
  return true;
}

bool storage_has_pending(const DeferredStorage* s) {
  std::lock_guard<SpinLock> lock(C(s->device).mu);
  return s->pending_uses > 0;
}

namespace {
// The errors most recently seen by the user, newest last: a bounded window (a
// storage holds its error until it is overwritten, and the values computed
// from it fail in the next flushes, not much later).
struct SeenErrors {
  static constexpr size_t kKeep = 64;
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
};
SeenErrors& seen_errors() {
  static SeenErrors* s = new SeenErrors();
  return *s;
}
}  // namespace

bool error_was_seen(const std::exception_ptr& e) {
  if (!e) return false;
  auto& s = seen_errors();
  std::lock_guard<std::mutex> lock(s.mu);
  return std::find(s.errors.begin(), s.errors.end(), e) != s.errors.end();
}

void note_error_seen(const std::exception_ptr& e) {
  if (!e) return;
  auto& s = seen_errors();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (std::find(s.errors.begin(), s.errors.end(), e) == s.errors.end()) {
      if (s.errors.size() >= SeenErrors::kKeep) s.errors.erase(s.errors.begin());
      s.errors.push_back(e);
    }
  }
  forget_unreported_error(e);  // a read raised it: no synchronizing call reports it again
}

void check_storage_error(const DeferredStorage* s) {
  if (s->error) std::rethrow_exception(s->error);
}

void raise_storage_error(DeferredStorage* s) {
  if (!s->error) return;
  s->mark_error_seen();
  std::rethrow_exception(s->error);
}

Metrics metrics_snapshot() {
  std::lock_guard<SpinLock> lock(Q().mu);
  Metrics m = Q().metrics;
  for (int d = 0; d < kMaxDevices; ++d) m.ops_recorded += C(d).ops_recorded.load(std::memory_order_relaxed);
  return m;
}

void reset_metrics() {
  {
    std::lock_guard<SpinLock> lock(Q().mu);
    Q().metrics = Metrics();
  }
  for (int d = 0; d < kMaxDevices; ++d) {
    ChipQueue& c = C(d);
    std::lock_guard<SpinLock> chip_lock(c.mu);  // an enqueue's load and store do not undo the reset
    c.ops_recorded.store(0, std::memory_order_relaxed);
  }
}

void count_eager_op(bool fallback) {
  std::lock_guard<SpinLock> lock(Q().mu);
  if (fallback)
    Q().metrics.fallback_ops++;
  else
    Q().metrics.eager_ops++;
}

void count_disk_cache(int64_t hits, int64_t misses, int64_t writes) {
  std::lock_guard<SpinLock> lock(Q().mu);
  Q().metrics.disk_cache_hits += hits;
  Q().metrics.disk_cache_misses += misses;
  Q().metrics.disk_cache_writes += writes;
}

void set_eager_mode(EagerMode m) {
  if (m != EagerMode::kDeferAndFuse) (void)flush_all(FlushReason::kDeferNever);
  Q().mode.store(m);
}

EagerMode eager_mode() { return Q().mode.load(); }

size_t pending_ops() {
  size_t n = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    std::lock_guard<SpinLock> lock(C(d).mu);
    n += C(d).nodes.size();
  }
  return n;
}

size_t pending_ops(int device) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  return C(device).nodes.size();
}

bool stream_idle(int device, int64_t stream) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  return C(device).nodes.empty() || C(device).stream != stream;
}

double stream_clock(int device, int64_t stream) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  auto it = C(device).stream_clock.find(stream);
  return std::max(it == C(device).stream_clock.end() ? 0.0 : it->second, C(device).host_seen_s);
}

void host_waited(int device, double t) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  C(device).host_seen_s = std::max(C(device).host_seen_s, t);
}

void host_waited_for_chip(int device) {
  auto& c = C(device);
  std::lock_guard<SpinLock> lock(c.mu);
  for (const auto& [stream, clock] : c.stream_clock) c.host_seen_s = std::max(c.host_seen_s, clock);
}

void stream_wait_until(int device, int64_t stream, double t) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  double& clock = C(device).stream_clock[stream];
  clock = std::max(clock, t);
}

double charge_collective_time(int device, int64_t stream, double seconds) {
  TORCH_CHECK_VALUE(seconds >= 0, "a collective's simulated time must be >= 0 seconds, got ", seconds);
  double start;
  {
    std::lock_guard<SpinLock> lock(C(device).mu);
    double& clock = C(device).stream_clock[stream];
    start = std::max(clock, C(device).host_seen_s);
    clock = start + seconds;
    C(device).sim_time_s += seconds;
  }
  std::lock_guard<SpinLock> lock(Q().mu);
  Q().metrics.collectives++;
  Q().metrics.collective_time_s += seconds;
  Q().metrics.sim_time_s += seconds;
  return start;
}

double chip_sim_time(int device) {
  std::lock_guard<SpinLock> lock(C(device).mu);
  return C(device).sim_time_s;
}

void set_queue_limits(int64_t max_ops, int64_t max_bytes) {
  TORCH_CHECK_VALUE(max_ops >= 1 && max_bytes >= 1, "queue limits must be positive, got max_ops=", max_ops,
                    " max_bytes=", max_bytes);
  Q().max_ops.store(max_ops);
  Q().max_bytes.store(max_bytes);
}

std::pair<int64_t, int64_t> queue_limits() { return {Q().max_ops.load(), Q().max_bytes.load()}; }

void set_location_hooks(LocationHook hook, LocationFormatter formatter) {
  Q().formatter = formatter;
  Q().location = hook;
}

SourceLocation current_location() {
  SourceLocation loc;
  if (LocationHook hook = Q().location.load(std::memory_order_relaxed)) loc.id = hook();
  return loc;
}

std::string SourceLocation::str() const {
  LocationFormatter f = Q().formatter.load();
  return (id < 0 || !f) ? std::string() : f(id);
}

}  // namespace tpu_eager
