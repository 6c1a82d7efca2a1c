// KTIR (Kernel Tile IR) of the simulated Spyre as a data structure, with its
// printer, parser, verifier and interpreter. The text form is documented in
// docs/ktir.md; print(parse(text)) == text for every printed program.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "executors/executor.h"
#include "executors/spyre/card.h"

namespace tpu_eager {
namespace spyre {

// An expression of the program's symbols, `constant + sum coef[k] * s<k> +
// sum products[j]`: affine, plus products of symbols (a monomial `c*s1*s2`).
// A size, stride, offset or element count that follows the symbols (a slice
// `d[:, 1:]` of a dynamic dim n has size n-1 = "s0-1" and pitch n = "s0"; a
// contiguous `[s0, s1, s2]` has stride "s1*s2" at dim 0 and "s0*s1*s2" elements).
// Text: "s0", "64*s0", "2*s0+3", "s0-1", "s1*s2", "2*s0*s1-s1", or a plain
// number (docs/ktir.md).
struct KtirExpr {
  // c * s<syms[0]> * s<syms[1]> * ...: two or more symbols, in increasing order (repeats: powers).
  struct Product {
    int64_t c = 0;
    std::vector<int> syms;
  };
  int64_t constant = 0;
  std::vector<int64_t> coef;      // per symbol k (shorter: the rest are 0)
  std::vector<Product> products;  // distinct monomials of degree >= 2, none with c == 0
  bool symbolic() const;
  // The value under symbol `values` (a missing symbol counts 0); saturates
  // at the int64 limits instead of overflowing.
  int64_t eval(const std::vector<int64_t>& values) const;
  // The one symbol it names, linearly (every other coefficient 0, no product), else -1.
  int single_symbol() const;
  static KtirExpr symbol(int k, int64_t coef = 1, int64_t constant = 0);
};

// A kernel argument: one device storage (HBM buffer) the job plan binds.
struct KtirArg {
  enum Kind : uint8_t { kIn, kOut, kInOut };
  Kind kind = kIn;
  c10::ScalarType dtype = c10::kFloat;  // host dtype of the storage
  int64_t elems = 0;                    // storage size in elements (bound)
  int line = 0;
  // Symbolic elems ("16*s0", "16*s0-16"), bound at launch (not symbolic: a constant).
  KtirExpr elems_expr;
};

// A memory view: HBM (over an argument's storage) or LX (a temporary).
struct KtirView {
  bool lx = false;
  c10::ScalarType dtype = c10::kFloat;  // host dtype; the device dtype follows (f32, df16, i32, ...)
  int arg = -1;                         // HBM: the argument it views
  int buf = -1;                         // LX: the scratchpad buffer it views (%tK; views of one buffer alias)
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;  // bound
  int line = 0;
  std::vector<KtirExpr> size_expr;  // per dim (empty: all numbers): "s0", "s0-1", "2*s0"
  // Symbolic strides (per dim; empty: all numbers) and offset (when
  // offset_expr.symbolic()): bound with the sizes at launch.
  std::vector<KtirExpr> stride_expr;
  KtirExpr offset_expr;
};

// The access tile of a view on one core: `sizes` elements at `at`, where a
// split dim 0 starts at core * `core_stride` (address arithmetic) and every
// other dim at 0.
struct KtirTile {
  int view = 0;
  std::vector<int64_t> sizes;
  int64_t core_stride = 0;  // 0: replicated (every core reads the tile at 0)
  int line = 0;
  std::vector<KtirExpr> size_expr;  // per dim as the view's (a split dim 0 follows rows_per_core)
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
  // The resolved op (set by ktir_build, else on first use); not printed.
  mutable const c10::OperatorHandle* handle = nullptr;
};

// The op's dispatcher handle (resolved once, kept in `o.handle`), or null for an unknown op.
const c10::OperatorHandle* ktir_op_handle(const KtirOp& o);

struct KtirProgram {
  std::string name;
  int64_t grid = 1;           // cores of the grid
  int64_t rows_per_core = 1;  // rows of the split dim per core
  int64_t cores_used = 1;
  bool ring_reduce = false;
  // Symbolic SpyreCode: sizes that vary inside a dynamic-shape range are
  // affine in symbols s0, s1, ... whose values are bound at launch
  // (sym_values, printed in the header as syms=[s0=V, ...]). When the split
  // rows are symbolic (rows_expr), rows_per_core and cores_used are bound
  // from them ("?" in text). sym_lower/sym_upper (empty: no range; printed
  // ranges=[L..U, ...]): the values the program serves, every one verified.
  KtirExpr rows_expr;
  std::vector<int64_t> sym_values, sym_lower, sym_upper;
  std::vector<KtirArg> args;
  std::vector<KtirView> views;
  std::vector<KtirTile> tiles;
  std::vector<KtirOp> ops;
};

struct RegionLayout;
// Builds the program of `region` (views, grid and tiles of layout.h; `layout`
// when the caller computed it already).
KtirProgram ktir_build(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card);
KtirProgram ktir_build(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                       const CardParams& card, const RegionLayout& layout);
// True when `a` and `b` are one compiled program at two launches: the same
// ops, arguments (kinds, dtypes), views (memory, buffer, dtype, rank) and
// tiling structure; sizes, strides, offsets, element counts, rows and literal
// operands may differ (they are bound at launch).
bool ktir_same_structure(const KtirProgram& a, const KtirProgram& b);

// Per-op customization of ktir_execute (the executor's storage errors,
// int32 checks, library calls, error context). The defaults serve run_ktir.
class KtirRunHooks {
 public:
  virtual ~KtirRunHooks() = default;
  // Before op `k` runs (outside its error context): may throw, e.g. an
  // operand's earlier error. `k` indexes KtirProgram::ops.
  virtual void before_op(size_t k) {}
  // Runs op `k` on its CPU stack (view operands bound): default: in f32 from
  // df16 operands, each 16-bit result rounded once to df16 (df16_ops.h).
  virtual void call(size_t k, const c10::OperatorHandle& op, torch::jit::Stack& stack,
                    const std::vector<c10::ScalarType>& result_dtypes);
  // After op `k` stored its results: `results` (its result views) and
  // `written` (its view operands the op writes).
  virtual void after_op(size_t k, const std::vector<at::Tensor>& results, const std::vector<at::Tensor>& written) {}
  // Op `k` failed with `e` (also when an operand was poisoned by an earlier failure).
  virtual void failed(size_t k, const std::exception_ptr& e) {}
  // "KTIR line N (op)" by default: appended to an op's c10 error as context.
  virtual std::string where(const KtirProgram& p, size_t k);
};

// A dim the region reads inside a mark_dynamic range: its size, the size
// `base` the marked tensor had at that dim (the symbol's value: the size is
// base + (size - base), "s0-1" for d[:, 1:]) and the range [lower, upper].
// `scale` > 1: a dim that merges the marked dim with fixed ones (a flatten),
// of size scale * base: "16*s0"; `divisor` > 1: a part of a split of the
// marked dim (view(16, 4, n / 4): both the 4 and n / 4), of size base /
// divisor: its own symbol, the marked size the product of the parts'
// symbols. lower/upper are the marked dim's range. `part` > 1: the dim (or
// a split's parts together) is one of `part` equal parts of the marked dim
// (qkv's chunk(3)), number `index` (0 for q): when the region reads a part
// of number >= 1, the part size is the symbol and the marked size `part`
// times it ("3*s0").
struct KtirDynamicDim {
  int64_t size = 0, base = 0, lower = 0, upper = 0, scale = 1, divisor = 1, part = 1, index = 0;
  // A step slice of the marked dim (d[:, ::2], k.t()[:, 1::2]): its step,
  // start, and the view (%<view>) and dim it is; size ceil((base - start) / step).
  int64_t step = 1, start = 0, view = -1, dim = -1;
  // A split of a slice near the whole (x[:, 1:].view(b, -1, 64)): base -
  // the split's elements.
  int64_t trim = 0;
};

// Makes the sizes of `p` (built for one launch) symbolic: each distinct base
// of `dynamic` (> 1) is a symbol; every view size (and tile size) equal to
// base + c, for c = 0 or the offset of a dynamic dim of that base near it
// (2|c| <= base), becomes "s<k>+c", the split rows too (a far size, the 2 of
// d[:, :2], stays a number; its base names the pitch); a size the region creates from them (a
// cat's sum, a pad's s0+2) follows them. The symbol's range is the mark's,
// narrowed so that every dynamic dim's size stays inside [lower, upper]. A
// view's strides become expressions where they follow its symbolic sizes
// (dims in order of stride, each stride the product of the next smaller one
// and its size, as in a dense tensor or a permutation of one: "s1*s2" with
// two symbolic sizes), and its offset one in those strides (offset = sum
// q_d * stride_d + r, the larger strides first). An argument's elems is the
// extent of a view that reaches its end ("s0*s1"), else a multiple of a
// symbol's size. A symbol no expression names is dropped. Binds the
// symbols to those values. A view the region only reads, of a marked
// storage or a whole one of no mark (a weight), is symbolic at its marked
// dims alone; an op result's dim that a meta rerun with the marked dims
// grown finds fixed, of a value such a view has fixed, stays a number.
void ktir_symbolize(KtirProgram& p, const std::vector<KtirDynamicDim>& dynamic);
// Sets the symbol values and every size, stride, offset, element count,
// rows_per_core, cores_used and tile size that follows from them.
void ktir_bind(KtirProgram& p, const std::vector<int64_t>& values);
// The symbol values under which `p` describes `launch` (a concrete program
// built for one launch): p bound to them equals launch in every size,
// stride, offset, element count, tile and grid field, and each lies in its
// symbol's range. Empty optional when no binding does (the launch needs its
// own program).
std::optional<std::vector<int64_t>> ktir_match(const KtirProgram& p, const KtirProgram& launch);

// How the interpreter walks a program over the grid (docs/ktir.md, "How the
// executor runs a program"): dim 0 of the split views ("rows", `rows` of
// them) is cut into `rows_per_core` rows on each of `cores_used` cores, and
// each core's share into tiles of `tile_rows` rows (the dataflow schedule's
// tiles, schedule.h; tile_rows == rows_per_core: one tile per core). Tile
// step i holds tile i of every core: the cores run the same pipeline in
// lockstep, each on its own rows.
struct KtirTiling {
  int64_t rows_per_core = 1, cores_used = 1, tile_rows = 1, n_tiles = 1;
  int64_t corelets = 2;  // of a core (a ring partial per corelet: ktir_execute)
};

// The interpreter's plan of a program under a tiling (ktir_tile_plan):
// which ops run per tile step and which views are cut into tiles. Built once
// per bound program; `tiled` is false (with `whole_reason`) when some op is
// not row-local (its values on a tile of rows are not those rows of its
// values on the whole views) or views of a written storage alias: then
// every op runs once on whole views, still in program order.
struct KtirTilePlan {
  enum Phase : uint8_t { kPre, kTile, kRing, kPost };
  bool tiled = false;
  std::string whole_reason;
  std::string whole_op;  // the op that is not row-local, else the reason (metrics key)
  // The region runs whole because a reduction of the split rows has no tile
  // program (median, sort, topk, ...): that op runs as a library call.
  bool whole_library = false;
  KtirTiling tiling;
  int64_t rows = 0;               // rows of the split views (dim 0)
  std::vector<uint8_t> phase;     // per op: kPre (replicated operands only, once before the tiles),
                                  // kTile (per tile step), kRing (the ring reduction), kPost (after it)
  std::vector<char> split;        // per view: cut into tiles
  std::vector<char> load, store;  // per view: copied HBM -> LX before a step / LX -> HBM after it
  // The ring reduction (kRing op): how partials combine, its reduced dims of
  // the input, and the element count each result element reduces
  // (docs/ktir.md, "Ring reductions"). kSum/kMean add f32 partials, kMax/kMin
  // take their max/min, kProd multiplies them, kVar merges (count, mean, M2)
  // partials (Chan et al.; var, std, var_mean, std_mean), kArgMax/kArgMin
  // keep (value, index) pairs, the first index on ties; kSoftmax/kLogSoftmax
  // merge (max, sum of exp(x - max)) partials and kLayerNorm (count, mean,
  // M2) ones, then run a second pass over the tile steps that normalizes
  // each core's rows with the combined statistics (`normalize`). kCumsum
  // scans each core's rows tile by tile with a carried prefix, passes each
  // core's total along the ring (an exclusive prefix per core) and adds it to
  // the core's rows in a second pass (also `normalize`). kNllLoss adds
  // (sum of -weight[t] x[i, t], sum of weight[t]) partials over the rows
  // (nll_loss with reduction mean or sum; the target is split with the rows).
  // max.dim/min.dim combine as kArgMax/kArgMin and return both the values
  // and the indices (`ring_values`); max()/min() of every element as
  // kMax/kMin. kLogSumExp merges (max, sum of exp(x - finite(max)))
  // partials, finite(m) = m, or 0 where m is +-inf (CPU's shift), and
  // returns log(sum) + finite(max). kCumprod scans as kCumsum with
  // products (the carried and ring prefixes multiply). kNorm adds f32
  // partials of |x|^ord (x * x for ord 2, x != 0 for ord 0; max/min of |x|
  // for ord +-inf) and takes the ord-th root of the total once. kMinMax
  // (aminmax) keeps (min, max) pairs. kCummax/kCummin scan each core's rows
  // with a carried (value, index) pair and merge the cores' last pairs along
  // the ring with CPU's rule (the later element wins on ties and NaN wins).
  // kNanSum adds partials with NaNs as 0, kCountNonzero int64 counts of
  // x != 0, kAny/kAll or/and the partials of x != 0.
  // The order statistics (kSort, kTopk, kKthvalue, kMedian, kNanMedian,
  // kMode; ktir_is_order) keep per core a sorted run of its rows (values and
  // their row indices per column, stable: equal values in row order, NaN
  // after every number ascending, before descending), merged stably in tile
  // order and then in core order; topk keeps the first k of each run. The
  // result is read off the merged order (docs/ktir.md, "Order statistics").
  // kRenorm (renorm over a dim other than 0: the norm of each slice reduces
  // the split rows) sums kNorm's partials over `ring_dims` (every dim but
  // renorm's), takes the root once, and its normalizing pass multiplies each
  // row by CPU's scale factor of that norm.
  enum Combine : uint8_t {
    kNone,
    kSum,
    kMean,
    kMax,
    kMin,
    kProd,
    kVar,
    kArgMax,
    kArgMin,
    kSoftmax,
    kLogSoftmax,
    kLayerNorm,
    kCumsum,
    kNllLoss,
    kLogSumExp,
    kCumprod,
    kNorm,
    kMinMax,
    kCummax,
    kCummin,
    kNanSum,
    kCountNonzero,
    kAny,
    kAll,
    kSort,
    kTopk,
    kKthvalue,
    kMedian,
    kNanMedian,
    kMode,
    kRenorm
  };
  // What the ring op's partials sum (kSum/kMean), when it is not its first
  // operand: the elementwise loss of the operand and `ring_target` (split
  // with it; mse_loss, huber_loss, smooth_l1_loss, binary_cross_entropy with
  // a mean or sum, and its weight of the input's sizes), computed in f32 by CPU's kernel with reduction 'none'; or
  // the diagonal of a matrix (trace): element (i, i) of each row i, 0 past
  // the last column.
  // kPreMultilabelMargin: multilabel_margin_loss's loss of each row ([rows,
  // 1], its target [rows, classes] split with it); mean divides by the rows.
  enum RingPre : uint8_t { kPreNone, kPreMse, kPreHuber, kPreSmoothL1, kPreBce, kPreDiag, kPreMultilabelMargin };
  RingPre ring_pre = kPreNone;
  int ring_target = -1;
  int ring_weight = -1;     // binary_cross_entropy's weight (split with the rows), or -1
  int ring_is_target = -1;  // multilabel_margin_loss_forward's is_target result (split rows), or -1
  int ring_op = -1;
  Combine combine = kNone;
  bool normalize = false;    // the ring op's first result is the split rows (softmax, layer_norm, cumsum, renorm)
  bool ring_flat = false;    // argmax/argmin without a dim: indices into the flattened input
  bool ring_values = false;  // max.dim/min.dim: the (value, index) pair, both results
  std::vector<int64_t> ring_dims;
  int64_t ring_count = 1;
  // The ring op's result views: its results, or (median.dim_values,
  // kthvalue.values, ...) the out= operands it writes.
  std::vector<int> ring_outs;
  // Order statistics: the sizes of the run one ring hop carries on average
  // (values and indices: ring_stats 2): half the rows of a chain's growing
  // runs, k rows for topk; the input's other sizes (flat: one column).
  std::vector<int64_t> ring_payload_sizes;
  // A selection (topk, kthvalue, median, nanmedian): the payload sizes of
  // each of its chains along the ring, in order (int32; each chain
  // cores_used - 1 hops): per key digit the histograms and the broadcast of
  // the digit found, then the counts of equal keys. Empty for other ops (one
  // chain of ring_payload_sizes).
  std::vector<std::vector<int64_t>> ring_chains;
  // What one ring hop carries: `ring_stats` tensors of the partial's shape
  // in `ring_dtype` (f32; f64 for a float64 input).
  int64_t ring_stats = 1;
  c10::ScalarType ring_dtype = c10::kFloat;
  // Per op (empty: none): a loss gradient with reduction 'mean' that runs on
  // the tiles (mse, binary_cross_entropy: the loss) and
  // the element count of its whole input, which divides it instead of the
  // tile's (docs/ktir.md, "How the executor runs a program").
  std::vector<std::pair<RingPre, int64_t>> mean_grad;
  std::vector<char> keep;  // per view: an LX view a step writes that a later pass reads whole (stored to its buffer)
  // Per tile step: per core, [begin, end) of its rows (empty when it has none).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> steps;
  std::vector<at::Tensor> step_index;  // per step: its rows in core order (int64), undefined when one range
};
KtirTilePlan ktir_tile_plan(const KtirProgram& p, const KtirTiling& tiling);
// A scan over the split rows (cumsum, cumprod, cummax, cummin): a carried
// prefix per core, passed forward along the ring only.
bool ktir_is_scan(KtirTilePlan::Combine c);
// An order statistic over the split rows (sort, topk, kthvalue, median,
// nanmedian, mode): sorted runs merged along the ring.
bool ktir_is_order(KtirTilePlan::Combine c);
// The rows each of a core's `corelets` corelets reduces of its `rows` rows,
// in corelet order: corelet j takes ceil(left / (corelets - j)) of the
// `left` rows the earlier ones did not take, so the shares sum to rows,
// differ by at most 1 and never grow (the larger ones first; docs/ktir.md,
// "Ring reductions"). Throws ValueError for corelets < 1 or rows < 0.
std::vector<int64_t> corelet_shares(int64_t rows, int64_t corelets);

// What a walk did: tile steps run (0 when whole), ring combine steps.
struct KtirWalk {
  bool tiled = false;
  int64_t tile_steps = 0;
  int64_t ring_steps = 0;
};

// The interpreter: runs `p` on `arg_bytes` (one flat CPU byte tensor per
// argument: the storage its HBM views address; LX buffers are allocated
// here, zero-filled, and freed at the end). Ops run in program order on
// their views (element `idx` of a view at offset + sum idx[d] * strides[d]),
// results stored through their views. An op that fails poisons the storages
// it writes: later ops reading them fail with the same error, the others run;
// the first error is rethrown at the end, and `failed_at` (if given) is its
// op index (-1 when none failed). The program must have been verified.
//
// With `plan` (tiled), the walk follows the schedule: kPre ops once on the
// whole views, then per tile step: the step's rows of every split view that
// is read are loaded (copied into an LX tile), the kTile ops run on the
// tiles (the ring op adds each core's f32 partial of the step to the core's
// accumulator), the written split views are stored; then the ring combines
// the cores' partials in core order (core 0 + core 1, + core 2, ...), the
// result is rounded once and stored, and kPost ops run on whole views.
void ktir_execute(const KtirProgram& p, const std::vector<at::Tensor>& arg_bytes, KtirRunHooks& hooks,
                  int* failed_at = nullptr, const KtirTilePlan* plan = nullptr, KtirWalk* walk = nullptr);

std::string ktir_print(const KtirProgram& p);
// Parses KTIR text; throws ValueError "line N: rule 'syntax': ..." on bad text.
KtirProgram ktir_parse(const std::string& text);
// Checks the program against the rules of docs/ktir.md (and, when `args` is
// given, against the tensors bound to its arguments). Throws ValueError
// naming the line and the rule.
void ktir_verify(const KtirProgram& p, const CardParams& card, const std::vector<at::Tensor>* args = nullptr);
// The part of ktir_verify for a program with ranges=[...]: the bound values
// lie in their ranges, and under each value of each symbol (the others at
// their bound values and, when an expression has a product of symbols, at
// each corner of their ranges) every view has sizes, strides and offset >= 0
// and its elements inside its argument (rules 'sym-range', 'view',
// 'view-bounds'; the message names the values).
void ktir_verify_ranges(const KtirProgram& p);
// Narrows each symbol's range to the values around its bound one under
// which ktir_verify_ranges' geometry holds (a size that only happened to
// equal a symbol's value at compile time does not grow with it).
void ktir_narrow_ranges(KtirProgram& p);
// Runs the program on contiguous CPU tensors `inputs` bound to its in and
// inout arguments in order (out arguments are allocated, zero-filled): each op
// in f32 from df16 inputs, rounded once to df16 (df16_ops.h). inout tensors
// are written in place. Returns the out and inout arguments (flat, in argument
// order). Verifies first (ValueError naming the line and rule).
std::vector<at::Tensor> ktir_run(const KtirProgram& p, const CardParams& card, std::vector<at::Tensor> inputs);

}  // namespace spyre
}  // namespace tpu_eager
