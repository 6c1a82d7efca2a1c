// Out= overloads of functional ATen ops, so a CPU kernel can write a
// materialized result straight into its device buffer instead of into a
// fresh CPU tensor that is then copied there (one copy less per output).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace tpu_eager {
namespace host {

// The out= overload of the functional op `op` (e.g. aten::_softmax ->
// aten::_softmax.out): same name, the same non-out arguments (names and
// types, in order) followed by one out= Tensor per Tensor return. nullptr
// when none exists or `op` returns anything but Tensors. Cached per op. An
// aten op's candidate is the one overload named by out_overloads.inc
// (generated from the installed torch by tools/gen_op_table.py), looked up by
// name; other namespaces search all overloads of the op's name.
// `functional_plus_copy`, when given, is set to whether that overload's only
// kernel is the functional op followed by a copy into out (PyTorch generates
// such out= overloads for ops that have no out= kernel of their own).
const c10::OperatorHandle* out_variant(const c10::OperatorHandle& op, bool* functional_plus_copy = nullptr);

}  // namespace host
}  // namespace tpu_eager
