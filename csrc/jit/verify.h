// The region verifier: checks partition()'s output between the JIT's stages.
#pragma once

#include <string>
#include <vector>

#include "jit/region.h"
#include "lazy/storage_map.h"

namespace tpu_eager {
namespace jit {

// Checks `regions` cut from the live nodes of `g` (`live`, `observed` as
// given to partition): every live node in exactly one region and no dead
// one; each region's nodes in program order and at most kMaxRegionOps;
// operands defined before use (a value produced in this flush comes from an
// earlier node in the same or an earlier region; reads and writes of one
// storage keep their program order across regions); materialize flags sized
// to the nodes' outputs and set on every output a later region reads or that
// is observed after the flush; the anchor consistent with the ops' kinds
// (kLibrary: one library op alone, or lowered non-matmul ops run op by op;
// kMatmul: one matmul first, elementwise epilogue after it; kReduction: no
// library or matmul op and at least one reduction; kElementwise: only
// elementwise, data and random ops); the loops partition assigned
// (Region::loop): numbered in order of first op, each over one shape, a
// reduction last in its loop, no value made or written in one loop touched
// by another; a matmul's epilogue iterating over the product's shape.
// Returns "" or the first violation.
std::string verify_regions(const std::vector<Node>& g, const std::vector<char>& live, const StorageSet& observed,
                           const std::vector<Region>& regions);

// Whether run_graph verifies each flush's regions: TORCH_TPU_DEBUG >= 2, a
// debug build (TORCH_TPU_DEBUG_BUILD=1 python setup.py ...), or _C._jit_set_verify(True) (tests).
bool verify_enabled();
void set_verify(bool on);

// Test hook (_C._jit_break_next_partition): corrupts the next flush's regions
// once, after partition, so tests can see the verifier catch it. 1: swaps the
// first two nodes of the first region with two; 2: clears the first set
// materialize flag; 3: marks the first region's anchor kMatmul; 4: moves
// the last op of the first one-loop region of two ops or more into a loop
// of its own. 0: off.
void set_break_next_partition(int mode);
void apply_test_break(std::vector<Region>& regions);
// Whether a test break waits for the next partition (the flush cache then lets the flush partition).
bool test_break_pending();

}  // namespace jit
}  // namespace tpu_eager
