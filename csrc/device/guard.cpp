// Device guard for PrivateUse1: one simulated device, no streams of its own
// (ordering is the DeferAndFuse queue's program order).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "device/device.h"

namespace tpu_eager {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;

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
    TORCH_CHECK(d.index() >= 0 && d.index() < kNumDevices, "tpu device index ", static_cast<int>(d.index()),
                " out of range; device_count() is ", kNumDevices);
    t_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return kNumDevices; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace

c10::DeviceIndex current_device_index() { return t_current_device; }

}  // namespace tpu_eager
