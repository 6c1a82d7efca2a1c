"""out= overloads of the reductions and sorts: equal to CPU on "tpu".

Most out= overloads without a CPU kernel are composites that call the recorded
functional op and copy; mode.values' composite accepts only CPU/CUDA/XPU, so it
is an op-table row (tools/gen_op_table.py COMPOSITE_OUT_CPU_ONLY) recorded like
mode. Results, their sizes and strides, and the out= tensors' geometry match
CPU, with empty (resized), right-sized and transposed out= tensors; bad out=
tensors raise CPU's exception at the call.
"""

import pytest
import torch

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)

A = torch.ops.aten
X = torch.tensor([[1.0, 2.0, 2.0, 5.0], [3.0, 3.0, 0.0, -1.0], [4.0, 4.0, 4.0, 1.0]])
X4 = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4).sin()
L = torch.long


def _e(d, dt=torch.float32):
    return torch.empty(0, dtype=dt, device=d)


def _t(d, rows, cols, dt=torch.float32):
    """A transposed (non-contiguous) out= tensor of shape (rows, cols)."""
    return torch.zeros(cols, rows, dtype=dt, device=d).t()


# name -> fn(dev) -> result(s); every input is created on `dev`.
CASES = {
    "mode.values": lambda d: torch.mode(X.to(d), 1, out=(_e(d), _e(d, L))),
    "mode.values_keepdim": lambda d: torch.mode(X.to(d), 0, keepdim=True, out=(_e(d), _e(d, L))),
    "mode.values_sized": lambda d: torch.mode(
        X.to(d), 1, out=(torch.zeros(3, device=d), torch.zeros(3, dtype=L, device=d))
    ),
    "mode.values_transposed": lambda d: torch.mode(X.to(d), 1, keepdim=True, out=(_t(d, 3, 1), _t(d, 3, 1, L))),
    "mode.values_int": lambda d: torch.mode(X.to(d).long(), 1, out=(_e(d, L), _e(d, L))),
    "sort.values": lambda d: torch.sort(X.to(d), 1, out=(_e(d), _e(d, L))),
    "sort.values_transposed": lambda d: torch.sort(X.to(d).t(), 0, out=(_t(d, 4, 3), _t(d, 4, 3, L))),
    "sum.out": lambda d: A.sum.out(X.to(d), out=_e(d)),
    "prod.out": lambda d: A.prod.out(X.to(d), out=_e(d)),
    "mean.dtype_out": lambda d: A.mean.dtype_out(X.to(d), dtype=torch.float64, out=_e(d, torch.float64)),
    "count_nonzero.out": lambda d: A.count_nonzero.out(X.to(d), out=_e(d, L)),
    "count_nonzero.dim_IntList_out": lambda d: A.count_nonzero.dim_IntList_out(X.to(d), [1], out=_e(d, L)),
    "norm.Scalar_out": lambda d: A.norm.Scalar_out(X.to(d), 3, out=_e(d)),
    "norm.ScalarOpt_dtype_out": lambda d: A.norm.ScalarOpt_dtype_out(
        X.to(d), 2, dtype=torch.float64, out=_e(d, torch.float64)
    ),
    "trace.out": lambda d: A.trace.out(X.to(d), out=_e(d)),
    "std_mean.correction_out": lambda d: A.std_mean.correction_out(X.to(d), [1], out0=_e(d), out1=_e(d)),
    "var_mean.correction_out": lambda d: A.var_mean.correction_out(
        X.to(d), [0], correction=0, keepdim=True, out0=_e(d), out1=_e(d)
    ),
    "_adaptive_avg_pool2d.out": lambda d: A._adaptive_avg_pool2d.out(X4.to(d), [2, 2], out=_e(d)),
    "_adaptive_avg_pool3d_backward.out": lambda d: A._adaptive_avg_pool3d_backward.out(
        torch.ones(2, 1, 2, 2, device=d), X4.to(d), out=_e(d)
    ),
    "_pdist_forward.out": lambda d: A._pdist_forward.out(X.to(d), 2.0, out=_e(d)),
    "_pdist_backward.out": lambda d: A._pdist_backward.out(
        torch.ones(3, device=d), X.to(d), 2.0, torch.cdist(X, X)[[0, 0, 1], [1, 2, 2]].to(d), out=_e(d)
    ),
    "_cdist_backward.out": lambda d: A._cdist_backward.out(
        torch.ones(3, 3, device=d), X.to(d), X.to(d) + 1, 2.0, torch.cdist(X, X + 1).to(d), out=_e(d)
    ),
    "native_layer_norm.out": lambda d: A.native_layer_norm.out(
        X4.to(d), [4], None, None, 1e-5, out0=_e(d), out1=_e(d), out2=_e(d)
    ),
    "native_layer_norm_backward.out": lambda d: A.native_layer_norm_backward.out(
        torch.ones_like(X4).to(d),
        X4.to(d),
        [4],
        X4.mean(-1, keepdim=True).to(d),
        X4.var(-1, unbiased=False, keepdim=True).add(1e-5).rsqrt().to(d),
        torch.ones(4, device=d),
        torch.zeros(4, device=d),
        [True, True, True],
        out0=_e(d),
        out1=_e(d),
        out2=_e(d),
    ),
    "native_batch_norm_backward.out": lambda d: A.native_batch_norm_backward.out(
        torch.ones_like(X4).to(d),
        X4.to(d),
        torch.ones(3, device=d),
        None,
        None,
        torch.zeros(3, device=d),
        torch.ones(3, device=d),
        True,
        1e-5,
        [True, True, True],
        out0=_e(d),
        out1=_e(d),
        out2=_e(d),
    ),
    "native_group_norm_backward.out": lambda d: A.native_group_norm_backward.out(
        torch.ones_like(X4).to(d),
        X4.to(d),
        torch.zeros(2, 3, device=d),
        torch.ones(2, 3, device=d),
        torch.ones(3, device=d),
        2,
        3,
        16,
        3,
        [True, True, True],
        out0=_e(d),
        out1=_e(d),
        out2=_e(d),
    ),
}


def _flat(r):
    if isinstance(r, torch.Tensor):
        return [r]
    return [t for e in r for t in _flat(e)]


@pytest.mark.parametrize("name", list(CASES))
def test_reduction_out_overload_matches_cpu(name):
    cpu = _flat(CASES[name]("cpu"))
    tpu = _flat(CASES[name]("tpu"))
    assert len(tpu) == len(cpu)
    for k, (c, t) in enumerate(zip(cpu, tpu)):
        assert t.device.type == "tpu"
        assert (t.shape, t.stride(), t.dtype) == (c.shape, c.stride(), c.dtype), f"result {k}"
        torch.testing.assert_close(t.cpu(), c, msg=f"result {k}")


def test_reduction_out_overloads_are_op_table_rows():
    names = {row[0] for row in torch_tpu_eager.op_table()}
    assert "mode.values" in names


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return type(e)
    return None


BAD = {
    "mode_float_indices": lambda d: torch.mode(X.to(d), 1, out=(_e(d), _e(d))),
    "mode_int32_indices": lambda d: torch.mode(X.to(d), 1, out=(_e(d), _e(d, torch.int32))),
    "mode_bad_dim": lambda d: torch.mode(X.to(d), 5, out=(_e(d), _e(d, L))),
    "mode_long_values": lambda d: torch.mode(X.to(d), 1, out=(_e(d, L), _e(d, L))),
    "mode_double_values": lambda d: torch.mode(X.to(d), 1, out=(_e(d, torch.float64), _e(d, L))),
    "sort_float_indices": lambda d: torch.sort(X.to(d), 1, out=(_e(d), _e(d))),
    "kthvalue_float_indices": lambda d: torch.kthvalue(X.to(d), 1, 1, out=(_e(d), _e(d))),
    "median_float_indices": lambda d: torch.median(X.to(d), 1, out=(_e(d), _e(d))),
    "nanmedian_float_indices": lambda d: torch.nanmedian(X.to(d), 1, out=(_e(d), _e(d))),
    "topk_float_indices": lambda d: torch.topk(X.to(d), 1, 1, out=(_e(d), _e(d))),
    "max_float_indices": lambda d: torch.max(X.to(d), 1, out=(_e(d), _e(d))),
    "cummax_float_indices": lambda d: torch.cummax(X.to(d), 1, out=(_e(d), _e(d))),
    "sum_long_out": lambda d: A.sum.out(X.to(d), out=_e(d, L)),
    "count_nonzero_float_out": lambda d: A.count_nonzero.out(X.to(d), out=_e(d)),
}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_bad_mode_out_raises_like_cpu_and_the_queue_survives(bad):
    expected = _error(lambda: bad("cpu"))
    assert expected is not None
    pending = torch.ones(3, device="tpu") + 1
    assert _error(lambda: bad("tpu")) is expected
    torch.testing.assert_close(pending.cpu(), torch.full((3,), 2.0))
    v, i = torch.mode(X.to("tpu"), 1, out=(_e("tpu"), _e("tpu", L)))
    cv, ci = torch.mode(X, 1)
    torch.testing.assert_close((v.cpu(), i.cpu()), (cv, ci))
