// Device allocator: host memory per storage plus simulated-memory accounting,
// capped at the active chip's HBM capacity.
#include "device/device.h"

#include "device/block_cache.h"
#include "device/fork.h"
#include "device/host_share.h"
#include "device/spin_lock.h"
#include "lazy/async_errors.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include <unistd.h>

#include <algorithm>

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/COWDeleter.h>

#include <unordered_map>
#include <variant>

namespace tpu_eager {
namespace {

using c10::CachingAllocator::StatType;
constexpr size_t kAll = static_cast<size_t>(StatType::AGGREGATE);

// Per-chip counters (bytes unless named otherwise). Written only under the
// registry's lock (below), which every allocation takes anyway for its link:
// one locked instruction an allocation and one a free, where an atomic
// read-modify-write of each counter was ~10 an allocation and 4 a free, each
// waiting for the stores before it (the new storage's cold memory:
// docs/performance.md, sections llama21 and llama23). Atomics so that the
// statistics read them without the lock.
struct ChipMemory {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> reserved_peak{0};
  std::atomic<int64_t> allocated_total{0};  // cumulative bytes allocated (since the last reset of accumulated stats)
  std::atomic<int64_t> freed_total{0};
  std::atomic<int64_t> live_count{0};  // storages alive
  std::atomic<int64_t> count_peak{0};
  std::atomic<int64_t> alloc_count{0};  // cumulative allocations
  std::atomic<int64_t> free_count{0};
  std::atomic<int64_t> ooms{0};
  // Bytes counted as freed whose buffers pending ops still hold (drop_external_holder):
  // reserved, as a freed block in CUDA's cache is, until the flush frees them.
  std::atomic<int64_t> freed_held{0};
};

ChipMemory g_mem[kMaxDevices];
uint64_t g_next_id = 1;              // under the registry's lock
std::atomic<int64_t> g_capacity{0};  // simulated HBM bytes per chip; 0: unlimited
std::mutex g_owner_mu;
std::string g_owner;  // the chip whose HBM g_capacity is

ChipMemory& chip_memory(int device) { return g_mem[device >= 0 && device < kMaxDevices ? device : 0]; }

// Counts one storage of `nbytes` freed (the registry's lock held).
void count_free_locked(ChipMemory& mem, size_t nbytes) {
  add_locked(mem.allocated, -static_cast<int64_t>(nbytes));
  add_locked(mem.freed_total, static_cast<int64_t>(nbytes));
  add_locked(mem.live_count, -1);
  add_locked(mem.free_count, 1);
}

// Raises a peak that only the registry's lock holder writes (add_locked: spin_lock.h).
void raise_max_locked(std::atomic<int64_t>& peak, int64_t now) {
  if (now > peak.load(std::memory_order_relaxed)) peak.store(now, std::memory_order_relaxed);
}

std::string human(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

// Registry of the storages that have holders outside the queue (a doubly
// linked list through DeferredStorage::registry_prev/next): it maps a
// pointer into device memory back to its storage, for StorageImpls that
// PyTorch builds over device memory itself (alias storages, below). Linking
// costs a lock and four pointer writes per allocation; lookups are rare.
// The same lock guards every chip's counters (ChipMemory) and the storage ids.
struct Registry {
  // Taken three times an op (a fresh result's link and counters, a dead
  // tensor's unlink, the storage's free): see SpinLock.
  SpinLock mu;
  DeferredStorage* head = nullptr;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: storages may die after static destructors
  return *r;
}

// Links `ds` (r.mu held).
void registry_link(Registry& r, DeferredStorage* ds) {
  ds->registry_next = r.head;
  if (r.head) r.head->registry_prev = ds;
  r.head = ds;
}

// Unlinks `ds` (r.mu held). `forget_impl`: also drops the storage's weak
// reference to its StorageImpl (see drop_external_holder).
void registry_unlink(Registry& r, DeferredStorage* ds, bool forget_impl) {
  if (forget_impl) ds->impl.reset();
  if (ds->registry_prev)
    ds->registry_prev->registry_next = ds->registry_next;
  else if (r.head == ds)
    r.head = ds->registry_next;
  if (ds->registry_next) ds->registry_next->registry_prev = ds->registry_prev;
  ds->registry_prev = ds->registry_next = nullptr;
}

// The lazy-clone table: for each storage that lazy clones share, PyTorch's
// copy-on-write context (which keeps what it wraps private) -> the storage.
struct CowTable {
  std::mutex mu;
  std::unordered_map<const void*, DeferredStorage*> storage_of;
};

CowTable& cow_table() {
  static auto* t = new CowTable();  // never destroyed: storages may die after static destructors
  return *t;
}

// Forgets the copy-on-write context of `ds` (destroyed, or `ds` taken back
// out of it). A new context at the same address maps another storage and stays.
void cow_forget(DeferredStorage* ds) {
  CowTable& t = cow_table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (ds->cow_context == nullptr) return;
  auto it = t.storage_of.find(ds->cow_context);
  if (it != t.storage_of.end() && it->second == ds) t.storage_of.erase(it);
  ds->cow_context = nullptr;
}

DeferredStorage* cow_storage(const void* cow_context) {
  CowTable& t = cow_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.storage_of.find(cow_context);
  TORCH_CHECK(it != t.storage_of.end(),
              "tpu: a copy-on-write storage that the device did not make (torch._lazy_clone makes them)");
  return it->second;
}

// One holder outside the queue (a StorageImpl) is gone. After the last, only
// queue nodes use the storage and its pending values need not be computed.
// Drops one holder of `ds` outside the queue. `owner`: the holder is the
// StorageImpl whose DataPtr has `ds` as its context, and that DataPtr is going
// (the StorageImpl dies, or its memory was replaced): the weak reference to
// it (DeferredStorage::impl, for adopt_host_buffer, which reads it under the
// registry's mutex) is dropped now, so the dying StorageImpl is freed at once,
// as a CPU tensor's is, instead of by the flush that frees `ds`.
// The count falls under the registry's lock, as adopt_alias raises it: the
// lock's exchange is the one locked instruction (a dead tensor's unlink took
// two, the count's and the lock's).
void drop_external_holder(DeferredStorage* ds, bool owner) {
  Registry& r = registry();
  std::lock_guard<SpinLock> lock(r.mu);
  const int32_t left = ds->external_holders.load(std::memory_order_relaxed) - 1;
  ds->external_holders.store(left, std::memory_order_relaxed);
  if (left == 0) {
    ds->external_alive.store(false, std::memory_order_release);
    registry_unlink(r, ds, owner);
    // Others than the caller hold it (pending ops): CUDA frees a tensor's memory at
    // its last reference, and nothing outside the queue can read these bytes now,
    // so memory_allocated() stops counting them here, not at the flush. The caller
    // releases its reference after this: the destructor runs after it, on any thread.
    if (c10::raw::intrusive_ptr::use_count(ds) > 1) {
      ds->freed_early = true;
      ChipMemory& mem = chip_memory(ds->device);
      count_free_locked(mem, ds->nbytes);
      add_locked(mem.freed_held, static_cast<int64_t>(ds->nbytes));
    }
  } else if (owner) {
    ds->impl.reset();
  }
}

void delete_storage_ctx(void* ctx) {
  // In a bad fork the storage is the parent's: leak it rather than take locks
  // a parent thread may have held at the fork (device/fork.h).
  if (in_bad_fork()) return;
  // The StorageImpl died: its DeferredStorage lives on while queue nodes use it.
  auto* ds = static_cast<DeferredStorage*>(ctx);
  // The last lazy clone died unmaterialized: its copy-on-write context is going.
  if (ds->cow_context != nullptr) cow_forget(ds);
  drop_external_holder(ds, /*owner=*/true);
  c10::intrusive_ptr<DeferredStorage>::reclaim(ds);  // drops the StorageImpl's reference
}

// The context of an alias storage: a "tpu" StorageImpl that PyTorch built over
// device memory it did not allocate through us (torch.from_dlpack of a tpu
// tensor, UntypedStorage slicing, from_blob over a device buffer in legacy
// torch.save). Its DataPtr is re-homed onto this context the first time the
// device sees it; the original DataPtr (and its deleter) lives on inside.
struct AliasCtx {
  c10::DataPtr original;  // what PyTorch built; released with this context
  StoragePtr owner;       // the storage whose bytes these are
  int64_t byte_offset;    // of the alias's first byte in `owner`
};

void delete_alias_ctx(void* ctx) {
  auto* a = static_cast<AliasCtx*>(ctx);
  drop_external_holder(a->owner.get(), /*owner=*/false);
  delete a;
}

int64_t reserved_bytes(int device) {
  const ChipMemory& mem = g_mem[device];
  return mem.allocated.load() + mem.freed_held.load() + block_live_padding(device) + block_cache_bytes(device);
}

// Raises the error of an allocation of `nbytes` that does not fit in the
// chip's simulated HBM (counted as an out-of-memory event, as CUDA's).
[[noreturn]] void out_of_hbm(ChipMemory& mem, int device, size_t nbytes) {
  int64_t allocated = 0;
  {
    std::lock_guard<SpinLock> lock(registry().mu);
    add_locked(mem.ooms, 1);
    allocated = mem.allocated.load(std::memory_order_relaxed);
  }
  std::string owner;
  {
    std::lock_guard<std::mutex> lock(g_owner_mu);
    owner = g_owner;
  }
  const int64_t cap = g_capacity.load();
  const auto n = static_cast<int64_t>(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu: out of simulated HBM: tried to allocate ", human(n), " (", nbytes,
                   " bytes) on tpu:", device, "; the simulated ", owner, " has ", human(cap), " of HBM, of which ",
                   human(allocated),
                   " are allocated. Free tensors or choose a target "
                   "with more HBM (torch_tpu_eager.set_target).");
  __builtin_unreachable();  // TORCH_CHECK_WITH(..., false, ...) throws
}

// A c10::DeviceAllocator, so torch.accelerator's memory API (memory_stats,
// memory_allocated, get_memory_info, empty_cache, ...) reaches it. Each
// allocation is accounted to the current chip (the device guard's index, as
// CUDA's caching allocator uses the current device).
struct DeviceAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const int device = current_device_index();
    ChipMemory& mem = g_mem[device];
    check_not_in_bad_fork();
    note_device_used();
    const auto n = static_cast<int64_t>(nbytes);
    // Checked before a block is taken, so an allocation that cannot fit leaves
    // the block cache alone; again under the lock, where the bytes are counted.
    const int64_t cap = g_capacity.load(std::memory_order_relaxed);
    if (cap > 0 && mem.allocated.load(std::memory_order_relaxed) + n > cap) out_of_hbm(mem, device, nbytes);
    void* data = nullptr;
    void* companion = nullptr;       // memory for the DeferredStorage, kept with the block
    bool reused_same = nbytes == 0;  // memory_reserved unchanged
    if (nbytes > 0) {
      // 64-byte alignment, like CPU's allocator, so vectorized kernels can read it.
      data = block_alloc_paired(nbytes, device, &companion, &reused_same);
      if (data == nullptr) {
        {
          std::lock_guard<SpinLock> lock(registry().mu);
          add_locked(mem.ooms, 1);
        }
        TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu: failed to allocate ", nbytes, " bytes of host memory");
      }
    }
    void* place = companion != nullptr ? companion : DeferredStorage::operator new(sizeof(DeferredStorage));
    Registry& r = registry();
    DeferredStorage* ds = nullptr;
    {
      std::unique_lock<SpinLock> lock(r.mu);
      const int64_t now = mem.allocated.load(std::memory_order_relaxed) + n;
      if (C10_UNLIKELY(cap > 0 && now > cap)) {  // another thread's allocation took the room meanwhile
        lock.unlock();
        block_free(data, nbytes, device);
        DeferredStorage::operator delete(place, sizeof(DeferredStorage));
        out_of_hbm(mem, device, nbytes);
      }
      mem.allocated.store(now, std::memory_order_relaxed);
      raise_max_locked(mem.peak, now);
      add_locked(mem.allocated_total, n);
      add_locked(mem.alloc_count, 1);
      add_locked(mem.live_count, 1);
      raise_max_locked(mem.count_peak, mem.live_count.load(std::memory_order_relaxed));
      // A block this chip freed into the cache moves from its cached bytes to its allocated ones.
      if (!reused_same) raise_max_locked(mem.reserved_peak, reserved_bytes(device));
      // The DataPtr's context holds the one reference (unsafe_steal_from_new sets the count to 1).
      ds = c10::intrusive_ptr<DeferredStorage>::unsafe_steal_from_new(::new (place)
                                                                          DeferredStorage(data, nbytes, g_next_id++))
               .release();
      ds->device = device;
      registry_link(r, ds);
    }
    return {data, ds, &delete_storage_ctx,
            c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }

  bool initialized() override { return true; }
  // Frees the host blocks of freed storages kept for reuse (every chip's:
  // they are one pool of host memory).
  void emptyCache(c10::MempoolId_t) override { block_cache_release(); }
  // Storages are not reused while queued ops use them (queue nodes hold
  // references), so there is nothing to record.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const int d = checked_device(device);
    const ChipMemory& mem = g_mem[d];
    c10::CachingDeviceAllocator::DeviceStats st;
    const int64_t cur = mem.allocated.load();
    for (auto* arr : {&st.allocated_bytes, &st.active_bytes, &st.requested_bytes}) {
      auto& a = (*arr)[kAll];
      a.current = cur;
      a.peak = mem.peak.load();
      a.allocated = mem.allocated_total.load();
      a.freed = mem.freed_total.load();
    }
    auto& r = st.reserved_bytes[kAll];
    r.current = reserved_bytes(d);
    r.peak = std::max(mem.reserved_peak.load(), r.current);
    r.allocated = mem.allocated_total.load();
    r.freed = mem.freed_total.load();
    for (auto* arr : {&st.allocation, &st.active, &st.segment}) {
      auto& a = (*arr)[kAll];
      a.current = mem.live_count.load();
      a.peak = mem.count_peak.load();
      a.allocated = mem.alloc_count.load();
      a.freed = mem.free_count.load();
    }
    st.num_ooms = mem.ooms.load();
    st.num_device_alloc = mem.alloc_count.load();
    st.num_device_free = mem.free_count.load();
    return st;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    ChipMemory& mem = g_mem[checked_device(device)];
    std::lock_guard<SpinLock> lock(registry().mu);
    mem.allocated_total = 0;
    mem.freed_total = 0;
    mem.alloc_count = 0;
    mem.free_count = 0;
    mem.ooms = 0;
  }
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak_memory_stats(checked_device(device)); }
  // (free, total) bytes of the chip's simulated HBM: total is the active
  // target's capacity, free what the allocator does not hold (CUDA's
  // cudaMemGetInfo also counts cached blocks as used).
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const int d = checked_device(device);
    const int64_t total = memory_capacity(d);
    const int64_t used = std::min(total, reserved_bytes(d));
    return {static_cast<size_t>(total - used), static_cast<size_t>(total)};
  }
};

DeviceAllocator g_allocator;

}  // namespace

namespace {
// Freed DeferredStorage blocks kept by a thread for its next storages (at
// most kKeptStorageBlocks, ~160 KiB): one thread records ops and frees the
// flush's dying intermediates, so nearly every storage reuses a block without
// malloc / free. A block freed by another thread joins that thread's list.
// 1024: a flush of up to ~1000 ops frees all its intermediates into the list
// (at 256, three quarters of a 1000-op flush's went back to malloc / free).
constexpr int kKeptStorageBlocks = 1024;
// Plain data (zero-initialized, no destructor): each use is one TLS lookup.
// A thread_local with a destructor costs a guard check (another lookup) per
// use, and a "destroyed" flag apart from it a third, for each storage made and
// each storage freed. The destructor is a separate object (BlocksReaper),
// armed by the first block the thread keeps.
struct StorageBlocks {
  void* blocks[kKeptStorageBlocks];
  int n;
  bool armed;  // the thread's BlocksReaper is registered
  bool gone;   // the list was emptied at thread exit: later frees go to the C library
};
thread_local StorageBlocks t_storage_blocks;
struct BlocksReaper {
  ~BlocksReaper() {
    StorageBlocks& b = t_storage_blocks;
    for (int i = 0; i < b.n; ++i) ::operator delete(b.blocks[i]);
    b.n = 0;
    b.gone = true;
  }
};
void arm_reaper() {
  thread_local BlocksReaper reaper;
  (void)reaper;
}
}  // namespace

void* DeferredStorage::operator new(size_t size) {
  StorageBlocks& b = t_storage_blocks;
  if (size == sizeof(DeferredStorage) && b.n > 0) return b.blocks[--b.n];
  return ::operator new(size);
}

void DeferredStorage::operator delete(void* p, size_t size) {
  if (block_companion_kept(p)) return;  // the block cache keeps it with the storage's block
  StorageBlocks& b = t_storage_blocks;
  if (size == sizeof(DeferredStorage) && !b.gone && b.n < kKeptStorageBlocks) {
    if (!b.armed) {
      b.armed = true;
      arm_reaper();
    }
    b.blocks[b.n++] = p;
    return;
  }
  ::operator delete(p);
}

DeferredStorage::~DeferredStorage() {
  if (in_bad_fork()) {  // the parent's buffer: leaked, no locks (device/fork.h)
    if (host_owner) (void)host_owner.unsafeReleaseStorageImpl();
    return;
  }
  forget_unreported_storage(this);  // lazy/async_errors.h
  // A buffer that CPU tensors still share is freed by the last of them; an
  // adopted CPU buffer (host_owner) by its storage.
  if (!release_host_share(this) && !host_owner) {
    // In a flush, the block keeps this storage's memory for the next one of
    // its size; not while members with destructors still hold something (a
    // destructor could free another storage before this one's operator delete).
    const bool bare = !error && !impl && cow_context == nullptr;
    if (!bare || !block_free_paired(data, nbytes, device, this)) block_free(data, nbytes, device);
  }
  if (freed_early) {
    std::lock_guard<SpinLock> lock(registry().mu);
    add_locked(chip_memory(device).freed_held, -static_cast<int64_t>(nbytes));
  } else
    account_free(nbytes, device);
}

bool adopt_host_buffer(DeferredStorage* s, const c10::Storage& buffer) {
  if (s->nbytes == 0 || buffer.nbytes() != s->nbytes || !buffer.device().is_cpu()) return false;
  // No buffer (a ZeroTensor's storage has none), or not the device's alignment (block_alloc).
  const void* data_const = buffer.data();
  if (data_const == nullptr || reinterpret_cast<uintptr_t>(data_const) % 64 != 0) return false;
  void* data = buffer.unsafeGetStorageImpl()->mutable_data();
  // Declared before the lock: if this is the last reference, the StorageImpl
  // dies (and takes the registry lock) after the unlock.
  c10::intrusive_ptr<c10::StorageImpl> impl;
  Registry& reg = registry();
  // Alias lookups (adopt_alias) read s->data under it; a dying StorageImpl drops s->impl under it.
  std::lock_guard<SpinLock> lock(reg.mu);
  if (s->impl) impl = s->impl->lock();
  if (!impl) return false;
  if (s->address_exported.load(std::memory_order_acquire) || s->host_share.load(std::memory_order_acquire) != nullptr ||
      s->host_owner)
    return false;
  c10::DataPtr& old = impl->_mutable_data_ptr_no_checks();
  if (old.get_context() != s || old.get_deleter() != &delete_storage_ctx) return false;  // resized meanwhile
  const c10::Device device = old.device();
  old.release_context();  // the same context (one reference to `s`) goes into the new DataPtr
  impl->set_data_ptr_noswap(c10::DataPtr(data, s, &delete_storage_ctx, device));
  block_free(s->data, s->nbytes, s->device);
  s->data = data;
  s->host_owner = buffer;
  return true;
}

void account_free(size_t nbytes, int device) {
  ChipMemory& mem = chip_memory(device);
  std::lock_guard<SpinLock> lock(registry().mu);
  count_free_locked(mem, nbytes);
}

c10::Allocator* device_allocator() { return &g_allocator; }

namespace {

// Re-homes an alias storage (see AliasCtx): finds the storage whose buffer
// holds its bytes and gives it an AliasCtx. A zero-byte storage over no
// device buffer gets a fresh empty storage of its own.
DeviceBytes adopt_alias(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  auto* p = static_cast<char*>(storage.data_ptr().get());
  const size_t n = storage.nbytes();
  StoragePtr owner;
  int64_t offset = 0;
  {
    Registry& reg = registry();
    std::lock_guard<SpinLock> lock(reg.mu);
    const c10::DataPtr& dp = storage.data_ptr();
    if (dp.get_deleter() == &delete_storage_ctx) return {static_cast<DeferredStorage*>(dp.get_context()), 0};
    if (dp.get_deleter() == &delete_alias_ctx) {  // re-homed meanwhile by another thread
      auto* a = static_cast<AliasCtx*>(dp.get_context());
      return {a->owner.get(), a->byte_offset};
    }
    for (DeferredStorage* s = reg.head; s != nullptr && p != nullptr; s = s->registry_next) {
      auto* base = static_cast<char*>(s->data);
      if (base != nullptr && p >= base && p + n <= base + s->nbytes) {
        owner = StoragePtr::reclaim_copy(s);
        offset = p - base;
        s->external_holders.fetch_add(1, std::memory_order_acq_rel);  // under the lock: see drop_external_holder
        s->address_exported.store(true, std::memory_order_release);
        break;
      }
    }
  }
  if (!owner) {
    TORCH_CHECK(n == 0, "tpu: a tensor's storage (", n, " bytes at ", static_cast<void*>(p),
                ") is not memory of the tpu device: it was built over memory the device did not allocate "
                "(a DLPack capsule of another library, or a storage of a freed or resized tensor). "
                "Copy the data to the device with .to(\"tpu\") instead.");
    // An empty storage over no device memory: give it a fresh empty storage.
    c10::DataPtr fresh = g_allocator.allocate(0);
    owner = StoragePtr::reclaim(static_cast<DeferredStorage*>(fresh.release_context()));
  }
  const DeviceBytes result{owner.get(), offset};
  auto* ctx = new AliasCtx{std::move(impl->_mutable_data_ptr_no_checks()), std::move(owner), offset};
  impl->set_data_ptr_noswap(c10::DataPtr(p, ctx, &delete_alias_ctx, impl->device()));
  return result;
}

}  // namespace

DeviceBytes device_bytes_of(const c10::Storage& storage) {
  const c10::DataPtr& dp = storage.data_ptr();
  if (C10_LIKELY(dp.get_deleter() == &delete_storage_ctx)) return {static_cast<DeferredStorage*>(dp.get_context()), 0};
  if (dp.get_deleter() == &delete_alias_ctx) {
    auto* a = static_cast<AliasCtx*>(dp.get_context());
    return {a->owner.get(), a->byte_offset};
  }
  if (dp.get_deleter() == &c10::impl::cow::cow_deleter) return {cow_storage(dp.get_context()), 0};
  return adopt_alias(storage);
}

bool is_copy_on_write(const c10::DataPtr& dp) { return dp.get_deleter() == &c10::impl::cow::cow_deleter; }

c10::DataPtr share_copy_on_write(c10::StorageImpl& impl) {
  using c10::impl::cow::COWDeleterContext;
  const c10::DeleterFnPtr deleter = impl.data_ptr().get_deleter();
  void* data = impl.data_ptr().get();
  const c10::Device device = impl.data_ptr().device();
  COWDeleterContext* ctx = nullptr;
  if (deleter == &delete_storage_ctx) {
    // A plain device storage: its reference to the DeferredStorage moves into
    // a new copy-on-write context, which this and every later lazy clone share.
    auto* ds = static_cast<DeferredStorage*>(impl.data_ptr().get_context());
    std::unique_ptr<void, c10::DeleterFnPtr> own(std::move(impl._mutable_data_ptr_no_checks().move_context()));
    ctx = new COWDeleterContext(std::move(own));
    {
      CowTable& t = cow_table();
      std::lock_guard<std::mutex> lock(t.mu);
      t.storage_of[ctx] = ds;
      ds->cow_context = ctx;
    }
    impl.set_data_ptr_noswap(c10::DataPtr(data, ctx, &c10::impl::cow::cow_deleter, device));
  } else if (deleter == &c10::impl::cow::cow_deleter) {
    ctx = impl.data_ptr().cast_context<COWDeleterContext>(&c10::impl::cow::cow_deleter);
  } else {
    // An alias storage (a DLPack import, an UntypedStorage slice): CPU's
    // lazy clone refuses a storage whose context it does not know, with this error.
    TORCH_CHECK(false,
                "Expected storage != nullptr to be true, but got false.  (Could this error message be improved?  ",
                "If so, please report an enhancement request to PyTorch.)");
  }
  ctx->increment_refcount();
  return c10::DataPtr(data, ctx, &c10::impl::cow::cow_deleter, device);
}

bool end_copy_on_write(c10::StorageImpl& impl, const c10::Storage& copy, c10::function_ref<void()> fill_copy) {
  using c10::impl::cow::COWDeleterContext;
  auto* ctx = impl.data_ptr().cast_context<COWDeleterContext>(&c10::impl::cow::cow_deleter);
  TORCH_INTERNAL_ASSERT(ctx != nullptr, "end_copy_on_write: not a copy-on-write storage");
  DeferredStorage* ds = cow_storage(ctx);
  const c10::Device device = impl.data_ptr().device();
  // While `result` holds a NotLastReference (a shared lock on the context),
  // the context and the bytes it wraps stay alive.
  auto result = ctx->decrement_refcount();
  c10::DataPtr now;
  std::exception_ptr error;
  const bool last = std::holds_alternative<COWDeleterContext::LastReference>(result);
  if (last) {
    // The only holder left: take the storage back (the context is gone).
    std::unique_ptr<void, c10::DeleterFnPtr> own = std::get<COWDeleterContext::LastReference>(std::move(result));
    TORCH_INTERNAL_ASSERT(own.get() == ds);
    cow_forget(ds);
    const c10::DeleterFnPtr deleter = own.get_deleter();
    now = c10::DataPtr(ds->data, own.release(), deleter, device);
  } else {
    try {
      fill_copy();
    } catch (...) {
      // The copy could not be recorded: the storage takes it anyway (the
      // others keep the shared bytes) and reading it raises this error.
      error = std::current_exception();
    }
    now = std::move(const_cast<c10::Storage&>(copy).unsafeGetStorageImpl()->_mutable_data_ptr_no_checks());
    if (error) static_cast<DeferredStorage*>(now.get_context())->set_error(error);
  }
  // The old DataPtr's count on the context was dropped above.
  impl._mutable_data_ptr_no_checks().release_context();
  impl.set_data_ptr_noswap(std::move(now));
  if (last && ds->host_share.load(std::memory_order_acquire) != nullptr)
    host_share_follow(ds, c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(&impl)));
  if (error) std::rethrow_exception(error);
  return last;
}

DeferredStorage* deferred_storage_of(const c10::Storage& storage) { return device_bytes_of(storage).storage; }

bool is_alias_storage(const c10::Storage& storage) { return storage.data_ptr().get_deleter() != &delete_storage_ctx; }

void set_memory_capacity(int64_t bytes, const std::string& owner) {
  std::lock_guard<std::mutex> lock(g_owner_mu);
  g_owner = owner;
  g_capacity.store(bytes > 0 ? bytes : 0);
}

int64_t memory_capacity(int) {
  const int64_t cap = g_capacity.load();
  if (cap > 0) return cap;
  // Unlimited (no target set yet): the host's physical memory.
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
}

int64_t memory_allocated(int device) { return g_mem[checked_device(device)].allocated.load(); }
int64_t max_memory_allocated(int device) { return g_mem[checked_device(device)].peak.load(); }
int64_t memory_reserved(int device) { return reserved_bytes(checked_device(device)); }
int64_t max_memory_reserved(int device) {
  const int d = checked_device(device);
  return std::max(g_mem[d].reserved_peak.load(), reserved_bytes(d));
}
void reset_peak_memory_stats(int device) {
  ChipMemory& mem = g_mem[checked_device(device)];
  std::lock_guard<SpinLock> lock(registry().mu);
  mem.peak.store(mem.allocated.load());
  mem.reserved_peak.store(reserved_bytes(device));
  mem.count_peak.store(mem.live_count.load());
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace tpu_eager
