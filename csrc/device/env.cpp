#include "device/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <c10/util/Exception.h>

namespace tpu_eager {
namespace env {

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      {"TORCH_TPU_TARGET", KnobType::kString, "tpu-v5e", "python",
       "simulated chip at import: tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e or spyre (torch_tpu_eager.set_target)"},
      {"TORCH_TPU_NUM_DEVICES", KnobType::kInt, "2", "runtime",
       "simulated chips per process, 1..16 (torch.tpu.set_device_count before first use)"},
      {"TORCH_TPU_DEFER_AND_FUSE", KnobType::kBool, "1", "runtime",
       "0: DEFER_NEVER, every op is flushed as it is recorded (torch_tpu_eager.set_eager_mode)"},
      {"TORCH_TPU_CPU_FALLBACK", KnobType::kBool, "0", "runtime",
       "1: ops without a tpu kernel run on the host CPU with a warning instead of raising NotImplementedError"},
      {"TORCH_TPU_MAX_PENDING_OPS", KnobType::kInt, "4096", "runtime",
       "queue length that triggers a flush (torch_tpu_eager.set_queue_limits)"},
      {"TORCH_TPU_MAX_PENDING_BYTES", KnobType::kInt, "1G", "runtime",
       "bytes of pending fresh outputs that trigger a flush (torch_tpu_eager.set_queue_limits)"},
      {"TORCH_TPU_DEBUG", KnobType::kInt, "0", "runtime",
       "1: one stderr line per flush (cause, ops, regions, compiles, cache hits, the Python line that triggered "
       "it) and a summary at exit; 2: also each region as it runs"},
      {"TORCH_TPU_KERNEL_CACHE_SIZE", KnobType::kInt, "8192", "runtime",
       "compiled kernels the JIT keeps in memory (least recently used evicted first)"},
      {"TORCH_TPU_FLUSH_CACHE_SIZE", KnobType::kInt, "256", "runtime",
       "flush plans the JIT keeps (partition, keys and kernels of a flush structure, reused by a later flush of the "
       "same structure; least recently used evicted first)"},
      {"TORCH_TPU_BACKWARD_ON_CALLER", KnobType::kBool, "1", "python",
       "1: backward runs on the thread that calls it (torch.autograd.set_multithreading_enabled(False) in the thread "
       "that imports torch_tpu_eager), saving two thread hand-offs per backward; 0: on the device's autograd "
       "thread, as CUDA"},
      {"TORCH_TPU_LOG_REGIONS", KnobType::kBool, "0", "runtime", "1: print each fused region to stderr as it runs"},
      {"TORCH_TPU_CACHE_DIR", KnobType::kPath, "", "runtime",
       "directory that keeps compiled regions and meta results across processes (torch_tpu_eager.set_cache_dir)"},
      {"TORCH_TPU_DUMP_DIR", KnobType::kPath, "", "runtime",
       "directory where each Spyre region's KTIR program is written as it is compiled"},
      {"TORCH_TPU_QUICK", KnobType::kBool, "0", "examples",
       "1: examples/, benchmarks/run_all.py and the coverage sweep run their short form (--quick)"},
      {"TORCH_TPU_FULL_OPS", KnobType::kBool, "0", "tests",
       "1: tests/api/test_ops.py also sweeps the second 16-bit float type"},
      {"TORCH_TPU_DEBUG_BUILD", KnobType::kBool, "0", "build", "1: pip install builds csrc/ with -g -O0"},
  };
  return table;
}

namespace {

const Knob& find(const char* name) {
  for (const Knob& k : knobs())
    if (std::strcmp(k.name, name) == 0) return k;
  TORCH_CHECK(false, "torch_tpu_eager: environment knob ", name, " is not declared in csrc/device/env.cpp");
}

std::string value_or_default(const Knob& k) {
  const char* v = std::getenv(k.name);
  return (v && *v) ? std::string(v) : std::string(k.default_value);
}

[[noreturn]] void malformed(const Knob& k, const std::string& v, const char* expected) {
  TORCH_CHECK_VALUE(false, "environment variable ", k.name, "='", v, "': expected ", expected,
                    " (python -m torch_tpu_eager.env lists every knob)");
}

bool parse_bool(const Knob& k, const std::string& v) {
  if (v == "0") return false;
  if (v == "1") return true;
  malformed(k, v, "0 or 1");
}

int64_t parse_int(const Knob& k, const std::string& v) {
  constexpr const char* kExpected = "a decimal integer >= 0, optionally with a K, M or G suffix";
  if (v.empty() || v[0] < '0' || v[0] > '9') malformed(k, v, kExpected);
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  int shift = 0;
  if (*end == 'K' || *end == 'M' || *end == 'G') shift = *end == 'K' ? 10 : *end == 'M' ? 20 : 30, ++end;
  const auto max = static_cast<unsigned long long>(std::numeric_limits<int64_t>::max());
  if (errno != 0 || *end != '\0' || n > (max >> shift)) malformed(k, v, kExpected);
  return static_cast<int64_t>(n << shift);
}

}  // namespace

std::optional<std::string> raw(const char* name) {
  const Knob& k = find(name);
  const char* v = std::getenv(k.name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool get_bool(const char* name) {
  const Knob& k = find(name);
  TORCH_INTERNAL_ASSERT(k.type == KnobType::kBool, name, " is not a bool knob");
  return parse_bool(k, value_or_default(k));
}

int64_t get_int(const char* name) {
  const Knob& k = find(name);
  TORCH_INTERNAL_ASSERT(k.type == KnobType::kInt, name, " is not an int knob");
  return parse_int(k, value_or_default(k));
}

std::string get_string(const char* name) {
  const Knob& k = find(name);
  TORCH_INTERNAL_ASSERT(k.type == KnobType::kString || k.type == KnobType::kPath, name, " is not a string knob");
  return value_or_default(k);
}

void validate_all() {
  for (const Knob& k : knobs()) {
    if (!raw(k.name)) continue;
    if (k.type == KnobType::kBool) get_bool(k.name);
    if (k.type == KnobType::kInt) get_int(k.name);
  }
}

}  // namespace env
}  // namespace tpu_eager
