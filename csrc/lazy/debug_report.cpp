#include "lazy/debug_report.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "device/env.h"
#include "device/spin_lock.h"

namespace tpu_eager {
namespace debug {
namespace {

struct State {
  // A spin lock (device/spin_lock.h): every flush takes it for its timers
  // (a few map and vector updates); a std::mutex pair was ~55 instructions each.
  SpinLock mu;
  std::map<std::string, TimerStats> timers;
  // The timers time() found last by the address of their name (a literal:
  // "flush", "region_run" every flush), before a map lookup by string.
  static constexpr int kRecentTimers = 4;
  const char* recent_names[kRecentTimers] = {};
  TimerStats* recent_timers[kRecentTimers] = {};
  int recent_next = 0;
  std::map<int32_t, int64_t> flushes_by_location;  // SourceLocation id -> flushes
  std::map<std::string, int64_t> op_counts;        // "category.op" -> calls
  std::minstd_rand rng{12345};
  // Distinct values seen (each set stops growing at kRecompileWarnThreshold).
  struct Recompiles {
    std::set<uint64_t> args;
    std::vector<std::set<uint64_t>> dims;  // per input dim: its size buckets
  };
  std::map<std::pair<uint64_t, int32_t>, Recompiles> recompiles;  // (structure, location id)
  std::set<std::string> warned_lines;                             // never cleared: once per process
};
constexpr size_t kMaxRecompileEntries = 1 << 14;  // bounds the map in programs with many region kinds
std::atomic<WarnHook> g_warn_hook{nullptr};

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

namespace {
// time() under the state's lock, held by the caller.
void time_locked(State& s, const char* name, double seconds) {
  TimerStats* t = nullptr;
  for (int k = 0; k < State::kRecentTimers; ++k)
    if (s.recent_names[k] == name) t = s.recent_timers[k];
  if (t == nullptr) {
    t = &s.timers[name];  // std::map: the entry stays where it is until reset()
    s.recent_names[s.recent_next] = name;
    s.recent_timers[s.recent_next] = t;
    s.recent_next = (s.recent_next + 1) % State::kRecentTimers;
  }
  add_sample(*t, seconds, s.rng);
}

}  // namespace

void time(const char* name, double seconds) {
  State& s = S();
  std::lock_guard<SpinLock> lock(s.mu);
  time_locked(s, name, seconds);
}

void time_all(const char* name, const double* seconds, size_t n) {
  if (n == 0) return;
  State& s = S();
  std::lock_guard<SpinLock> lock(s.mu);
  for (size_t i = 0; i < n; ++i) time_locked(s, name, seconds[i]);
}

void on_flush(FlushReason reason, size_t ops, const Metrics& delta, double seconds, SourceLocation where) {
  {
    State& s = S();
    std::lock_guard<SpinLock> lock(s.mu);  // once for the timers and the count by line
    time_locked(s, "flush", seconds);
    if (delta.compile_time_s > 0) time_locked(s, "compile", delta.compile_time_s);
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
  std::lock_guard<SpinLock> lock(s.mu);
  s.op_counts[std::string(category) + "." + op]++;
}

std::vector<std::pair<std::string, int64_t>> op_counts() {
  State& s = S();
  std::lock_guard<SpinLock> lock(s.mu);
  return {s.op_counts.begin(), s.op_counts.end()};
}

std::vector<std::pair<std::string, TimerStats>> timers() {
  State& s = S();
  std::lock_guard<SpinLock> lock(s.mu);
  return {s.timers.begin(), s.timers.end()};
}

std::vector<std::pair<std::string, int64_t>> flushes_by_line() {
  std::map<int32_t, int64_t> by_id;
  {
    State& s = S();
    std::lock_guard<SpinLock> lock(s.mu);
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

void set_warn_hook(WarnHook hook) { g_warn_hook.store(hook); }

void on_compile(uint64_t structure, const std::vector<uint64_t>& dims, uint64_t args, SourceLocation where,
                const std::string& region) {
  if (where.empty()) return;  // no user line to name
  State& s = S();
  bool args_varied = false;
  int varied_dim = -1;
  {
    std::lock_guard<SpinLock> lock(s.mu);
    auto it = s.recompiles.find({structure, where.id});
    if (it == s.recompiles.end()) {
      if (s.recompiles.size() >= kMaxRecompileEntries) return;
      it = s.recompiles.emplace(std::make_pair(structure, where.id), State::Recompiles{}).first;
      it->second.dims.resize(dims.size());
    }
    auto& r = it->second;
    if (r.dims.size() != dims.size()) return;  // a hash collision of two structures
    const auto n = static_cast<size_t>(kRecompileWarnThreshold);
    if (r.args.size() < n) args_varied = r.args.insert(args).second && r.args.size() == n;
    for (size_t d = 0; d < dims.size(); ++d)
      if (r.dims[d].size() < n && r.dims[d].insert(dims[d]).second && r.dims[d].size() == n && varied_dim < 0)
        varied_dim = static_cast<int>(d);
    if (!args_varied && varied_dim < 0) return;
  }
  const std::string line = where.str();  // takes the GIL: outside our lock
  if (line.empty()) return;
  {
    std::lock_guard<SpinLock> lock(s.mu);
    if (!s.warned_lines.insert(line).second) return;
  }
  std::string msg =
      "region " + region + " recorded at " + line + " was compiled for " + std::to_string(kRecompileWarnThreshold);
  if (args_varied) {
    msg +=
        " different values of its size or index arguments (e.g. torch.arange(n), a view's shape, a dim): "
        "argument values are part of the compiled region's key, so each new value compiles again. "
        "torch_tpu_eager.mark_dynamic(tensor, dim, lower, upper) buckets tensor sizes only and would not "
        "help here; keep these arguments the same across steps (e.g. pad to a fixed length) to compile once.";
  } else {
    msg +=
        " different sizes of one dim of its inputs (power-of-two buckets): mark that dim of the input with "
        "torch_tpu_eager.mark_dynamic(tensor, dim, lower, upper) to compile once for the whole range.";
  }
  const size_t colon = line.rfind(':');
  const std::string file = line.substr(0, colon);
  const int lineno = colon == std::string::npos ? 0 : std::atoi(line.c_str() + colon + 1);
  if (WarnHook hook = g_warn_hook.load()) {
    hook(msg, file, lineno);
  } else {
    std::fprintf(stderr, "torch_tpu_eager RecompileWarning: %s\n", msg.c_str());
  }
}

void reset() {
  State& s = S();
  std::lock_guard<SpinLock> lock(s.mu);
  s.recompiles.clear();
  s.timers.clear();
  for (int k = 0; k < State::kRecentTimers; ++k) {
    s.recent_names[k] = nullptr;
    s.recent_timers[k] = nullptr;
  }
  s.flushes_by_location.clear();
  s.op_counts.clear();
}

}  // namespace debug
}  // namespace tpu_eager
