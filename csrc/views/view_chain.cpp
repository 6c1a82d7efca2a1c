// View decomposition and inversion.
#include "views/view_chain.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include <ATen/ops/as_strided.h>
#include <ATen/ops/constant_pad_nd.h>

namespace tpu_eager {
namespace views {
namespace {

ViewChain gather_chain() {
  ViewChain c;
  c.gather = true;
  c.steps.push_back(ViewStep{StepKind::kGather});
  return c;
}

void push(ViewChain& c, StepKind k, int64_t dim = 0, int64_t start = 0, int64_t length = 0,
          std::vector<int64_t> shape = {}) {
  c.steps.push_back(ViewStep{k, dim, start, length, std::move(shape)});
}

}  // namespace

ViewChain decompose(int64_t storage_numel, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  ViewChain c;
  int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  if (numel == 0) {
    push(c, StepKind::kNarrow, 0, 0, 0);
    push(c, StepKind::kReshape, 0, 0, 0, sizes.vec());
    return c;
  }
  // kept: dims that move through memory; the rest are size 1 or broadcast.
  std::vector<int64_t> kept;
  bool broadcast = false;
  for (int64_t d = 0; d < n; ++d) {
    if (sizes[d] == 1) continue;
    if (strides[d] == 0) {
      broadcast = true;
      continue;
    }
    if (strides[d] < 0) return gather_chain();
    kept.push_back(d);
  }
  // Inner to outer by stride; equal strides overlap.
  std::vector<int64_t> order = kept;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] < strides[b]; });
  for (size_t i = 1; i < order.size(); ++i)
    if (strides[order[i]] == strides[order[i - 1]]) return gather_chain();

  // Base dims, inner to outer: view dim j spans a base dim of extent
  // stride(next outer) / stride(j); a leading stride > 1 adds a "lane" dim
  // of that extent from which one index is selected.
  const int64_t lane = order.empty() ? 1 : strides[order[0]];
  std::vector<int64_t> extent(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t s = strides[order[i]], sz = sizes[order[i]];
    if (i + 1 < order.size()) {
      const int64_t next = strides[order[i + 1]];
      if (next % s != 0 || sz > next / s) return gather_chain();  // wraps or overlaps
      extent[i] = next / s;
    } else {
      extent[i] = sz;
    }
  }
  int64_t total = lane;
  for (auto e : extent) total *= e;
  // Start coordinates: the block starts at the view's first element unless it
  // would then run past the storage end; then shift the start back as far as
  // the slack of each inner dim allows (a pad covers what remains).
  int64_t base = offset;
  std::vector<int64_t> start(order.size(), 0);
  int64_t lane_start = 0;
  if (offset + total > storage_numel) {
    for (size_t i = order.size(); i-- > 0;) {
      if (i + 1 == order.size()) continue;  // the outermost dim has no slack
      const int64_t s = strides[order[i]];
      start[i] = std::min(extent[i] - sizes[order[i]], base / s);
      base -= start[i] * s;
    }
    if (lane > 1) {
      lane_start = std::min(lane - 1, base);
      base -= lane_start;
    }
  }
  const int64_t avail = storage_numel - base;
  push(c, StepKind::kNarrow, 0, base, std::min(total, avail));
  if (total > avail) {
    push(c, StepKind::kPad, 0, 0, total);
    c.padded = true;
  }
  // Reshape outer to inner (then the lane).
  std::vector<int64_t> shape(extent.rbegin(), extent.rend());
  if (lane > 1) shape.push_back(lane);
  if (shape.empty()) shape = {};
  push(c, StepKind::kReshape, 0, 0, 0, shape);
  const int64_t k = static_cast<int64_t>(order.size());
  for (int64_t pos = 0; pos < k; ++pos) {
    const size_t i = static_cast<size_t>(k - 1 - pos);
    if (start[i] != 0 || extent[i] != sizes[order[i]]) push(c, StepKind::kSlice, pos, start[i], sizes[order[i]]);
  }
  if (lane > 1) push(c, StepKind::kSelect, k, lane_start);
  // Now dim pos holds view dim order[k-1-pos]; permute into increasing dim order.
  std::vector<int64_t> by_stride_desc(order.rbegin(), order.rend());
  std::vector<int64_t> perm(static_cast<size_t>(k));
  for (int64_t q = 0; q < k; ++q)
    perm[q] = std::find(by_stride_desc.begin(), by_stride_desc.end(), kept[q]) - by_stride_desc.begin();
  bool identity = true;
  for (int64_t q = 0; q < k; ++q) identity = identity && perm[q] == q;
  if (!identity) push(c, StepKind::kPermute, 0, 0, 0, perm);
  for (int64_t d = 0; d < n; ++d)
    if (std::find(kept.begin(), kept.end(), d) == kept.end()) push(c, StepKind::kUnsqueeze, d);
  if (broadcast) push(c, StepKind::kExpand, 0, 0, 0, sizes.vec());
  return c;
}

bool overlaps_itself(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of the dims that move
  int64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    numel *= sizes[d];
    if (sizes[d] <= 1) continue;
    if (strides[d] == 0) return true;
    dims.emplace_back(strides[d] < 0 ? -strides[d] : strides[d], sizes[d]);
  }
  if (numel <= 1) return false;
  std::sort(dims.begin(), dims.end());
  // Sufficient: each dim steps past everything the inner dims span.
  int64_t span = 0;  // largest offset reached by the inner dims
  bool nested = true;
  for (const auto& [stride, size] : dims) {
    if (stride <= span) nested = false;
    span += (size - 1) * stride;
  }
  if (nested) return false;
  // Interleaved dims (sizes (2, 2), strides (3, 2)) may still be disjoint:
  // decide exactly by marking every offset, when that is cheap enough.
  constexpr int64_t kMaxExact = int64_t(1) << 24;
  if (numel > kMaxExact || span >= kMaxExact) return true;
  std::vector<bool> seen(static_cast<size_t>(span + 1), false);
  std::vector<int64_t> idx(dims.size(), 0);
  int64_t off = 0;
  for (int64_t e = 0; e < numel; ++e) {
    if (seen[static_cast<size_t>(off)]) return true;
    seen[static_cast<size_t>(off)] = true;
    for (size_t d = 0; d < dims.size(); ++d) {  // odometer over the dims
      if (++idx[d] < dims[d].second) {
        off += dims[d].first;
        break;
      }
      off -= (idx[d] - 1) * dims[d].first;
      idx[d] = 0;
    }
  }
  return false;
}

std::string ViewChain::str() const {
  std::ostringstream o;
  auto list = [&](const std::vector<int64_t>& v) {
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    o << "]";
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    if (i) o << " -> ";
    switch (s.kind) {
      case StepKind::kNarrow:
        o << "narrow(" << s.start << ", " << s.length << ")";
        break;
      case StepKind::kPad:
        o << "pad(" << s.length << ")";
        break;
      case StepKind::kReshape:
        o << "reshape";
        list(s.shape);
        break;
      case StepKind::kSlice:
        o << "slice(" << s.dim << ", " << s.start << ", " << s.length << ")";
        break;
      case StepKind::kSelect:
        o << "select(" << s.dim << ", " << s.start << ")";
        break;
      case StepKind::kPermute:
        o << "permute";
        list(s.shape);
        break;
      case StepKind::kUnsqueeze:
        o << "unsqueeze(" << s.dim << ")";
        break;
      case StepKind::kExpand:
        o << "expand";
        list(s.shape);
        break;
      case StepKind::kGather:
        o << "gather";
        break;
    }
  }
  return o.str();
}

at::Tensor apply(const at::Tensor& flat, const ViewChain& chain, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                 int64_t offset) {
  at::Tensor t = flat;
  for (const auto& s : chain.steps) {
    switch (s.kind) {
      case StepKind::kNarrow:
        t = t.narrow(0, s.start, s.length);
        break;
      case StepKind::kPad:
        t = at::constant_pad_nd(t, {0, s.length - t.numel()}, 0);
        break;
      case StepKind::kReshape:
        t = t.view(s.shape);
        break;
      case StepKind::kSlice:
        t = t.narrow(s.dim, s.start, s.length);
        break;
      case StepKind::kSelect:
        t = t.select(s.dim, s.start);
        break;
      case StepKind::kPermute:
        t = t.permute(s.shape);
        break;
      case StepKind::kUnsqueeze:
        t = t.unsqueeze(s.dim);
        break;
      case StepKind::kExpand:
        t = t.expand(s.shape);
        break;
      // The index gather: on the host, a strided read of the flat value.
      case StepKind::kGather:
        t = at::as_strided(flat, sizes, strides, offset).clone();
        break;
    }
  }
  return t;
}

void scatter(at::Tensor& flat, const ViewChain& chain, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset,
             const at::Tensor& value) {
  if (chain.gather) {
    at::as_strided(flat, sizes, strides, offset).copy_(value);  // index scatter
    return;
  }
  if (!chain.padded) {
    apply(flat, chain, sizes, strides, offset).copy_(value);  // every step aliases: the inverse writes in place
    return;
  }
  // Padded: write into the padded block, then store its in-storage prefix.
  const auto& narrow = chain.steps[0];
  at::Tensor region = flat.narrow(0, narrow.start, narrow.length);
  at::Tensor block = at::constant_pad_nd(region, {0, chain.steps[1].length - region.numel()}, 0);
  ViewChain rest;
  rest.steps.assign(chain.steps.begin() + 2, chain.steps.end());
  apply(block, rest, sizes, strides, offset).copy_(value);
  region.copy_(block.narrow(0, 0, narrow.length));
}

}  // namespace views
}  // namespace tpu_eager
