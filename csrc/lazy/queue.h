// The DeferAndFuse queue: recorded ATen ops (Nodes) over tensor snapshots
// (TensorRefs), flushed to the JIT on host reads and limits.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <new>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include "lazy/deferred_storage.h"
#include "lazy/storage_map.h"

namespace tpu_eager {

// Why a flush happened; reported by metrics().
enum class FlushReason : int {
  kHostRead = 0,     // .cpu(), .numpy(), repr, copy to host
  kItem,             // .item(), bool(), int(), float()
  kSynchronize,      // torch.tpu.synchronize()
  kDataDependent,    // an op whose output shape depends on data (nonzero, unique, ...)
  kCpuFallback,      // an op without a device kernel ran on the host
  kQueueLength,      // pending ops reached the length limit
  kPendingBytes,     // bytes of pending outputs reached the limit
  kStorageResize,    // a storage grew or shrank
  kDeferNever,       // eager mode DEFER_NEVER*: every op flushes
  kTargetSwitch,     // the active target changed
  kStreamSwitch,     // an op on another stream of the chip than the pending ones
  kEvent,            // an event was recorded (its simulated timestamp needs the work before it)
  kCollective,       // a collective was charged to the chip's clock (it follows the work before it)
  kPrecisionSwitch,  // an op recorded at another float32 matmul precision than the pending ones
  kCount
};
const char* flush_reason_name(FlushReason r);

// A small vector whose moves relocate inline elements in an inlined loop
// (and take a heap buffer whole): SmallVector's generic out-of-line move
// assignment cost ~570 instructions for the five lists of a recorded `a + b`
// moved into the queue. A moved-from one is empty.
template <typename T, unsigned N>
struct InlineVec : c10::SmallVector<T, N> {
  using Base = c10::SmallVector<T, N>;
  using Base::Base;
  InlineVec() = default;
  InlineVec(const InlineVec&) = default;
  InlineVec& operator=(const InlineVec&) = default;
  InlineVec(InlineVec&& o) noexcept { take(o); }
  InlineVec& operator=(InlineVec&& o) noexcept {
    if (this != &o) {
      this->clear();
      if (!this->isSmall()) {
        std::free(this->begin());
        this->resetToSmall();
        this->Capacity = N;
      }
      take(o);
    }
    return *this;
  }

 private:
  // Takes `o`'s elements (`this` is empty and inline); `o` is left empty.
  void take(InlineVec& o) {
    if (o.isSmall()) {
      const size_t n = o.size();
      T* d = this->data();
      T* from = o.data();
      for (size_t i = 0; i < n; ++i) {
        new (d + i) T(std::move(from[i]));
        from[i].~T();
      }
      this->set_size(n);
      o.set_size(0);
    } else {
      this->BeginX = o.BeginX;
      this->Size = o.Size;
      this->Capacity = o.Capacity;
      o.resetToSmall();
      o.Capacity = N;
    }
  }
};

// A list of dims (a loop's shape, a key's sizes, a plan's strides), held
// inline up to 4: the jit and executor stages build many of them per plan.
// Four, not more, and a 4-byte count in place of a small vector's pointer and
// capacity (40 bytes, not 48). More than 4 dims live on the heap (the union's
// pointer); the dims are inline exactly when size() <= kInline.
// Converts to std::vector and IntArrayRef, and from IntArrayRef (a
// TensorRef's sizes() and strides()), for the stages that keep them.
class Dims {
 public:
  static constexpr size_t kInline = 4;
  using value_type = int64_t;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using size_type = size_t;

  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { set(c10::IntArrayRef(v.begin(), v.size())); }
  template <typename It, typename = decltype(*std::declval<It>())>
  Dims(It first, It last) {
    resize_uninit(static_cast<size_t>(std::distance(first, last)));
    std::copy(first, last, data());
  }
  Dims(size_t n, int64_t v) { assign(n, v); }
  Dims(c10::IntArrayRef v) { set(v); }             // NOLINT: implicit (a TensorRef's sizes() and strides())
  Dims(const std::vector<int64_t>& v) { set(v); }  // NOLINT: implicit
  Dims(const Dims& o) { set(o); }
  // A move copies the inline words whole, or takes the heap buffer; `o` is left empty.
  Dims(Dims&& o) noexcept : u_(o.u_), size_(o.size_) { o.size_ = 0; }
  Dims& operator=(const Dims& o) {
    if (this != &o) set(o);
    return *this;
  }
  Dims& operator=(Dims&& o) noexcept {
    if (this != &o) {
      release();
      u_ = o.u_;
      size_ = o.size_;
      o.size_ = 0;
    }
    return *this;
  }
  ~Dims() { release(); }

  operator std::vector<int64_t>() const { return std::vector<int64_t>(begin(), end()); }  // NOLINT: implicit
  operator c10::IntArrayRef() const { return c10::IntArrayRef(data(), size()); }          // NOLINT: implicit

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return heap() ? u_.heap : u_.in; }
  const int64_t* data() const { return heap() ? u_.heap : u_.in; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& front() { return data()[0]; }
  int64_t front() const { return data()[0]; }
  int64_t& back() { return data()[size_ - 1]; }
  int64_t back() const { return data()[size_ - 1]; }

  // Replaces the dims by `v` (which may not alias them).
  void set(c10::IntArrayRef v) {
    resize_uninit(v.size());
    int64_t* d = data();
    for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
  }
  void assign(size_t n, int64_t v) {
    resize_uninit(n);
    std::fill(begin(), end(), v);
  }
  template <typename It, typename = decltype(*std::declval<It>())>
  void assign(It first, It last) {
    *this = Dims(first, last);
  }
  void assign(std::initializer_list<int64_t> v) { set(c10::IntArrayRef(v.begin(), v.size())); }
  void clear() { resize_uninit(0); }
  void reserve(size_t) {}  // room follows the size
  void resize(size_t n, int64_t v = 0) {
    const size_t old = size_;
    resize_uninit(n);
    if (n > old) std::fill(begin() + old, end(), v);
  }
  void push_back(int64_t v) {
    resize_uninit(size_ + 1);
    back() = v;
  }
  void emplace_back(int64_t v) { push_back(v); }
  void pop_back() { resize_uninit(size_ - 1); }
  int64_t* insert(const int64_t* pos, int64_t v) {
    const size_t i = static_cast<size_t>(pos - begin());
    resize_uninit(size_ + 1);
    int64_t* d = data();
    std::copy_backward(d + i, d + size_ - 1, d + size_);
    d[i] = v;
    return d + i;
  }
  int64_t* erase(const int64_t* pos) { return erase(pos, pos + 1); }
  int64_t* erase(const int64_t* first, const int64_t* last) {
    const size_t i = static_cast<size_t>(first - begin());
    const size_t n = static_cast<size_t>(last - first);
    int64_t* d = data();
    std::copy(d + i + n, d + size_, d + i);
    resize_uninit(size_ - n);
    return data() + i;
  }

  friend bool operator==(const Dims& a, const Dims& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }
  // Against a TensorRef's sizes() or strides(), without a copy into Dims.
  friend bool operator==(const Dims& a, c10::IntArrayRef b) { return c10::IntArrayRef(a).equals(b); }
  friend bool operator==(c10::IntArrayRef a, const Dims& b) { return a.equals(c10::IntArrayRef(b)); }
  friend bool operator!=(const Dims& a, c10::IntArrayRef b) { return !(a == b); }
  friend bool operator!=(c10::IntArrayRef a, const Dims& b) { return !(a == b); }
  friend bool operator<(const Dims& a, const Dims& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool heap() const { return size_ > kInline; }
  void release() {
    if (heap()) std::free(u_.heap);
  }
  // Makes the size `n`, keeping the first min(size, n) dims; new ones are unset.
  void resize_uninit(size_t n) {
    if (n <= kInline && !heap()) {
      size_ = static_cast<uint32_t>(n);
      return;
    }
    if (n > kInline) {
      auto* p = static_cast<int64_t*>(std::malloc(n * sizeof(int64_t)));
      if (p == nullptr) throw std::bad_alloc();
      std::copy(data(), data() + std::min<size_t>(size_, n), p);
      release();
      u_.heap = p;
    } else {  // heap -> inline
      int64_t* p = u_.heap;
      std::copy(p, p + n, u_.in);
      std::free(p);
    }
    size_ = static_cast<uint32_t>(n);
  }

  union U {
    int64_t in[kInline];
    int64_t* heap;
  } u_{};
  uint32_t size_ = 0;
};

// Snapshot of a tensor's view of a deferred storage at record time:
// (storage, dtype, sizes, strides, storage offset). Later metadata changes of
// the tensor (resize_, set_, t_) do not affect a recorded op.
// Sizes and strides share one array under one rank: up to 4 dims inline
// (sizes in the first four words, strides in the last four), more on the heap
// (sizes then strides). Every recorded op writes its Node into memory the
// queue has not touched recently, so its bytes are the record path's cache
// misses: one array is 88 bytes a reference, two `Dims` were 104.
// The 4-byte rank and the one-byte fields last: no padding between them.
struct TensorRef {
  static constexpr size_t kInline = 4;

  TensorRef() = default;
  TensorRef(const TensorRef& o);
  // A move copies the inline words whole, or takes the heap array; `o` is left rank 0.
  TensorRef(TensorRef&& o) noexcept
      : storage(std::move(o.storage)),
        offset(o.offset),
        dims_(o.dims_),
        rank_(o.rank_),
        dtype(o.dtype),
        conj(o.conj),
        neg(o.neg) {
    o.rank_ = 0;
  }
  TensorRef& operator=(const TensorRef& o);
  TensorRef& operator=(TensorRef&& o) noexcept;
  ~TensorRef() { release(); }

  StoragePtr storage;
  int64_t offset = 0;

  size_t dim() const { return rank_; }
  c10::IntArrayRef sizes() const { return {dims(), rank_}; }
  c10::IntArrayRef strides() const { return {dims() + stride_at(), rank_}; }
  int64_t* mutable_sizes() { return dims(); }
  int64_t* mutable_strides() { return dims() + stride_at(); }
  // Replaces sizes and strides (of one length; they may not alias this reference's).
  void set_dims(c10::IntArrayRef sizes, c10::IntArrayRef strides);
  // Makes the rank `n`; the dims are unset.
  void set_rank(size_t n);

  int64_t numel() const;
  int64_t nbytes() const;       // numel * itemsize
  bool is_dense() const;        // row-major contiguous strides (size-1 dims may have any stride)
  bool covers_storage() const;  // every byte of its storage once, from offset 0, in some order of its dims

 private:
  bool heap() const { return rank_ > kInline; }
  size_t stride_at() const { return heap() ? rank_ : kInline; }
  int64_t* dims() { return heap() ? dims_.heap : dims_.in; }
  const int64_t* dims() const { return heap() ? dims_.heap : dims_.in; }
  void release() {
    if (heap()) std::free(dims_.heap);
  }
  union U {
    int64_t in[2 * kInline];
    int64_t* heap;
  } dims_{};
  uint32_t rank_ = 0;

 public:
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool conj = false;  // conjugate / negative view bits of the tensor
  bool neg = false;
};
TensorRef make_ref(const at::Tensor& t);
// The same into `r` (a node's slot, built in place: a returned TensorRef
// moved into the node and destroyed cost the record path ~50 instructions).
void make_ref(const at::Tensor& t, TensorRef& r);

// A tensor argument of a recorded op: where it sits in the argument list.
// The small fields first, in one word (96 bytes, not 104).
struct InputSlot {
  int32_t elem = -1;     // index inside a Tensor[] / Tensor?[] argument, -1 otherwise
  int16_t arg = 0;       // index into Node::args (a schema has fewer than 2^15 arguments)
  bool written = false;  // the op writes it (in-place, out=, or a documented side effect)
  TensorRef ref;
};

// Where an op was recorded: an id into the Python binding's table of
// (code object, bytecode offset) pairs, formatted as "file:line" only when
// an error needs it (formatting at record time cost ~0.3 us per op).
struct SourceLocation {
  int32_t id = -1;  // -1: not recorded from Python
  bool empty() const { return id < 0; }
  std::string str() const;  // "file:line", or "" when empty
  operator std::string() const { return str(); }
};

// One recorded ATen op. Its lists hold the common case inline (small
// vectors): each heap allocation cost the record path ~25 ns.
struct Node {
  explicit Node(const c10::OperatorHandle& o) : op(o) {}
  c10::OperatorHandle op;
  InlineVec<c10::IValue, 4> args;  // tensor arguments replaced by None; see inputs
  InlineVec<InputSlot, 2> inputs;
  InlineVec<TensorRef, 1> outputs;  // fresh (non-aliasing) tensor results, in return order
  // Per schema return: >= 0 aliases inputs[i]; -1 one fresh tensor; -2 a list of
  // `list_len` fresh tensors. Used to rebuild results at execution.
  InlineVec<int, 2> returns;
  InlineVec<int, 2> list_lens;
  // Bit i: args[i] is a Python number the call passed as a wrapped-number
  // tensor (`x + 1.0`, `x * 0.5`), kept as its Scalar (a double, int64, bool
  // or complex double IValue: the wrapped tensor's dtype, wrapped_number_dtype).
  // It promotes as a wrapped number and is a runtime scalar; the host loop
  // gives the CPU kernel a wrapped-number tensor again (host::build_stack).
  uint32_t wrapped = 0;
  int kind = 0;          // jit::PrimKind of the op, from the op table
  SourceLocation where;  // Python file:line that recorded it (beside the 4-byte fields: no padding)
  bool rng = false;      // consumes a random stream
  // Its CPU kernel raises on the values it reads (the op table's kChecksValues):
  // it runs even when nothing reads its result (jit live_nodes).
  bool checks_values = false;
  // A foreach op recorded whole (the op table's kExpandsPerTensor): the flush expands it into
  // the per-tensor ops CPU's kernel calls before anything else sees the graph (jit/foreach_expand.h).
  bool expands = false;
  // Its meta inference warned at the call, as CPU's kernel does (a uint8 mask's deprecation):
  // the flush runs CPU's kernel without its warnings, which the user has had (executors/region_runner.cpp).
  bool warned_at_call = false;
  // The interned id of the call's exact meta key (ops/record.cpp MetaCache):
  // the op, its argument metadata and structural values, from which every
  // field of this node but its storages, runtime scalar values and random
  // stream follows. Two calls with one id have equal keys; 0: no id (the key
  // was not cacheable). The flush structure writes it for the node's fields
  // (jit/flush_cache.cpp).
  uint64_t meta_id = 0;
  uint64_t rng_seed = 0;  // the stream reserved at record time
  uint64_t seq = 0;       // program order
};

// Every recorded op writes one Node: its size is the record path's memory traffic.
static_assert(sizeof(TensorRef) <= 88 && sizeof(InputSlot) <= 96 && sizeof(Node) <= 496,
              "a Node grew: keep it small (see TensorRef)");

// Whether args[i] of `n` is a wrapped number kept as a Scalar (Node::wrapped).
inline bool is_wrapped_arg(const Node& n, size_t i) { return i < 32 && ((n.wrapped >> i) & 1u) != 0; }
// The dtype of the wrapped-number tensor a Scalar argument `v` stands for
// (Node::wrapped): double, int64, bool or complex double, as PyTorch's
// scalar_to_tensor makes them.
inline c10::ScalarType wrapped_number_dtype(const c10::IValue& v) {
  return v.isDouble() ? c10::ScalarType::Double
         : v.isInt()  ? c10::ScalarType::Long
         : v.isBool() ? c10::ScalarType::Bool
                      : c10::ScalarType::ComplexDouble;
}

// Calls f(storage) for each storage node `n` writes: its fresh outputs, then
// its written arguments (in place, out=).
template <typename F>
void for_each_written_storage(const Node& n, F&& f) {
  for (const auto& out : n.outputs) f(out.storage.get());
  for (const auto& in : n.inputs)
    if (in.written) f(in.ref.storage.get());
}

// Counters reported by torch_tpu_eager.metrics().
struct Metrics {
  int64_t ops_recorded = 0;
  int64_t ops_executed = 0;
  int64_t ops_eliminated = 0;  // dead-code elimination
  int64_t eager_ops = 0;       // ops run at record time (data-dependent shapes)
  int64_t fallback_ops = 0;    // ops run through the CPU fallback
  int64_t flushes = 0;
  int64_t flush_reasons[static_cast<int>(FlushReason::kCount)] = {};
  int64_t regions_run = 0;
  int64_t library_calls = 0;  // ops run as a library call (not lowered)
  int64_t output_copies = 0;  // op results copied into their device storage (the kernel did not write it)
  int64_t cache_hits = 0;
  int64_t flush_cache_hits = 0;  // flushes that reused an earlier flush's plan (jit/flush_cache.h)
  int64_t compiles = 0;
  int64_t plans_built = 0;             // kernel plans built: compiles plus re-plans for a new exact layout
  int64_t kernel_cache_evictions = 0;  // kernels the bounded kernel cache dropped (least recently used)
  int64_t bytes_materialized = 0;      // bytes written to device storages by flushes
  int64_t bytes_read = 0;              // bytes read from device storages by flushes
  int64_t padding_bytes = 0;           // extra HBM bytes moved for tiled layouts (target's cost model)
  double flops = 0;                    // useful operations of the regions run (matmul 2*M*N*K)
  double sim_time_s = 0;               // simulated device time, seconds (kernels and collectives)
  double schedule_time_s = 0;          // the same kernels timed by their pipelined schedules (Spyre), seconds
  int64_t collectives = 0;             // collectives charged to a chip's clock (charge_collective_time)
  double collective_time_s = 0;        // their simulated interconnect time, seconds (part of sim_time_s)
  double compile_time_s = 0;           // host seconds spent compiling regions
  // On-disk cache (TORCH_TPU_CACHE_DIR), compiled regions and meta results
  // together: entries found / not found on disk after an in-memory miss, and appended.
  int64_t disk_cache_hits = 0;
  int64_t disk_cache_misses = 0;
  int64_t disk_cache_writes = 0;

  // Adds every counter of `d` (a flush's counters) to this one.
  void add(const Metrics& d);
};

// Eager modes, named as in TorchTPU.
enum class EagerMode : int { kDeferAndFuse = 0, kDeferNever = 1, kDeferNeverAndLaunchBlocking = 2 };

// Appends a node to the device queue; may flush (mode, length and byte limits).
// `precision`: the float32 matmul precision the node runs at (device.h,
// recording_precision()), or kAnyPrecision for a node that does not read it
// (the record path passes it for matmul-class ops only: reading it costs a
// hash lookup in at::Context). Pending nodes that read another precision are
// flushed first (FlushReason::kPrecisionSwitch).
constexpr int kAnyPrecision = -1;
void enqueue(Node&& node, int64_t fresh_bytes, int precision);
// The same at the calling thread's recording precision.
void enqueue(Node&& node, int64_t fresh_bytes);
// Flushes every pending op of the device; a no-op on an empty queue. An op
// that fails does not stop the flush: the storages it (and ops depending on
// it) should have written are marked with its error, which reading them
// raises (raise_storage_error); every other tensor stays valid. Returns the
// first error of the flush, for callers that report it (synchronize,
// DEFER_NEVER_AND_LAUNCH_BLOCKING): with `reported`, the caller raises it, so
// the storages that hold it count as having shown it (error_seen).
std::exception_ptr flush_all(FlushReason reason, bool reported = false);
// The same for one simulated chip's queue (each chip has its own).
std::exception_ptr flush_device(int device, FlushReason reason, bool reported = false);
// Pending ops of one chip.
size_t pending_ops(int device);
// Simulated device time of every kernel run on `device` so far, seconds (the
// chip's clock; stream and event timing read it).
double chip_sim_time(int device);
// Streams are lanes of a chip's queue: the pending ops of a chip are all of
// one stream (an op on another stream flushes them first), so each flush's
// simulated time goes to that stream's clock. Whether `stream` of `device`
// has no pending op:
bool stream_idle(int device, int64_t stream);
// The stream's clock: simulated seconds at which its next work can start: where its last
// flushed kernel ends, and no earlier than the last time the host waited for the chip.
double stream_clock(int device, int64_t stream);
// The host waited for `device` up to simulated time `t` (a read of a result, a synchronize):
// work recorded after it, on any stream of the chip, starts no earlier, as on CUDA a stream
// that was idle starts its next kernel after the host has issued it. A flush for a host read
// calls it with its stream's clock.
void host_waited(int device, double t);
// The same for every stream of the chip (a device-wide synchronize): up to the latest clock.
void host_waited_for_chip(int device);
// Makes the stream's later work start no earlier than `t` (waiting on an event).
void stream_wait_until(int device, int64_t stream, double t);
// Charges `seconds` of simulated device time that no kernel accounts for (a
// collective over the chip interconnect) to `stream` of `device`: its clock and
// the chip's clock advance as a flush advances them for its kernels, so events
// recorded around it measure it. Counted in metrics (collectives,
// collective_time_s, sim_time_s). The caller runs the chip's pending ops first
// when the work must follow them. Returns the stream clock before (its start).
double charge_collective_time(int device, int64_t stream, double seconds);
// True when queued nodes still read or write `s` (its host buffer may be stale).
bool storage_has_pending(const DeferredStorage* s);
// The storages one flush uses (the nodes `g`), numbered in order of first
// use: each node's inputs, then its outputs, in program order. The JIT's flush
// cache keys a flush by these numbers (which tensor references share a
// storage), not by the storages themselves.
struct FlushStorages {
  std::vector<DeferredStorage*> storages;  // by number
  // By number: the storage's value can be observed after the flush (a tensor
  // still holds it, or a node recorded since, by another thread while this
  // flush runs, uses it). Any other value the flush computes is dead and need
  // not be materialized.
  std::vector<char> observed;
  std::vector<int32_t> numbers;  // per tensor reference, in the order above
  // The numbering pass's stamp: while a storage's DeferredStorage::index_stamp
  // is this, its index_number is its number here. A flush nested in this one
  // may number again a storage a node recorded since uses: an observed one,
  // never one only this flush's nodes hold.
  uint64_t stamp = 0;
  // The observed storages as a set (what partition and liveness take).
  StorageSet observed_set() const;
};
// Numbers the storages of `g` into `f` (whose vectors keep their room: a
// thread's flushes reuse one) and finds which are observed after the flush.
// Called under the run lock (run_graph, ExecLock): the numbering writes scratch
// fields of the storages (DeferredStorage::index_stamp).
void index_flush_storages(const std::vector<Node>& g, FlushStorages& f);
// The same in three parts, for a pass over the nodes that numbers their
// storages as it goes (jit::flush_structure: one walk over the references
// instead of two). begin_flush_storages empties `f`, makes room for the
// references of `g` and returns the pass's stamp; number_storage numbers the
// storage of the next reference (in index_flush_storages' order) and returns
// its number; end_flush_storages finds which storages are observed.
uint64_t begin_flush_storages(const std::vector<Node>& g, FlushStorages& f);
inline int32_t number_storage(FlushStorages& f, DeferredStorage* s, uint64_t stamp, int32_t* number) {
  if (s->index_stamp != stamp) {
    s->index_stamp = stamp;
    s->index_number = static_cast<int32_t>(f.storages.size());
    s->index_uses = 0;
    f.storages.push_back(s);
  }
  s->index_uses++;
  *number = s->index_number;
  return s->index_number;
}
void end_flush_storages(const std::vector<Node>& g, FlushStorages& f);
// Runs `fn` under the queue lock when no queued node uses `s` (then nothing
// can be enqueued meanwhile); returns whether it ran.
bool run_if_idle(const DeferredStorage* s, c10::function_ref<void()> fn);
// Counts an op run at record time (eager path) or through the CPU fallback.
void count_eager_op(bool fallback);
// Counts on-disk cache lookups and appends made outside a flush (the record path).
void count_disk_cache(int64_t hits, int64_t misses, int64_t writes);
// Raises the recorded error of a storage whose value a failed flush could not compute.
void check_storage_error(const DeferredStorage* s);
// The same where the error reaches the user (a host read, a call on the
// tensor): marks it seen (DeferredStorage::error_seen).
void raise_storage_error(DeferredStorage* s);

Metrics metrics_snapshot();
void reset_metrics();
void set_eager_mode(EagerMode m);
EagerMode eager_mode();
size_t pending_ops();
void set_queue_limits(int64_t max_ops, int64_t max_bytes);
std::pair<int64_t, int64_t> queue_limits();

// Hooks installed by the Python binding: the location id of the Python code
// that is running (-1 when not called from Python), and its "file:line".
using LocationHook = int32_t (*)();
using LocationFormatter = std::string (*)(int32_t);
void set_location_hooks(LocationHook hook, LocationFormatter formatter);
SourceLocation current_location();

// The run lock: while one is alive on a thread, no other thread runs a graph
// (the JIT's and executors' caches and per-flush state are shared by every
// chip). flush_device holds it from its nodes' run to its end, after the
// chip's own flush lock; re-entrant on one thread (a nested flush). A wait
// for it releases the GIL (set_lock_wait_hook).
class ExecLock {
 public:
  ExecLock();
  ~ExecLock();
  ExecLock(const ExecLock&) = delete;
  ExecLock& operator=(const ExecLock&) = delete;
};

// Lets go of this thread's ExecLock (every level) for a scope and takes it
// back at its end: host code inside a flush (HostCodeScope) and a wait for a
// chip's flush lock run without it, so another thread may flush another chip
// meanwhile (what that host code may wait for). The JIT tolerates a flush
// between two of a flush's regions, as it does a nested one. Nothing when
// the thread holds none.
class ExecRelease {
 public:
  ExecRelease();
  ~ExecRelease();
  ExecRelease(const ExecRelease&) = delete;
  ExecRelease& operator=(const ExecRelease&) = delete;

 private:
  int depth_;
};

// Host code that runs inside a flush (a custom op's kernel, run on CPU
// tensors): while a HostCodeScope is alive on a thread, recording a "tpu" op
// (enqueue) or flushing on that thread raises RuntimeError naming `what`,
// instead of re-entering the queue that is being flushed. The flush's run
// lock is released meanwhile (ExecRelease): a thread the host code starts
// and joins may read, synchronize or flush another chip; the flushed chip's
// own flush lock stays held, so its reads wait for the flush's end.
class HostCodeScope {
 public:
  explicit HostCodeScope(const char* what);
  ~HostCodeScope();
  HostCodeScope(const HostCodeScope&) = delete;
  HostCodeScope& operator=(const HostCodeScope&) = delete;

 private:
  const char* prev_;
  ExecRelease release_;  // after prev_: destroyed (the lock taken back) after the scope's end
};

// Waits for a flush lock or the run lock (ExecLock). Installed by the Python
// binding: a thread that holds the GIL releases it while it waits, since a
// flush may run Python (custom op kernels) and so take the GIL while it holds
// those locks.
using LockWaitHook = void (*)(c10::function_ref<void()> wait);
void set_lock_wait_hook(LockWaitHook hook);

}  // namespace tpu_eager
