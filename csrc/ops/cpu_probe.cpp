// Dtype checks that only CPU's kernel makes: a probe of the kernel on tiny CPU twins (cpu_probe.h).
#include "ops/cpu_probe.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "ops/stack_tensors.h"

namespace tpu_eager {

bool is_generator_arg(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  const auto opt = t->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

namespace {

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// A Scalar's or double's type tag (its value never enters a dtype verdict).
int64_t scalar_tag(const c10::IValue& v) {
  if (v.isDouble()) return 1;
  if (v.isComplexDouble()) return 2;
  if (v.isInt()) return 3;
  if (v.isBool()) return 4;
  return 5;
}

// The key of one tensor: what its twin keeps (dtype, rank, emptiness, conj/neg
// bits, and whether it is a 0-dim CPU tensor kept as is).
int64_t tensor_tag(const at::Tensor& t) {
  if (!t.defined()) return -7;
  const bool kept = !is_tpu(t) && t.dim() == 0;
  return static_cast<int64_t>(t.scalar_type()) | (int64_t{t.dim()} << 8) | (int64_t{t.numel() == 0} << 16) |
         (int64_t{kept} << 17) | (int64_t{t.is_conj()} << 18) | (int64_t{t.is_neg()} << 19) |
         (int64_t{t.unsafeGetTensorImpl()->is_wrapped_number()} << 20);
}

// Twin sizes are clamped to this: its sizes, for full-size twins.
constexpr int64_t kFullSize = std::numeric_limits<int64_t>::max();

// `t`'s twin: a zero-filled contiguous CPU tensor of its dtype and rank, every
// size clamped to `cap` (0 stays 0). A 0-dim CPU tensor (a scalar) is used as is.
at::Tensor twin_of(const at::Tensor& t, int64_t cap) {
  if (!t.defined() || (!is_tpu(t) && t.dim() == 0)) return t;
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  for (auto& s : sizes) s = std::min(s, cap);
  at::Tensor c = at::detail::empty_cpu(sizes, t.scalar_type(), std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  if (c.numel() > 0) std::memset(c.data_ptr(), 0, c.nbytes());
  if (t.is_conj()) c._set_conj(true);
  if (t.is_neg()) c._set_neg(true);
  return c;
}

// A non-tensor argument's value clamped to [-1, 1] (ints, doubles and
// Scalars of a factory: they size its result, as arange's end or eye's n do).
c10::IValue clamped(const c10::IValue& v) {
  if (v.isInt()) return std::clamp<int64_t>(v.toInt(), -1, 1);
  if (v.isDouble()) return std::clamp(v.toDouble(), -1.0, 1.0);
  if (v.isIntList()) {
    auto l = v.toIntList().vec();
    for (auto& s : l) s = std::min<int64_t>(s, 1);
    return l;
  }
  return v;
}

struct Hash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ULL;
    for (auto x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
    return static_cast<size_t>(h);
  }
};

class Verdicts {
 public:
  // 1: rejects, 0: accepts, -1: not yet probed.
  int find(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? -1 : it->second;
  }
  void set(const std::vector<int64_t>& key, bool rejects) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() > kMaxEntries) map_.clear();  // bounded, as the meta cache is
    map_[key] = rejects;
  }

 private:
  static constexpr size_t kMaxEntries = 1 << 16;
  std::mutex mu_;
  std::unordered_map<std::vector<int64_t>, bool, Hash> map_;
};

Verdicts& verdicts() {
  static Verdicts* v = new Verdicts();
  return *v;
}

std::atomic<int64_t> n_probes{0}, n_rejects{0}, n_misled{0};

// The probe key of a call; false when an argument has a kind the probe does not model.
// With a `cap` above 1 a tensor's sizes clamped to it are keyed too: for such an op the
// verdict depends on them (pdist of one row returns before its dtype dispatch).
bool probe_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first, size_t nargs, int64_t cap,
               std::vector<int64_t>& k) {
  auto tensor_key = [&](const at::Tensor& t) {
    k.push_back(tensor_tag(t));
    if (cap > 1 && t.defined())
      for (const int64_t s : t.sizes()) k.push_back(std::min(s, cap));
  };
  k.clear();
  k.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&op.schema())));
  k.push_back(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  for (size_t i = first; i < first + nargs; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      tensor_key(v.toTensor());
    } else if (v.isTensorList()) {
      k.push_back(-1);
      for (const at::Tensor& t : v.toTensorList().vec()) tensor_key(t);
    } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      k.push_back(-2);  // Tensor?[] (index's indices)
      for (const c10::IValue& e : v.toList().vec()) {
        if (e.isTensor())
          tensor_key(e.toTensor());
        else
          k.push_back(-7);
      }
    } else if (v.isIntList()) {
      k.push_back(-3);
      for (auto s : v.toIntList().vec()) k.push_back(s);
    } else if (v.isInt()) {
      k.push_back(-4);
      k.push_back(v.toInt());
    } else if (v.isBool()) {
      k.push_back(v.toBool() ? -5 : -6);
    } else if (v.isNone()) {
      k.push_back(-8);
    } else if (v.isDouble() || v.isComplexDouble() || v.isScalar()) {
      k.push_back(-9 - scalar_tag(v));
    } else if (v.isString()) {
      k.push_back(-20);
      k.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
    } else if (v.isDevice()) {
      k.push_back(-21);
    } else if (v.isGenerator()) {
      k.push_back(-22);
    } else if (v.isList()) {
      k.push_back(-23);  // float[] (interpolation scales), bool[] (output masks): values do not pick dtypes
      k.push_back(static_cast<int64_t>(v.toList().size()));
    } else {
      return false;
    }
  }
  return true;
}

// The probe's arguments: twins of tensors (one per TensorImpl, so a tensor
// passed twice stays one tensor; sizes clamped to `cap`), CPU devices, a
// generator of its own, and the values that size the result clamped: a
// factory's (no tensor argument) and an int list named "size" (new_zeros',
// expand's). An int "size" is a window's length (unfold_backward's): clamped to
// 1 it would equal the step, the kernel's path that copies without its dtype
// dispatch, so the probe would accept a dtype the kernel has no loop for.
torch::jit::Stack probe_args(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                             size_t nargs, int64_t cap) {
  torch::jit::Stack args(stack.begin() + first, stack.begin() + first + nargs);
  std::unordered_map<const c10::TensorImpl*, at::Tensor> twins;
  auto twin = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor& c = twins[t.unsafeGetTensorImpl()];
    if (!c.defined()) c = twin_of(t, cap);
    return c;
  };
  bool any_tensor = false;
  for (auto& v : args) {
    if (v.isTensor()) {
      any_tensor = true;
      v = twin(v.toTensor());
    } else if (v.isTensorList()) {
      any_tensor = true;
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList().vec()) l.push_back(twin(t));
      v = std::move(l);
    } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      any_tensor = true;
      c10::List<std::optional<at::Tensor>> l;
      for (const c10::IValue& e : v.toList().vec())
        l.push_back(e.isTensor() ? std::optional<at::Tensor>(twin(e.toTensor())) : std::nullopt);
      v = std::move(l);
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
    }
  }
  // A random op's probe draws from a generator of its own: neither CPU's default
  // generator nor the device's stream is advanced by it.
  for (size_t i = 0; i < nargs; ++i)
    if (is_generator_arg(schema.arguments()[i])) args[i] = at::detail::createCPUGenerator(/*seed_in=*/0);
  for (size_t i = 0; i < nargs; ++i)
    if (!any_tensor || (schema.arguments()[i].name() == "size" && args[i].isIntList())) args[i] = clamped(args[i]);
  return args;
}

// Whether `msg` has `word` with no letter or digit on either side.
bool has_word(const std::string& msg, const std::string& word) {
  auto is_alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  for (size_t at = msg.find(word); at != std::string::npos; at = msg.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !is_alnum(msg[at - 1])) && (end == msg.size() || !is_alnum(msg[end]))) return true;
  }
  return false;
}

// Whether the probe's error is CPU's kernel rejecting a dtype of the call
// (`dtypes`: its tensors' dtypes): a NotImplementedError (AT_DISPATCH's
// "\"op_cpu\" not implemented for 'Float'", clamp's "not supported for complex
// types"), except the dispatcher's "Could not run ... with arguments from the
// 'CPU' backend"; or an error that names one of the call's dtypes ("expected
// scalar type Float but found Bool", "MKL FFT doesn't support tensors of type:
// Half", for Half and ComplexHalf: a complex dtype's real type counts, "may not
// be a boolean tensor", "Boolean inputs not supported") or speaks of dtypes or
// floating point.
// Errors about the twins' shapes do not.
bool is_dtype_rejection(const c10::Error& e, const std::vector<c10::ScalarType>& dtypes) {
  const std::string& msg = e.msg();
  if (msg.rfind("Could not run", 0) == 0) return false;
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return true;
  // std/var: "std and var only support floating point and complex dtypes".
  if (has_word(msg, "dtype") || has_word(msg, "dtypes") || has_word(msg, "floating point")) return true;
  for (const auto dt : dtypes) {
    if (has_word(msg, c10::toString(dt))) return true;
    // relu_: "Boolean inputs not supported for relu".
    if (dt == c10::kBool && (has_word(msg, "boolean") || has_word(msg, "Boolean"))) return true;
    if (c10::isComplexType(dt) && has_word(msg, "complex")) return true;
    // MKL's FFT names a complex tensor's real type: "doesn't support tensors of type: Half".
    if (c10::isComplexType(dt) && has_word(msg, c10::toString(c10::toRealValueType(dt)))) return true;
  }
  return false;
}

// The dtypes of the tensors among the arguments.
std::vector<c10::ScalarType> dtypes_of(const torch::jit::Stack& args) {
  std::vector<c10::ScalarType> dts;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && std::find(dts.begin(), dts.end(), t.scalar_type()) == dts.end()) dts.push_back(t.scalar_type());
  };
  for_each_tensor(args, 0, args.size(), [&](int, int, const at::Tensor& t) { add(t); });
  return dts;
}

// Full-size twins of at most this many bytes in all: the second probe, when
// the twins of size 1 fail on their shapes (glu halves an even dim, a pool's
// kernel needs room, cross needs a dim of 3) before the dtype dispatch.
constexpr int64_t kFullTwinMaxBytes = int64_t{1} << 20;

// Whether the full-size probe is worth its cost for this call (1), is not (0:
// all float), or would be but the tensors are too large (-1): its tensors
// hold at most kFullTwinMaxBytes, and one of them is of a dtype that CPU's
// floating-point kernels (pools, convolutions, glu, unfold) have no loop for:
// bool, integer or complex; float16 / bfloat16 too with `full_16bit`. (The
// full-size probe runs CPU's kernel for real: a convolution's backward costs
// ~150 ms on its first call, oneDNN's setup, so float calls, by far the most
// common, never pay it.)
int full_twins_fit(const torch::jit::Stack& stack, size_t first, size_t nargs, bool full_16bit) {
  int64_t bytes = 0;
  bool any = false;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const auto dt = t.scalar_type();
    if (c10::isIntegralType(dt, /*includeBool=*/true) || c10::isComplexType(dt)) any = true;
    if (full_16bit && (dt == c10::kHalf || dt == c10::kBFloat16)) any = true;
    bytes += t.numel() * static_cast<int64_t>(t.itemsize());
  };
  for_each_tensor(stack, first, nargs, [&](int, int, const at::Tensor& t) { add(t); });
  if (!any) return 0;
  return bytes <= kFullTwinMaxBytes ? 1 : -1;
}

// One run of CPU's kernel on twins of sizes clamped to `cap`: 1 it rejects a
// dtype, 0 it accepts, -1 it failed otherwise (the twins' shapes).
int probe_once(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first, size_t nargs, int64_t cap) {
  ++n_probes;
  torch::jit::Stack args = probe_args(op.schema(), stack, first, nargs, cap);
  const std::vector<c10::ScalarType> dtypes = dtypes_of(args);
  struct DropWarnings : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } drop;
  c10::WarningUtils::WarningHandlerGuard quiet(&drop);
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  at::RecordFunctionGuard untraced(false);  // the probe's CPU ops are not the user's: no profiler events
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &args);
  } catch (const c10::Error& e) {
    if (is_dtype_rejection(e, dtypes)) {
      ++n_rejects;
      return 1;
    }
    return -1;
  } catch (const std::exception&) {
    return -1;
  }
  return 0;
}

// The verdict (1 rejects, 0 accepts), or -1 when neither probe could tell:
// twins of sizes at most `twins.tiny_cap` first, then, when they fail on their
// shapes, full-size twins if full_twins_fit.
int probe(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first, size_t nargs, ProbeTwins twins) {
  const int tiny = probe_once(op, stack, first, nargs, twins.tiny_cap);
  if (tiny >= 0) return tiny;
  const int fit = full_twins_fit(stack, first, nargs, twins.full_16bit);
  if (fit <= 0) return fit;  // float calls: accepted; too large: no verdict
  const int full = probe_once(op, stack, first, nargs, kFullSize);
  return full == 1 ? 1 : 0;  // full-size twins that fail otherwise: CPU's kernel decides at the flush
}

}  // namespace

bool cpu_kernel_rejects_dtypes(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first,
                               size_t nargs, ProbeTwins twins, std::vector<int64_t>* key) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
    return false;
  if (!probe_key(op, stack, first, nargs, twins.tiny_cap, *key)) return false;
  int verdict = verdicts().find(*key);
  if (verdict < 0) {
    verdict = probe(op, stack, first, nargs, twins);
    // No verdict (shapes too large for full-size twins): probed again on the next miss.
    if (verdict >= 0) verdicts().set(*key, verdict == 1);
  }
  return verdict == 1;
}

bool probe_needless(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first, size_t nargs) {
  std::optional<c10::ScalarType> floating;
  bool ok = true;
  for_each_tensor(stack, first, nargs, [&](int arg, int, const at::Tensor& t) {
    if (!ok || !t.defined()) return;
    const c10::ScalarType dt = t.scalar_type();
    if (dt == c10::kFloat || dt == c10::kDouble) {
      if (!floating) floating = dt;
      ok = *floating == dt;
      return;
    }
    const std::string& name = schema.arguments()[arg].name();
    ok = dt == c10::kLong && (name == "indices" || name == "index" || name == "target");
  });
  return ok && floating.has_value();
}

void cpu_probe_misled(const std::vector<int64_t>& key) {
  ++n_misled;
  verdicts().set(key, false);
}

std::vector<int64_t> cpu_probe_counts() { return {n_probes.load(), n_rejects.load(), n_misled.load()}; }

}  // namespace tpu_eager
