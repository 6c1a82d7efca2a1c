// The op table: every ATen overload the device records, with its primitive
// kind. Generated data (op_table.inc, tools/gen_op_table.py).
#pragma once

#include <cstdint>
#include <vector>

#include "jit/ir.h"

namespace tpu_eager {

struct OpEntry {
  const char* name;        // "add.Tensor"
  PrimKind kind;
  uint32_t extra_writes;   // bit i: argument i is written though its schema does not say so
};

const std::vector<OpEntry>& op_table();

// Registers the record kernel for every row of the table and the device's own
// kernels (empty, copies, scalar reads, resize_, set_, views). Called once at
// import; returns the number of overloads registered.
int64_t register_device_kernels();

}  // namespace tpu_eager
