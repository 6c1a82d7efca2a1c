// KTIR (Kernel Tile IR) of the simulated Spyre as a data structure, with its
// printer, parser, verifier and interpreter. The text form is documented in
// docs/ktir.md; print(parse(text)) == text for every printed program.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

// A kernel argument: one device storage (HBM buffer) the job plan binds.
struct KtirArg {
  enum Kind : uint8_t { kIn, kOut, kInOut };
  Kind kind = kIn;
  c10::ScalarType dtype = c10::kFloat;  // host dtype of the storage
  int64_t elems = 0;                    // storage size in elements
  int line = 0;
};

// A memory view: HBM (over an argument's storage) or LX (a temporary).
struct KtirView {
  bool lx = false;
  c10::ScalarType dtype = c10::kFloat;  // host dtype; the device dtype follows (f32, df16, i32, ...)
  int arg = -1;                         // HBM: the argument it views
  int buf = -1;                         // LX: the scratchpad buffer it views (%tK; views of one buffer alias)
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  int line = 0;
};

// The access tile of a view on one core: `sizes` elements at `at`, where a
// split dim 0 starts at core * `core_stride` (address arithmetic) and every
// other dim at 0.
struct KtirTile {
  int view = 0;
  std::vector<int64_t> sizes;
  int64_t core_stride = 0;  // 0: replicated (every core reads the tile at 0)
  int line = 0;
};

// One literal or view operand of an op.
struct KtirValue {
  enum Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kDtype, kView, kList };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;  // int, view id, dtype (c10::ScalarType)
  double f = 0;
  std::string s;
  std::vector<KtirValue> list;
};

// An op: results (view ids), the op (an ATen schema "add.Tensor"), operands.
struct KtirOp {
  std::vector<int> results;
  std::string op;
  std::vector<KtirValue> args;
  int line = 0;
};

struct KtirProgram {
  std::string name;
  int64_t grid = 1;           // cores of the grid
  int64_t rows_per_core = 1;  // rows of the split dim per core
  int64_t cores_used = 1;
  bool ring_reduce = false;
  std::vector<KtirArg> args;
  std::vector<KtirView> views;
  std::vector<KtirTile> tiles;
  std::vector<KtirOp> ops;
};

// Builds the program of `region` (views, grid and tiles of layout.h).
KtirProgram ktir_build(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card);
std::string ktir_print(const KtirProgram& p);
// Parses KTIR text; throws ValueError "line N: rule 'syntax': ..." on bad text.
KtirProgram ktir_parse(const std::string& text);
// Checks the program against the rules of docs/ktir.md (and, when `args` is
// given, against the tensors bound to its arguments). Throws ValueError
// naming the line and the rule.
void ktir_verify(const KtirProgram& p, const CardParams& card, const std::vector<at::Tensor>* args = nullptr);
// Runs the program on contiguous CPU tensors `inputs` bound to its in and
// inout arguments in order (out arguments are allocated, zero-filled): each op
// in f32 from df16 inputs, rounded once to df16 (df16_ops.h). inout tensors
// are written in place. Returns the out and inout arguments (flat, in argument
// order). Verifies first (ValueError naming the line and rule).
std::vector<at::Tensor> ktir_run(const KtirProgram& p, const CardParams& card, std::vector<at::Tensor> inputs);

}  // namespace spyre
}  // namespace tpu_eager
