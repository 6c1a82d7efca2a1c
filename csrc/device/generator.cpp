// The device generator: seed + offset, consumed at record time.
#include <cstring>
#include <mutex>

#include <ATen/core/Generator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/ops/empty.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include "device/device.h"

namespace tpu_eager {
namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // CPU's default_rng_seed_val

struct TpuGenerator final : c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t s) override {
    seed_ = s;
    offset_ = 0;
  }
  void set_offset(uint64_t o) override { offset_ = o; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  // State: 16 bytes (seed, offset) in a CPU uint8 tensor, like CUDA's layout,
  // with CUDA's checks: a contiguous CPU ByteTensor (TypeError otherwise; a
  // "tpu" tensor's bytes may still be pending), of 16 bytes or of 8 (the seed
  // alone; offset 0).
  void set_state(const c10::TensorImpl& s) override {
    at::detail::check_rng_state(s);
    TORCH_CHECK(s.numel() == 16 || s.numel() == 8, "RNG state is wrong size");
    uint64_t p[2] = {0, 0};
    std::memcpy(p, s.data(), s.numel());
    seed_ = p[0];
    offset_ = p[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* p = static_cast<uint64_t*>(t.data_ptr());
    p[0] = seed_;
    p[1] = offset_;
    return t.getIntrusivePtr();
  }
  // The state as a generator (torch.Generator.graphsafe_get_state /
  // graphsafe_set_state, which torch 2.13's RNG-functionalization and
  // checkpointing paths use): a copy of (seed, offset).
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    return c10::intrusive_ptr<c10::GeneratorImpl>::reclaim(clone_impl());
  }
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& state) override {
    TORCH_CHECK(state && state->device().type() == c10::DeviceType::PrivateUse1,
                "graphsafe_set_state expects the state of a tpu generator");
    const auto* other = static_cast<const TpuGenerator*>(state.get());
    seed_ = other->seed_;
    offset_ = other->offset_;
  }
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t offset) {
  auto splitmix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  return splitmix(seed ^ splitmix(offset));
}

at::Generator make_device_generator(c10::DeviceIndex index) { return at::make_generator<TpuGenerator>(index); }

const at::Generator& default_device_generator(c10::DeviceIndex index) {
  // One generator per chip, as CUDA keeps one per device.
  static std::once_flag once;
  // Never destroyed: a daemon thread's random op may still read it while the exiting
  // thread runs the static destructors (docs/newcomer_review.md, exit with daemon threads).
  static auto& gens = *new std::vector<at::Generator>();
  const int d = checked_device(index);
  std::call_once(once, [] {
    for (int i = 0; i < device_count(); ++i) gens.push_back(make_device_generator(static_cast<c10::DeviceIndex>(i)));
  });
  return gens[d];
}

uint64_t reserve_random_stream(const at::Generator& gen) {
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(gen).mutex());
  auto* impl = static_cast<TpuGenerator*>(gen.unsafeGetGeneratorImpl());
  uint64_t s = mix_seed(impl->seed_, impl->offset_);
  impl->offset_ += 1;
  return s;
}

}  // namespace tpu_eager
