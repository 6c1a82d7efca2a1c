// The op table: every ATen overload the device records, with its primitive
// kind. Generated data (op_table.inc, tools/gen_op_table.py).
#pragma once

#include <cstdint>
#include <vector>

#include "jit/ir.h"

namespace tpu_eager {

// What the record kernel knows of an overload beyond its schema (OpEntry::traits bits).
enum OpTrait : uint32_t {
  // The C++ meta kernel gives CPU's result geometry and call-time errors: a
  // structured kernel's meta function (the code CPU runs first: shapes, dtypes,
  // strides, checks), or an in-place op's hand-written one (fill_, zero_).
  // Shape/dtype inference runs it instead of the Python meta kernel that shadows
  // it (tools/gen_op_table.py, cpp_meta_is_cpu_overloads).
  kCppMetaIsCpu = 1u << 0,
};

struct OpEntry {
  const char* name;  // "add.Tensor"
  PrimKind kind;
  uint32_t extra_writes;  // bit i: argument i is written though its schema does not say so
  uint32_t traits = 0;    // OpTrait bits
};

const std::vector<OpEntry>& op_table();

// Registers the record kernel for every row of the table and the device's own
// kernels (empty, copies, scalar reads, resize_, set_, views). Called once at
// import; returns the number of overloads registered.
int64_t register_device_kernels();

}  // namespace tpu_eager
