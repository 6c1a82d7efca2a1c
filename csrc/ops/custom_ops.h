// Custom ops (torch.library) on "tpu": recorded like ATen ops, run at flush
// by the kernel their author registered for the device.
//
// An op defined outside aten (torch.library.custom_op, Library.define) whose
// author registers a "tpu" (PrivateUse1) kernel gets, in its place, the
// generic record kernel: shapes and dtypes come from the op's fake (meta)
// impl at the call, which raises its errors there; one Node of kind kLibrary
// is queued. At flush the author's kernel — the HostKernel registered here —
// runs on CPU tensors that hold the device buffers (host::call_cpu), as every
// library call runs CPU code on host buffers. No per-op code: any schema
// (several results, Tensor[] arguments and results, mutated arguments).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "lazy/queue.h"

namespace tpu_eager {

// The author's kernel of a custom op, run on host tensors: `stack` holds the
// op's arguments (CPU tensors aliasing the device buffers; written arguments
// are written in place) and is left holding its results. `where` is the
// Python line that recorded the call, for error messages.
class HostKernel {
 public:
  virtual ~HostKernel() = default;
  virtual void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, const SourceLocation& where) = 0;
};

// A cost the author gives for one call of a custom op, used by the TPU cost
// model instead of its default rule for library calls (one vector op per
// result element; bytes of the tensors read and written). `flops` < 0: the
// default rule; `hbm_bytes` < 0: the bytes of the tensors read and written.
// `grid` and `blocks` describe a tiled (Pallas) kernel for the profiler.
struct CustomCost {
  double flops = -1;
  bool mxu = false;        // flops run on the MXUs (else on the vector unit)
  int64_t hbm_bytes = -1;  // HBM bytes the kernel moves over its whole grid
  int64_t vmem_bytes = 0;  // VMEM footprint (double-buffered blocks)
  std::vector<int64_t> grid;
  struct Block {
    std::string role;  // "input" / "output"
    std::string dtype;
    std::vector<int64_t> shape, block;
    int buffers = 2;
    int64_t vmem_bytes = 0;
  };
  std::vector<Block> blocks;
};

// Registers the record kernel for `qualname` ("ns::name" or "ns::name.overload")
// on PrivateUse1, with `kernel` as what runs at flush. The op need not be
// defined yet. Registrations of one op stack: the latest is used, and
// deregistering it restores the previous one. Returns a handle for
// deregister_custom_op. Raises for an aten op (its device kernel is the
// op table's) and for a malformed name.
int64_t register_custom_op(const std::string& qualname, std::shared_ptr<HostKernel> kernel);
void deregister_custom_op(int64_t handle);

// Adopts a "tpu" kernel registered in C++ (TORCH_LIBRARY_IMPL(ns, PrivateUse1,
// m) in a user's extension, which the dispatcher would run at the call on
// "tpu" tensors whose buffers are not yet computed): the kernel is taken from
// the dispatcher (a SafeKernelFunction, valid while its registration lives)
// and the record kernel is registered over it, with that C++ kernel as what
// runs at flush on CPU tensors holding the device buffers (boxed, with the
// CPU dispatch key set), as Python kernels run. Returns the registration's
// handle, or 0 when `qualname` ("ns::name[.overload]") is not defined, is an
// aten op, has no PrivateUse1 kernel of its own (a composite or fallthrough
// kernel is left alone), or its PrivateUse1 kernel is already the record kernel.
int64_t adopt_cpp_kernel(const std::string& qualname);

// The author's kernel of `op` when it is a registered custom op, else null.
// Cheap for aten ops (no lookup).
std::shared_ptr<HostKernel> custom_host_kernel(const c10::OperatorHandle& op);

// Sets (or, with nullptr, clears) the cost of every call of `qualname`.
void set_custom_cost(const std::string& qualname, std::shared_ptr<const CustomCost> cost);
std::shared_ptr<const CustomCost> custom_cost(const c10::OperatorHandle& op);

// The short name of an op for kernel names and the profiler: "add" for
// aten::add, the qualified name ("mylib::myop") for any other namespace.
std::string op_short_name(const c10::FunctionSchema& schema);

}  // namespace tpu_eager
