// Collectives on the simulated timeline: a collective's simulated interconnect
// time (costed by torch_tpu_eager.ici from the chip data) is charged to the
// chip that runs it, after the work recorded before it, so that events and the
// profiler see it as they see kernels.
#pragma once

#include <cstdint>
#include <string>

#include "jit/kernel_trace.h"

namespace tpu_eager {
namespace distributed {

// Runs the pending ops of `device` (flush reason "collective"; an error of a
// failed op stays with the tensors it poisoned), then advances the clock of the
// current stream of `device` by `seconds` (lazy/queue.h charge_collective_time)
// and, while a profiler is active, appends a trace record of kind "collective"
// named `op` with `info`. Returns the stream clock at which the collective starts.
double record_collective(int device, const std::string& op, const std::string& target, double seconds,
                         const jit::CollectiveRecord& info);

}  // namespace distributed
}  // namespace tpu_eager
