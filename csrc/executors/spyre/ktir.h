// KTIR text of the regions run on the simulated Spyre: the printed form of
// each region's KtirProgram (ktir_ir.h; format, numerics and verifier rules in
// docs/ktir.md), kept per flush for spyre.dump_ktir() and written to
// TORCH_TPU_DUMP_DIR when set.
#pragma once

#include <string>
#include <vector>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

std::string ktir_text(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                      const CardParams& card);

// The programs of the last flush run on Spyre, in run order.
std::vector<std::string> last_flush_ktir();
// Called by the Spyre executor.
void ktir_begin_flush();
void ktir_record(const std::string& name, std::string text);

}  // namespace spyre
}  // namespace tpu_eager
