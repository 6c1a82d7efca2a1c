"""RMSNorm and per-row sums as one fused region (csrc/jit/partition.cpp, row-value rule;
csrc/executors/tpu/fused_elementwise.cpp, per_row_sum): ``mean(x ** 2, -1, keepdim=True)``
ends its loop, the per-row ``+ eps`` and ``rsqrt`` run in a loop over the rows, and
``x * rstd * weight`` in a loop over the elements reading rstd broadcast along each row.
Values are compared with CPU PyTorch bit for bit (CPU's sum order is followed; the other
steps are single IEEE operations); region counts are asserted where they are the point."""

import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager


def rms_norm(x, w, eps=1e-6):
    """The RMSNorm of transformers' LlamaRMSNorm (float32)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def _kernels(fn, *dev):
    """fn on device tensors, read to the host, and the kernels (regions) that ran."""
    torch.tpu.synchronize()
    with torch_tpu_eager.profile() as prof:
        out = fn(*dev)
        out = tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()
    return out, [k["name"] for k in prof.kernels]


SHAPES = [(1, 1), (2, 16, 64), (3, 5, 37), (7, 8), (4, 1024), (3, 2, 2000)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_forward_is_one_region_and_bit_equal(shape):
    x, w = cpu_randn(*shape, seed=1), cpu_randn(shape[-1], seed=2)
    out, kernels = _kernels(rms_norm, x.to("tpu"), w.to("tpu"))
    assert torch.equal(out, rms_norm(x, w))
    if shape[-1] > 1:  # a one-column row: the rstd "broadcast" is no broadcast
        assert kernels == ["fused_pow_mean_add_rsqrt_mul_mul"], kernels


@pytest.mark.parametrize("shape", [(2, 16, 64), (3, 5, 37)], ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_backward_is_bit_equal(shape):
    x, w, g = cpu_randn(*shape, seed=1), cpu_randn(shape[-1], seed=2), cpu_randn(*shape, seed=3)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    rms_norm(xc, wc).backward(g)
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    rms_norm(xt, wt).backward(g.to("tpu"))
    assert torch.equal(xt.grad.cpu(), xc.grad)
    assert torch.equal(wt.grad.cpu(), wc.grad)


def test_rstd_saved_for_backward_is_materialized():
    # rsqrt's value is read after the region (here: returned): stored, and equal.
    def fn(x, w):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return w * (x * r), r

    x, w = cpu_randn(6, 40, seed=4), cpu_randn(40, seed=5)
    (y, r), kernels = _kernels(fn, x.to("tpu"), w.to("tpu"))
    ey, er = fn(x, w)
    assert torch.equal(y, ey) and torch.equal(r, er)
    assert len(kernels) == 1, kernels


CASES = {
    "sum": lambda x: (x * 2).sum(-1),
    "sum_keepdim": lambda x: (x - 1).sum(-1, keepdim=True),
    "mean": lambda x: (x * 3 + 1).mean(-1),
    "mean_dim_minus": lambda x: (x * x).mean(dim=[-1], keepdim=True) + 1,
    "sum_then_scale_rows": lambda x: x / x.abs().sum(-1, keepdim=True),
    "sum_then_row_consumers": lambda x: torch.rsqrt(x.pow(2).sum(-1, keepdim=True)) * 3,
}


@pytest.mark.parametrize(
    "shape", [(1, 1), (3, 17), (64, 1000), (5, 7, 33), (2, 9)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("case", CASES)
def test_row_sums_with_producers_and_consumers_match_cpu(case, shape):
    fn = CASES[case]
    x = cpu_randn(*shape, seed=6)
    out, kernels = _kernels(fn, x.to("tpu"))
    assert torch.equal(out, fn(x))
    assert len(kernels) == 1, kernels
    assert not any(k.startswith("kernel_") for k in kernels), kernels


def test_rows_with_nan_and_inf_match_cpu():
    x = cpu_randn(4, 19, seed=7)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2, 5], x[2, 6] = float("inf"), float("-inf")
    w = cpu_randn(19, seed=8)
    out, _ = _kernels(rms_norm, x.to("tpu"), w.to("tpu"))
    assert torch.equal(out.isnan(), rms_norm(x, w).isnan())
    ok = ~out.isnan()
    assert torch.equal(out[ok], rms_norm(x, w)[ok])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(0, keepdim=True) * 2,  # not the last dim
        lambda x: x.double().mean(-1) * 2,  # float64
        lambda x: x.sum(-1, dtype=torch.float64) + 1,  # a dtype argument
        lambda x: x.sum([0, 1]) * 2,  # two dims
        lambda x: x.t().sum(-1) * 2,  # a strided input
    ],
    ids=["dim0", "float64", "dtype", "two_dims", "strided"],
)
def test_sums_the_row_loop_does_not_take_still_match_cpu(fn):
    x = cpu_randn(6, 10, seed=9)
    out, _ = _kernels(fn, x.to("tpu"))
    assert torch.equal(out, fn(x))


def test_one_long_row_runs_through_cpu_kernel_and_matches():
    # CPU's sum splits one row of >= 32,768 floats between threads: not fused.
    x = cpu_randn(40000, seed=10)
    out, _ = _kernels(lambda t: (t * 2).sum(-1, keepdim=True) + 1, x.to("tpu"))
    assert torch.equal(out, (x * 2).sum(-1, keepdim=True) + 1)


def test_rms_norm_module_regions_in_a_step_fall():
    # Two stacked RMSNorms with a linear between: the norms take one region each.
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32, bias=False)
    w1, w2 = cpu_randn(32, seed=11), cpu_randn(32, seed=12)
    x = cpu_randn(4, 8, 32, seed=13)

    def fn(x, w1, w2, weight):
        h = rms_norm(x, w1)
        return rms_norm(torch.nn.functional.linear(h, weight) + x, w2)

    out, kernels = _kernels(fn, x.to("tpu"), w1.to("tpu"), w2.to("tpu"), lin.weight.detach().to("tpu"))
    torch.set_float32_matmul_precision("highest")
    assert torch.allclose(out, fn(x, w1, w2, lin.weight.detach()), rtol=1e-5, atol=1e-5)
    assert sum("mean" in k for k in kernels) == 2 and len(kernels) <= 3, kernels


def test_rms_norm_backward_regions():
    # The backward: the row sum of gy * x, rstd ** 3, the mean gradient expanded along
    # each row, x ** 1 and the sums of the input gradient run in one region; the weight
    # gradient's column sum (over the leading dims) runs op by op beside it.
    x, w, g = cpu_randn(2, 16, 64, seed=1), cpu_randn(64, seed=2), cpu_randn(2, 16, 64, seed=3)
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    y = rms_norm(xt, wt)
    torch.tpu.synchronize()

    def backward(gd):
        y.backward(gd)
        return xt.grad, wt.grad

    (gx, gw), kernels = _kernels(backward, g.to("tpu"))
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    rms_norm(xc, wc).backward(g)
    assert torch.equal(gx, xc.grad) and torch.equal(gw, wc.grad)
    assert len(kernels) == 2, kernels
    assert any("sum_pow" in k for k in kernels), kernels


@pytest.mark.parametrize("shape", [(3, 17), (2, 4, 9), (5, 1, 33)], ids=lambda s: "x".join(map(str, s)))
def test_expanded_row_value_is_read_as_a_row_broadcast(shape):
    # expand(v[..., :1]) along the row (stride 0 in the last dim) is a loop operand.
    def fn(x, v):
        r = v.sum(-1, keepdim=True) * 0.5
        return x / r.expand(x.shape) + 1, r

    x, v = cpu_randn(*shape, seed=14), cpu_randn(*shape, seed=15)
    (out, r), kernels = _kernels(fn, x.to("tpu"), v.to("tpu"))
    eo, er = fn(x, v)
    assert torch.equal(out, eo) and torch.equal(r, er)
    assert len(kernels) == 1, kernels


def test_pow_by_one_is_a_copy_in_the_loop():
    x = cpu_randn(7, 13, seed=16)
    x[0, 0], x[1, 1], x[2, 2] = float("inf"), -0.0, float("nan")

    def fn(t):
        return t.pow(1) * 2 + t.pow(1.0)

    out, kernels = _kernels(fn, x.to("tpu"))
    expected = fn(x)
    assert torch.equal(out.isnan(), expected.isnan())
    ok = ~expected.isnan()
    assert torch.equal(out[ok], expected[ok]) and torch.equal(out[ok].signbit(), expected[ok].signbit())
    assert len(kernels) == 1 and kernels[0].startswith("fused_"), kernels


def test_rms_norm_is_independent_of_the_thread_split():
    # Rows are split between intra-op threads in whole rows: each row's sum order is CPU's.
    x, w = cpu_randn(4096, 64, seed=17), cpu_randn(64, seed=18)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two, _ = _kernels(rms_norm, x.to("tpu"), w.to("tpu"))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(two, rms_norm(x, w))
