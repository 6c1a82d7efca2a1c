// KTIR-like tile programs of the simulated Spyre (issue 6, item 3): each
// fused region printed as a kernel over a grid of cores with memory views,
// access tiles and its op list. The text format (docs/ktir.md):
//
//   ktir.kernel @<region name> grid=[<cores>] split=dim0 rows_per_core=<r> cores_used=<u> {
//     %<i> = view <HBM|LX> <dtype> offset=<elements> sizes=[..] strides=[..]
//     ...
//     tile %<i> sizes=[..] at=[core*<r>, 0, ..]     (split along dim 0 over the cores)
//     tile %<i> sizes=[..] at=[0, ..]               (replicated: every core reads it whole)
//     ...
//     %<out> = <op>.<overload>(<args>)              (or (%a, %b) = ..., or no "=" for none)
//   }
//
// Views are numbered in order of first use by the ops. HBM: a value read
// from or written to device memory; LX: a region temporary that stays in
// the cores' scratchpads. dtype is the device dtype: f32, df16 (float16 and
// bfloat16), i32 (int64), else c10's name. The grid (layout.h) splits dim 0
// of the last op's first result (its "rows"), or of the input of a reduction
// across those rows (header suffix " reduce=ring"), into ceil(rows / cores) rows per core;
// a view whose dim 0 equals those rows is split the same way, any other
// view is replicated. A rank-0 anchor is not split (rows_per_core=1,
// cores_used=1). Non-tensor arguments are printed as Python literals.
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
