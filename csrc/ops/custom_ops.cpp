// Custom ops on "tpu": the generic record kernel and the registry of the
// authors' kernels (see custom_ops.h).
#include "ops/custom_ops.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "device/device.h"
#include "lazy/debug_report.h"
#include "ops/memory_format.h"
#include "ops/record.h"

namespace tpu_eager {
namespace {

std::atomic<int64_t> g_next_id{1};

// The "file" of the record kernel's registrations: the dispatcher's debug
// string of a kernel names it ("registered at <file>:<line>"), which tells the
// record kernel apart from a user's C++ kernel in adopt_cpp_kernel.
constexpr char kRecordKernelFile[] = "torch_tpu_eager/csrc/ops/custom_ops.cpp (tpu record kernel)";

// A user's C++ PrivateUse1 kernel, run at flush on host tensors.
class CppHostKernel final : public HostKernel {
 public:
  explicit CppHostKernel(c10::SafeKernelFunction kernel) : kernel_(std::move(kernel)) {}
  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, const SourceLocation& where) override {
    try {
      kernel_.callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    } catch (c10::Error& e) {
      // Its own exception type and message, plus the op and the line that recorded it.
      e.add_context("while running the C++ tpu kernel of " + op.schema().name() + " (" + kernel_.debug() +
                    ") at a flush (recorded at " + (where.empty() ? std::string("<unknown>") : where.str()) + ")");
      throw;
    }
  }

 private:
  c10::SafeKernelFunction kernel_;
};

struct Registry {
  std::mutex mu;
  struct Registration {
    c10::OperatorName op;
    std::shared_ptr<HostKernel> kernel;
    std::unique_ptr<torch::Library> lib;  // owns the dispatcher registration of the record kernel
  };
  std::map<int64_t, Registration> by_handle;
  // Per op, its registrations' handles in order: the last one's kernel runs.
  std::unordered_map<c10::OperatorName, std::vector<int64_t>> stacks;
  std::unordered_map<c10::OperatorName, std::shared_ptr<const CustomCost>> costs;
  std::atomic<int> count{0};  // registrations alive: 0 keeps custom_host_kernel free for aten ops
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: dispatcher registrations outlive static destructors
  return *r;
}

c10::OperatorName parse_name(const std::string& qualname) {
  const auto sep = qualname.find("::");
  TORCH_CHECK(sep != std::string::npos && sep > 0, "tpu: custom op name '", qualname,
              "' is not of the form 'namespace::name[.overload]'");
  const auto dot = qualname.find('.', sep + 2);
  if (dot == std::string::npos) return c10::OperatorName(qualname, "");
  return c10::OperatorName(qualname.substr(0, dot), qualname.substr(dot + 1));
}

bool is_aten(const c10::OperatorName& name) { return name.name.rfind("aten::", 0) == 0; }

// A meta tensor with t's geometry over a meta storage of t's storage size.
at::Tensor meta_twin(const at::Tensor& t) {
  c10::Storage st(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                  c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)), c10::GetAllocator(c10::DeviceType::Meta),
                  /*resizable=*/true);
  auto m =
      at::detail::make_tensor<c10::TensorImpl>(std::move(st), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
  m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return m;
}

// Whether every return aliases an argument without writing it (a view op).
bool returns_views(const c10::FunctionSchema& s) {
  if (s.returns().empty()) return false;
  for (const auto& r : s.returns())
    if (!r.alias_info() || r.alias_info()->isWrite()) return false;
  return true;
}

// The argument return `k` aliases, or -1.
int aliased_argument(const c10::FunctionSchema& s, size_t k) {
  const auto* ra = s.returns()[k].alias_info();
  if (!ra) return -1;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* a = s.arguments()[i].alias_info();
    if (a && a->beforeSets() == ra->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// A view op (every result aliases an argument, nothing written): as for
// ATen's views, the result is metadata over the argument's storage, with the
// geometry the fake impl gives; nothing is recorded (the kernel would return
// exactly that view of the same memory).
void record_view(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  torch::jit::Stack meta(stack->begin() + first, stack->end());
  for (auto& v : meta)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      v = meta_twin(v.toTensor());
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    DeviceMetaInference as_cpu;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  }
  std::vector<c10::IValue> results;
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    const int a = aliased_argument(schema, k);
    TORCH_CHECK_NOT_IMPLEMENTED(a >= 0 && (*stack)[first + a].isTensor() && meta[k].isTensor(), "tpu: custom op ",
                                schema.name(), ": result ", k, " is a view of an argument that is not one tensor");
    const at::Tensor orig = (*stack)[first + a].toTensor();
    const at::Tensor m = meta[k].toTensor();
    at::Tensor alias =
        at::detail::make_tensor<c10::TensorImpl>(c10::Storage(orig.storage()), orig.key_set(), m.dtype());
    alias.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
    results.emplace_back(std::move(alias));
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

// The record kernel of one registration of a custom op.
struct CustomOpRecorder final : c10::OperatorKernel {
  explicit CustomOpRecorder(std::string n) : name(std::move(n)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    std::call_once(planned, [&] {
      entry = OpEntry{name.c_str(), PrimKind::kLibrary, 0};
      plan.reset(plan_op(op, entry));
      plan->custom_id = g_next_id++;  // meta results are cached per registration, never across a redefinition
      view = returns_views(op.schema());
    });
    debug::count_op("custom_op", name);
    if (view) {
      record_view(op, stack);
      return;
    }
    record_op(op, entry, *plan, stack);
  }
  std::string name;
  std::once_flag planned;
  OpEntry entry{nullptr, PrimKind::kLibrary, 0};
  std::unique_ptr<OpPlan> plan;
  bool view = false;
};

}  // namespace

int64_t register_custom_op(const std::string& qualname, std::shared_ptr<HostKernel> kernel) {
  const c10::OperatorName name = parse_name(qualname);
  TORCH_CHECK(!is_aten(name), "tpu: ", qualname, " is an ATen op; its tpu kernel is the device's own");
  const std::string ns = name.name.substr(0, name.name.find("::"));
  const std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  auto lib =
      std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, kRecordKernelFile, 0);
  // The dispatcher warns when a kernel replaces one registered before for
  // the same key (a second registration of one op): the stack below is the
  // intended behaviour, so the warning is dropped.
  struct DropWarnings : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } drop;
  {
    c10::WarningUtils::WarningHandlerGuard quiet(&drop);
    lib->impl(full.substr(ns.size() + 2).c_str(),
              torch::CppFunction::makeFromBoxedFunctor(std::make_unique<CustomOpRecorder>(full)));
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t handle = g_next_id++;
  r.by_handle.emplace(handle, Registry::Registration{name, std::move(kernel), std::move(lib)});
  r.stacks[name].push_back(handle);
  r.count++;
  return handle;
}

void deregister_custom_op(int64_t handle) {
  auto& r = registry();
  std::unique_ptr<torch::Library> lib;
  std::shared_ptr<HostKernel> kernel;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_handle.find(handle);
    if (it == r.by_handle.end()) return;
    lib = std::move(it->second.lib);
    kernel = std::move(it->second.kernel);
    auto& s = r.stacks[it->second.op];
    s.erase(std::remove(s.begin(), s.end(), handle), s.end());
    if (s.empty()) r.stacks.erase(it->second.op);
    r.by_handle.erase(it);
    r.count--;
  }
  // Outside the lock: deregistering takes the dispatcher's lock; the kernel
  // (a Python callable) is released by its own destructor.
  lib.reset();
  kernel.reset();
}

int64_t adopt_cpp_kernel(const std::string& qualname) {
  const c10::OperatorName name = parse_name(qualname);
  if (is_aten(name)) return 0;
  static std::mutex adopt_mu;  // two adoptions of one op must not stack two record kernels
  std::lock_guard<std::mutex> lock(adopt_mu);
  auto op = c10::Dispatcher::singleton().findOp(name);
  if (!op || !op->hasSchema() || !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return 0;
  if (op->isKernelFallthroughKernel(c10::DispatchKey::PrivateUse1)) return 0;
  c10::SafeKernelFunction kernel = op->getComputedKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
  if (kernel.debug().find(kRecordKernelFile) != std::string::npos) return 0;  // already recorded
  return register_custom_op(qualname, std::make_shared<CppHostKernel>(std::move(kernel)));
}

std::shared_ptr<HostKernel> custom_host_kernel(const c10::OperatorHandle& op) {
  auto& r = registry();
  if (r.count.load(std::memory_order_relaxed) == 0) return nullptr;
  const auto& name = op.operator_name();
  if (is_aten(name)) return nullptr;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.stacks.find(name);
  if (it == r.stacks.end() || it->second.empty()) return nullptr;
  return r.by_handle.at(it->second.back()).kernel;
}

void set_custom_cost(const std::string& qualname, std::shared_ptr<const CustomCost> cost) {
  const c10::OperatorName name = parse_name(qualname);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (cost) {
    r.costs[name] = std::move(cost);
  } else {
    r.costs.erase(name);
  }
}

std::shared_ptr<const CustomCost> custom_cost(const c10::OperatorHandle& op) {
  auto& r = registry();
  const auto& name = op.operator_name();
  if (is_aten(name)) return nullptr;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.costs.find(name);
  return it == r.costs.end() ? nullptr : it->second;
}

std::string op_short_name(const c10::FunctionSchema& schema) {
  const std::string& n = schema.name();
  return n.rfind("aten::", 0) == 0 ? n.substr(6) : n;
}

}  // namespace tpu_eager
