// The job plan of a flush on the simulated Spyre (issue 6, item 5): a
// SpyreCode-like manifest of the flush's work as ordered steps
//   H2D     copy a host tensor into device memory (the job's inputs),
//   Compute run one region's kernel (its KTIR program and schedule),
//   D2H     copy a result back to the host (the job's outputs),
// over symbolic tensor arguments "%arg<k>" (one per device storage the flush
// reads or writes, numbered in order of first use). Each argument records its
// device dtype, element count and stick layout; at launch (when its first
// Compute step runs) it is bound ("patched") to a simulated device address:
// consecutive stick-aligned addresses from 0 in argument order.
//
// H2D steps come right before the first Compute step that reads an argument
// the flush did not write before; D2H steps follow the last Compute step,
// one per argument any step wrote. Temporaries kept in LX are not arguments.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

struct JobArg {
  std::string symbol;          // "%arg<k>"
  std::string dtype;           // device dtype: f32, df16, i32, ...
  int64_t numel = 0;           // elements of the storage
  std::vector<int64_t> sizes;  // sizes of the first view that used it
  int64_t stick_elems = 0;     // elements per 128-byte stick
  int64_t sticks = 0;          // sticks of the flat storage (numel padded to whole sticks)
  int64_t bytes = 0;           // sticks * stick bytes
  int64_t address = -1;        // simulated device address once patched, else -1
};

struct JobStep {
  std::string kind;                 // "H2D", "Compute" or "D2H"
  std::string arg;                  // H2D/D2H: the argument's symbol
  int64_t bytes = 0;                // H2D/D2H: bytes copied
  std::string kernel;               // Compute: the region's kernel name
  int64_t region = -1;              // Compute: index into dump_ktir() / last_schedule() of the flush
  std::vector<std::string> reads;   // Compute: arguments read from device memory
  std::vector<std::string> writes;  // Compute: arguments written to device memory
  // Compute: the launch's binding of the kernel's symbolic sizes (KTIR
  // symbols s0, s1, ... and, with symbolic rows, rows_per_core and cores_used).
  std::vector<std::pair<std::string, int64_t>> binding;
  // Compute: which of the kernel's compiled programs the launch bound (its
  // number, counted from 0 in order of compiling) and how many it holds.
  int64_t program = 0, programs = 1;
};

struct JobPlan {
  std::vector<JobArg> args;
  std::vector<JobStep> steps;
  int64_t device_bytes = 0;  // sum of the arguments' bytes
};

void job_plan_begin_flush();
// Adds region `index` (kernel `kernel`) of the flush: its H2D and Compute
// steps, and patches its arguments.
void job_plan_add_region(const std::string& kernel, const Region& region, const std::vector<Node>& graph,
                         const CardParams& card);
struct RegionLayout;
// The same with the region's layout (layout.h) already computed.
void job_plan_add_region(const std::string& kernel, const RegionLayout& layout, const CardParams& card);
// Sets the binding of the last Compute step added, and the program it bound
// (number `program` of the kernel's `programs`).
void job_plan_bind_last(std::vector<std::pair<std::string, int64_t>> binding, int64_t program, int64_t programs);
// The plan of the last flush run on Spyre, with its D2H steps.
JobPlan last_job_plan();

}  // namespace spyre
}  // namespace tpu_eager
