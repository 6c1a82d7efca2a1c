// Output memory formats of CPU's kernels where the meta kernels do not know them.
#include "ops/memory_format.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/core/SymIntArrayRef.h>

#include "ops/op_table.h"

namespace tpu_eager {
namespace {

thread_local bool t_in_meta = false;

std::vector<int64_t> strides_for(const std::vector<int64_t>& sizes, at::MemoryFormat fmt) {
  if (fmt == at::MemoryFormat::ChannelsLast && sizes.size() == 4) return c10::get_channels_last_strides_2d(sizes);
  if (fmt == at::MemoryFormat::ChannelsLast3d && sizes.size() == 5) return c10::get_channels_last_strides_3d(sizes);
  std::vector<int64_t> st(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    st[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return st;
}

void restride(Geometry& g, at::MemoryFormat fmt) {
  if (g.defined && (g.sizes.size() == 4 || g.sizes.size() == 5)) g.strides = strides_for(g.sizes, fmt);
}

// A CPU tensor with `t`'s dtype, sizes and strides and no data: enough for
// ATen's convolution backend choice, which reads only metadata.
at::Tensor cpu_shell(const at::Tensor& t) {
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)), nullptr,
                  false);
  auto s =
      at::detail::make_tensor<c10::TensorImpl>(std::move(st), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  s.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), 0);
  return s;
}

std::vector<c10::SymInt> sym(const c10::IValue& v) {
  std::vector<c10::SymInt> out;
  for (int64_t x : v.toIntVector()) out.emplace_back(x);
  return out;
}

// The memory format CPU's convolution (forward or backward) computes in:
// ATen's select_conv_backend + _determine_backend_memory_format on CPU
// stand-ins of the arguments, as CPU's _convolution and convolution_backward do.
// `a` is the index of `input` among the arguments (0 forward, 1 backward).
std::optional<at::MemoryFormat> conv_memory_format(const torch::jit::Stack& stack, size_t first, bool backward) {
  const size_t a = first + (backward ? 1 : 0);
  const at::Tensor& input = stack[a].toTensor();
  const at::Tensor& weight = stack[a + 1].toTensor();
  // conv1d runs as a 2-d convolution of a contiguous input: its result is contiguous, as the meta kernel says.
  if (input.dim() != 4 && input.dim() != 5) return std::nullopt;
  std::optional<at::Tensor> bias;
  std::optional<std::vector<c10::SymInt>> bias_sizes;
  if (!backward && stack[a + 2].isTensor() && stack[a + 2].toTensor().defined()) {
    bias = cpu_shell(stack[a + 2].toTensor());
    bias_sizes = std::vector<c10::SymInt>{c10::SymInt(stack[a + 2].toTensor().size(0))};
  } else if (backward && !stack[a + 2].isNone()) {
    bias_sizes = sym(stack[a + 2]);
  }
  const auto stride = sym(stack[a + 3]), padding = sym(stack[a + 4]), dilation = sym(stack[a + 5]);
  const bool transposed = stack[a + 6].toBool();
  const auto output_padding = sym(stack[a + 7]);
  const c10::SymInt groups(stack[a + 8].toInt());
  const at::Tensor in = cpu_shell(input), w = cpu_shell(weight);
  at::OptionalSymIntArrayRef bs;
  if (bias_sizes) bs = c10::SymIntArrayRef(*bias_sizes);
  const auto backend =
      at::native::select_conv_backend(in, w, bias, stride, padding, dilation, transposed, output_padding, groups, bs);
  return at::native::_determine_backend_memory_format(in, w, backend);
}

// The strides `.to(dtype)` gives `t` (empty_like, MemoryFormat::Preserve):
// a dense tensor keeps its strides, another strided one gets the dense
// strides of its permutation (expanded dims become real ones).
std::vector<int64_t> empty_like_strides(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return t.strides().vec();
  return at::infer_dense_strides(t.sizes(), t.strides());
}

// Meta tensor of `t`'s sizes and dtype with `strides`.
at::Tensor meta_tensor(const at::Tensor& t, c10::IntArrayRef strides) {
  return at::detail::empty_strided_meta(t.sizes(), strides, t.scalar_type(), std::nullopt, c10::Device(c10::kMeta),
                                        std::nullopt);
}

// A 0-dim meta tensor standing for a wrapped number of `dtype` (its dtype yields to a
// tensor's in the common dtype, as CPU's wrapped_scalar_tensor).
at::Tensor wrapped_number_meta(c10::ScalarType dtype) {
  at::Tensor m = at::detail::empty_strided_meta({}, {}, dtype, std::nullopt, c10::Device(c10::kMeta), std::nullopt);
  m.unsafeGetTensorImpl()->set_wrapped_number(true);
  return m;
}

// Meta twins of the call's tensor arguments in schema order, out= tensors
// excluded; with `other_contiguous`, the argument `other` made contiguous.
// A Scalar `self` / `other` (eq.Scalar, add.Scalar, remainder.Scalar_Tensor, ...)
// counts as the 0-dim operand CPU's kernel wraps it in: with it the operands'
// shapes differ, so CPU's iterator orders the dims by the tensor's strides
// instead of taking its contiguous fast path (a (5, 1) tensor of strides
// (1, 5) gives a result of strides (1, 5), not (1, 1)).
std::vector<at::Tensor> tensor_inputs(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                                      bool other_contiguous) {
  std::vector<at::Tensor> in;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && first + i < stack.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    const bool operand_name = args[i].name() == "self" || args[i].name() == "other";
    if (operand_name && v.isScalar() && args[i].type()->kind() == c10::TypeKind::NumberType) {
      in.push_back(wrapped_number_meta(v.toScalar().type()));
      continue;
    }
    if (args[i].is_out() || !v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) continue;
    at::Tensor m = other_contiguous && args[i].name() == "other"
                       ? meta_tensor(t, strides_for(t.sizes().vec(), at::MemoryFormat::Contiguous))
                       : meta_tensor(t, t.strides());
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
    in.push_back(m);
  }
  return in;
}

// The strides of the output CPU's TensorIterator allocates for `inputs` (meta tensors)
// (binary_op / comparison_op style: inputs promoted to their common dtype).
// On CPU the iterator replaces an input of another dtype by `.to(common)`
// before it orders the dimensions, so that input counts with the strides of
// its converted copy. The iterator itself runs on meta tensors with the same
// geometry: ATen's own broadcast, dimension ordering and allocation.
std::optional<std::vector<int64_t>> iterator_output_strides(const std::vector<at::Tensor>& inputs,
                                                            c10::ScalarType out_dtype) {
  if (inputs.empty()) return std::nullopt;
  at::native::ResultTypeState state;
  for (const auto& t : inputs) state = at::native::update_result_type_state(t, state);
  const c10::ScalarType common = at::native::result_type(state);
  at::TensorIteratorConfig config;
  config.set_check_mem_overlap(false).check_all_same_dtype(false).declare_static_dtype(out_dtype);
  config.add_owned_output(at::Tensor());
  for (const auto& t : inputs) {
    config.add_owned_const_input(t.scalar_type() == common ? t : meta_tensor(t, empty_like_strides(t)));
  }
  auto iter = config.build();
  return iter.output(0).strides().vec();
}

}  // namespace

bool in_device_meta_inference() { return t_in_meta; }

DeviceMetaInference::DeviceMetaInference() : prev_(t_in_meta) { t_in_meta = true; }
DeviceMetaInference::~DeviceMetaInference() { t_in_meta = prev_; }

void apply_cpu_memory_format(uint64_t traits, const torch::jit::Stack& stack, size_t first, MetaOutcome& outcome) {
  const bool fwd = (traits & kConvolutionFormat) != 0;
  const bool bwd = (traits & kConvolutionBackwardFormat) != 0;
  if (fwd || bwd) {
    std::optional<at::MemoryFormat> fmt;
    try {
      fmt = conv_memory_format(stack, first, bwd);
    } catch (const c10::Error&) {
      return;  // the meta kernel accepted the call; keep its answer
    }
    if (!fmt) return;
    // Forward: the result. Backward: grad_input and grad_weight (grad_bias is 1-d).
    for (size_t k = 0; k < (bwd ? 2u : 1u) && k < outcome.returns.size(); ++k)
      for (auto& g : outcome.returns[k]) restride(g, *fmt);
    return;
  }
  // CPU kernels that allocate their results with empty_like(self) / clone(self)
  // (MemoryFormat::Preserve): a non-overlapping and dense self's strides are
  // kept exactly, size-1 dims included; the meta kernels recompute the strides
  // of size-1 dims. Kernels whose structured meta allocates contiguous results
  // (tril, triu, log_softmax), and roll and masked_fill (empty_like / clone in
  // MemoryFormat::Contiguous), get contiguous strides, size-1 dims included.
  // (kPreservesSelfStrides / kContiguousResult; out= forms keep their given strides.)
  // roll along dims: CPU's kernel concatenates two narrowed views of self, and
  // cat allocates in their common suggest_memory_format() (channels-last stays
  // channels-last, a transposed matrix comes back contiguous); roll without
  // dims rolls the flattened tensor (contiguous). No elements: clone(Preserve).
  if ((traits & kRollFormat) && stack[first].isTensor() && !outcome.returns.empty() && first + 2 < stack.size() &&
      stack[first + 1].isIntList() && stack[first + 2].isIntList()) {
    const at::Tensor& self = stack[first].toTensor();
    if (self.numel() == 0) return;
    const auto shifts = stack[first + 1].toIntVector(), dims = stack[first + 2].toIntVector();
    std::vector<int64_t> strides = self.strides().vec();
    if (dims.empty() || dims.size() != shifts.size()) {
      strides = strides_for(self.sizes().vec(), at::MemoryFormat::Contiguous);
    } else {
      // One roll per dim, each a cat of the two pieces (shells: metadata only).
      for (size_t i = 0; i < dims.size(); ++i) {
        const int64_t d = c10::maybe_wrap_dim(dims[i], self.dim());
        const int64_t size = self.size(d);
        int64_t start = (size - shifts[i]) % size;
        if (start < 0) start += size;
        at::MemoryFormat fmt = at::MemoryFormat::Contiguous;
        std::optional<at::MemoryFormat> common;
        for (int64_t piece : {size - start, start}) {
          std::vector<int64_t> sizes = self.sizes().vec();
          sizes[d] = piece;
          at::Tensor shell = cpu_shell(self);
          shell.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, 0);
          const at::MemoryFormat f = shell.suggest_memory_format();
          if (f == at::MemoryFormat::Contiguous || (common && *common != f)) {
            common = at::MemoryFormat::Contiguous;
            break;
          }
          common = f;
        }
        fmt = common.value_or(fmt);
        strides = strides_for(self.sizes().vec(), fmt);
      }
    }
    for (auto& g : outcome.returns[0])
      if (g.defined && self.sizes().equals(g.sizes)) g.strides = strides;
    return;
  }
  if ((traits & (kPreservesSelfStrides | kContiguousResult)) && stack[first].isTensor() && !outcome.returns.empty()) {
    const at::Tensor& self = stack[first].toTensor();
    const bool preserve = (traits & kPreservesSelfStrides) != 0;
    if (preserve && !self.is_non_overlapping_and_dense()) return;
    for (auto& r : outcome.returns) {
      for (auto& g : r) {
        if (!g.defined || !self.sizes().equals(g.sizes)) continue;
        g.strides = preserve ? self.strides().vec() : strides_for(g.sizes, at::MemoryFormat::Contiguous);
      }
    }
    return;
  }
  // Batch norm on CPU allocates its output in input.suggest_memory_format()
  // (contiguous unless a 4-d / 5-d input is channels_last); the meta kernels
  // keep the input's strides (a transposed 3-d input stays transposed).
  if ((traits & kInputFormatResult) && stack[first].isTensor() && !outcome.returns.empty()) {
    const at::Tensor& input = stack[first].toTensor();
    for (auto& g : outcome.returns[0])
      if (g.defined && input.sizes().equals(g.sizes)) g.strides = strides_for(g.sizes, input.suggest_memory_format());
    return;
  }
  // CPU kernels that allocate their result in self.suggest_memory_format();
  // their meta kernels (decompositions, or the structured meta function of
  // replication_pad2d/3d, which CPU's kernel restrides) allocate it contiguous.
  // (kSelfFormatResult)
  if ((traits & kSelfFormatResult) && stack[first].isTensor() && !outcome.returns.empty()) {
    const at::Tensor& self = stack[first].toTensor();
    const at::MemoryFormat fmt = self.suggest_memory_format();
    for (auto& g : outcome.returns[0])
      if (static_cast<int64_t>(g.sizes.size()) == self.dim()) restride(g, fmt);
  }
}

void apply_cpu_result_layout(const c10::FunctionSchema& schema, uint64_t traits, const torch::jit::Stack& stack,
                             size_t first, MetaOutcome& outcome) {
  if (!(traits & (kIteratorLayout | kEmptyLikeSelf))) return;
  // The geometries CPU's kernel lays out: the fresh results, and the out=
  // tensors it resizes (their shape changes); the first gives sizes and dtype.
  std::vector<Geometry*> laid_out;
  for (auto& r : outcome.returns)
    for (auto& g : r)
      if (g.defined) laid_out.push_back(&g);
  const auto& args = schema.arguments();
  for (auto& w : outcome.written) {
    const size_t i = first + static_cast<size_t>(w.first);
    if (!args[w.first].is_out() || i >= stack.size() || !stack[i].isTensor() || !w.second.defined) continue;
    if (!stack[i].toTensor().sizes().equals(w.second.sizes)) laid_out.push_back(&w.second);
  }
  if (laid_out.empty()) return;
  const std::vector<int64_t> sizes = laid_out.front()->sizes;
  std::optional<std::vector<int64_t>> strides;
  if (traits & kIteratorLayout) {
    try {
      strides = iterator_output_strides(tensor_inputs(schema, stack, first, (traits & kOtherContiguous) != 0),
                                        laid_out.front()->dtype);
    } catch (const c10::Error&) {
      return;  // the meta kernel accepted the call; keep its answer
    }
  } else {
    for (size_t i = 0; i < args.size() && first + i < stack.size() && !strides; ++i)
      if ((args[i].name() == "self" || args[i].name() == "input") && stack[first + i].isTensor() &&
          stack[first + i].toTensor().defined() && stack[first + i].toTensor().sizes().equals(sizes))
        strides = empty_like_strides(stack[first + i].toTensor());
  }
  if (!strides || strides->size() != sizes.size()) return;
  for (Geometry* g : laid_out)
    if (g->sizes == sizes) g->strides = *strides;
}

}  // namespace tpu_eager
