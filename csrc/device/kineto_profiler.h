// torch.profiler integration: simulated kernels as PrivateUse1 device activities.
//
// torch 2.13 traces a PrivateUse1 device through a libkineto child profiler
// that the backend registers (torch::profiler::impl::PrivateUse1ProfilerRegistry).
// Ours collects one activity per kernel (fused region) run while a
// torch.profiler session with ProfilerActivity.PrivateUse1 records; each lies
// on the track of its chip (Chrome trace pid) and stream (tid), lasts the
// kernel's simulated time, and starts when the host ran it or when the
// previous kernel of its stream ended, whichever is later (the device is
// asynchronous to the host, as a GPU's). Collectives charged to a chip's
// clock (distributed/collective_clock.h) are activities "ici::<op>" of the
// same kind on their stream's track. Costs one relaxed atomic load per
// kernel when no session records.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace tpu_eager {
namespace kineto {

namespace detail {
extern std::atomic<bool> g_recording;
}
// True while a torch.profiler session collects device activities.
inline bool recording() { return detail::g_recording.load(std::memory_order_relaxed); }

// The kernel's host run began at `host_start_ns` (ns since the Unix epoch,
// system clock): records it as a device activity of the current chip and the
// stream of the running flush, lasting `sim_time_s` simulated seconds.
// `ops` names its fused ops ("add.Tensor,mul.Tensor"); `flops` and `bytes`
// go into the activity's metadata.
void record_kernel(const std::string& name, const std::string& ops, double sim_time_s, int64_t host_start_ns,
                   double flops, double bytes);

// What the interconnect cost model chose for a collective (the activity's args).
struct CollectiveArgs {
  std::string algorithm;  // "ring", "torus", ...
  int64_t group_size = 0;
  int64_t nbytes = 0;
  int64_t hops = 0;
  double bytes_per_link = 0;
};

// A collective `op` ("all_reduce") charged to stream `stream` of chip `device`
// at host time `host_start_ns`: a device activity "ici::<op>" on that chip's
// and stream's track, lasting `sim_time_s` simulated seconds and placed as a
// kernel is (after the stream's previous activity, not before the host call),
// so that it overlaps the other streams' kernels.
void record_collective(int device, int64_t stream, const std::string& op, double sim_time_s, int64_t host_start_ns,
                       const CollectiveArgs& args);

// Now, ns since the Unix epoch (the clock torch.profiler's events use).
int64_t now_ns();

// The stream whose work a flush runs, for the scope of that flush (set by the
// queue; read by record_kernel).
struct FlushLane {
  explicit FlushLane(int64_t stream);
  ~FlushLane();
  FlushLane(const FlushLane&) = delete;
  FlushLane& operator=(const FlushLane&) = delete;

 private:
  int64_t prev_;
};

}  // namespace kineto
}  // namespace tpu_eager
