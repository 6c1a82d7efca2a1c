// Simulated TPU chip parameters used by the v1 roofline cost.
// Source: Google Cloud TPU v5e documentation (system architecture page):
// 197 TFLOP/s bf16 per chip, 16 GB HBM2 at 819 GB/s. The launch cost is an
// assumption of this simulator (a few microseconds per kernel, typical of an
// accelerator kernel launch), not a published figure.
#pragma once

namespace tpu_eager {
namespace tpu {

struct ChipParams {
  const char* name;
  double peak_flops;      // FLOP/s, bf16 MXU
  double hbm_bandwidth;   // bytes/s
  double launch_s;        // seconds per kernel (simulator assumption)
};

constexpr ChipParams kV5e{"tpu-v5e", 197e12, 819e9, 2e-6};

}  // namespace tpu
}  // namespace tpu_eager
