// The DDP runtime-statistics timer of the "tpu" device.
//
// DistributedDataParallel's Reducer asks c10d::TimerRegistry for a timer of its
// parameters' device type (torch/csrc/distributed/c10d/reducer_timer.hpp) and
// samples forward, backward-compute and communication times with it
// (ddp._get_ddp_logging_data(): avg_forward_compute_time, ... in ns). CPU and
// CUDA register one; without one DDP warns "Time stats are currently only
// collected for CPU and CUDA devices" on every rank and leaves the times unset.
//
// This timer reads the host clock, as CPU's does: the intervals are the host
// time between the Reducer's hooks. (CUDA's timer records device events
// instead; an event on "tpu" runs the chip's pending ops first, which would cut
// DDP's backward into extra flushes on every sampled iteration.)
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <memory>
#include <optional>

namespace tpu_eager {
namespace distributed {
namespace {

class HostClockTimer : public ::c10d::Timer {
 public:
  explicit HostClockTimer(c10::Device /*device*/) {}

  // Nanoseconds from `start` to `end`; none when `end` was not recorded after
  // `start` in this iteration (as CPU's timer answers).
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t s = getTimeRef(start);
    const int64_t e = getTimeRef(end);
    if (s == ::c10d::kUnsetTime || e == ::c10d::kUnsetTime || e < s) return std::nullopt;
    return e - s;
  }
};

}  // namespace
}  // namespace distributed
}  // namespace tpu_eager

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, tpu_eager::distributed::HostClockTimer);
}  // namespace c10d
