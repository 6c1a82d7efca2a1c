// Parameters of the simulated TPU chip (the active target). The numbers are
// not in C++: they live in torch_tpu_eager/targets/<name>.json, each with its
// source, and Python sets them here at import and on set_target().
#pragma once

#include <cstdint>
#include <string>

namespace tpu_eager {
namespace tpu {

struct ChipParams {
  std::string name;           // "tpu-v5e"; empty until Python sets a target
  int64_t tensor_cores = 1;   // TensorCores per chip (v4/v5p: 2, used as one megacore device)
  int64_t mxus_per_core = 1;  // matrix units per TensorCore
  int64_t mxu_size = 128;     // an MXU multiplies by a mxu_size x mxu_size weight tile
  int64_t sublanes = 8;       // vector register: sublanes x lanes 32-bit slots
  int64_t lanes = 128;
  double peak_bf16_flops = 0;  // FLOP/s per chip, bf16 inputs on the MXUs
  double hbm_bandwidth = 0;    // bytes/s per chip
  int64_t hbm_bytes = 0;       // HBM capacity per chip, bytes
  int64_t vmem_bytes = 0;      // VMEM per TensorCore, bytes
  double vpu_elems_per_s = 0;  // vector-unit element rate per chip (32-bit slots per second)
  double launch_s = 0;         // fixed cost per kernel, seconds (simulator assumption)

  // True once a target with a usable cost model was set.
  bool valid() const { return peak_bf16_flops > 0 && hbm_bandwidth > 0 && vpu_elems_per_s > 0; }
};

// The active chip (a copy: callers never hold a reference across a target switch).
ChipParams active_chip();
// Replaces the active chip. The caller (set_target) flushes pending work and
// clears the region cache around it.
void set_active_chip(const ChipParams& chip);

}  // namespace tpu
}  // namespace tpu_eager
