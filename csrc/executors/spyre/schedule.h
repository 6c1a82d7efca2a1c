// The dataflow schedule of a region on the simulated Spyre (issue 6, item 4):
// what each core runs, as a double-buffered load -> compute -> store pipeline
// over tiles of the region's views (docs/spyre.md, "Dataflow schedule").
//
// - Grid: the region's rows are split over the cores (layout.h); every core
//   runs the same pipeline on its share, so the schedule describes one core
//   with a full share (core 0).
// - Tiles: a core's share of every view is cut into the same number of tiles
//   `n_tiles` (tile i holds slice i of each view). A tile is whole dim-0 rows
//   while one row of every view fits; otherwise rows are split into whole
//   128-byte sticks (`row_split`). n_tiles is the smallest count >= 2 (when
//   the share has 2 sticks or more) whose double-buffered tiles fit the usable
//   LX: 2 x sum over views of tile bytes <= lx_usable_bytes_per_core. If even
//   one stick of every view does not fit twice, the region cannot be scheduled
//   and an error is raised (never a truncated tile).
// - Buffers: tile i uses LX buffer i % 2, so the load of tile i+1 runs while
//   tile i computes; loads and stores share the core's one DRAM channel.
// - Corelets: each tile's compute is split across the core's corelets
//   (multi-instance): its rows (or, for a one-row tile, its sticks) are
//   divided between them.
// - Ring: a reduction over the split dim ends with a ring reduction: the
//   cores_used partials (each `partial_bytes`) are combined in cores_used - 1
//   ring steps.
//
// Timing: the region's compute time C and memory time M (cost_model.h) are
// spread evenly over the tiles (loads and stores share M in proportion to
// their bytes), then the pipeline is simulated: pipelined_s = fill (first
// load) + steady state + drain (last store). With one tile this is C + M; as
// tiles grow it tends to max(C, M) + one tile's memory time: the ideal
// overlap. The region's time stays the calibrated law
// T = C + M - overlap x min(C, M), measured on hardware, which sits between
// the two (docs/spyre.md relates them); the ring reduction is counted in
// steps, bytes and ring cycles at 128 B per cycle and timed at the card's
// ring_link_bandwidth plus a latency per hop (card.h; the clock and the
// latency are assumptions, spyre.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

struct ScheduleStage {
  std::string kind;    // "load", "compute", "store" or "ring_reduce"
  int64_t tile = -1;   // tile index on the core; -1 for ring_reduce
  int buffer = -1;     // LX buffer (0 or 1); -1 for ring_reduce
  int64_t bytes = 0;   // load/store: DRAM bytes; compute: LX bytes of the tile; ring: bytes over the ring
  double start_s = 0;  // seconds from the region's start
  double end_s = 0;
};

struct ScheduleView {
  int id = 0;  // KTIR view number (%id)
  bool lx = false, loaded = false, stored = false, split = false;
  std::vector<int64_t> tile_sizes;  // elements of one tile
  int64_t tile_sticks = 0;          // 128-byte sticks of one tile
  int64_t tile_bytes = 0;           // tile_sticks * stick bytes
};

// One core's share of an executed schedule (time_executed): the rows it
// processed, its summed stage times and when its pipeline ended.
struct CoreTiming {
  int64_t core = 0;
  double rows = 0;  // rows of the split dim processed
  int64_t tiles = 0;
  double load_s = 0, compute_s = 0, store_s = 0;
  double end_s = 0;      // its pipeline's end (seconds from the region's start)
  double overlap_s = 0;  // load + compute + store - end: time hidden by double buffering
};

struct Schedule {
  std::string kernel;
  int64_t cores = 0, cores_used = 0, corelets = 0;
  int64_t rows = 0, rows_per_core = 0;
  int64_t n_tiles = 1;    // tiles per core
  int64_t tile_rows = 0;  // rows per tile of the split views; 0 when rows are split into sticks
  bool row_split = false;
  std::string corelet_split;           // "rows" or "sticks": what each tile divides between the corelets
  std::vector<int64_t> corelet_share;  // rows (or sticks) of the first tile per corelet
  int buffers = 2;
  int64_t lx_budget_bytes = 0;  // lx_usable_bytes_per_core
  int64_t lx_bytes_used = 0;    // buffers * sum of tile bytes
  std::vector<ScheduleView> views;
  int64_t load_bytes_per_tile = 0, store_bytes_per_tile = 0;
  // Ring reduction over the cores (0 when none).
  // ring_steps hops of partial_bytes each, one after the other; ring_s =
  // ring_steps x ring_hop_latency_s + ring_bytes / ring_link_bandwidth (the
  // bytes' part 0 when the card gives no bandwidth), added after the cores'
  // pipelines (pipelined_s, executed_s).
  int64_t ring_steps = 0, ring_bytes = 0, ring_cycles = 0, partial_bytes = 0;
  double ring_s = 0;
  // The hops' fixed part of ring_s: ring_steps x card.ring_hop_latency_s
  // (ring_s = this + ring_bytes / ring_link_bandwidth).
  double ring_latency_s = 0;
  // Timing, seconds (see the header comment).
  double compute_s = 0, memory_s = 0;  // the region's C and M
  double tile_load_s = 0, tile_compute_s = 0, tile_store_s = 0;
  double fill_s = 0, steady_s = 0, drain_s = 0, pipelined_s = 0;
  double calibrated_s = 0;  // C + M - overlap * min(C, M)
  // Stages of the first tiles and the last (in start order); the stages of
  // the other tiles repeat the steady state and are left out.
  std::vector<ScheduleStage> stages;
  int64_t stages_omitted = 0;
  // The executed schedule (time_executed): how the interpreter walked the
  // region (tiles, or whole views and why), and each core's pipeline over
  // the rows it processed in each step. executed_s = the latest core's end.
  bool executed_tiles = false;
  std::string whole_reason;
  int64_t tile_steps = 0, ring_steps_run = 0;
  std::vector<CoreTiming> per_core;
  double executed_s = 0;
};

// Tiles the region (throws a ValueError-typed c10 error when one stick of
// every view does not fit LX twice). Timing fields are left 0.
Schedule plan_schedule(const std::string& kernel, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card);
// The ring's payload once the interpreter's plan is known: each hop carries
// `stats` partial tensors of `partial_sizes` in `dtype` (f32, f64 for a
// float64 reduction), stick padded; `broadcast`: the combined statistics
// travel back to every core (a normalizing pass: softmax, layer_norm), so
// the chain runs twice.
void schedule_ring_payload(Schedule& s, const std::vector<int64_t>& partial_sizes, c10::ScalarType dtype, int64_t stats,
                           bool broadcast, const CardParams& card);
// The ring of a combine that runs several chains one after the other (an
// order statistic's selection, KtirTilePlan::ring_chains): each chain is
// cores_used - 1 hops of its payload `sizes` in `dtype`, stick padded;
// ring_steps and ring_bytes add up every chain's hops and partial_bytes is
// the largest hop.
void schedule_ring_chains(Schedule& s, const std::vector<std::vector<int64_t>>& chains, c10::ScalarType dtype,
                          const CardParams& card);
// Fills the timing fields and stages from the region's C and M (seconds).
void time_schedule(Schedule& s, double compute_s, double memory_s, const CardParams& card);
// The executed timing from the tile steps of the walk: per core c and step
// i with n rows of the `rows` split rows, load = M_load x cores_used x n /
// rows, compute = C x cores x n / rows (C assumes every core of the card
// busy), store likewise; each core's steps run through the double-buffered
// pipeline of time_schedule; executed_s is the latest core's end. A row cut
// into sticks (row_split) counts as n_tiles / steps sub-steps. The walk's
// tiles are whole rows, ceil(rows_per_core / tile_rows) of them: fewer than
// n_tiles when n_tiles does not divide the rows (the model's even split). `step_rows`
// [step][core] = rows; empty: the region has no split rows (one core, the
// schedule's pipelined time). Call after time_schedule.
void time_executed(Schedule& s, const std::vector<std::vector<double>>& step_rows, double rows);
// Human-readable text (docs/spyre.md).
std::string schedule_text(const Schedule& s);

// The schedules of the last flush run on Spyre, in run order.
std::vector<Schedule> last_flush_schedules();
void schedule_begin_flush();
void schedule_record(Schedule s);

}  // namespace spyre
}  // namespace tpu_eager
