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
#include <vector>

namespace tpu_eager {
namespace kineto {

namespace detail {
extern std::atomic<bool> g_recording;
}
// True while a torch.profiler session collects device activities.
inline bool recording() { return detail::g_recording.load(std::memory_order_relaxed); }

// The correlation id of the innermost op torch.profiler records on this thread
// (0 when none, or no session collects device activities).
uint64_t current_correlation();

// The queue recorded its op number `seq` (Node::seq) now: remembers
// current_correlation() for it, so that the kernel running that op links to
// the op that recorded it (record_kernel). Called only while recording().
void note_op(uint64_t seq);

// The kernel's host run began at `host_start_ns` (ns since the Unix epoch,
// system clock): records it as a device activity of the current chip and the
// stream of the running flush, lasting `sim_time_s` simulated seconds.
// `ops` names its fused ops ("add.Tensor,mul.Tensor"); `flops` and `bytes`
// go into the activity's metadata. `seqs` are the queue's numbers of its ops
// (Node::seq), in region order: torch.profiler links the kernel to the op that
// recorded the first of them noted in this session (note_op), so
// key_averages() charges its device time there, not to the op whose host read
// flushed the queue; ops all recorded before the session: linked to no op.
void record_kernel(const std::string& name, const std::string& ops, double sim_time_s, int64_t host_start_ns,
                   double flops, double bytes, const std::vector<uint64_t>& seqs);

// The kernel about to be recorded on this thread (the next record_kernel)
// also ran an executed tile schedule (the Spyre target): its time
// `schedule_s` (the latest core's pipeline end), the ideal one-core
// pipeline `pipelined_s` and each core's busy time (seconds), added to the
// activity's metadata next to sim_time_us. Called only while recording().
// A note for another kernel name than the next recorded one is dropped.
void note_kernel_schedule(const std::string& kernel, double schedule_s, double pipelined_s,
                          const std::vector<double>& core_end_s);

// Where an event recorded now on (`device`, `stream`) lies on that stream's
// device track: ns since the Unix epoch, after the stream's last traced
// activity and not before now. (Meaningful while a session records; now otherwise.)
int64_t stream_point(int device, int64_t stream);

// `stream` of chip `device` waits (wait_event / wait_stream) for an event
// recorded at track time `event_ns` on `waited_stream`, by the op with
// correlation id `event_correlation`: a device activity "Stream Wait Event"
// (category "cuda_sync", as CUDA's traces show stream waits) on the waiting
// stream's track, from where that stream is (not before now) to the event
// (at least 1 ns), with args wait_on_stream and
// wait_on_event_record_corr_id; the stream's next activities start after it.
void record_stream_wait(int device, int64_t stream, int64_t waited_stream, int64_t event_ns,
                        uint64_t event_correlation);

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
