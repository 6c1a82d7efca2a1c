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

  // The target's storage numerics, for values that reach a device storage
  // outside a region (host copies, ops run eagerly, deterministic fills).
  // Defaults: the storage holds host values as they are.
  //
  // Checks a host value (CPU, already in the destination's dtype) before a
  // copy writes it into a device storage; raises (e.g. OverflowError for an
  // int64 outside int32 on Spyre) before anything is written. `what` names the copy.
  virtual void check_host_value(const at::Tensor& value, const char* what) {}
  // Rewrites values just written into a device storage (`written`, a CPU
  // view of the storage) in the target's storage format (Spyre: 16-bit floats as df16).
  virtual void to_storage_format(const at::Tensor& written) {}
  // True when the target applies its storage numerics to ops run eagerly
  // (then after_eager_op is called with the op's returns).
  virtual bool has_eager_numerics() const { return false; }
  // Applies them to `returns` (CPU tensors, fresh results and written
  // arguments of an op run at record time); `what` names the op and its line.
  virtual void after_eager_op(std::vector<c10::IValue>& returns, const std::string& what) {}
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
