// The debug report (TORCH_TPU_DEBUG, like PyTorch/XLA's PT_XLA_DEBUG_LEVEL) and the
// timers of torch_tpu_eager.metrics_report().
//
// Level 1 prints one line per flush to stderr: its cause, the ops it ran, the
// regions, compiles and cache hits, host milliseconds, and the user's Python
// file:line that triggered it. Level 2 also prints each region as it runs
// (jit/). The per-cause and per-line totals feed the summary Python prints at
// exit. Timers keep count, sum and a bounded sample of every duration.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lazy/queue.h"

namespace tpu_eager {
namespace debug {

// TORCH_TPU_DEBUG: 0 (off), 1 (flushes), 2 (flushes and regions). Read once.
int level();

// Called by flush_all after each non-empty flush: `ops` nodes ran in `seconds`
// of host time with the counters `delta`; `where` is the Python location that
// triggered it (empty off the Python thread, e.g. in backward's worker).
void on_flush(FlushReason reason, size_t ops, const Metrics& delta, double seconds, SourceLocation where);

// A timer: durations in seconds.
struct TimerStats {
  int64_t count = 0;
  double total_s = 0;
  std::vector<double> samples;  // at most kMaxSamples, a uniform sample (reservoir)
};
constexpr size_t kMaxSamples = 4096;

// Adds one duration to the named timer ("flush", "compile", "record", ...).
// `name` must live as long as the process (a string literal): the timer is
// remembered by its address.
void time(const char* name, double seconds);
// Adds `n` durations to the named timer under one lock (a flush's regions).
void time_all(const char* name, const double* seconds, size_t n);
std::vector<std::pair<std::string, TimerStats>> timers();

// Counts one call of ATen op `op` (overload name) in `category` ("cpu_fallback",
// "library_call"): metrics_report() lists them by name.
void count_op(const char* category, const std::string& op);
std::vector<std::pair<std::string, int64_t>> op_counts();  // "category.op" -> calls

// Flush totals since start or reset: per cause, and per triggering "file:line"
// (formatted here; call with the GIL free or held, not from a flush).
std::vector<std::pair<std::string, int64_t>> flushes_by_line();
void reset();

// Recompile detection: a region with the same structure (ops, dtypes, ranks,
// argument kinds) recorded at the same Python line compiled again with new
// argument values (`args`, a hash of its int/float/bool/list arguments, e.g.
// torch.arange's end) or new sizes (`dims`: the size bucket of each dim of its
// inputs from outside the region, in order). When the arguments took
// kRecompileWarnThreshold distinct values, or one dim that many buckets, the
// warn hook gets one message per line (once per process) saying whether
// mark_dynamic helps: only for sizes, since argument values are part of the
// cache key. Counting distinct values per dim (not compiles) keeps regions
// that share a line but differ in a fixed size (the Linear layers of a model,
// all recorded in torch's linear.py) from adding up.
constexpr int64_t kRecompileWarnThreshold = 8;
void on_compile(uint64_t structure, const std::vector<uint64_t>& dims, uint64_t args, SourceLocation where,
                const std::string& region);

// Receives a recompile warning: its text and the user's "file" and line it names.
// Installed by the Python module (a RecompileWarning); without it, stderr.
using WarnHook = void (*)(const std::string& message, const std::string& file, int line);
void set_warn_hook(WarnHook hook);

}  // namespace debug
}  // namespace tpu_eager
