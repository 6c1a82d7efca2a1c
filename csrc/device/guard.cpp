// Device guard for PrivateUse1: the current chip of each thread, the number
// of simulated chips, device synchronization and capabilities.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "device/env.h"
#include "device/device.h"
#include "device/kineto_profiler.h"
#include "lazy/async_errors.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;

// Streams: lanes of a chip's queue (lazy/queue.h). Id 0 is the default
// stream; new streams get the next id of their chip. Current stream: per
// thread and chip, as CUDA's.
thread_local int64_t t_stream[kMaxDevices] = {};
std::atomic<int64_t> g_next_stream[kMaxDevices];

// An event: where a stream's clock stood when it was recorded. Recording
// flushes the chip's queue (flush reason "event"), so the work before it has
// run and its simulated time is known; query() and synchronize() then have
// nothing to wait for.
struct TpuEvent {
  int device = -1;
  int64_t stream = 0;
  bool timing = false;
  double time_s = 0;  // simulated seconds on the stream's clock
  // torch.profiler only: the op that recorded it (0: none).
  uint64_t correlation = 0;
};

int index_of(const c10::Device& d) { return d.has_index() ? d.index() : t_current_device; }

// 0: not fixed yet. Fixed by the first device_count() call.
std::atomic<int> g_count{0};
std::atomic<int> g_requested{0};  // set_device_count before first use
std::once_flag g_count_once;

int count_from_env() {
  const int64_t n = env::get_int("TORCH_TPU_NUM_DEVICES");
  TORCH_CHECK_VALUE(n >= 1 && n <= kMaxDevices, "environment variable TORCH_TPU_NUM_DEVICES=", n,
                    ": expected an integer in 1..", kMaxDevices);
  return static_cast<int>(n);
}

[[noreturn]] void invalid_ordinal(int device) {
  // CUDA raises torch.AcceleratorError (cudaErrorInvalidDevice = 101) here.
  throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 101,
                              "tpu error: invalid device ordinal: tpu:" + std::to_string(device) +
                                  " (device_count() is " + std::to_string(device_count()) + ")");
}

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType D = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return D; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {D, t_current_device}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == D, "expected a tpu device, got ", d);
    t_current_device = static_cast<c10::DeviceIndex>(checked_device(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kMaxDevices) t_current_device = d.index();
  }
  // An invalid ordinal raises as everywhere else (torch.accelerator.current_stream(99)).
  c10::Stream getStream(c10::Device d) const override { return current_of(checked_device(index_of(d))); }
  static c10::Stream current_of(int i) noexcept {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(D, static_cast<c10::DeviceIndex>(i)),
                       i >= 0 && i < kMaxDevices ? t_stream[i] : 0);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT,
                       c10::Device(D, static_cast<c10::DeviceIndex>(checked_device(index_of(d)))));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const int i = checked_device(index_of(d));
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(D, static_cast<c10::DeviceIndex>(i)), ++g_next_stream[i]);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  // noexcept: a stream of an invalid chip (a torch.Stream built from raw ids) changes nothing.
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const int i = index_of(s.device());
    const c10::Stream old = current_of(i);
    if (i >= 0 && i < kMaxDevices) t_stream[i] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 1;
    }
  }
  // Every dtype CPU supports: the simulated chip computes them as CPU does.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    (void)checked_device(d.index());
    return c10::DeviceCapability();
  }
  bool queryStream(const c10::Stream& s) const override {
    return stream_idle(checked_device(s.device_index()), s.id());
  }
  // Runs the chip's pending ops (all of one stream) and raises the oldest
  // error of a failed op that nothing has reported yet (this flush's or an
  // earlier one's), as CUDA's stream synchronize reports asynchronous errors
  // (lazy/async_errors.h).
  void synchronizeStream(const c10::Stream& s) const override {
    const int d = checked_device(s.device_index());
    std::exception_ptr err =
        stream_idle(d, s.id()) ? take_unreported_error(d) : synchronize_errors(d, FlushReason::kSynchronize);
    host_waited(d, stream_clock(d, s.id()));
    if (err) std::rethrow_exception(err);
  }
  // torch.accelerator.synchronize: runs every pending op and raises the oldest
  // unreported error of a failed one, as torch.tpu.synchronize does.
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    const int d = checked_device(index);
    std::exception_ptr err = synchronize_errors(d, FlushReason::kSynchronize);
    host_waited_for_chip(d);
    if (err) std::rethrow_exception(err);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    const int d = checked_device(stream.device_index());
    auto* e = static_cast<TpuEvent*>(*event);
    TORCH_CHECK(e == nullptr || e->device == d, "Event device index ", e ? e->device : -1,
                " does not match recording stream's device index ", d, ".");
    (void)flush_device(d, FlushReason::kEvent);  // errors stay with the tensors they poisoned
    if (e == nullptr) {
      e = new TpuEvent();
      e->device = d;
      // torch.Event(enable_timing=True) asks for BACKEND_DEFAULT (CUDA: timing on).
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
    }
    e->stream = stream.id();
    e->time_s = stream_clock(d, stream.id());
    e->correlation = kineto::recording() ? kineto::current_correlation() : 0;
  }
  // The stream's later work starts no earlier than the event (an unrecorded
  // event: nothing to wait for, as on CUDA).
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    const auto* e = static_cast<const TpuEvent*>(event);
    const int d = checked_device(stream.device_index());
    // Work the stream recorded before the wait runs before it.
    if (!stream_idle(d, stream.id())) (void)flush_device(d, FlushReason::kEvent);
    const double from_s = stream_clock(d, stream.id());
    stream_wait_until(d, stream.id(), e->time_s);
    kineto::record_stream_wait(d, stream.id(), e->stream, from_s, e->time_s, e->correlation);
  }
  bool queryEvent(void*) const override { return true; }
  // The work before the event ran when it was recorded; an error of it (or
  // of earlier work on the chip) that nothing has reported yet is raised here,
  // as cudaEventSynchronize reports asynchronous errors (lazy/async_errors.h).
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    const auto* e = static_cast<const TpuEvent*>(event);
    host_waited(e->device, e->time_s);
    if (std::exception_ptr err = take_unreported_error(e->device)) std::rethrow_exception(err);
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  // Simulated milliseconds between two events: the simulated time of the
  // kernels run on the stream between them (plus any wait on another stream's event).
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    const auto* a = static_cast<const TpuEvent*>(start);
    const auto* b = static_cast<const TpuEvent*>(end);
    TORCH_CHECK(a->timing && b->timing, "Both events must be created with argument 'enable_timing=True'.");
    TORCH_CHECK(a->device == b->device, "Both events must be recorded on the same device (tpu:", a->device,
                " and tpu:", b->device, ").");
    return (b->time_s - a->time_s) * 1e3;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace

int device_count() {
  // Once fixed, the count is read without call_once: the device guard asks
  // for it on every op (measured in docs/performance.md, llama20 section).
  if (const int n = g_count.load(std::memory_order_acquire); n > 0) return n;
  std::call_once(g_count_once, [] {
    const int requested = g_requested.load();
    g_count.store(requested > 0 ? requested : count_from_env());
  });
  return g_count.load();
}

void set_device_count(int n) {
  TORCH_CHECK_VALUE(n >= 1 && n <= kMaxDevices, "the number of tpu devices must be in 1..", kMaxDevices, ", got ", n);
  if (g_count.load() == 0) {
    g_requested.store(n);
    if (device_count() == n) return;  // fixed it now
  }
  TORCH_CHECK(g_count.load() == n, "torch.tpu.set_device_count(", n,
              ") must be called before the device is first used; "
              "device_count() is already ",
              g_count.load());
}

int checked_device(int device) {
  if (device == -1) return t_current_device;
  if (device < 0 || device >= device_count()) invalid_ordinal(device);
  return device;
}

c10::DeviceIndex current_device_index() { return t_current_device; }
int64_t current_stream_id(int device) { return device >= 0 && device < kMaxDevices ? t_stream[device] : 0; }
void set_current_device_unchecked(c10::DeviceIndex d) { t_current_device = d; }

}  // namespace tpu_eager
