#include "lazy/debug_report.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <random>

#include "device/env.h"

namespace tpu_eager {
namespace debug {
namespace {

struct State {
  std::mutex mu;
  std::map<std::string, TimerStats> timers;
  std::map<int32_t, int64_t> flushes_by_location;  // SourceLocation id -> flushes
  std::map<std::string, int64_t> op_counts;        // "category.op" -> calls
  std::minstd_rand rng{12345};
};

State& S() {
  static auto* s = new State();  // never destroyed: flushes may run during interpreter shutdown
  return *s;
}

void add_sample(TimerStats& t, double seconds, std::minstd_rand& rng) {
  t.count++;
  t.total_s += seconds;
  if (t.samples.size() < kMaxSamples) {
    t.samples.push_back(seconds);
    return;
  }
  // Reservoir sampling: every duration so far is kept with probability kMaxSamples / count.
  const auto j = std::uniform_int_distribution<int64_t>(0, t.count - 1)(rng);
  if (j < static_cast<int64_t>(kMaxSamples)) t.samples[j] = seconds;
}

}  // namespace

int level() {
  static const int l = static_cast<int>(env::get_int("TORCH_TPU_DEBUG"));
  return l;
}

void time(const char* name, double seconds) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  add_sample(s.timers[name], seconds, s.rng);
}

void on_flush(FlushReason reason, size_t ops, const Metrics& delta, double seconds, SourceLocation where) {
  time("flush", seconds);
  if (delta.compile_time_s > 0) time("compile", delta.compile_time_s);
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    s.flushes_by_location[where.id]++;
  }
  if (level() < 1) return;
  const std::string line = where.str();
  std::fprintf(stderr, "[tpu debug] flush: %s, %zu ops, %lld regions, %lld compiled, %lld cache hits, %.3f ms, at %s\n",
               flush_reason_name(reason), ops, static_cast<long long>(delta.regions_run),
               static_cast<long long>(delta.compiles), static_cast<long long>(delta.cache_hits), seconds * 1e3,
               line.empty() ? "(no Python frame: autograd or another C++ thread)" : line.c_str());
}

void count_op(const char* category, const std::string& op) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.op_counts[std::string(category) + "." + op]++;
}

std::vector<std::pair<std::string, int64_t>> op_counts() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.op_counts.begin(), s.op_counts.end()};
}

std::vector<std::pair<std::string, TimerStats>> timers() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.timers.begin(), s.timers.end()};
}

std::vector<std::pair<std::string, int64_t>> flushes_by_line() {
  std::map<int32_t, int64_t> by_id;
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    by_id = s.flushes_by_location;
  }
  std::map<std::string, int64_t> by_line;  // distinct ids can format to one line
  for (const auto& [id, n] : by_id) {
    SourceLocation loc;
    loc.id = id;
    const std::string line = loc.str();
    by_line[line.empty() ? "(no Python frame)" : line] += n;
  }
  return {by_line.begin(), by_line.end()};
}

void reset() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timers.clear();
  s.flushes_by_location.clear();
  s.op_counts.clear();
}

}  // namespace debug
}  // namespace tpu_eager
