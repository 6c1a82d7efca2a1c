// The simulated Spyre target's storage numerics, shared by its executor and
// the host<->device copies (ops/device_kernels.cpp): float16/bfloat16 values
// are held as df16, int64 values as int32.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tpu_eager {
namespace spyre {

// True while the active target is Spyre.
bool active();

// Rounds a float16/bfloat16 tensor in place through df16 (df16_round); other
// dtypes are left alone.
void round_in_place(const at::Tensor& t);
// `t` rounded through df16 when float16/bfloat16, else `t` itself.
at::Tensor rounded(const at::Tensor& t);
// Raises OverflowError (see set_overflow_thrower) when an int64 tensor holds a
// value outside int32; `what` names the op or copy in the message.
void check_int32(const at::Tensor& t, const std::string& what);

// Spyre's storage numerics for an op run eagerly (ops/record.cpp run_eager):
// each tensor among its CPU `returns` (fresh results and written arguments)
// is checked to fit int32 when int64 and rounded in place through df16 when
// float16/bfloat16; `what` names the op in errors.
void after_eager_op(std::vector<c10::IValue>& returns, const std::string& what);

// Throws the error Python sees as OverflowError. The binding installs a
// thrower of a torch::PyTorchError whose python_type() is OverflowError
// (c10 has no error type that torch translates to OverflowError); without
// it a c10::Error (RuntimeError) is thrown.
using OverflowThrower = void (*)(const std::string& msg);
void set_overflow_thrower(OverflowThrower thrower);
[[noreturn]] void throw_overflow(const std::string& msg);

}  // namespace spyre
}  // namespace tpu_eager
