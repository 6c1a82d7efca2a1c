// Checks exp_as_sleef (csrc/executors/tpu/fused_kernels.inc) against at::vec's
// Vectorized<float>::exp() (SLEEF's expf u10 in torch's build) on every float32
// bit pattern, bit for bit. Build and run with tools/check_sleef_exp.py.
// An optional argument N checks every N-th vector of bit patterns only.
#ifdef CHECK_AVX512
#include "executors/tpu/fused_kernels_avx512.cpp"
#else
#include "executors/tpu/fused_kernels_avx2.cpp"
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

// The fused loops count a debug metric (lazy/debug_report.h); this check links
// them without the debug report: level 0, nothing counted.
namespace tpu_eager::debug {
int level() { return 0; }
void count_op(const char*, const std::string&) {}
}  // namespace tpu_eager::debug

int main(int argc, char** argv) {
  using tpu_eager::tpu::fused::Vec;
  uint64_t mismatches = 0;
  constexpr int64_t kLanes = Vec::size();
  alignas(64) uint32_t bits[kLanes];
  alignas(64) float a[kLanes], b[kLanes];
  const uint64_t every = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kLanes * every) {
    for (int64_t i = 0; i < kLanes; ++i) bits[i] = static_cast<uint32_t>(base + i);
    const Vec x = Vec::loadu(bits);
    tpu_eager::tpu::fused::exp_as_sleef(x).store(a);
    x.exp().store(b);
    for (int64_t i = 0; i < kLanes; ++i) {
      if (std::memcmp(&a[i], &b[i], 4) != 0 && mismatches++ < 10) {
        float in;
        std::memcpy(&in, &bits[i], 4);
        std::printf("x=%a (0x%08x): inline %a library %a\n", in, bits[i], a[i], b[i]);
      }
    }
  }
  std::printf("%s: %llu of 2^32 / %llu float32 values differ\n", Vec::size() == 16 ? "AVX512" : "AVX2",
              static_cast<unsigned long long>(mismatches), static_cast<unsigned long long>(every));
  return mismatches != 0;
}
