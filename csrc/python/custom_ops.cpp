// Bindings of custom ops on "tpu" (ops/custom_ops.h): a Python kernel as the
// HostKernel that runs at flush, and the GIL-aware wait for the flush lock.
#include "python/custom_ops.h"

#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "lazy/queue.h"
#include "ops/custom_ops.h"

namespace py = pybind11;

namespace tpu_eager {
namespace {

// The author's Python kernel, called with the op's arguments as torch.library
// calls a Python kernel (positional and keyword-only arguments; a
// DispatchKeySet first with with_keyset), its result pushed as the op's.
class PyHostKernel final : public HostKernel {
 public:
  PyHostKernel(py::object fn, bool with_keyset) : fn_(new py::object(std::move(fn))), with_keyset_(with_keyset) {}
  ~PyHostKernel() override {
    // The last reference may go on a thread without the GIL (a flush).
    if (!Py_IsInitialized()) {
      fn_->release();  // the interpreter is gone: drop the pointer, not the reference
      delete fn_;
      return;
    }
    py::gil_scoped_acquire gil;
    delete fn_;
  }

  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack, const SourceLocation& where) override {
    py::gil_scoped_acquire gil;
    const size_t nargs = op.schema().arguments().size();
    const std::vector<c10::IValue> args(stack->end() - nargs, stack->end());
    try {
      // Positional arguments, then keyword-only ones by name (as torch.library passes them).
      const auto& schema = op.schema();
      py::list py_args;
      py::dict py_kwargs;
      if (with_keyset_) py_args.append(py::cast(c10::DispatchKeySet(c10::DispatchKey::CPU)));
      for (size_t i = 0; i < nargs; ++i) {
        py::object v = torch::jit::toPyObject(args[i]);
        if (schema.arguments()[i].kwarg_only()) {
          py_kwargs[py::str(schema.arguments()[i].name())] = v;
        } else {
          py_args.append(v);
        }
      }
      py::object out = (*fn_)(*py::tuple(py_args), **py_kwargs);
      // Its results: None for no return, one value, or a tuple of them.
      torch::jit::drop(*stack, nargs);
      const auto& rets = schema.returns();
      if (rets.size() == 1) {
        stack->push_back(torch::jit::toIValue(out, rets[0].real_type()));
      } else if (rets.size() > 1) {
        const auto seq = out.cast<py::sequence>();
        TORCH_CHECK(py::len(seq) == rets.size(), "tpu: the kernel of ", schema.name(), " returned ", py::len(seq),
                    " values; its schema has ", rets.size());
        for (size_t k = 0; k < rets.size(); ++k) stack->push_back(torch::jit::toIValue(seq[k], rets[k].real_type()));
      }
    } catch (py::error_already_set& e) {
      // The Python exception as is (type, message), with a note naming the op
      // and the line that recorded it: it surfaces where its results are read.
      const std::string name = op.schema().name();
      const std::string line = where.empty() ? std::string("<unknown>") : where.str();
      try {
        e.value().attr("add_note")("while running the tpu kernel of " + name + " at a flush (recorded at " + line +
                                   ")");
      } catch (py::error_already_set&) {
      }
      e.restore();
      python_error err;
      err.persist();
      throw err;
    }
  }

 private:
  py::object* fn_;  // deleted with the GIL held
  bool with_keyset_;
};

// Waits for the flush lock without the GIL when this thread holds it.
void wait_without_gil(c10::function_ref<void()> wait) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    wait();
    return;
  }
  wait();
}

CustomCost cost_from_dict(const py::dict& d) {
  CustomCost c;
  if (d.contains("flops") && !d["flops"].is_none()) c.flops = d["flops"].cast<double>();
  if (d.contains("mxu")) c.mxu = d["mxu"].cast<bool>();
  if (d.contains("hbm_bytes") && !d["hbm_bytes"].is_none()) c.hbm_bytes = d["hbm_bytes"].cast<int64_t>();
  if (d.contains("vmem_bytes")) c.vmem_bytes = d["vmem_bytes"].cast<int64_t>();
  if (d.contains("grid")) c.grid = d["grid"].cast<std::vector<int64_t>>();
  if (d.contains("blocks")) {
    for (const auto& b : d["blocks"].cast<py::list>()) {
      const auto bd = b.cast<py::dict>();
      CustomCost::Block blk;
      blk.role = bd["role"].cast<std::string>();
      blk.dtype = bd["dtype"].cast<std::string>();
      blk.shape = bd["shape"].cast<std::vector<int64_t>>();
      blk.block = bd["block"].cast<std::vector<int64_t>>();
      blk.buffers = bd["buffers"].cast<int>();
      blk.vmem_bytes = bd["vmem_bytes"].cast<int64_t>();
      c.blocks.push_back(std::move(blk));
    }
  }
  return c;
}

}  // namespace

void bind_custom_ops(py::module& m) {
  set_lock_wait_hook(&wait_without_gil);
  m.def(
      "_register_custom_op",
      [](const std::string& qualname, py::object fn, bool with_keyset) {
        return register_custom_op(qualname, std::make_shared<PyHostKernel>(std::move(fn), with_keyset));
      },
      py::arg("qualname"), py::arg("fn"), py::arg("with_keyset") = false,
      "Records `qualname` on tpu; `fn` runs at flush on CPU tensors. Returns a handle.");
  m.def("_deregister_custom_op", &deregister_custom_op, py::arg("handle"));
  m.def("_adopt_cpp_kernel", &adopt_cpp_kernel, py::arg("qualname"),
        "Records `qualname` on tpu when its PrivateUse1 kernel is a C++ one (run at flush). Returns a handle or 0.");
  m.def(
      "_set_custom_op_cost",
      [](const std::string& qualname, const py::object& cost) {
        if (cost.is_none()) {
          set_custom_cost(qualname, nullptr);
        } else {
          set_custom_cost(qualname, std::make_shared<const CustomCost>(cost_from_dict(cost.cast<py::dict>())));
        }
      },
      py::arg("qualname"), py::arg("cost"));
}

}  // namespace tpu_eager
