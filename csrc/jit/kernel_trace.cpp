// Kernel trace buffer of the profiler.
#include "jit/kernel_trace.h"

#include <mutex>

namespace tpu_eager {
namespace jit {
namespace detail {
std::atomic<int> g_trace_depth{0};
}

namespace {
std::mutex g_mu;
std::vector<KernelRecord>& g_records = *new std::vector<KernelRecord>();  // never destroyed: flushes may run at exit
double g_clock_s = 0;  // simulated timeline, advanced only while a profiler is active
// The executor's tiling of the region running on this thread, until its record is made.
thread_local TilingRecord t_pending_tiling;
}  // namespace

std::pair<size_t, double> trace_begin() {
  std::lock_guard<std::mutex> lock(g_mu);
  detail::g_trace_depth.fetch_add(1);
  return {g_records.size(), g_clock_s};
}

std::vector<KernelRecord> trace_end(size_t first) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<KernelRecord> out;
  if (first < g_records.size()) out.assign(g_records.begin() + static_cast<std::ptrdiff_t>(first), g_records.end());
  if (detail::g_trace_depth.fetch_sub(1) == 1) g_records.clear();
  return out;
}

void trace_attach_tiling(TilingRecord&& t) { t_pending_tiling = std::move(t); }

void trace_record(KernelRecord&& r) {
  r.tiling = std::move(t_pending_tiling);
  t_pending_tiling = TilingRecord();
  std::lock_guard<std::mutex> lock(g_mu);
  if (detail::g_trace_depth.load() == 0) return;  // the profiler ended while this region ran
  r.start_s = g_clock_s;
  g_clock_s += r.stats.sim_time_s;
  g_records.push_back(std::move(r));
}

size_t trace_size() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_records.size();
}

}  // namespace jit
}  // namespace tpu_eager
