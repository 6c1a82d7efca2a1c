"""Generate csrc/ops/op_table.inc: the ATen overloads the "tpu" device records.

The table is data: one row per overload, its primitive kind (how the JIT lowers
it), the arguments it writes without saying so in its schema, and its traits
(OpTrait bits, csrc/ops/op_table.h). Rows come from
the dispatcher of the installed torch (every aten overload with a CPU kernel and
no composite kernel), filtered by the exclusion rules below and classified by the
kind rules. Re-run after a torch upgrade:  python tools/gen_op_table.py
"""

import os
import re

import torch
import torchgen
import yaml

C = torch._C
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "csrc", "ops", "op_table.inc")
OUT_OVERLOADS = os.path.join(HERE, "..", "csrc", "executors", "out_overloads.inc")

# Overloads that the device implements with kernels of their own (csrc/ops/device_kernels.cpp).
SPECIAL = {
    "empty.memory_format",
    "empty_strided",
    "_efficientzerotensor",
    "_copy_from",
    "_copy_from_and_resize",
    "_local_scalar_dense",
    "resize_",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
    "set_.source_Tensor",
    "set_",
    "view",
    "as_strided",
    "_reshape_alias",
}
# Backends, layouts and test ops the simulated device does not model.
EXCLUDE = re.compile(
    r"quantiz|^q_|_per_tensor|_per_channel|sparse|mkldnn|fbgemm|nested|cudnn|miopen|_test_|_dyn_quant|vulkan|"
    r"xnnpack|_mps|_weight_int|_convert_weight|_cslt|_pin_memory|is_pinned|record_stream|_foobar|_fused_moving_avg|"
    r"to_padded_tensor|_jagged|_padded_dense|_cufft|_fft_c2c_mkl|_fused_sdp|_scaled_dot_product_flash_attention(?!_for_cpu)|"
    r"^_flash_attention|_efficient_attention|_scaled_dot_product_cudnn|"
    r"_triton|_cudnn|lstm_mps|_mkl|^_fake|_make_dep_token|_assert|_functional_assert|"
    r"_print|sym_|_nnpack|_use_|_has_compatible|_version|_fw_primal|_make_dual|_unpack_dual|"
    r"_thnn_fused_gru|_validate|_chunk_cat|_int_mm|_dimI|_dimV|_nnz|_coalesced|^_?indices(_copy)?(\.|$)|"
    r"^_?values(_copy)?(\.|$)|crow_|col_indices|"
    r"ccol_|row_indices|_to_dense|to_dense|_spdiags|_addmm_activation|_grouped_mm|_scaled_grouped|"
    r"_mixed_dtypes|_convert_indices|_dirichlet_grad|_fused_rms|"
    r"_wrapped_|_sobol|_propagate_xla|_lazy_clone|_nested|_safe_softmax"
)
# Data-dependent output shapes, or non-tensor results: run at record time after a flush.
# Also _scaled_mm / _scaled_mm_v2 (float8 operands with scales): no fused loop or matmul
# of the device takes float8, so CPU's kernel runs at the call.
SYNC = re.compile(
    r"^(nonzero|nonzero_numpy|unique|_unique|unique_consecutive|unique_dim|unique_dim_consecutive|_unique2|"
    r"masked_select|bincount|repeat_interleave|_local_scalar_dense|is_nonzero|equal|allclose|is_set_to|"
    r"argwhere|histc|histogram|_histogramdd_bin_edges|_histogramdd_from_bin_cts|_histogramdd_from_bin_tensors|_aminmax|lstsq|linalg_lstsq|_linalg_check_errors|"
    r"_check_|segment_reduce|_segment_reduce|_embedding_bag|_embedding_bag_forward_only|embedding_bag|"
    r"_ctc_loss|ctc_loss|_ctc_loss_backward|_batch_norm_impl_index|"
    r"linalg_eig|linalg_eigvals|_linalg_eigvals|_linalg_eigh|linalg_eigh|symeig|qr|linalg_qr|_linalg_svd|"
    r"linalg_svd|svd|geqrf|triangular_solve|linalg_solve_triangular|linalg_lu|linalg_lu_factor_ex|lu_unpack|"
    r"_linalg_det|_linalg_slogdet|linalg_cholesky_ex|cholesky|cholesky_inverse|cholesky_solve|_cholesky_solve_helper|"
    r"linalg_inv_ex|_linalg_solve_ex|linalg_ldl_factor_ex|linalg_ldl_solve|linalg_householder_product|"
    r"ormqr|linalg_matrix_exp|linalg_pinv|_linalg_eig|lu_solve|linalg_lu_solve|frexp|_scaled_mm|_scaled_mm_v2)$"
)
RANDOM = re.compile(
    r"^(uniform|normal|bernoulli|random|exponential|geometric|log_normal|cauchy|multinomial|randperm|rand|randn|"
    r"randint|rand_like|randn_like|randint_like|poisson|_standard_gamma|binomial|_sample_dirichlet|native_dropout|"
    r"rrelu_with_noise|_fused_dropout|_s_where_placeholder)_?$"
)
MATMUL = re.compile(
    r"^(mm|bmm|addmm|baddbmm|addbmm|addmv|mv|dot|vdot|addr|_convolution|convolution_overrideable|"
    r"convolution_backward_overrideable|slow_conv.*|_slow_conv2d_forward|_slow_conv2d_backward|"
    r"thnn_conv2d|conv_depthwise3d|_conv_depthwise2d|linear|matmul|_mm_dtype|ger|outer|tensordot|"
    r"_embedding_bag_dense_backward)_?$"
)
REDUCTION = re.compile(
    r"^(sum|mean|prod|amax|amin|max|min|argmax|argmin|var|std|var_mean|std_mean|logsumexp|norm|linalg_vector_norm|"
    r"all|any|_softmax|_log_softmax|_softmax_backward_data|_log_softmax_backward_data|native_layer_norm|"
    r"native_layer_norm_backward|cumsum|cumprod|cummax|cummin|logcumsumexp|nansum|aminmax|count_nonzero|"
    r"native_batch_norm|native_batch_norm_backward|_native_batch_norm_legit|_native_batch_norm_legit_no_training|"
    r"batch_norm_stats|batch_norm_elemt|batch_norm_gather_stats|batch_norm_update_stats|native_group_norm|"
    r"native_group_norm_backward|_batch_norm_with_update|batch_norm_backward|_fused_rms_norm|"
    r"nll_loss_forward|nll_loss_backward|nll_loss2d_forward|nll_loss2d_backward|mse_loss|mse_loss_backward|"
    r"l1_loss|smooth_l1_loss|smooth_l1_loss_backward|huber_loss|huber_loss_backward|binary_cross_entropy|"
    r"binary_cross_entropy_backward|soft_margin_loss|soft_margin_loss_backward|multilabel_margin_loss_forward|"
    r"kl_div|_cdist_forward|_euclidean_dist|dist|renorm|_weight_norm|trace|sort|topk|argsort|msort|"
    r"_pdist_forward|_cdist_backward|_pdist_backward|std_mean|linalg_matrix_norm|_upsample.*|upsample.*|"
    r"max_pool.*|avg_pool.*|adaptive_.*|fractional_max_pool.*|_adaptive_avg_pool.*|mish_backward|"
    r"median|nanmedian|kthvalue|mode|_cummax_helper|_cummin_helper)$"
)
DATA = re.compile(
    r"^(cat|stack|_stack|index|index_put|_index_put_impl|gather|scatter|scatter_add|scatter_reduce|index_select|"
    r"index_add|index_copy|index_fill|index_reduce|take|put|masked_scatter|copy|constant_pad_nd|"
    r"embedding_dense_backward|repeat|flip|roll|tril|triu|tril_indices|triu_indices|diag_embed|diag|"
    r"reflection_pad.*|replication_pad.*|im2col|col2im|unfold_backward|_unsafe_index|_unsafe_index_put|"
    r"_index_put_impl_|select_backward|slice_backward|diagonal_backward|as_strided_scatter|select_scatter|"
    r"slice_scatter|diagonal_scatter|narrow_copy|.*_copy|embedding|embedding_backward|_embedding_bag_backward|"
    r"pixel_shuffle|pixel_unshuffle|channel_shuffle|native_channel_shuffle|_pad_circular|_pad_enum|"
    r"eye|arange|linspace|logspace|full|zeros|ones|fill|zero|block_diag|"
    r"searchsorted|bucketize|_cat|cartesian_prod|combinations|rot90|_unsafe_masked_index.*|"
    r"masked_fill|_masked_softmax|_masked_softmax_backward)_?$"
)


def base_name(overload):
    name = overload.split(".")[0]
    return name


def kind_of(overload, schema):
    b = base_name(overload)
    core = b.rstrip("_")
    if SYNC.match(core) or SYNC.match(b):
        return "kSync"
    # Their out= kernels resize `out` to the unreduced loss's shape before reducing
    # into it (OUT_KERNEL_RESIZES), which a deferred node's fixed-size device buffer
    # cannot take: an explicit out= call runs at the call, where the eager path gives
    # CPU's kernel a resizable out and copies the result back (CPU's warnings too).
    if functional_of_out(overload) in OUT_KERNEL_RESIZES and any(a.is_out for a in schema.arguments):
        return "kSync"
    # results that are not tensors need the data
    if any(not str(r.type).startswith(("Tensor", "List[Tensor]", "Optional[Tensor]")) for r in schema.returns):
        return "kSync"
    if RANDOM.match(core) or RANDOM.match(b):
        return "kRandom"
    if MATMUL.match(core):
        return "kMatmul"
    if REDUCTION.match(core):
        return "kReduction"
    if DATA.match(core) or DATA.match(b):
        return "kData"
    if "backward" in core and core not in ELEMENTWISE_BACKWARD:
        return "kLibrary"
    if b in {
        "_to_copy",
        "clone",
        "where",
        "_conj_physical",
        "conj_physical",
        "lerp",
        "addcmul",
        "addcdiv",
        "rsub",  # rsub.Tensor has no pointwise tag (rsub.Scalar has); both are other - alpha * self
        # Integer index math without a pointwise tag (executors/tpu/fused_int.cpp lowers them).
        "floor_divide",
        "floor_divide_",
        "__irshift__",
    } or is_pointwise(overload):
        return "kElementwise"
    return "kLibrary"


ELEMENTWISE_BACKWARD = {
    "threshold_backward",
    "gelu_backward",
    "silu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "elu_backward",
    "leaky_relu_backward",
    "hardtanh_backward",
    "hardsigmoid_backward",
    "hardswish_backward",
    "softplus_backward",
    "log_sigmoid_backward",
    "logit_backward",
    "hardshrink_backward",
    "softshrink_backward",
    "mish_backward",
}


def is_pointwise(overload):
    op = op_packet(overload)
    if op is not None and torch.Tag.pointwise in op.tags:
        return True
    # in-place variants (add_.Tensor) carry no tag: use the functional overload's
    name, _, ov = overload.partition(".")
    if name.endswith("_"):
        op = op_packet(name[:-1] + ("." + ov if ov else ""))
        return op is not None and torch.Tag.pointwise in op.tags
    return False


def composite_pointwise(full, overload):
    """Functional pointwise ops whose only kernel is CompositeExplicitAutograd
    (abs, clone, mul.Scalar, ...): recording them directly gives one node and
    CPU's output strides (their decomposition resizes an empty out= tensor,
    whose meta kernel picks contiguous strides where CPU preserves the input's)."""
    if not C._dispatch_has_kernel_for_dispatch_key(full, "CompositeExplicitAutograd"):
        return False
    op = op_packet(overload)
    return op is not None and torch.Tag.pointwise in op.tags and not any(r.alias_info for r in op._schema.returns)


def op_packet(overload):
    name, _, ov = overload.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    try:
        return getattr(packet, ov or "default")
    except AttributeError:
        return None


def writes_without_annotation(overload):
    # native_batch_norm updates running_mean/running_var (args 3, 4) in training
    # mode, but its schema does not mark them as written (PRIVATEUSE1_NOTES pitfall 11).
    if overload in ("native_batch_norm", "native_batch_norm.out"):
        return "(1u << 3) | (1u << 4)"
    return "0"


# out= overloads without a CPU kernel whose CompositeExplicitAutograd kernel
# accepts only CPU/CUDA/XPU tensors (mode_out checks the device), so on "tpu"
# they fail while their functional overload records. They are recorded like it:
# the Meta kernel sizes the out= tensors and the executor runs CPU's composite.
# Found by comparing, for every recorded reduction/sort, CPU's registered out=
# overloads with the table; the others' composites call the recorded functional
# op and copy, which works on "tpu" (tests/api/test_out_overloads.py sweeps them).
COMPOSITE_OUT_CPU_ONLY = {"mode.values"}


def composite_out_cpu_only(full, overload):
    """True for a COMPOSITE_OUT_CPU_ONLY overload that still has no CPU kernel
    and has the Meta kernel the record kernel needs."""
    return (
        overload in COMPOSITE_OUT_CPU_ONLY
        and not C._dispatch_has_kernel_for_dispatch_key(full, "CPU")
        and C._dispatch_has_kernel_for_dispatch_key(full, "Meta")
    )


# Functional composites recorded as one node: the JIT then sees the whole op and can run it
# as one row loop fused with its producers (csrc/executors/tpu/logsumexp_row.inc); elsewhere
# the executor runs CPU's out= composite on host buffers, so results equal CPU's. Autograd is
# unaffected: the op's derivative is registered above the backend key. cummax/cummin: their
# composite calls _cummax_helper/_cummin_helper, which have no Meta kernel (every call ran
# eagerly); recorded whole, the Spyre target scans them over its cores (docs/ktir.md).
# _foreach_norm.Scalar and stack: clip_grad_norm_'s foreach path records one node over all
# its tensors instead of a linalg_vector_norm (or an unsqueeze view) per tensor; the host
# runs the foreach norm's float32 2-norms with its own kernel (executors/direct_kernels.cpp).
COMPOSITE_RECORDED = {"logsumexp", "cummax", "cummin", "_foreach_norm.Scalar", "stack"}
# In-place ops whose only kernel is CompositeExplicitAutograd and whose composite calls CPU's
# DispatchStub itself instead of an op the device registers: on "tpu" the stub has no kernel
# and raises an INTERNAL ASSERT. Recorded whole, the executor runs the composite on host
# buffers. conj_physical_ (a no-op for real dtypes; TestMathBits' conj / neg_conj views).
COMPOSITE_RECORDED |= {"conj_physical_"}


# Foreach ops recorded as one node over all their tensors and expanded by the flush into the
# per-tensor ops CPU's kernel calls, in its order (jit/foreach_expand.cpp): the optimizers'
# foreach paths (SGD, Adam, AdamW, with weight decay's functional add, amsgrad's maximum_ and
# maximize's neg) and clip_grad_norm_'s scale. One node instead of one per tensor saves the
# record path the dispatcher hops and meta key of every tensor's op; the fused loops still
# see each tensor's elementwise chain. Shapes and call-time errors come
# from CPU's foreach kernel on zero-filled twins (kInferOnCpu): it checks what CPU checks
# (list lengths, in-place casts, a non-0-dim scalar tensor) and, when it raises, the call
# runs CPU's kernel on the values, which writes the tensors before the failing one as CPU does.
FOREACH_EXPANDED = {
    "_foreach_mul_.Scalar",
    "_foreach_mul_.ScalarList",
    "_foreach_mul_.Tensor",
    "_foreach_mul_.List",
    "_foreach_add_.Scalar",
    "_foreach_add_.ScalarList",
    "_foreach_add_.List",
    "_foreach_div_.Scalar",
    "_foreach_div_.ScalarList",
    "_foreach_div_.List",
    "_foreach_lerp_.Scalar",
    "_foreach_addcmul_.Scalar",
    "_foreach_addcmul_.ScalarList",
    "_foreach_addcdiv_.Scalar",
    "_foreach_addcdiv_.ScalarList",
    "_foreach_sqrt",
    "_foreach_add.List",
    "_foreach_maximum_.List",
    "_foreach_neg",
}


def foreach_expanded(full, overload):
    """True for a FOREACH_EXPANDED overload whose only kernel is still CPU's slow
    (CompositeExplicitAutograd) loop over its tensors."""
    return (
        overload in FOREACH_EXPANDED
        and not C._dispatch_has_kernel_for_dispatch_key(full, "CPU")
        and C._dispatch_has_kernel_for_dispatch_key(full, "CompositeExplicitAutograd")
    )


def composite_recorded(full, overload):
    """True for a COMPOSITE_RECORDED overload whose only kernel is still the
    CompositeExplicitAutograd one and which has the Meta kernel the record kernel needs."""
    return (
        overload in COMPOSITE_RECORDED
        and not C._dispatch_has_kernel_for_dispatch_key(full, "CPU")
        and C._dispatch_has_kernel_for_dispatch_key(full, "CompositeExplicitAutograd")
        and C._dispatch_has_kernel_for_dispatch_key(full, "Meta")
    )


def cpp_meta_is_cpu_overloads():
    """Overloads whose C++ meta kernel gives CPU's result geometry and call-time errors,
    from the native_functions.yaml torchgen ships with torch:

    - structured kernels (``structured: True`` or a ``structured_delegate``): their meta
      function is the code CPU's kernel runs first (TensorIterator's shape, dtype, stride
      and overlap logic);
    - in-place ops with a hand-written ``Meta`` kernel (``fill_``, ``zero_``): the result
      is ``self`` as it is, and the kernel checks the arguments CPU checks before it
      writes. Not the in-place RNG ops (``normal_``, ``uniform_``, ``random_``): their
      meta kernels skip CPU's dtype checks (normal_ of an int64 tensor), which the Python
      ones make (traits_of).

    The record kernel infers these with the C++ kernel alone: the Python meta kernels
    that shadow them (torch._refs) import sympy on their first call, which CPU never does.

    Not the overloads in ``META_NOT_FINAL``: their structured meta function sets a
    placeholder geometry that CPU's kernel then replaces."""
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    with open(path) as f:
        functions = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    found = set()
    for fn in functions:
        overload = fn["func"].split("(")[0]
        meta_keys = [k for k in fn.get("dispatch", {}) if "Meta" in (x.strip() for x in k.split(","))]
        if fn.get("structured") or fn.get("structured_delegate"):
            found.add(overload)
        elif meta_keys and overload.split(".")[0].endswith("_"):
            found.add(overload)
    return found - META_NOT_FINAL


# isin(Scalar, Tensor): the meta function sets a result of shape [0]; the kernel wraps the
# Scalar in a 0-dim tensor and calls isin.Tensor_Tensor_out, which resizes the result to
# the Scalar's shape [] (the Python meta kernel gives [] directly).
META_NOT_FINAL = {"isin.Scalar_Tensor", "isin.Scalar_Tensor_out"}


def _every(ov):
    return True


def _default(ov):
    return ov == ""


def _no_out_in_name(ov):
    # memory-format fixes skip the out= forms (CPU keeps a given out's strides); an
    # overload counts as out= when its name contains "out" (sort.values does not)
    return "out" not in ov


# The ops that write through an index tensor (in place, out= or functional).
INDEX_WRITES = {
    "_index_put_impl_",
    "put_",
    "index_add",
    "index_add_",
    "index_copy",
    "index_copy_",
    "index_fill_",
    "index_reduce",
    "index_reduce_",
    "scatter",
    "scatter_",
    "scatter_add",
    "scatter_add_",
    "scatter_reduce",
    "scatter_reduce_",
}

# Per-op knowledge of the record kernel: where an op's meta kernel disagrees with
# CPU's kernel, or CPU does something at the call. Each row: an OpTrait bit (what it
# does is documented in csrc/ops/op_table.h), the base names it applies to, and which
# of their overloads (by overload name). The table is the one place these ops are named.
OP_TRAITS = [
    # Scalar values size the result: key meta results by value; an out= keeps its geometry when its numel fits.
    ("kRangeFactory", {"arange", "range", "linspace", "logspace"}, _every),
    # CPU's arange.out warns when it resizes a non-empty out tensor (range, linspace, logspace do not).
    ("kWarnsOnOutResize", {"arange"}, _every),
    # 16-bit inputs keep mean/rstd in their dtype unless a parameter is float32 (then
    # float32); group norm's backward gives each gradient its argument's dtype.
    (
        "kNormStatsInInputDtype",
        {
            "native_layer_norm",
            "native_batch_norm",
            "_native_batch_norm_legit",
            "_batch_norm_with_update",
            "native_group_norm",
            "native_group_norm_backward",
        },
        lambda ov: ov in ("", "no_stats"),
    ),
    # CPU kernels that read torch.use_deterministic_algorithms when they run: the index
    # writes (a deterministic order for duplicate indices, or the nondeterministic alert)
    # and max_unpool (the alert: raise, or warn with warn_only). While the mode is on they
    # run at the call, under the mode of the call (record.cpp); with it off they are
    # queued, and changing the mode runs the queue first (torch_tpu_eager/_deterministic.py).
    (
        "kReadsDeterministicMode",
        INDEX_WRITES | {"max_unpool2d", "max_unpool3d"},
        _every,
    ),
    # bool tensor ** bool stays bool.
    ("kBoolPowKeepsBool", {"pow"}, lambda ov: ov == "Tensor_Scalar"),
    # Shapes from CPU's kernel on zero-filled CPU twins: their Python meta kernels are
    # decompositions into dozens of reference ops (1-5 ms a call), and CPU's kernels read
    # no values to size results or raise (docs/performance.md, cold start, 2026-12-05).
    (
        "kInferOnCpu",
        {
            "native_batch_norm",
            "native_batch_norm_backward",
            "_native_batch_norm_legit",
            "native_layer_norm",
            "native_layer_norm_backward",
            "_adaptive_avg_pool2d",
            "_adaptive_avg_pool2d_backward",
        },
        _default,
    ),
    # Composites recorded whole (COMPOSITE_RECORDED): the Python meta kernel of the foreach
    # norm accepts what CPU's kernel raises at the call (integer tensors); stack's is a
    # decomposition. CPU's kernel on the twins gives CPU's errors and geometry.
    # CPU's relu refuses bool, then returns clamp_min(self, 0): the structured meta function of
    # clamp_min gives its geometry and errors, without twins (a first relu's twin, kernel
    # run and fresh result cost ~75 page faults at 256 KiB; docs/performance.md, "thr23").
    ("kInferAsClampMinZero", {"relu"}, _default),
    # Batch norm's shapes by rules of their own on meta twins (csrc/ops/shape_rules.h), for the
    # calls the rules cover; the others keep kInferOnCpu (above), and with it CPU's errors.
    # Every overload (out=, no_stats, _batch_norm_with_update): the rules check the arguments
    # CPU's kernels read unchecked (a missing statistic, a per-channel tensor too short) and
    # give results for the functional forms only.
    ("kShapeRuleBatchNorm", {"native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update"}, _every),
    ("kShapeRuleBatchNormBackward", {"native_batch_norm_backward"}, _every),
    # The foreach ops recorded whole: each per-tensor op's C++ meta function on meta twins
    # (ops/foreach_rules.h), for the calls the rule covers; the others keep kInferOnCpu.
    ("kShapeRuleForeach", {o.split(".")[0] for o in FOREACH_EXPANDED}, lambda ov: True),
    ("kInferOnCpu", {"_foreach_norm"}, lambda ov: ov == "Scalar"),
    ("kInferOnCpu", {"stack"}, _default),
    ("kInferOnCpu", {o.split(".")[0] for o in FOREACH_EXPANDED}, lambda ov: True),
    # CPU's kernels with float32 and float64 loops (AT_DISPATCH_FLOATING_TYPES and wider): a
    # call of one of these dtypes (int64 indices aside) skips the dtype probe (ops/cpu_probe.h).
    # The ops of the training steps' first steps; out= forms keep the probe.
    (
        "kFloatLoops",
        {
            "add",
            "add_",
            "sub",
            "sub_",
            "mul",
            "mul_",
            "div",
            "div_",
            "neg",
            "exp",
            "sqrt",
            "reciprocal",
            "addcmul_",
            "addcdiv_",
            "lerp_",
            "zero_",
            "fill_",
            "clone",
            "sum",
            "mean",
            "mm",
            "addmm",
            "bmm",
            "cat",
            "clamp",
            "relu",
            "gelu",
            "gelu_backward",
            "threshold_backward",
            "_log_softmax",
            "_log_softmax_backward_data",
            "_softmax",
            "_softmax_backward_data",
            "nll_loss_forward",
            "nll_loss_backward",
            "max_pool2d_with_indices",
            "max_pool2d_with_indices_backward",
            "linalg_vector_norm",
            "embedding_dense_backward",
            "index_select",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
        },
        _no_out_in_name,
    ),
    # CPU's kernel returns before its dtype dispatch when a dim has one element (pdist of fewer
    # than two rows: an empty result), so the dtype probe's twins keep sizes up to 2. The
    # backward dispatches first (its size-1 probe rejects Half too); it is given the same twins.
    # flip copies when no flipped dim has two elements (no ComplexHalf loop past that).
    ("kProbeTwinsOfTwo", {"_pdist_forward", "_pdist_backward", "flip"}, _every),
    # CPU's kernel has no float16 / bfloat16 loop that size-1 twins can reach (the window needs
    # room): 16-bit calls get the full-size dtype probe.
    ("kProbeFull16Bit", {"avg_pool3d", "avg_pool3d_backward"}, _every),
    # The gradient is contiguous whatever grad_output's strides.
    ("kContiguousGradient", {"_log_softmax_backward_data"}, _default),
    # Eval mode: save_mean / save_invstd are empty (out=: as given); running stats not written.
    ("kEvalEmptySaveStats", {"native_batch_norm", "_native_batch_norm_legit"}, lambda ov: ov in ("", "out")),
    # out= tensors of the right shape keep their strides.
    ("kOutKeepsGivenStrides", {"sort"}, lambda ov: ov in ("values", "values_stable")),
    # need_weights=False: no weights (None), not an empty tensor.
    ("kNoUnrequestedWeights", {"_native_multi_head_attention"}, _default),
    # Result memory formats (csrc/ops/memory_format.cpp).
    ("kPreservesSelfStrides", {"flip", "sort", "nan_to_num", "hardtanh"}, _no_out_in_name),
    ("kContiguousResult", {"tril", "triu", "_log_softmax", "masked_fill", "mse_loss_backward"}, _no_out_in_name),
    ("kRollFormat", {"roll"}, _no_out_in_name),
    (
        "kInputFormatResult",
        {"native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update"},
        _no_out_in_name,
    ),
    (
        "kSelfFormatResult",
        {
            "channel_shuffle",
            "native_channel_shuffle",
            "max_unpool2d",
            "reflection_pad3d",
            "replication_pad2d",
            "replication_pad3d",
        },
        _default,
    ),
    # Kernels that are not structured (no C++ meta function gives their strides): CPU's
    # TensorIterator over the tensor arguments lays out a fresh or resized result
    # (csrc/ops/memory_format.cpp apply_cpu_result_layout; tests/record/test_output_strides.py).
    (
        "kIteratorLayout",
        {
            "floor_divide",
            "logical_and",
            "logical_or",
            "logical_xor",
            "complex",
            "polar",
            "hardtanh_backward",
            "hardswish_backward",
            "native_dropout_backward",
        },
        _every,
    ),
    # Structured kernels whose TensorIterator promotes its inputs to their common dtype: on
    # CPU the iterator replaces an input of another dtype by its `.to(common)` copy before it
    # orders the dimensions (an expanded int32 operand of a float32 add enters contiguous);
    # the meta kernel's iterator does not convert, so mixed dtypes gave other strides
    # (tests/executors/tpu/test_random_fused.py found it; tests/record/test_output_strides.py).
    (
        "kIteratorLayout",
        {
            "add",
            "sub",
            "mul",
            "div",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "maximum",
            "minimum",
            "fmax",
            "fmin",
            "atan2",
            "remainder",
            "fmod",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "copysign",
            "xlogy",
            "addcmul",
            "addcdiv",
        },
        _every,
    ),
    # Unary ops CPU computes into a TensorIterator's output (abs / angle / logical_not through
    # their out= kernel on an empty tensor, isnan / isinf as comparisons): a contiguous input with
    # size-1 dims gets contiguous strides there, the meta kernel's empty_like keeps the input's.
    ("kIteratorLayout", {"abs", "angle", "logical_not", "isnan", "isinf"}, _every),
    ("kIteratorLayout", {"pow"}, lambda ov: ov.startswith("Tensor_Tensor")),
    ("kIteratorLayout", {"clamp", "clamp_min", "clamp_max"}, lambda ov: ov.startswith("Tensor")),
    # ldexp (self * pow(2, other)): the iterator sees pow's result, which is contiguous.
    ("kIteratorLayout", {"ldexp"}, _every),
    # huber_loss's out= kernel iterates over (self, target) into the out tensor it resizes.
    ("kIteratorLayout", {"huber_loss"}, lambda ov: ov == "out"),
    ("kOtherContiguous", {"ldexp"}, _every),
    # ... or empty_like(self), which the kernel then iterates into.
    ("kEmptyLikeSelf", {"huber_loss", "binary_cross_entropy", "binary_cross_entropy_backward"}, _default),
    # The out= kernel resizes out and copies the functional result: a resized out is contiguous.
    (
        "kOutResizedContiguous",
        {"_fft_c2c", "_fft_r2c", "_fft_c2r", "native_batch_norm", "_native_batch_norm_legit", "normal", "mvlgamma"},
        _every,
    ),
]

# CPU call-time checks the meta kernels do not make (OpTrait kCheck* bits): same row form.
CALL_CHECKS = [
    ("kCheckPowTensorScalar", {"pow"}, lambda ov: ov.startswith("Tensor_Scalar")),
    ("kCheckPowScalarInPlace", {"pow_"}, lambda ov: ov == "Scalar"),
    ("kCheckSubBool", {"sub", "sub_", "rsub"}, _every),
    ("kCheckInPlaceCast", {"add_", "sub_", "mul_"}, lambda ov: ov in ("Tensor", "Scalar")),
    ("kCheckIndexPut", {"_index_put_impl_", "index_put_", "index_put"}, _every),
    ("kCheckMaskedScatter", {"masked_scatter_", "masked_scatter"}, _every),
    ("kCheckIndexBounds", {"index", "_index_put_impl_", "index_put_", "index_put"}, _every),
    ("kCheckSameDtypePair", {"complex", "polar"}, _every),
    ("kCheckRandperm", {"randperm"}, _every),
    ("kCheckIndexDevices", {"index"}, _every),
    ("kCheckReductionDims", {"nansum"}, _every),
    ("kCheckBoundaries1d", {"bucketize"}, _every),
    ("kCheckSearchSide", {"searchsorted"}, _every),
    # CPU's gelu kernels parse `approximate` when they run; the structured meta function does not.
    ("kCheckGeluApproximate", {"gelu", "gelu_", "gelu_backward"}, _every),
    # CPU's multinomial checks its arguments before it draws; the meta kernel checks the rank only.
    ("kCheckMultinomial", {"multinomial"}, _every),
    ("kCheckDegreesOfFreedom", {"var", "std", "var_mean", "std_mean"}, lambda ov: ov.startswith("correction")),
    # Integer division by zero (CPU: RuntimeError "ZeroDivisionError"); the divisor is argument 1.
    ("kCheckIntegerDivisor", {"fmod", "fmod_", "remainder", "remainder_", "floor_divide", "floor_divide_"}, _every),
    ("kCheckIntegerDivisor", {"div", "div_"}, lambda ov: "mode" in ov),
    # An `index` tensor whose values the host holds, with one outside [0, size): CPU's kernel
    # raises (or wraps a negative index) at the call, where a queued op would raise at the flush.
    (
        "kCheckIndexValues",
        (INDEX_WRITES - {"_index_put_impl_"}) | {"index_fill", "put", "index_select", "gather", "take"},
        _every,
    ),
    # A class `target` whose values the host holds, with one outside [0, classes) that is not
    # ignore_index: CPU's kernel raises "Target 5 is out of bounds." at the call.
    (
        "kCheckTargetValues",
        {"nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward", "nll_loss2d_backward", "multi_margin_loss"},
        _every,
    ),
]

# Ops whose CPU kernel raises on the values it reads, not only on shapes and dtypes: indices
# and targets out of range, a Scalar from a tensor that does not fit the result's dtype,
# probabilities or BCE inputs outside their range. Deferred, their check runs when the op
# runs, so such an op runs even when nothing reads its result (jit live_nodes, as CUDA
# runs every launched kernel and its device-side asserts): its error then reaches the user
# at the chip's next synchronizing call (csrc/lazy/async_errors.h). Their rows carry the
# OpTrait kChecksValues, which the record kernel copies into the Node (Node::checks_values).
VALUE_CHECKS = [
    (
        INDEX_WRITES
        | {
            "index_select",
            "index",
            "gather",
            "take",
            "embedding_renorm_",
            "max_unpool2d",
            "max_unpool3d",
            "masked_scatter_",
            "nll_loss_forward",
            "nll_loss2d_forward",
            "nll_loss_backward",
            "nll_loss2d_backward",
            "multi_margin_loss",
            "multilabel_margin_loss_forward",
            "binary_cross_entropy",
            "multinomial",
        },
        _every,
    ),
    # The fill value is a tensor's element, converted to self's dtype when the op runs.
    ({"masked_fill", "masked_fill_", "fill_"}, lambda ov: ov.startswith("Tensor")),
]


def checks_values(overload):
    """Whether the overload's CPU kernel raises on values it reads (VALUE_CHECKS)."""
    base, _, ov = overload.partition(".")
    return any(base in bases and overloads(ov) for bases, overloads in VALUE_CHECKS)


def traits_of(overload, kind, schema, cpp_meta_is_cpu):
    """The OpTrait bits of an overload, as C++ source ("0" when it has none)."""
    bits = []
    if overload in cpp_meta_is_cpu and kind != "kRandom":
        bits.append("kCppMetaIsCpu")
    base, _, ov = overload.partition(".")
    for trait, bases, overloads in OP_TRAITS + CALL_CHECKS:
        if base in bases and overloads(ov):
            bits.append(trait)
    # normal with a std tensor: CPU checks std >= 0 (its meta kernel does not)
    if base == "normal" and any(a.name == "std" and a.type.kind() == "TensorType" for a in schema.arguments):
        bits.append("kCheckNormalStd")
    if checks_values(overload):
        bits.append("kChecksValues")
    if overload in FOREACH_EXPANDED:
        bits.append("kExpandsPerTensor")
    return " | ".join(bits) or "0"


def main():
    cpp_meta_is_cpu = cpp_meta_is_cpu_overloads()
    rows = []
    for full in sorted(C._dispatch_get_all_op_names()):
        if not full.startswith("aten::"):
            continue
        # A composite op is decomposed before it reaches the device, except where CPU has a
        # kernel of its own, which the dispatcher prefers (silu_backward, mish_backward:
        # their decompositions round every 16-bit intermediate, CPU's kernels once).
        if C._dispatch_has_kernel_for_dispatch_key(
            full, "CompositeImplicitAutograd"
        ) and not C._dispatch_has_kernel_for_dispatch_key(full, "CPU"):
            continue
        overload = full[len("aten::") :]
        if not (
            C._dispatch_has_kernel_for_dispatch_key(full, "CPU")
            or composite_pointwise(full, overload)
            or composite_out_cpu_only(full, overload)
            or composite_recorded(full, overload)
            or foreach_expanded(full, overload)
        ):
            continue
        if overload in SPECIAL or EXCLUDE.search(overload):
            continue
        op = op_packet(overload)
        if op is None:
            continue
        schema = op._schema
        if any(not r.alias_info or r.alias_info.is_write for r in schema.returns) or not schema.returns:
            is_view = False
        else:
            is_view = True
        kind = "kView" if is_view else kind_of(overload, schema)
        rows.append(
            (overload, kind, writes_without_annotation(overload), traits_of(overload, kind, schema, cpp_meta_is_cpu))
        )
    with open(OUT, "w") as f:
        f.write("// Generated by tools/gen_op_table.py from torch %s. Do not edit by hand.\n" % torch.__version__)
        f.write("// overload name, primitive kind, bit mask of arguments written without a schema annotation, traits\n")
        for name, kind, writes, traits in rows:
            f.write('{"%s", PrimKind::%s, %s, %s},\n' % (name, kind, writes, traits))
    counts = {}
    for _, k, _, _ in rows:
        counts[k] = counts.get(k, 0) + 1
    print(len(rows), "overloads", counts)


def is_out_of(functional, candidate):
    """True when `candidate` is the out= overload of `functional` (both torch._C.FunctionSchema):
    the same arguments (names and types, in order) followed by one out= Tensor per return.
    The rule of csrc/executors/out_variant.cpp, is_out_of."""
    fa, oa = functional.arguments, candidate.arguments
    if not candidate.is_mutable or len(oa) != len(fa) + len(functional.returns):
        return False
    if any(a.name != b.name or str(a.type) != str(b.type) or b.is_out for a, b in zip(fa, oa)):
        return False
    return all(b.is_out and b.type.kind() == "TensorType" for b in oa[len(fa) :])


# Functional ops whose CPU out= kernel computes the unreduced elementwise loss
# into `out` before reducing, so a correctly sized 0-dim out is resized to the
# input's shape first: PyTorch's deprecation warning "An output with one or
# more elements was resized" on every call (torch 2.13; found by running the
# OpInfo samples of every op on "tpu" with warnings recorded). The host runs
# their functional kernel and copies, as CPU's functional call warns nothing; their
# explicit out= overloads run at the call (kind_of). isin(Scalar, Tensor)'s out= kernel
# likewise resizes a 0-dim out to [0] first (META_NOT_FINAL). Functional overload names.
OUT_KERNEL_RESIZES = {"mse_loss", "huber_loss", "smooth_l1_loss", "binary_cross_entropy", "isin.Scalar_Tensor"}


def functional_of_out(overload):
    """The functional overload name of an out= overload's name ("isin.Scalar_Tensor_out" ->
    "isin.Scalar_Tensor", "mse_loss.out" -> "mse_loss"); other names unchanged."""
    base, _, ov = overload.partition(".")
    if ov == "out":
        return base
    return base + "." + ov[: -len("_out")] if ov.endswith("_out") else overload


def out_overload_names():
    """{"sum.dim_IntList": "IntList_out", ...}: every functional aten overload of the
    installed torch's dispatcher whose returns are fresh Tensors, mapped to the overload
    name of its out= overload (out_variant.cpp looks the latter up by name instead of
    walking every registered operator). Functional overloads without one, and those of
    OUT_KERNEL_RESIZES, are absent."""
    registered = set(C._dispatch_get_all_op_names())
    by_name = {}
    for s in C._jit_get_all_schemas():
        full = s.name + ("." + s.overload_name if s.overload_name else "")
        if s.name.startswith("aten::") and full in registered:
            by_name.setdefault(s.name, []).append(s)
    found = {}
    for name, schemas in by_name.items():
        for f in schemas:
            if not f.returns or f.is_mutable:
                continue
            if any(r.type.kind() != "TensorType" or r.alias_info is not None for r in f.returns):
                continue
            outs = [o.overload_name for o in schemas if is_out_of(f, o)]
            assert len(outs) <= 1, (name, f.overload_name, outs)
            key = name[len("aten::") :] + ("." + f.overload_name if f.overload_name else "")
            if outs and key not in OUT_KERNEL_RESIZES:
                found[key] = outs[0]
    return found


def write_out_overloads(path=OUT_OVERLOADS):
    """Writes csrc/executors/out_overloads.inc: out_overload_names() sorted by functional
    overload name (byte order, for a binary search with strcmp)."""
    found = out_overload_names()
    with open(path, "w") as f:
        f.write("// Generated by tools/gen_op_table.py from torch %s. Do not edit by hand.\n" % torch.__version__)
        f.write("// functional aten overload, overload name of its out= overload (sorted, byte order)\n")
        for key in sorted(found, key=lambda k: k.encode()):
            f.write('{"%s", "%s"},\n' % (key, found[key]))
    print(len(found), "out= overloads")


if __name__ == "__main__":
    main()
    write_out_overloads()
