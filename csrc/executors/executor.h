// The executor interface between the JIT and a target (DESIGN §6).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executors/host_runtime.h"
#include "jit/ir.h"
#include "jit/region.h"
#include "lazy/queue.h"

namespace tpu_eager {

// A target: its fusion rules (asked by partition), compile and run.
class Executor : public FusionRules {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  // The simulated chip regions are costed on (e.g. "tpu-v5e").
  virtual std::string target() const = 0;
  // Compiles `region` of `graph` (identified by `info`): plans it once for
  // its structure and layout. The JIT caches the kernel under the region's
  // structural key. May throw (a region that cannot fit the target): nothing
  // is cached then, and the error is the region's.
  virtual std::shared_ptr<Kernel> compile(const CompiledRegion& info, const Region& region,
                                          const std::vector<Node>& graph) = 0;
  // Called by the JIT before the regions of one flush run.
  virtual void begin_flush() {}
};

// Which executor runs regions: set with the target (torch_tpu_eager.set_target).
enum class TargetKind : int { kTpu = 0, kSpyre = 1 };
TargetKind active_target_kind();
void set_active_target_kind(TargetKind kind);

// The executors (singletons).
Executor& tpu_executor();    // executors/tpu/tpu_executor.cpp
Executor& spyre_executor();  // executors/spyre/spyre_executor.cpp

// The executor of the active target.
Executor& active_executor();

}  // namespace tpu_eager
