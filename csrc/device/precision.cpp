// Per-thread float32 matmul precision scopes (torch.tpu.precision; device.h).
// An op's precision is fixed when it is recorded, as CPU reads
// torch.get_float32_matmul_precision() when the op runs at the call: the
// queue keeps one precision per chip's pending ops and the flush runs them at it.
#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include "device/device.h"

namespace tpu_eager {
namespace {
thread_local int t_scope = -1;  // torch.tpu.precision of this thread, -1: none
thread_local int t_run = -1;    // precision of the flush this thread runs, -1: none
}  // namespace

int thread_precision() { return t_scope; }

void set_thread_precision(int p) {
  TORCH_CHECK_VALUE(p >= -1 && p <= static_cast<int>(at::Float32MatmulPrecision::MEDIUM),
                    "invalid float32 matmul precision ", p);
  t_scope = p;
}

int recording_precision() {
  return t_scope >= 0 ? t_scope : static_cast<int>(at::globalContext().float32MatmulPrecision());
}

int run_precision() { return t_run >= 0 ? t_run : recording_precision(); }

RunPrecision::RunPrecision(int p) : prev_(t_run) { t_run = p; }
RunPrecision::~RunPrecision() { t_run = prev_; }

}  // namespace tpu_eager
