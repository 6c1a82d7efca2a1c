// The job plan of a flush (see job_plan.h).
#include "executors/spyre/job_plan.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "executors/spyre/cost_model.h"
#include "executors/spyre/layout.h"

namespace tpu_eager {
namespace spyre {
namespace {

struct State {
  JobPlan plan;
  std::map<const DeferredStorage*, int> arg_of;  // storage -> index into plan.args
  std::set<int> written;                         // args some Compute step wrote, in arg order
  std::vector<int> write_order;                  // first-write order (D2H order)
  int64_t next_address = 0;
  int64_t regions = 0;
};

std::mutex g_mu;
State& state() {
  static auto* s = new State();  // never destroyed: flushes may run during shutdown
  return *s;
}

}  // namespace

void job_plan_begin_flush() {
  std::lock_guard<std::mutex> lock(g_mu);
  state() = State();
}

void job_plan_add_region(const std::string& kernel, const Region& region, const std::vector<Node>& graph,
                         const CardParams& card) {
  job_plan_add_region(kernel, region_layout(region, graph, card), card);
}

void job_plan_add_region(const std::string& kernel, const RegionLayout& L, const CardParams& card) {
  std::lock_guard<std::mutex> lock(g_mu);
  State& st = state();
  const int64_t stick = std::max<int64_t>(1, card.stick_bytes);
  auto arg_for = [&](const TensorRef& r) {
    const DeferredStorage* s = r.storage.get();
    auto it = st.arg_of.find(s);
    if (it != st.arg_of.end()) return it->second;
    JobArg a;
    a.symbol = "%arg" + std::to_string(st.plan.args.size());
    a.dtype = device_dtype_name(r.dtype);
    a.numel = static_cast<int64_t>(s->nbytes / std::max<size_t>(1, c10::elementSize(r.dtype)));
    a.sizes = r.sizes().vec();
    a.stick_elems = stick_elems(r.dtype, card);
    a.sticks = (a.numel + a.stick_elems - 1) / a.stick_elems;
    a.bytes = a.sticks * stick;
    st.plan.args.push_back(a);
    const int k = static_cast<int>(st.plan.args.size()) - 1;
    st.arg_of.emplace(s, k);
    return k;
  };
  JobStep compute;
  compute.kind = "Compute";
  compute.kernel = kernel;
  compute.region = st.regions++;
  std::set<int> reads, writes;
  for (const auto& v : L.views) {
    if (v.lx) continue;
    const int k = arg_for(*v.ref);
    if (v.loaded && !reads.count(k)) {
      // First read of a value the flush has not produced: the host copies it in.
      const bool known =
          st.written.count(k) || std::any_of(st.plan.steps.begin(), st.plan.steps.end(), [&](const JobStep& s) {
            return s.kind == "H2D" && s.arg == st.plan.args[k].symbol;
          });
      if (!known) st.plan.steps.push_back({"H2D", st.plan.args[k].symbol, st.plan.args[k].bytes});
      reads.insert(k);
      compute.reads.push_back(st.plan.args[k].symbol);
    }
    if (v.stored && !writes.count(k)) {
      writes.insert(k);
      compute.writes.push_back(st.plan.args[k].symbol);
      if (st.written.insert(k).second) st.write_order.push_back(k);
    }
  }
  // Launch: bind the arguments this step introduced to device addresses.
  for (JobArg& a : st.plan.args) {
    if (a.address >= 0) continue;
    a.address = st.next_address;
    st.next_address += a.bytes;
    st.plan.device_bytes += a.bytes;
  }
  st.plan.steps.push_back(std::move(compute));
}

void job_plan_bind_last(std::vector<std::pair<std::string, int64_t>> binding, int64_t program, int64_t programs) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& steps = state().plan.steps;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (it->kind == "Compute") {
      it->binding = std::move(binding);
      it->program = program;
      it->programs = programs;
      return;
    }
}

JobPlan last_job_plan() {
  std::lock_guard<std::mutex> lock(g_mu);
  const State& st = state();
  JobPlan p = st.plan;
  for (int k : st.write_order) p.steps.push_back({"D2H", p.args[k].symbol, p.args[k].bytes});
  return p;
}

}  // namespace spyre
}  // namespace tpu_eager
