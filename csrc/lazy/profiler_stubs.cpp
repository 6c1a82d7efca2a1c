// The PrivateUse1 profiler stubs: torch.autograd.profiler.profile(use_device="tpu")
// (torch's KINETO_PRIVATEUSE1_FALLBACK state) records a device "event" at
// each op's entry and exit and reports the op's device time as elapsed(start,
// end). Our event is a reading of the chip's simulated clock, so an op's
// device time is the simulated time of the kernels that ran during it (a
// deferred op's kernels run at the flush: in the op that reads the result).
#include <memory>

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "device/device.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace {

struct ClockReading {
  int device = 0;
  double sim_time_s = 0;
};

struct TpuProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const int d = current_device_index() < 0 ? 0 : current_device_index();
    if (device) *device = static_cast<c10::DeviceIndex>(d);
    auto r = std::make_shared<ClockReading>();
    r->device = d;
    r->sim_time_s = chip_sim_time(d);
    if (event) *event = std::move(r);
    if (cpu_ns) *cpu_ns = c10::getTime();
  }

  // Microseconds of simulated device time between the two readings (0 when
  // they are of different chips or missing).
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    if (!a || !b || !*a || !*b) return 0.f;
    const auto* x = static_cast<const ClockReading*>(a->get());
    const auto* y = static_cast<const ClockReading*>(b->get());
    if (x->device != y->device) return 0.f;
    const double us = (y->sim_time_s - x->sim_time_s) * 1e6;
    return us > 0 ? static_cast<float>(us) : 0.f;
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < device_count(); ++d) {
      ChipGuard chip(d);
      op(d);
    }
  }

  // Runs every chip's pending ops, as cudaDeviceSynchronize waits for the GPU's.
  void synchronize() const override { flush_all(FlushReason::kSynchronize); }
};

struct RegisterStubs {
  RegisterStubs() {
    static TpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} register_stubs;

}  // namespace
}  // namespace tpu_eager
