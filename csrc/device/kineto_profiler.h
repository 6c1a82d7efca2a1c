// torch.profiler integration: simulated kernels as PrivateUse1 device activities.
//
// torch 2.13 traces a PrivateUse1 device through a libkineto child profiler
// that the backend registers (torch::profiler::impl::PrivateUse1ProfilerRegistry).
// Ours collects one activity per kernel (fused region) run while a
// torch.profiler session with ProfilerActivity.PrivateUse1 records; each lies
// on the track of its chip (Chrome trace pid) and stream (tid).
//
// Device tracks are on the simulated clock, host tracks on host time. Each
// activity keeps the simulated seconds at which it starts on its stream (the
// stream's clock: when the stream was free and the events it waited for had
// happened, lazy/queue.h stream_clock) and its simulated duration. When the
// session stops, every chip's activities are laid out on one axis: the
// earliest simulated start among the chip's kernels and collectives is placed
// at the host time the session started, every activity after it by its
// simulated distance (a stream wait starts no earlier).
// So work of two streams that overlaps on the simulated timeline (a
// collective on the interconnect stream during backward kernels) overlaps on
// the trace, work that waited does not, and each lasts exactly its simulated
// time; a device activity may start before the host op that issued it (the
// simulated device is faster than this host). Collectives charged to a chip's
// clock (distributed/collective_clock.h) are activities "ici::<op>" of the
// same kind on their stream's track. Costs one relaxed atomic load per kernel
// when no session records.
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

// Records a kernel the running flush ran as a device activity of the current
// chip and the flush's stream, lasting `sim_time_s` simulated seconds and
// starting where the flush's previous kernels ended on that stream's clock
// (FlushLane; kernels of a flush run one after another).
// `ops` names its fused ops ("add.Tensor,mul.Tensor"); `flops` and `bytes`
// go into the activity's metadata. `seqs` are the queue's numbers of its ops
// (Node::seq), in region order: torch.profiler links the kernel to the op that
// recorded the first of them noted in this session (note_op), so
// key_averages() charges its device time there, not to the op whose host read
// flushed the queue; ops all recorded before the session: linked to no op.
void record_kernel(const std::string& name, const std::string& ops, double sim_time_s, double flops, double bytes,
                   const std::vector<uint64_t>& seqs);

// The kernel about to be recorded on this thread (the next record_kernel)
// also ran an executed tile schedule (the Spyre target): its time
// `schedule_s` (the latest core's pipeline end), the ideal one-core
// pipeline `pipelined_s`, each core's busy time and the ring reduction's
// time `ring_s` (part of schedule_s; seconds) with its hops' latency
// `ring_latency_s` (part of ring_s), added to the activity's metadata next
// to sim_time_us. Called only while recording().
// A note for another kernel name than the next recorded one is dropped.
void note_kernel_schedule(const std::string& kernel, double schedule_s, double pipelined_s,
                          const std::vector<double>& core_end_s, double ring_s = 0, double ring_latency_s = 0);

// `stream` of chip `device` waits (wait_event / wait_stream) for an event
// recorded at simulated time `event_s` on `waited_stream`, by the op with
// correlation id `event_correlation`; the waiting stream's clock was at
// `from_s` (simulated seconds) before the wait. A device activity "Stream Wait
// Event" (category "cuda_sync", as CUDA's traces show stream waits) on the
// waiting stream's track, from `from_s` to max(`from_s`, `event_s`) (drawn at
// least 1 ns long), with args wait_on_stream and wait_on_event_record_corr_id.
void record_stream_wait(int device, int64_t stream, int64_t waited_stream, double from_s, double event_s,
                        uint64_t event_correlation);

// What the interconnect cost model chose for a collective (the activity's args).
struct CollectiveArgs {
  std::string algorithm;  // "ring", "torus", ...
  int64_t group_size = 0;
  int64_t nbytes = 0;
  int64_t hops = 0;
  double bytes_per_link = 0;
};

// A collective `op` ("all_reduce") charged to stream `stream` of chip `device`,
// starting at simulated time `start_s` of that stream's clock: a device
// activity "ici::<op>" on that chip's and stream's track, lasting `sim_time_s`
// simulated seconds, so that it overlaps the other streams' kernels where the
// simulated timeline does.
void record_collective(int device, int64_t stream, const std::string& op, double start_s, double sim_time_s,
                       const CollectiveArgs& args);

// Now, ns since the Unix epoch (the clock torch.profiler's events use).
int64_t now_ns();

// The stream whose work a flush runs and the simulated time at which its
// first kernel starts (the stream's clock when the flush began), for the
// scope of that flush (set by the queue; read and advanced by record_kernel).
struct FlushLane {
  FlushLane(int64_t stream, double start_s);
  ~FlushLane();
  FlushLane(const FlushLane&) = delete;
  FlushLane& operator=(const FlushLane&) = delete;

 private:
  int64_t prev_stream_;
  double prev_clock_s_;
};

}  // namespace kineto
}  // namespace tpu_eager
