// View decomposition and inversion (DESIGN §3).
//
// A device value is a flat storage; a tensor is a view (sizes, strides,
// storage offset) of it. An accelerator without strided memory access reads
// such a view as a short chain of primitive view steps and writes it back
// through the inverse chain. decompose() finds that chain:
//
//   narrow(flat, offset, span) -> [pad] -> reshape(base) -> slice per dim
//   -> [select the step lane] -> permute -> unsqueeze (size-1 dims)
//   -> expand (stride-0 dims)
//
// and falls back to an index gather only when no such chain exists
// (overlapping windows such as unfold(size > step), arbitrary as_strided).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tpu_eager {
namespace views {

enum class StepKind {
  kNarrow,     // flat[start : start + length]
  kPad,        // pad the flat range at its end to `length` elements (never read)
  kReshape,    // to `shape` (contiguous)
  kSlice,      // dim `dim`: [start : start + length]
  kSelect,     // dim `dim`: index `start` (drops the dim)
  kPermute,    // `shape` holds the permutation
  kUnsqueeze,  // insert a size-1 dim at `dim`
  kExpand,     // broadcast to `shape`
  kGather,     // flat.as_strided(...) materialized by an index gather
};

struct ViewStep {
  StepKind kind;
  int64_t dim = 0;
  int64_t start = 0;
  int64_t length = 0;
  std::vector<int64_t> shape;
};

struct ViewChain {
  std::vector<ViewStep> steps;
  bool gather = false;  // needs an index gather (no primitive chain exists)
  bool padded = false;  // reads past the storage end that are padded, never observed
  // "narrow(3, 21) -> reshape[4, 6] -> slice(1, 1, 2) -> permute[1, 0]"
  std::string str() const;
};

// Decomposes the view (sizes, strides, offset) of a flat storage holding
// `storage_numel` elements. Strides and offset in elements. Never fails: a
// view no chain describes becomes a gather.
ViewChain decompose(int64_t storage_numel, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);

// True when two elements of the view (sizes, strides in elements) share a
// memory location, or when that is too costly to decide exactly (then the
// caller must treat the view as overlapping). A write through such a view
// (unfold with step < size, overlapping as_strided) must run element by
// element in memory order as CPU's kernels do, never as a gathered copy
// scattered back: a stale copy of a shared element would overwrite the new one.
bool overlaps_itself(c10::IntArrayRef sizes, c10::IntArrayRef strides);

// Read: the value of the view, from the flat (1-D, contiguous) storage value.
// Without pad/gather steps the result aliases `flat` (CPU views).
at::Tensor apply(const at::Tensor& flat, const ViewChain& chain, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                 int64_t offset);

// Write: stores `value` (the new value of the view) into `flat` through the
// inverse chain (expand -> reduce is invalid for writes: a view with stride-0
// dims must not be written; callers check internal overlap first).
void scatter(at::Tensor& flat, const ViewChain& chain, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
             const at::Tensor& value);

}  // namespace views
}  // namespace tpu_eager
