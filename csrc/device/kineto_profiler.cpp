// libkineto child profiler of the simulated device (see kineto_profiler.h).
#ifndef USE_KINETO
#define USE_KINETO 1  // torch's wheels are built with kineto; its registry header needs the flag
#endif
// libkineto's activity metadata formats with fmt, whose compiled part torch does
// not export: this file compiles it inline (hidden, like all our symbols).
#define FMT_HEADER_ONLY 1

#include "device/kineto_profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <IActivityProfiler.h>
#include <libkineto.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include "device/device.h"

namespace tpu_eager {
namespace kineto {

namespace detail {
std::atomic<bool> g_recording{false};
}

namespace {

thread_local int64_t t_flush_stream = 0;
// Simulated seconds at which the running flush's next kernel starts (FlushLane).
thread_local double t_flush_clock_s = 0;
// note_kernel_schedule's values for this thread's next record_kernel (schedule_s < 0: none).
struct ScheduleNote {
  std::string kernel;
  double schedule_s = -1, pipelined_s = 0, ring_s = 0, ring_latency_s = 0;
  std::vector<double> core_end_s;
};
thread_local ScheduleNote t_schedule;
// The correlation ids of the ops this thread is inside (torch.profiler pushes
// one per op it records); a kernel links to the innermost: the call that ran it.
thread_local std::vector<uint64_t> t_correlation;
// Likewise for user scopes (record_function); a collective called outside any op
// links to the innermost.
thread_local std::vector<uint64_t> t_user_correlation;

struct KernelActivity {
  enum Kind { kKernel, kCollective, kStreamWait };
  std::string name, ops;
  int device = 0;
  int64_t stream = 0;
  double start_s = 0;  // simulated seconds on the chip's clock (its stream's clock at the start)
  double sim_time_s = 0;
  uint64_t correlation = 0;
  double flops = 0, bytes = 0;
  Kind kind = kKernel;
  CollectiveArgs coll;             // collective only
  ScheduleNote schedule;           // kernel with an executed tile schedule (Spyre) only
  int64_t waited_stream = 0;       // stream wait only
  uint64_t event_correlation = 0;  // stream wait only: the op that recorded the event
};

// What the running session collected; guarded by g_mu.
std::mutex g_mu;
std::vector<KernelActivity> g_activities;
std::unordered_map<uint64_t, uint64_t> g_op_correlation;  // queue op number -> correlation id (note_op)
int64_t g_session_start_ns = 0;                           // host time the running session started

// Where each activity lies on the trace, ns since the Unix epoch: chip d's
// simulated time t at anchor_ns + (t - t0_d), t0_d the earliest simulated start
// among the chip's kernels and collectives; as long as its simulated time (at
// least 1 ns). A stream wait starts no earlier than t0_d: a stream idle since
// long before the session (an interconnect stream's clock before its first
// collective) does not stretch the trace back to when it was last busy. An
// activity starts no earlier than the previous one (in simulated time) of its
// (chip, stream) ended, so that rounding to ns never makes one stream's
// activities overlap. Returns (start, end) per activity, in the order of `acts`.
std::vector<std::pair<int64_t, int64_t>> lay_out(const std::vector<KernelActivity>& acts, int64_t anchor_ns) {
  std::map<int, double> t0, t0_waits;  // chip -> earliest start of its work, of its waits
  for (const KernelActivity& k : acts) {
    auto& first = k.kind == KernelActivity::kStreamWait ? t0_waits : t0;
    const auto it = first.find(k.device);
    if (it == first.end())
      first[k.device] = k.start_s;
    else
      it->second = std::min(it->second, k.start_s);
  }
  for (const auto& w : t0_waits) t0.insert(w);  // a chip with nothing but waits: from its first wait
  std::vector<size_t> order(acts.size());       // by lane, then simulated start (collection order on ties)
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const KernelActivity &x = acts[a], &y = acts[b];
    return std::tie(x.device, x.stream, x.start_s) < std::tie(y.device, y.stream, y.start_s);
  });
  std::vector<std::pair<int64_t, int64_t>> out(acts.size());
  int64_t lane_end = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    const KernelActivity& k = acts[order[j]];
    const bool new_lane = j == 0 || acts[order[j - 1]].device != k.device || acts[order[j - 1]].stream != k.stream;
    const double from = std::max(k.start_s, t0[k.device]);
    const double end = k.start_s + k.sim_time_s;
    int64_t start = anchor_ns + static_cast<int64_t>(std::llround((from - t0[k.device]) * 1e9));
    const int64_t dur = std::max<int64_t>(1, static_cast<int64_t>(std::llround((end - from) * 1e9)));
    if (!new_lane) start = std::max(start, lane_end);
    out[order[j]] = {start, start + dur};
    lane_end = start + dur;
  }
  return out;
}

const std::set<libkineto::ActivityType>& device_activities() {
  static const std::set<libkineto::ActivityType> s{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                   libkineto::ActivityType::CUDA_SYNC};
  return s;
}

class TpuProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  TpuProfilerSession() : buffer_(std::make_unique<libkineto::CpuTraceBuffer>()) {
    buffer_->span = libkineto::TraceSpan(0, 0, "tpu (simulated)");
    buffer_->gpuOpCount = -1;
  }
  ~TpuProfilerSession() override {
    if (started_ && !stopped_) stop();
  }

  void start() override {
    std::lock_guard<std::mutex> lock(g_mu);
    g_activities.clear();
    g_op_correlation.clear();
    g_session_start_ns = now_ns();
    started_ = true;
    status_ = libkineto::TraceStatus::RECORDING;
    detail::g_recording.store(true);
  }

  void stop() override {
    detail::g_recording.store(false);
    std::lock_guard<std::mutex> lock(g_mu);
    collected_.swap(g_activities);
    anchor_ns_ = g_session_start_ns;
    g_activities.clear();
    g_op_correlation.clear();
    stopped_ = true;
    status_ = libkineto::TraceStatus::READY;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { process(logger, nullptr); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    process(logger, &linked);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Chip 0's track; further chips' tracks carry their resource names.
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "tpu:0 (simulated)", "tpu:0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& lane : lanes_)
      out.push_back(
          libkineto::ResourceInfo{lane.second, lane.second, lane.first,
                                  "tpu:" + std::to_string(lane.first) + " stream " + std::to_string(lane.second)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override { t_user_correlation.push_back(id); }
  void popUserCorrelationId() override {
    if (!t_user_correlation.empty()) t_user_correlation.pop_back();
  }

 private:
  void process(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback* linked) {
    if (!buffer_) return;
    // An activity's own id is what the trace prints as its "External id" when it
    // links to no op: numbered from 2^30, clear of the ids torch.profiler gives
    // its ops (1, 2, ...), so that no tool pairs it with an unrelated op.
    int32_t next_id = 1 << 30;
    const std::vector<std::pair<int64_t, int64_t>> spans = lay_out(collected_, anchor_ns_);
    for (size_t i = 0; i < collected_.size(); ++i) {
      const KernelActivity& k = collected_[i];
      const bool wait = k.kind == KernelActivity::kStreamWait;
      buffer_->emplace_activity(buffer_->span,
                                wait ? libkineto::ActivityType::CUDA_SYNC : libkineto::ActivityType::CONCURRENT_KERNEL,
                                k.name);
      auto& act = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
      act.device = k.device;
      act.resource = static_cast<int32_t>(k.stream);
      act.startTime = spans[i].first;
      act.endTime = spans[i].second;
      act.id = next_id++;
      // A wait is no work of the op that asked for it: linked to none, so that
      // key_averages() charges its stall to no op's device time.
      if (!wait && linked && *linked && k.correlation != 0) act.linked = (*linked)(static_cast<int32_t>(k.correlation));
      act.addMetadata("device", k.device);
      act.addMetadata("stream", k.stream);
      if (wait) {
        act.addMetadataQuoted("kind", "stream_wait");
        act.addMetadata("wait_on_stream", k.waited_stream);
        act.addMetadata("wait_on_event_record_corr_id", k.event_correlation);
        act.addMetadata("correlation", k.correlation);
        act.addMetadata("sim_start_us", k.start_s * 1e6);
        act.addMetadataQuoted("clock", "simulated device time");
        lanes_.insert({k.device, k.stream});
        act.log(logger);
        continue;
      }
      if (k.kind == KernelActivity::kCollective) {
        act.addMetadataQuoted("kind", "collective");
        act.addMetadataQuoted("algorithm", k.coll.algorithm);
        act.addMetadata("group_size", k.coll.group_size);
        act.addMetadata("bytes", k.coll.nbytes);
        act.addMetadata("hops", k.coll.hops);
        act.addMetadata("bytes_per_link", k.coll.bytes_per_link);
      } else {
        act.addMetadataQuoted("kind", "kernel");
        act.addMetadataQuoted("ops", k.ops);
        act.addMetadata("flops", k.flops);
        act.addMetadata("bytes", k.bytes);
        if (k.schedule.schedule_s >= 0) {
          act.addMetadata("schedule_time_us", k.schedule.schedule_s * 1e6);
          act.addMetadata("pipelined_us", k.schedule.pipelined_s * 1e6);
          act.addMetadata("ring_us", k.schedule.ring_s * 1e6);
          act.addMetadata("ring_latency_us", k.schedule.ring_latency_s * 1e6);
          std::string cores = "[";
          for (size_t c = 0; c < k.schedule.core_end_s.size(); ++c)
            cores += (c ? "," : "") + std::to_string(k.schedule.core_end_s[c] * 1e6);
          act.addMetadata("core_busy_us", cores + "]");
        }
      }
      act.addMetadata("sim_time_us", k.sim_time_s * 1e6);
      act.addMetadata("sim_start_us", k.start_s * 1e6);
      act.addMetadataQuoted("clock", "simulated device time");
      lanes_.insert({k.device, k.stream});
      act.log(logger);
    }
    if (!spans.empty()) {  // lanes overlap: the span is the earliest start to the latest end
      buffer_->span.startTime = spans.front().first;
      buffer_->span.endTime = spans.front().second;
      for (const auto& sp : spans) {
        buffer_->span.startTime = std::min<int64_t>(buffer_->span.startTime, sp.first);
        buffer_->span.endTime = std::max<int64_t>(buffer_->span.endTime, sp.second);
      }
    }
    collected_.clear();
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<KernelActivity> collected_;
  std::set<std::pair<int, int64_t>> lanes_;
  int64_t anchor_ns_ = 0;  // host time the session started: where each chip's earliest activity lies
  bool started_ = false, stopped_ = false;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return device_activities(); }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // Only when the session asks for device kernels (ProfilerActivity.PrivateUse1).
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<TpuProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"tpu_simulated"};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

// Adds `k` to the running session's activities (none when no session records).
void collect(KernelActivity k) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!detail::g_recording.load()) return;
  g_activities.push_back(std::move(k));
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t current_correlation() { return recording() && !t_correlation.empty() ? t_correlation.back() : 0; }

void note_op(uint64_t seq) {
  const uint64_t correlation = current_correlation();
  if (correlation == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (detail::g_recording.load()) g_op_correlation[seq] = correlation;
}

void record_kernel(const std::string& name, const std::string& ops, double sim_time_s, double flops, double bytes,
                   const std::vector<uint64_t>& seqs) {
  KernelActivity k;
  k.name = name;
  k.ops = ops;
  k.device = current_device_index() < 0 ? 0 : current_device_index();
  k.stream = t_flush_stream;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (uint64_t seq : seqs) {  // each op runs once: its entry is dropped here
      const auto it = g_op_correlation.find(seq);
      if (it == g_op_correlation.end()) continue;
      if (k.correlation == 0) k.correlation = it->second;
      g_op_correlation.erase(it);
    }
  }
  k.flops = flops;
  k.bytes = bytes;
  k.start_s = t_flush_clock_s;
  k.sim_time_s = sim_time_s;
  if (t_schedule.kernel == name) k.schedule = std::move(t_schedule);
  t_schedule = ScheduleNote();
  t_flush_clock_s += sim_time_s;  // the flush's next kernel starts after this one
  collect(std::move(k));
}

void note_kernel_schedule(const std::string& kernel, double schedule_s, double pipelined_s,
                          const std::vector<double>& core_end_s, double ring_s, double ring_latency_s) {
  t_schedule.kernel = kernel;
  t_schedule.schedule_s = schedule_s;
  t_schedule.pipelined_s = pipelined_s;
  t_schedule.ring_s = ring_s;
  t_schedule.ring_latency_s = ring_latency_s;
  t_schedule.core_end_s = core_end_s;
}

void record_collective(int device, int64_t stream, const std::string& op, double start_s, double sim_time_s,
                       const CollectiveArgs& args) {
  if (!recording()) return;
  KernelActivity k;
  k.name = "ici::" + op;
  k.ops = op;
  k.device = device;
  k.stream = stream;
  k.correlation = !t_correlation.empty()        ? t_correlation.back()
                  : !t_user_correlation.empty() ? t_user_correlation.back()
                                                : 0;
  k.start_s = start_s;
  k.sim_time_s = sim_time_s;
  k.kind = KernelActivity::kCollective;
  k.coll = args;
  collect(std::move(k));
}

void record_stream_wait(int device, int64_t stream, int64_t waited_stream, double from_s, double event_s,
                        uint64_t event_correlation) {
  if (!recording()) return;
  KernelActivity k;
  k.name = "Stream Wait Event";
  k.ops = "wait_event";
  k.device = device;
  k.stream = stream;
  k.kind = KernelActivity::kStreamWait;
  k.correlation = current_correlation();
  k.waited_stream = waited_stream;
  k.event_correlation = event_correlation;
  k.start_s = from_s;
  k.sim_time_s = std::max(0.0, event_s - from_s);
  collect(std::move(k));
}

FlushLane::FlushLane(int64_t stream, double start_s) : prev_stream_(t_flush_stream), prev_clock_s_(t_flush_clock_s) {
  t_flush_stream = stream;
  t_flush_clock_s = start_s;
}
FlushLane::~FlushLane() {
  t_flush_stream = prev_stream_;
  t_flush_clock_s = prev_clock_s_;
}

}  // namespace kineto
}  // namespace tpu_eager
