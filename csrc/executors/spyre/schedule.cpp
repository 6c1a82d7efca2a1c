// The dataflow schedule of a region (see schedule.h).
#include "executors/spyre/schedule.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>

#include <c10/util/Exception.h>

#include "executors/spyre/cost_model.h"
#include "executors/spyre/layout.h"

namespace tpu_eager {
namespace spyre {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

// One view's share on a core, in rows of whole sticks.
struct Share {
  int64_t rows = 1;        // dim-0 rows (1 for rank <= 1)
  int64_t row_sticks = 0;  // sticks of one row
  int64_t sticks() const { return rows * row_sticks; }
  // Sticks of one of n tiles: whole rows while n <= rows, else parts of rows.
  int64_t tile_sticks(int64_t n) const { return n <= rows ? ceil_div(rows, n) * row_sticks : ceil_div(sticks(), n); }
};

Share share_of(const LayoutView& v, const RegionLayout& L, const CardParams& card) {
  const TensorRef& r = *v.ref;
  const int64_t se = stick_elems(r.dtype, card);
  Share s;
  if (r.sizes().empty()) {
    s.row_sticks = 1;
  } else if (r.sizes().size() == 1) {
    s.row_sticks = ceil_div(v.split ? std::min(L.rows_per_core, r.sizes()[0]) : r.sizes()[0], se);
  } else {
    s.rows = v.split ? std::min(L.rows_per_core, r.sizes()[0]) : r.sizes()[0];
    int64_t lead = 1;
    for (size_t d = 1; d + 1 < r.sizes().size(); ++d) lead *= r.sizes()[d];
    s.row_sticks = lead * ceil_div(r.sizes().back(), se);
  }
  return s;
}

std::mutex g_mu;
std::vector<Schedule>& last() {
  static auto* v = new std::vector<Schedule>();  // never destroyed: flushes may run during shutdown
  return *v;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", s);
  return b;
}

}  // namespace

Schedule plan_schedule(const std::string& kernel, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card) {
  const RegionLayout L = region_layout(region, graph, card);
  Schedule s;
  s.kernel = kernel;
  s.cores = L.cores;
  s.cores_used = L.cores_used;
  s.corelets = std::max<int64_t>(1, card.corelets_per_core);
  s.rows = L.rows;
  s.rows_per_core = L.rows_per_core;
  s.lx_budget_bytes = card.lx_usable_bytes_per_core > 0 ? card.lx_usable_bytes_per_core : card.lx_bytes_per_core;
  const int64_t stick = std::max<int64_t>(1, card.stick_bytes);

  std::vector<Share> shares;
  int64_t most = 1;
  for (const auto& v : L.views) {
    shares.push_back(share_of(v, L, card));
    most = std::max(most, shares.back().sticks());
  }
  auto footprint = [&](int64_t n) {
    int64_t b = 0;
    for (const auto& sh : shares) b += sh.tile_sticks(n) * stick;
    return s.buffers * b;
  };
  int64_t n = 1;
  if (s.lx_budget_bytes > 0) {
    TORCH_CHECK_VALUE(footprint(most) <= s.lx_budget_bytes, "Spyre: region ", kernel,
                      " cannot be tiled to fit LX: one ", stick, "-byte stick of each of its ", shares.size(),
                      " views in ", s.buffers, " buffers needs ", footprint(most),
                      " bytes, more than the usable LX of a core (lx_usable_bytes_per_core = ", s.lx_budget_bytes, ")");
    // The fewest tiles that fit (the footprint only shrinks as n grows), and
    // at least two when the share allows, so loads overlap compute.
    int64_t lo = most >= 2 ? 2 : 1, hi = std::max(lo, most);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (footprint(mid) <= s.lx_budget_bytes)
        hi = mid;
      else
        lo = mid + 1;
    }
    n = lo;
  }
  s.n_tiles = n;
  s.lx_bytes_used = footprint(n);

  int64_t split_rows = 0, split_row_sticks = 0;
  for (size_t i = 0; i < L.views.size(); ++i) {
    const LayoutView& v = L.views[i];
    const Share& sh = shares[i];
    const TensorRef& r = *v.ref;
    ScheduleView sv;
    sv.id = static_cast<int>(i);
    sv.lx = v.lx;
    sv.loaded = v.loaded;
    sv.stored = v.stored;
    sv.split = v.split;
    sv.tile_sticks = sh.tile_sticks(n);
    sv.tile_bytes = sv.tile_sticks * stick;
    const int64_t se = stick_elems(r.dtype, card);
    if (r.sizes().size() >= 2 && n <= sh.rows) {
      sv.tile_sizes = r.sizes().vec();
      sv.tile_sizes[0] = std::min(sh.rows, ceil_div(sh.rows, n));
    } else if (r.sizes().size() >= 2) {
      int64_t row = 1;
      for (size_t d = 1; d < r.sizes().size(); ++d) row *= r.sizes()[d];
      sv.tile_sizes = {1, std::min(row, sv.tile_sticks * se)};
    } else if (r.sizes().size() == 1) {
      sv.tile_sizes = {std::min(v.split ? L.rows_per_core : r.sizes()[0], sv.tile_sticks * se)};
    }
    if (v.loaded) s.load_bytes_per_tile += sv.tile_bytes;
    if (v.stored) s.store_bytes_per_tile += sv.tile_bytes;
    if (v.split || split_rows == 0) {
      split_rows = std::max(split_rows, sh.rows);
      split_row_sticks = std::max(split_row_sticks, sh.row_sticks);
    }
    s.views.push_back(std::move(sv));
  }
  s.row_split = n > split_rows;
  s.tile_rows = s.row_split ? 0 : ceil_div(split_rows, n);
  // Multi-instance: the corelets divide each tile's rows, or a row's sticks.
  const bool by_rows = !s.row_split && s.tile_rows >= s.corelets;
  const int64_t units =
      by_rows ? s.tile_rows : (s.row_split ? ceil_div(split_rows * split_row_sticks, n) : split_row_sticks);
  s.corelet_split = by_rows ? "rows" : "sticks";
  for (int64_t c = 0, left = units; c < s.corelets; ++c) {
    const int64_t part = ceil_div(left, s.corelets - c);
    s.corelet_share.push_back(part);
    left -= part;
  }
  if (L.ring_reduce && L.cores_used > 1) {
    s.partial_bytes = stick_bytes(L.partial_sizes, L.partial_dtype, card);
    s.ring_steps = L.cores_used - 1;  // a chain along the ring: each core adds its partial and passes it on
    s.ring_bytes = s.ring_steps * s.partial_bytes;
    s.ring_cycles = ceil_div(s.ring_bytes, stick);  // one stick per cycle per direction
  }
  return s;
}

void schedule_ring_payload(Schedule& s, const std::vector<int64_t>& partial_sizes, c10::ScalarType dtype, int64_t stats,
                           bool broadcast, const CardParams& card) {
  if (s.ring_steps == 0 || s.cores_used <= 1) return;
  const int64_t stick = std::max<int64_t>(1, card.stick_bytes);
  s.partial_bytes = std::max<int64_t>(1, stats) * stick_bytes(partial_sizes, dtype, card);
  s.ring_steps = (s.cores_used - 1) * (broadcast ? 2 : 1);
  s.ring_bytes = s.ring_steps * s.partial_bytes;
  s.ring_cycles = ceil_div(s.ring_bytes, stick);
}

void schedule_ring_chains(Schedule& s, const std::vector<std::vector<int64_t>>& chains, c10::ScalarType dtype,
                          const CardParams& card) {
  if (s.ring_steps == 0 || s.cores_used <= 1 || chains.empty()) return;
  const int64_t hops = s.cores_used - 1;
  s.partial_bytes = 0;
  s.ring_bytes = 0;
  for (const auto& sizes : chains) {
    const int64_t bytes = stick_bytes(sizes, dtype, card);
    s.partial_bytes = std::max(s.partial_bytes, bytes);
    s.ring_bytes += hops * bytes;
  }
  s.ring_steps = hops * static_cast<int64_t>(chains.size());
  s.ring_cycles = ceil_div(s.ring_bytes, std::max<int64_t>(1, card.stick_bytes));
}

void time_schedule(Schedule& s, double compute_s, double memory_s, const CardParams& card) {
  const int64_t n = std::max<int64_t>(1, s.n_tiles);
  s.compute_s = compute_s;
  s.memory_s = memory_s;
  s.calibrated_s = region_seconds(compute_s, memory_s, card);
  const double moved = static_cast<double>(s.load_bytes_per_tile + s.store_bytes_per_tile);
  const double load_share = moved > 0 ? s.load_bytes_per_tile / moved : 0.5;
  s.tile_load_s = memory_s * load_share / n;
  s.tile_store_s = memory_s * (1 - load_share) / n;
  s.tile_compute_s = compute_s / n;

  // One DMA queue per core in the order L0, L1, S0, L2, S1, ...: the load of
  // tile i+1 waits for the store of tile i-1 (its buffer), compute i for
  // load i and compute i-1, store i for compute i.
  s.stages.clear();
  auto keep = [&](int64_t i) { return i < 3 || i == n - 1; };
  auto add = [&](const char* kind, int64_t i, int64_t bytes, double a, double b) {
    if (keep(i)) s.stages.push_back({kind, i, static_cast<int>(i % 2), bytes, a, b});
  };
  const int64_t tile_lx = s.lx_bytes_used / std::max(1, s.buffers);
  double dma = s.tile_load_s, comp_end = 0, prev_store_end = 0, load_end = s.tile_load_s;
  add("load", 0, s.load_bytes_per_tile, 0, load_end);
  for (int64_t i = 0; i < n; ++i) {
    const double cs = std::max(load_end, comp_end);
    comp_end = cs + s.tile_compute_s;
    add("compute", i, tile_lx, cs, comp_end);
    if (i + 1 < n) {
      const double ls = std::max(dma, i >= 1 ? prev_store_end : 0.0);
      load_end = ls + s.tile_load_s;
      dma = load_end;
      add("load", i + 1, s.load_bytes_per_tile, ls, load_end);
    }
    const double ss = std::max(dma, comp_end);
    prev_store_end = ss + s.tile_store_s;
    dma = prev_store_end;
    add("store", i, s.store_bytes_per_tile, ss, prev_store_end);
  }
  s.fill_s = s.tile_load_s;
  s.pipelined_s = prev_store_end;
  s.drain_s = prev_store_end - comp_end;
  s.steady_s = s.pipelined_s - s.fill_s - s.drain_s;
  std::stable_sort(s.stages.begin(), s.stages.end(),
                   [](const ScheduleStage& a, const ScheduleStage& b) { return a.start_s < b.start_s; });
  s.stages_omitted = n > 4 ? 3 * (n - 4) : 0;
  // Each hop: a fixed latency, then its bytes over the link (the hops run one after the other).
  s.ring_latency_s = static_cast<double>(s.ring_steps) * card.ring_hop_latency_s;
  s.ring_s = s.ring_latency_s + (s.ring_steps > 0 && card.ring_link_bandwidth > 0
                                     ? static_cast<double>(s.ring_bytes) / card.ring_link_bandwidth
                                     : 0.0);
  if (s.ring_steps > 0) {
    s.stages.push_back({"ring_reduce", -1, -1, s.ring_bytes, s.pipelined_s, s.pipelined_s + s.ring_s});
    s.pipelined_s += s.ring_s;
  }
}

namespace {
// The double-buffered pipeline of one core over its tiles (one DMA queue:
// L0, L1, S0, L2, S1, ...): its end, seconds.
double pipeline_end(const std::vector<double>& load, const std::vector<double>& comp,
                    const std::vector<double>& store) {
  const size_t n = comp.size();
  if (n == 0) return 0;
  double dma = load[0], load_end = load[0], comp_end = 0, prev_store_end = 0;
  for (size_t i = 0; i < n; ++i) {
    const double cs = std::max(load_end, comp_end);
    comp_end = cs + comp[i];
    if (i + 1 < n) {
      const double ls = std::max(dma, i >= 1 ? prev_store_end : 0.0);
      load_end = ls + load[i + 1];
      dma = load_end;
    }
    const double ss = std::max(dma, comp_end);
    prev_store_end = ss + store[i];
    dma = prev_store_end;
  }
  return prev_store_end;
}
}  // namespace

void time_executed(Schedule& s, const std::vector<std::vector<double>>& step_rows, double rows) {
  s.per_core.clear();
  if (step_rows.empty() || rows <= 0) {
    CoreTiming t;
    t.rows = static_cast<double>(s.rows);
    t.tiles = s.n_tiles;
    t.load_s = s.tile_load_s * s.n_tiles;
    t.compute_s = s.tile_compute_s * s.n_tiles;
    t.store_s = s.tile_store_s * s.n_tiles;
    t.end_s = s.pipelined_s;
    t.overlap_s = t.load_s + t.compute_s + t.store_s - t.end_s;
    s.per_core.push_back(t);
    s.executed_s = s.pipelined_s;  // includes ring_s
    return;
  }
  const double moved = static_cast<double>(s.load_bytes_per_tile + s.store_bytes_per_tile);
  const double load_share = moved > 0 ? s.load_bytes_per_tile / moved : 0.5;
  const double cores = static_cast<double>(std::max<int64_t>(1, s.cores));
  const double used = static_cast<double>(std::max<int64_t>(1, s.cores_used));
  const size_t steps = step_rows.size();
  const int64_t sub =
      s.row_split ? std::max<int64_t>(1, (s.n_tiles + static_cast<int64_t>(steps) - 1) / static_cast<int64_t>(steps))
                  : 1;
  const size_t n_cores = step_rows[0].size();
  s.executed_s = 0;
  s.per_core.reserve(n_cores);
  std::vector<double> load, comp, store;  // one core's tiles; their capacity kept from core to core
  for (size_t c = 0; c < n_cores; ++c) {
    load.clear(), comp.clear(), store.clear();
    CoreTiming t;
    t.core = static_cast<int64_t>(c);
    for (size_t i = 0; i < steps; ++i) {
      const double n = c < step_rows[i].size() ? step_rows[i][c] : 0;
      if (n <= 0) continue;
      t.rows += n;
      for (int64_t j = 0; j < sub; ++j) {
        const double f = n / static_cast<double>(sub) / rows;
        load.push_back(s.memory_s * load_share * used * f);
        comp.push_back(s.compute_s * cores * f);
        store.push_back(s.memory_s * (1 - load_share) * used * f);
        t.load_s += load.back();
        t.compute_s += comp.back();
        t.store_s += store.back();
      }
    }
    t.tiles = static_cast<int64_t>(comp.size());
    t.end_s = pipeline_end(load, comp, store);
    t.overlap_s = t.load_s + t.compute_s + t.store_s - t.end_s;
    s.executed_s = std::max(s.executed_s, t.end_s);
    s.per_core.push_back(t);
  }
  // The ring starts when the cores' pipelines have ended (the chain passes
  // the partials one hop at a time).
  s.executed_s += s.ring_s;
}

std::string schedule_text(const Schedule& s) {
  std::ostringstream os;
  os << "schedule @" << s.kernel << " cores_used=" << s.cores_used << "/" << s.cores << " corelets=" << s.corelets
     << " rows_per_core=" << s.rows_per_core << " n_tiles=" << s.n_tiles << " tile_rows=" << s.tile_rows
     << (s.row_split ? " row_split" : "") << " buffers=" << s.buffers << " lx=" << s.lx_bytes_used << "/"
     << s.lx_budget_bytes << " {\n";
  for (const auto& v : s.views) {
    os << "  view %" << v.id << " " << (v.lx ? "LX" : "HBM") << (v.loaded ? " load" : "") << (v.stored ? " store" : "")
       << (v.split ? " split" : " replicated") << " tile=" << list(v.tile_sizes) << " sticks=" << v.tile_sticks
       << " bytes=" << v.tile_bytes << "\n";
  }
  os << "  corelets split " << s.corelet_split << " " << list(s.corelet_share) << "\n";
  for (const auto& st : s.stages) {
    if (st.kind == "ring_reduce") {
      os << "  ring_reduce steps=" << s.ring_steps << " bytes=" << s.ring_bytes << " cycles=" << s.ring_cycles
         << " partial_bytes=" << s.partial_bytes << " time=" << secs(s.ring_s) << "\n";
      continue;
    }
    os << "  " << st.kind << " tile=" << st.tile << " buffer=" << st.buffer << " bytes=" << st.bytes << " t=["
       << secs(st.start_s) << ", " << secs(st.end_s) << "]\n";
  }
  if (s.stages_omitted) os << "  ... " << s.stages_omitted << " stages of tiles 3.." << s.n_tiles - 2 << " omitted\n";
  os << "  time fill=" << secs(s.fill_s) << " steady=" << secs(s.steady_s) << " drain=" << secs(s.drain_s)
     << " pipelined=" << secs(s.pipelined_s) << " calibrated=" << secs(s.calibrated_s) << "\n";
  os << "  executed " << (s.executed_tiles ? "tiles" : "whole") << " steps=" << s.tile_steps
     << " ring_steps=" << s.ring_steps_run << " time=" << secs(s.executed_s)
     << (s.whole_reason.empty() ? "" : " (whole: " + s.whole_reason + ")") << "\n}\n";
  return os.str();
}

std::vector<Schedule> last_flush_schedules() {
  std::lock_guard<std::mutex> lock(g_mu);
  return last();
}

void schedule_begin_flush() {
  std::lock_guard<std::mutex> lock(g_mu);
  last().clear();
}

void schedule_record(Schedule s) {
  std::lock_guard<std::mutex> lock(g_mu);
  last().push_back(std::move(s));
}

}  // namespace spyre
}  // namespace tpu_eager
