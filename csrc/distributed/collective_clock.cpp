// Collectives on the simulated timeline (see collective_clock.h).
#include "distributed/collective_clock.h"

#include <utility>

#include "device/device.h"
#include "device/kineto_profiler.h"
#include "lazy/queue.h"

namespace tpu_eager {
namespace distributed {

double record_collective(int device, const std::string& op, const std::string& target, double seconds,
                         const jit::CollectiveRecord& info) {
  (void)flush_device(device, FlushReason::kCollective);  // errors stay with the tensors they poisoned
  const int64_t stream = current_stream_id(device);
  const double start = charge_collective_time(device, stream, seconds);
  if (kineto::recording())  // on the stream's track, from where its clock was
    kineto::record_collective(
        device, stream, op, start, seconds,
        kineto::CollectiveArgs{info.algorithm, info.group_size, info.nbytes, info.hops, info.bytes_per_link});
  if (jit::trace_active()) {
    jit::KernelRecord rec;
    rec.kind = "collective";
    rec.name = op;
    rec.target = target;
    rec.ops = {op};
    rec.stats.sim_time_s = seconds;
    rec.collective = info;
    jit::trace_record(std::move(rec));
  }
  return start;
}

}  // namespace distributed
}  // namespace tpu_eager
