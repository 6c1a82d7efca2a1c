// Kernels for ops real models reach that are not plain op-table rows (see model_kernels.h).
#include "ops/model_kernels.h"

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool1d.h>
#include <ATen/ops/max_pool1d_native.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/slice_backward_native.h>
#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Array.h>
#include <torch/library.h>

#include "ops/record.h"

namespace tpu_eager {
namespace {

// ---- integer histc -----------------------------------------------------------
// CPU's histc has no integer kernel; CUDA's has one, and code written for
// accelerators calls it (transformers' MoE routing counts tokens per expert with
// torch.histc on int32 on every device but cpu/mps). An accelerator supports what
// CUDA supports, so integer histc on "tpu" computes what CUDA's SummaryOps.cu
// computes: bounds are the Scalars converted to int64 (CUDA's accumulate type
// for integers; a float bound truncates toward zero); when they are equal and the
// input is not empty, the input's min and max replace them; equal bounds widen
// to [min - 1, max + 1]; each element v in [lo, hi] goes to bin
// (int)((v - lo) * bins / (hi - lo)) in int64 integer arithmetic, the value hi to
// the last bin; counts have the input's dtype (CUDA adds them in that type, so
// they wrap as it does). The op is the device's own host op tpu_eager::histc_int,
// recorded as a library call; its meta kernel does CUDA's call-time checks.

// The bounds CUDA's kernel starts from, checked as CUDA checks them before reading data.
std::pair<int64_t, int64_t> histc_int_bounds(int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "bins must be > 0");
  const int64_t lo = min.to<int64_t>(), hi = max.to<int64_t>();
  // With lo == hi the data decides (and the range is then never empty).
  TORCH_CHECK(lo == hi || lo < hi, "max must be larger than min");
  return {lo, hi};
}

void check_histc_int_dtype(const at::Tensor& self) {
  const auto dt = self.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(
      dt == at::kByte || dt == at::kChar || dt == at::kShort || dt == at::kInt || dt == at::kLong,
      "\"histc\" not implemented for '", c10::toString(dt), "'");
}

at::Tensor histc_int_meta(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  check_histc_int_dtype(self);
  (void)histc_int_bounds(bins, min, max);
  return at::empty({bins}, self.options());
}

at::Tensor& histc_int_out_meta(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
                               at::Tensor& out) {
  check_histc_int_dtype(self);
  (void)histc_int_bounds(bins, min, max);
  at::native::resize_output(out, {bins});
  return out;
}

at::Tensor histc_int_cpu(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  check_histc_int_dtype(self);
  auto [lo, hi] = histc_int_bounds(bins, min, max);
  if (lo == hi && self.numel() > 0) {
    auto [mn, mx] = at::aminmax(self);
    lo = mn.item<int64_t>();
    hi = mx.item<int64_t>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  std::vector<int64_t> counts(static_cast<size_t>(bins), 0);
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc", [&] {
    const at::Tensor x = self.contiguous();
    const scalar_t* p = x.const_data_ptr<scalar_t>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      if (v < lo || v > hi) continue;
      int64_t bin = static_cast<int>((v - lo) * bins / (hi - lo));
      if (bin == bins) bin -= 1;
      if (bin >= 0 && bin < bins) ++counts[static_cast<size_t>(bin)];  // (CUDA would write out of bounds otherwise)
    }
  });
  at::Tensor out = at::empty({bins}, self.options());
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc", [&] {
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    // Two's-complement wrap, as CUDA's atomic adds in scalar_t.
    for (int64_t b = 0; b < bins; ++b) o[b] = static_cast<scalar_t>(static_cast<uint64_t>(counts[b]));
  });
  return out;
}

at::Tensor& histc_int_out_cpu(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
                              at::Tensor& out) {
  const at::Tensor r = histc_int_cpu(self, bins, min, max);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

TORCH_LIBRARY(tpu_eager, m) {
  m.def("histc_int(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor");
  m.def("histc_int.out(Tensor self, int bins=100, Scalar min=0, Scalar max=0, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(tpu_eager, CPU, m) {
  m.impl("histc_int", TORCH_FN(histc_int_cpu));
  m.impl("histc_int.out", TORCH_FN(histc_int_out_cpu));
}

TORCH_LIBRARY_IMPL(tpu_eager, Meta, m) {
  m.impl("histc_int", TORCH_FN(histc_int_meta));
  m.impl("histc_int.out", TORCH_FN(histc_int_out_meta));
}

bool is_integer_histc_input(const c10::IValue& self) {
  if (!self.isTensor()) return false;
  const auto dt = self.toTensor().scalar_type();
  return c10::isIntegralType(dt, /*includeBool=*/false);
}

// aten::histc / histc.out on "tpu": integer inputs record tpu_eager::histc_int
// (same arguments), other dtypes the op-table row (CPU's kernel).
struct HistcKernel final : c10::OperatorKernel {
  explicit HistcKernel(const OpEntry* e, bool out) : entry(e), out_overload(out) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t nargs = op.schema().arguments().size();
    if (is_integer_histc_input((*stack)[stack->size() - nargs])) {
      std::call_once(int_planned, [&] {
        int_op = c10::Dispatcher::singleton().findSchemaOrThrow("tpu_eager::histc_int", out_overload ? "out" : "");
        int_entry = OpEntry{out_overload ? "tpu_eager::histc_int.out" : "tpu_eager::histc_int", PrimKind::kLibrary, 0};
        int_plan = plan_op(*int_op, int_entry);
      });
      record_op(*int_op, int_entry, *int_plan, stack);
      return;
    }
    std::call_once(planned, [&] { plan = plan_op(op, *entry); });
    record_op(op, *entry, *plan, stack);
  }
  const OpEntry* entry;
  bool out_overload;
  std::once_flag planned, int_planned;
  const OpPlan* plan = nullptr;
  std::optional<c10::OperatorHandle> int_op;
  OpEntry int_entry{"tpu_eager::histc_int", PrimKind::kLibrary, 0};
  const OpPlan* int_plan = nullptr;
};

// ---- scaled dot product attention ---------------------------------------------
// ATen's scaled_dot_product_attention asks _fused_sdp_choice_stub of the query's
// device which implementation to call; for SDPBackend::overrideable it calls
// _scaled_dot_product_fused_attention_overrideable (and autograd its backward),
// the entry points a PrivateUse1 device provides. The device's fused attention is
// CPU's fused kernel (_scaled_dot_product_flash_attention_for_cpu and its
// backward, op-table rows, recorded as library calls), so it serves exactly the
// calls CPU's fused kernel serves (CPU's constraints, from sdp_utils_cpp.h) and
// gives CPU's values. While CPU's flash switch is on (the default), every call
// gets CPU's own choice: its flash kernel, which ATen's SDPA then calls directly
// (recorded the same way, with CPU's autograd node, without the overrideable op's
// extra dispatch and its two philox tensors), or the math path, whose ops are
// recorded as on CPU, or CPU's error when no enabled backend fits. With flash
// switched off and overrideable on (sdpa_kernel(SDPBackend.OVERRIDEABLE)), calls
// CPU's fused kernel fits take the overrideable entry points.

// CPU's fused-kernel constraints (sdp_utils_cpp.cpp, use_flash_attention_cpp)
// without its runtime switch, which is CPU's flash switch, not this device's.
// A mask that needs a gradient takes the math path, as on CPU (its values are
// CPU's; sdpa_bias_grad serves direct calls of the fused backward).
bool fused_attention_fits(const sdp::sdp_params& p) {
  constexpr bool debug = false;
  if (!sdp::check_nested_tensor(p, debug) || !sdp::check_for_dropout(p, debug) || !sdp::check_tensor_shapes(p, debug) ||
      !sdp::check_batch_size_and_num_heads_dense<true /*grouped query attention*/>(p, debug) ||
      !sdp::check_attn_mask_shape(p, debug) || !sdp::check_nonzero_sequence_lengths_dense(p, debug) ||
      !sdp::check_last_dim_stride_equals_1_dense<false /*ignore_singleton_dim*/>(p, debug))
    return false;
  if (p.query.size(-1) != p.key.size(-1) || p.query.size(-1) != p.value.size(-1)) return false;  // same head dim
  constexpr auto dtypes = c10::array_of<at::ScalarType>(at::kFloat, at::kDouble, at::kBFloat16, at::kHalf);
  return sdp::check_tensor_dtype(p, dtypes, debug);
}

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const sdp::sdp_params params{query, key, value, attn_mask, dropout_p, is_causal, enable_gqa};
  const auto& ctx = at::globalContext();
  if (!ctx.userEnabledFlashSDP() && ctx.userEnabledOverrideableSDP() && fused_attention_fits(params))
    return static_cast<int64_t>(sdp::SDPBackend::overrideable);
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

using FusedForward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                at::Tensor, at::Tensor>;

// Returns (output [B, H, L, Ev], logsumexp [B, H, L] float, undefined cum_seq_q/k,
// max_q = L, max_k = S, philox seed/offset (0-dim int64, unused: no dropout),
// undefined debug mask). attn_bias is additive (SDPA converts a bool mask first).
FusedForward sdpa_overrideable(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                               bool return_debug_mask, std::optional<double> scale) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0.0,
                              "_scaled_dot_product_fused_attention_overrideable on tpu: dropout_p must be 0 "
                              "(scaled_dot_product_attention takes the math path for dropout)");
  TORCH_CHECK_NOT_IMPLEMENTED(!return_debug_mask,
                              "_scaled_dot_product_fused_attention_overrideable on tpu: no debug attention mask");
  auto [out, lse] =
      at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_bias, scale);
  const auto seed_opts = query.options().dtype(at::kLong);
  return FusedForward(std::move(out), std::move(lse), at::Tensor(), at::Tensor(), c10::SymInt(query.size(-2)),
                      c10::SymInt(key.size(-2)), at::empty({}, seed_opts), at::empty({}, seed_opts), at::Tensor());
}

// The gradient of the additive bias of a fused attention call. With
// S = scale * Q K^T + bias (+ -inf above the diagonal when causal) and
// P = softmax(S) = exp(S - lse), dS = P * (dP - rowsum(P * dP)) with dP = dO V^T,
// and dbias is dS summed over the dims the bias was broadcast along. Shapes:
// query [B, Hq, L, E], key/value [B, Hkv, S, E/Ev] with Hq a multiple of Hkv
// (grouped-query attention: query head h reads key/value head h / (Hq / Hkv)),
// grad_out [B, Hq, L, Ev], logsumexp [B, Hq, L] (the forward's, float; -inf on a
// row the mask hides entirely, whose P is 0 as in CPU's kernels), attn_bias
// broadcastable to [B, Hq, L, S]. Computed in float (double for double inputs);
// returned in the bias's dtype and shape. Recorded as device ops.
at::Tensor sdpa_bias_grad(const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
                          const at::Tensor& value, const at::Tensor& attn_bias, const at::Tensor& logsumexp,
                          bool is_causal, std::optional<double> scale) {
  const auto acc = query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor q = query.to(acc), go = grad_out.to(acc);
  at::Tensor k = key.to(acc), v = value.to(acc);
  const int64_t heads = q.size(-3), kv_heads = k.size(-3);
  if (kv_heads != heads) {
    k = k.repeat_interleave(heads / kv_heads, -3);
    v = v.repeat_interleave(heads / kv_heads, -3);
  }
  const double s = sdp::calculate_scale(query, scale).guard_float(__FILE__, __LINE__);
  at::Tensor scores = q.matmul(k.transpose(-2, -1)).mul_(s).add_(attn_bias.to(acc));
  if (is_causal) {  // top-left aligned, as CPU's kernels: query i sees keys j <= i
    const at::Tensor hidden = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu_(1);
    scores.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  }
  const at::Tensor lse = logsumexp.to(acc).unsqueeze(-1);
  const at::Tensor p = scores.sub(lse).exp_().masked_fill_(lse.isneginf(), 0.0);
  const at::Tensor dp = go.matmul(v.transpose(-2, -1));
  const at::Tensor ds = p.mul(dp.sub(p.mul(dp).sum(-1, /*keepdim=*/true)));
  return ds.sum_to_size(attn_bias.sizes()).to(attn_bias.scalar_type());
}

// Returns (grad_query, grad_key, grad_value, grad_attn_bias): CPU's fused
// backward for query, key and value; sdpa_bias_grad for a bias that needs one.
// dropout_p is 0 (the forward refuses any other).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p,
    bool is_causal, const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0.0,
                              "_scaled_dot_product_fused_attention_overrideable_backward on tpu: dropout_p must be 0 "
                              "(scaled_dot_product_attention takes the math path for dropout)");
  std::optional<at::Tensor> bias;
  if (attn_bias.defined()) bias = attn_bias;
  at::Tensor gq, gk, gv, gb;
  if (grad_input_mask[0] || grad_input_mask[1] || grad_input_mask[2])
    std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, bias, scale);
  if (grad_input_mask[3] && attn_bias.defined())
    gb = sdpa_bias_grad(grad_out, query, key, value, attn_bias, logsumexp, is_causal, scale);
  return {grad_input_mask[0] ? gq : at::Tensor(), grad_input_mask[1] ? gk : at::Tensor(),
          grad_input_mask[2] ? gv : at::Tensor(), gb};
}

// ---- slice_backward ------------------------------------------------------------
// CPU's slice_backward (a CompositeExplicitAutograd op, recorded through its
// decomposition) is zeros of the input's sizes with the gradient copied into
// the slice: on the device a zero_ and a copy_ into a strided slice, which no
// fused loop takes (a llama's rotary embedding runs 8 such op-by-op regions a
// training step). With step 1 the same tensor is cat([zeros, grad, zeros],
// dim) of the parts before and after the slice, each part an expand of one
// 0-dim zero kept per device and dtype: no op makes the zeros, and the cat
// joins the loop of the gradient's producer and the sum that reads it. Values
// (+0.0 and the gradient's own), sizes, dtype and contiguous strides are
// CPU's: cat's result is contiguous when its inputs suggest different memory
// formats, and an all-zero-stride expand suggests contiguous. Other cases
// (a step other than 1, an empty tensor, a gradient that is not exactly the
// slice's shape, which copy_ would broadcast) take ATen's own decomposition,
// which raises CPU's errors.

// The 0-dim zero of `options`' device and dtype, made once and kept for the
// process (never destroyed: it would outlive the device at exit).
const at::Tensor& device_zero(const at::TensorOptions& options) {
  static std::mutex mu;
  static auto& zeros =
      *new std::vector<std::pair<std::pair<int, at::ScalarType>, const at::Tensor*>>();  // ops may run at exit
  const std::pair<int, at::ScalarType> key{options.device().index(), at::typeMetaToScalarType(options.dtype())};
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [k, t] : zeros)
    if (k == key) return *t;
  c10::InferenceMode normal(false);  // a normal tensor, usable in and out of inference mode
  zeros.emplace_back(key, new at::Tensor(at::zeros({}, options)));
  return *zeros.back().second;
}

at::Tensor slice_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim, c10::SymInt start,
                          c10::SymInt end, c10::SymInt step) {
  const std::vector<int64_t> sizes = C10_AS_INTARRAYREF_SLOW(input_sizes).vec();
  const int64_t rank = static_cast<int64_t>(sizes.size());
  int64_t lo = start.guard_int(__FILE__, __LINE__), hi = end.guard_int(__FILE__, __LINE__);
  const int64_t stride = step.guard_int(__FILE__, __LINE__);
  const bool nonempty = std::all_of(sizes.begin(), sizes.end(), [](int64_t s) { return s > 0; });
  if (stride == 1 && rank > 0 && dim >= -rank && dim < rank && nonempty && !grad.is_conj() && !grad.is_neg()) {
    if (dim < 0) dim += rank;
    const int64_t n = sizes[dim];
    // The slice's bounds as Tensor.slice clamps them.
    if (lo < 0) lo += n;
    if (hi < 0) hi += n;
    lo = std::clamp<int64_t>(lo, 0, n);
    hi = std::clamp<int64_t>(hi, lo, n);
    std::vector<int64_t> slice = sizes;
    slice[dim] = hi - lo;
    if (grad.sizes().equals(slice) && hi > lo && (lo > 0 || hi < n)) {
      const at::Tensor& zero = device_zero(grad.options());
      std::vector<at::Tensor> parts;
      auto zeros = [&](int64_t len) {
        std::vector<int64_t> part = sizes;
        part[dim] = len;
        parts.push_back(zero.expand(part));
      };
      if (lo > 0) zeros(lo);
      parts.push_back(grad);
      if (hi < n) zeros(n - hi);
      return at::cat(parts, dim);
    }
  }
  return at::native::slice_backward(grad, sizes, dim, start.guard_int(__FILE__, __LINE__),
                                    end.guard_int(__FILE__, __LINE__), stride);
}

// ---- max_pool1d ------------------------------------------------------------------
// max_pool1d is CompositeImplicitAutograd, and its kernel branches on the device:
// a CPU input that needs no gradient takes CPU's own loop (floating types only: an
// integer, bool or complex input raises NotImplementedError "\"max_pool1d_impl\" not
// implemented for 'Long'", and the result is a new contiguous tensor); any other
// input takes max_pool1d_with_indices (max_pool2d's kernel, which has integer loops,
// and a squeezed view of its result). A "tpu" input always took the second branch:
// integer max_pool1d computed and the result was a view. This kernel, on
// AutogradPrivateUse1 ahead of the composite, takes CPU's branch by CPU's rule.

bool max_pool1d_loop_has(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

at::Tensor max_pool1d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  if ((self.requires_grad() && at::GradMode::is_enabled()) || self._fw_grad(/*level=*/0).defined() ||
      at::isTensorSubclassLike(self))
    return at::native::max_pool1d(self, kernel_size, stride, padding, dilation, ceil_mode);
  if (!max_pool1d_loop_has(self.scalar_type())) {
    // CPU's kernel on an uninitialized twin raises CPU's argument or dtype error (it
    // checks the arguments, then finds no loop; no value is read).
    at::Tensor twin = at::empty(self.sizes(), self.options().device(at::kCPU));
    (void)at::max_pool1d(twin, kernel_size, stride, padding, dilation, ceil_mode);
  }
  // The composite checks the arguments with CPU's messages, then takes the other branch.
  at::Tensor out = at::native::max_pool1d(self, kernel_size, stride, padding, dilation, ceil_mode);
  // CPU's loop writes a new contiguous tensor: not a view, whatever max_pool2d's layout.
  return out.is_contiguous() ? at::_unsafe_view(out, out.sizes()) : out.contiguous();
}

}  // namespace

void register_cpu_branch_kernels() {
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  lib.impl("max_pool1d", TORCH_FN(max_pool1d));
}

std::unordered_set<std::string> register_model_kernels(torch::Library& lib) {
  lib.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  lib.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_overrideable));
  lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_overrideable_backward));
  lib.impl("slice_backward", TORCH_FN(slice_backward));
  return {"_fused_sdp_choice", "_scaled_dot_product_fused_attention_overrideable",
          "_scaled_dot_product_fused_attention_overrideable_backward", "slice_backward"};
}

bool register_model_row_kernel(torch::Library& lib, const OpEntry& e) {
  const std::string name = e.name;
  if (name != "histc" && name != "histc.out") return false;
  lib.impl(e.name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<HistcKernel>(&e, name == "histc.out")));
  return true;
}

}  // namespace tpu_eager

namespace at::native {
// The device's answer to scaled_dot_product_attention's backend question.
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpu_eager::fused_sdp_choice)
}  // namespace at::native
