// Walking the tensors among an ATen op's arguments on the dispatcher stack.
#pragma once

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

namespace tpu_eager {

// Calls f(arg index, list index or -1, tensor) for every tensor among the op's
// `n` arguments at stack[first, first + n): a Tensor, each element of a
// Tensor[] and each defined Tensor of a Tensor?[] (other lists are skipped).
template <typename F>
void for_each_tensor(const torch::jit::Stack& stack, size_t first, size_t n, F&& f) {
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      f(static_cast<int>(i), -1, v.toTensor());
    } else if (!v.isList()) {
      // A Scalar, int, ...: isList is inline, isTensorList an out-of-line call
      // (~11 instructions a non-tensor argument a walk, several walks an op).
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) f(static_cast<int>(i), static_cast<int>(j), list.get(j));
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (e.isTensor()) f(static_cast<int>(i), static_cast<int>(j), e.toTensor());
      }
    }
  }
}

}  // namespace tpu_eager
