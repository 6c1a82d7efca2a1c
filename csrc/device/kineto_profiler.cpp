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
#include <map>
#include <memory>
#include <mutex>
#include <set>
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
// note_kernel_schedule's values for this thread's next record_kernel (schedule_s < 0: none).
struct ScheduleNote {
  std::string kernel;
  double schedule_s = -1, pipelined_s = 0;
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
  int64_t start_ns = 0, end_ns = 0;
  uint64_t correlation = 0;
  double flops = 0, bytes = 0, sim_time_s = 0;
  Kind kind = kKernel;
  CollectiveArgs coll;             // collective only
  ScheduleNote schedule;           // kernel with an executed tile schedule (Spyre) only
  int64_t waited_stream = 0;       // stream wait only
  uint64_t event_correlation = 0;  // stream wait only: the op that recorded the event
};

// What the running session collected; guarded by g_mu.
std::mutex g_mu;
std::vector<KernelActivity> g_activities;
std::map<std::pair<int, int64_t>, int64_t> g_lane_end;    // (chip, stream) -> end of its last kernel, ns
std::unordered_map<uint64_t, uint64_t> g_op_correlation;  // queue op number -> correlation id (note_op)

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
    g_lane_end.clear();
    g_op_correlation.clear();
    started_ = true;
    status_ = libkineto::TraceStatus::RECORDING;
    detail::g_recording.store(true);
  }

  void stop() override {
    detail::g_recording.store(false);
    std::lock_guard<std::mutex> lock(g_mu);
    collected_.swap(g_activities);
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
    for (const KernelActivity& k : collected_) {
      const bool wait = k.kind == KernelActivity::kStreamWait;
      buffer_->emplace_activity(buffer_->span,
                                wait ? libkineto::ActivityType::CUDA_SYNC : libkineto::ActivityType::CONCURRENT_KERNEL,
                                k.name);
      auto& act = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
      act.device = k.device;
      act.resource = static_cast<int32_t>(k.stream);
      act.startTime = k.start_ns;
      act.endTime = k.end_ns;
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
          std::string cores = "[";
          for (size_t c = 0; c < k.schedule.core_end_s.size(); ++c)
            cores += (c ? "," : "") + std::to_string(k.schedule.core_end_s[c] * 1e6);
          act.addMetadata("core_busy_us", cores + "]");
        }
      }
      act.addMetadata("sim_time_us", k.sim_time_s * 1e6);
      act.addMetadataQuoted("clock", "simulated device time");
      lanes_.insert({k.device, k.stream});
      act.log(logger);
    }
    if (!collected_.empty()) {  // lanes overlap: the span is the earliest start to the latest end
      buffer_->span.startTime = collected_.front().start_ns;
      buffer_->span.endTime = collected_.front().end_ns;
      for (const KernelActivity& k : collected_) {
        buffer_->span.startTime = std::min<int64_t>(buffer_->span.startTime, k.start_ns);
        buffer_->span.endTime = std::max<int64_t>(buffer_->span.endTime, k.end_ns);
      }
    }
    collected_.clear();
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<KernelActivity> collected_;
  std::set<std::pair<int, int64_t>> lanes_;
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

// Puts `k` on its (chip, stream) lane: it starts when the host issued it or
// when the lane's previous activity ended, whichever is later, and lasts its
// simulated time (at least 1 ns, so an activity of no simulated work still
// shows on the track).
void place(KernelActivity k, int64_t host_start_ns) {
  const int64_t dur = std::max<int64_t>(1, static_cast<int64_t>(k.sim_time_s * 1e9 + 0.5));
  std::lock_guard<std::mutex> lock(g_mu);
  if (!detail::g_recording.load()) return;
  int64_t& lane_end = g_lane_end[{k.device, k.stream}];
  k.start_ns = std::max(host_start_ns, lane_end);
  k.end_ns = k.start_ns + dur;
  lane_end = k.end_ns;
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

void record_kernel(const std::string& name, const std::string& ops, double sim_time_s, int64_t host_start_ns,
                   double flops, double bytes, const std::vector<uint64_t>& seqs) {
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
  k.sim_time_s = sim_time_s;
  if (t_schedule.kernel == name) k.schedule = std::move(t_schedule);
  t_schedule = ScheduleNote();
  place(std::move(k), host_start_ns);
}

void note_kernel_schedule(const std::string& kernel, double schedule_s, double pipelined_s,
                          const std::vector<double>& core_end_s) {
  t_schedule.kernel = kernel;
  t_schedule.schedule_s = schedule_s;
  t_schedule.pipelined_s = pipelined_s;
  t_schedule.core_end_s = core_end_s;
}

void record_collective(int device, int64_t stream, const std::string& op, double sim_time_s, int64_t host_start_ns,
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
  k.sim_time_s = sim_time_s;
  k.kind = KernelActivity::kCollective;
  k.coll = args;
  place(std::move(k), host_start_ns);
}

int64_t stream_point(int device, int64_t stream) {
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = g_lane_end.find({device, stream});
  return it == g_lane_end.end() ? now : std::max(now, it->second);
}

void record_stream_wait(int device, int64_t stream, int64_t waited_stream, int64_t event_ns,
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
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  if (!detail::g_recording.load()) return;
  int64_t& lane_end = g_lane_end[{device, stream}];
  k.start_ns = std::max(now, lane_end);
  k.end_ns = std::max(k.start_ns + 1, event_ns);
  lane_end = k.end_ns;
  g_activities.push_back(std::move(k));
}

FlushLane::FlushLane(int64_t stream) : prev_(t_flush_stream) { t_flush_stream = stream; }
FlushLane::~FlushLane() { t_flush_stream = prev_; }

}  // namespace kineto
}  // namespace tpu_eager
