// Fusion: cutting a flushed graph into fused regions, and their cache keys.
#pragma once

#include <cstdint>
#include <vector>

#include "jit/region.h"
#include "lazy/storage_map.h"

namespace tpu_eager {
namespace jit {

// Cuts the live nodes of `g` (program order) into regions and decides which
// outputs each materializes. Fusion is decided here only, asking the target
// (`rules`, the active executor; null: FusionRules' defaults) how each op runs
// (DESIGN §5): elementwise ops and data movement fuse with the ops that
// produce their inputs; producers fuse into a reduction or matmul, which then
// only takes consumers that iterate over its output (an epilogue), unless the
// target ends its loop at that reduction (OpFusion::kEndsLoop: its consumers
// start a new region); ops the target cannot fuse (OpFusion::kOpByOp) are cut
// out into regions of their own (anchor kLibrary) that run op by op, so they
// never keep a fused chain from fusing (a lone fusable elementwise op next to
// such a region joins it: a loop of one op gains nothing); library calls run alone; a region
// holds at most kMaxRegionOps ops. Outputs in `observed` (lazy/queue.h
// FlushStorages::observed) and outputs read by a later region are materialized.
std::vector<Region> partition(const std::vector<Node>& g, const std::vector<char>& live, const StorageSet& observed,
                              const FusionRules* rules = nullptr);

// Structural key of a region: ops, argument structure (which value feeds
// which argument), dtypes, the region inputs' sizes bucketed (dynamic_shapes.h), non-tensor
// arguments that shape the computation (dims, sizes, flags), and which outputs
// are materialized, and the region's anchor. Python float scalars are runtime parameters: only their
// kind is part of the key, so a changing learning rate never recompiles.
uint64_t structural_key(const std::vector<Node>& g, const Region& r);
// The same key, and in `words` every value it was built from: two regions
// share a kernel only when their words are equal (the hash alone may collide).
uint64_t structural_key(const std::vector<Node>& g, const Region& r, std::vector<uint64_t>* words);

// The same key with ops named by qualified name and overload instead of by
// address: equal across processes of one build (the on-disk cache's key).
uint64_t stable_structural_key(const std::vector<Node>& g, const Region& r);

constexpr size_t kMaxRegionOps = 256;

// The shape a fused loop running `n` iterates over: a reduction's input (the
// rows it reduces), cat's first non-empty input (Lowering::concat), else its
// first fresh output or first written argument; null when it has none.
c10::OptionalIntArrayRef loop_shape(const Node& n);

}  // namespace jit
}  // namespace tpu_eager
