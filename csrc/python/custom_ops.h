// Bindings of custom ops on "tpu" (see custom_ops.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace tpu_eager {

// Adds _register_custom_op, _deregister_custom_op and _set_custom_op_cost to
// `m`, and installs the GIL-aware wait for the flush lock.
void bind_custom_ops(pybind11::module& m);

}  // namespace tpu_eager
