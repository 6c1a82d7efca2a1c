// Parameters of the simulated IBM Spyre card (the active target when
// set_target("spyre")). The numbers live in torch_tpu_eager/targets/spyre.json,
// each with its source; Python sets them here.
#pragma once

#include <cstdint>
#include <string>

namespace tpu_eager {
namespace spyre {

struct CardParams {
  std::string name;  // "spyre"
  int64_t cores = 32;
  int64_t corelets_per_core = 2;
  int64_t lx_bytes_per_core = 0;  // scratchpad per core
  int64_t lx_usable_bytes_per_core = 0;
  int64_t dram_bytes = 0;                 // LPDDR5 capacity
  int64_t stick_bytes = 128;              // data moves in sticks of this many bytes
  double matmul_macs_per_s_per_core = 0;  // sustained
  double vector_elems_per_s_per_core = 0;
  double dram_bandwidth = 0;  // bytes/s, mixed read/write (calibrated)
  double overlap = 0;         // T = C + M - overlap * min(C, M)
  // One ring link between neighbouring cores, bytes/s per direction:
  // ring_bytes_per_cycle (128, torch-spyre docs) x core_clock_hz (1.5 GHz,
  // an ASSUMPTION: Spyre's clock is not published; IBM's 14 nm prototype of
  // the core it descends from ran at 1.5 GHz; spyre.json has the sources).
  // Only the ring's time depends on it: Schedule::ring_s, the ring part of
  // executed_s (metrics schedule_time_s) and the profiler's ring_us /
  // schedule_time_us. 0: unknown, the ring adds no time.
  double ring_link_bandwidth = 0;
  // The fixed time of one ring hop apart from its bytes (link, ring stop and
  // the receiving core's handshake), seconds: ring_hop_latency_cycles /
  // core_clock_hz, both ASSUMED (no public figure; spyre.json has the
  // sources). A ring of S hops carrying B bytes takes S x this + B /
  // ring_link_bandwidth (Schedule::ring_s). 0: the ring's bytes alone.
  double ring_hop_latency_s = 0;

  bool valid() const {
    return cores > 0 && stick_bytes > 0 && matmul_macs_per_s_per_core > 0 && vector_elems_per_s_per_core > 0 &&
           dram_bandwidth > 0 && overlap >= 0 && overlap <= 1 && ring_hop_latency_s >= 0;
  }
};

CardParams active_card();
void set_active_card(const CardParams& card);

}  // namespace spyre
}  // namespace tpu_eager
