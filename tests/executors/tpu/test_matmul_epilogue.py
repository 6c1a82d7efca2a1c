"""Matmul + epilogue (executors/tpu, kMatmul): partition puts an MXU op (mm, addmm, bmm,
linear) and the elementwise ops over its product that the fused loop takes (bias add,
relu, gelu, scale, residual add) into one region; the TPU kernel runs the product, then
the epilogue as one fused loop reading it. The product is handed to the loop in
flush-local memory and not materialized when nothing else reads it.

The product is CPU's own GEMM over the whole operands: CPU's GEMM (MKL / oneDNN) picks
its K blocking by the number of rows, so products of row blocks differ from the whole
product in the last bit (measured on this machine: 512x1024 @ 1024x1024 in blocks of
8-128 rows), and a per-tile product would not equal CPU's. Every value here is compared
with CPU PyTorch bit for bit (fused gelu as CPU's routine: set_fused_math("cpu"))."""

import pytest
import torch
import torch.nn.functional as F

from difftest import DEVICE, aten_ops_during, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="matmul epilogues are the tpu executor's")

if DEVICE == "tpu":
    import torch_tpu_eager


@pytest.fixture(autouse=True)
def cpu_math_and_verifier():
    """Fused gelu as CPU's routine (bit-equal), and the region verifier on."""
    torch_tpu_eager._C._jit_set_verify(True)
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_("cpu")
        yield


def _run(fn, *cpu_args):
    """(result on "tpu" read back, ATen ops its flush ran on the host, regions run)."""
    args = [a.to("tpu") for a in cpu_args]
    torch.tpu.synchronize()
    before = torch_tpu_eager.metrics()
    out = fn(*args)
    ops = aten_ops_during(torch.tpu.synchronize)
    after = torch_tpu_eager.metrics()
    return out.cpu(), ops, after["regions_run"] - before["regions_run"], after, before


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


EPILOGUES = {
    "linear_relu": lambda x, w, b, r: F.relu(F.linear(x, w, b)),
    "linear_gelu_scale_residual": lambda x, w, b, r: F.gelu(F.linear(x, w, b)) * 0.5 + r,
    "linear_gelu_tanh": lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "mm_bias_relu": lambda x, w, b, r: (x @ w.t() + b).relu(),
    "mm_scale_sub": lambda x, w, b, r: (x @ w.t()) * 0.125 - r,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(EPILOGUES))
@pytest.mark.parametrize("m,k,n", [(64, 32, 48), (5, 7, 3), (130, 64, 96)])
def test_epilogue_is_one_region_and_equals_cpu(name, dtype, m, k, n):
    fn = EPILOGUES[name]
    x, w = cpu_randn(m, k, seed=1).to(dtype), cpu_randn(n, k, seed=2).to(dtype)
    b, r = cpu_randn(n, seed=3).to(dtype), cpu_randn(m, n, seed=4).to(dtype)
    got, ops, regions, _, _ = _run(fn, x, w, b, r)
    if name == "linear_gelu_tanh":
        # The fused loop's gelu(approximate='tanh') differs from CPU's by an ulp when the
        # element count is not a multiple of 64 (CPU's tail path), with or without a
        # matmul before it (also on main: F.gelu(x * 1.0, approximate="tanh"), 15 elements).
        torch.testing.assert_close(got, fn(x, w, b, r))
    else:
        _same(got, fn(x, w, b, r))
    assert regions == 1
    for op in ("aten::relu", "aten::mul", "aten::add", "aten::sub"):
        assert op not in ops, ops  # the epilogue ran in the fused loop
    # (gelu with approximate='none' calls CPU's gelu per tile under set_fused_math("cpu"))


def test_product_is_not_materialized_when_only_the_epilogue_reads_it():
    x, w, b = cpu_randn(64, 32, seed=5), cpu_randn(48, 32, seed=6), cpu_randn(48, seed=7)
    got, _, regions, after, before = _run(lambda x, w, b: F.relu(F.linear(x, w, b)) * 2.0, x, w, b)
    _same(got, F.relu(F.linear(x, w, b)) * 2.0)
    assert regions == 1
    # Only the result (64 x 48 float32) reaches device memory.
    assert after["bytes_materialized"] - before["bytes_materialized"] == 64 * 48 * 4


def test_product_also_read_elsewhere_is_materialized_and_equal():
    x, w = cpu_randn(16, 8, seed=8), cpu_randn(12, 8, seed=9)
    xd, wd = x.to("tpu"), w.to("tpu")
    p = xd @ wd.t()
    y = p.relu() + 1
    _same(y.cpu(), (x @ w.t()).relu() + 1)
    _same(p.cpu(), x @ w.t())


@pytest.mark.parametrize("transpose", [False, True])
def test_bmm_scale_epilogue_with_non_contiguous_operands(transpose):
    q, kk = cpu_randn(3, 10, 16, seed=10), cpu_randn(3, 10, 16, seed=11)

    def scores(q, k):
        kt = k.transpose(-1, -2) if transpose else k.transpose(-1, -2).contiguous()
        return (q @ kt) * 0.25 + 1.0

    got, ops, regions, _, _ = _run(scores, q, kk)
    _same(got, scores(q, kk))
    assert "aten::mul" not in ops and "aten::add" not in ops, ops


def test_an_op_the_loop_does_not_take_is_cut_out_of_the_epilogue():
    # The cast to bfloat16 is not a loop op: the relu still fuses after the product,
    # the cast runs by itself; values equal CPU's.
    x, w = cpu_randn(32, 16, seed=12), cpu_randn(24, 16, seed=13)

    def fn(x, w):
        return ((x @ w.t()).relu() * 3.0).to(torch.bfloat16)

    got, ops, _, _, _ = _run(fn, x, w)
    _same(got, fn(x, w))
    assert "aten::relu" not in ops and "aten::mul" not in ops, ops


def test_a_failing_product_fails_its_epilogue_and_the_queue_stays_valid():
    a, b = torch.randn(4, 5).to("tpu"), torch.randn(5, 3).to("tpu")
    bad = torch.randn(4, 3).to("tpu")
    torch.tpu.synchronize()
    y = (a @ b).relu() + bad
    with pytest.raises(RuntimeError):
        torch.mm(a, bad).relu().cpu()  # shapes checked at record time
    _same(y.cpu(), (a.cpu() @ b.cpu()).relu() + bad.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_on_3d_input_takes_its_epilogue_over_the_reshaped_product(dtype):
    # F.linear on [B, T, C] makes its product [B * T, N] and reads it as [B, T, N]:
    # the epilogue (residual add, relu, scale) still runs in the matmul's region.
    x, w = cpu_randn(4, 8, 16, seed=14).to(dtype), cpu_randn(24, 16, seed=15).to(dtype)
    b, r = cpu_randn(24, seed=16).to(dtype), cpu_randn(4, 8, 24, seed=17).to(dtype)

    def fn(x, w, b, r):
        return (r + F.linear(x, w, b)).relu() * 2.0

    got, ops, regions, _, _ = _run(fn, x, w, b, r)
    _same(got, fn(x, w, b, r))
    assert regions == 1
    assert "aten::relu" not in ops and "aten::add" not in ops, ops


def test_in_place_accumulate_of_a_product_stays_in_the_epilogue():
    # acc.add_(x @ w) with acc used again but the product read by nothing else: the
    # update stays the matmul's epilogue (partition defers an in-place update out of it
    # only when a later op also reads the product: an optimizer state over a gradient).
    x, w, acc = cpu_randn(16, 32, seed=1), cpu_randn(32, 24, seed=2), cpu_randn(16, 24, seed=3)
    xd, wd, ad = x.to("tpu"), w.to("tpu"), acc.to("tpu")
    torch.tpu.synchronize()
    with torch_tpu_eager.profile() as prof:
        ad.add_(xd @ wd)
        got = (ad * 2).cpu()
    names = [k["name"] for k in prof.kernels]
    assert names == ["fused_mm_add__mul"], names
    _same(got, acc.add_(x @ w) * 2)


# ---- a layer_norm closing the epilogue (partition.cpp, epilogue_layer_norm)

LN_AFFINE = [(True, True), (True, False), (False, True), (False, False)]
LN_AFFINE_IDS = ["weight+bias", "weight", "bias", "neither"]


def _residual_layer_norm(x, w, b, r, g, beta, cols):
    """A pre-LN transformer's out-projection: the residual add, then the next layer_norm of that residual."""
    h = r + F.linear(x, w, b)
    out, mean, rstd = torch.native_layer_norm(h, (cols,), g, beta, 1e-5)
    return h, out, mean, rstd


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("affine", LN_AFFINE, ids=LN_AFFINE_IDS)
@pytest.mark.parametrize("shape", [(8, 64, 64, 64), (3, 5, 24, 40), (1, 300, 17, 100), (2, 700, 16, 1024)])
def test_residual_add_and_layer_norm_run_in_the_matmul_epilogue(shape, affine, threads):
    # On main the layer_norm ran in a region of its own through CPU's kernel; here the
    # epilogue loop normalizes each block of rows right after the residual add. Every
    # output (the residual, out, mean, rstd) is CPU's bit for bit, at 1 and 2 threads.
    bsz, t, k, n = shape
    x, w, b = cpu_randn(bsz, t, k, seed=61), cpu_randn(n, k, seed=62), cpu_randn(n, seed=63)
    r = cpu_randn(bsz, t, n, seed=64) * 3 + 1
    g = cpu_randn(n, seed=65) if affine[0] else None
    beta = cpu_randn(n, seed=66) if affine[1] else None
    for set_ in restoring(torch.get_num_threads, torch.set_num_threads):
        set_(threads)
        want = _residual_layer_norm(x, w, b, r, g, beta, n)
        dev = [None if a is None else a.to("tpu") for a in (x, w, b, r, g, beta)]
        torch.tpu.synchronize()
        with torch_tpu_eager.profile() as prof:
            got = _residual_layer_norm(*dev, n)
            ops = aten_ops_during(torch.tpu.synchronize)
        names = [k["name"] for k in prof.kernels]
        assert names == ["fused_addmm_add_native_layer_norm"], names
        assert "aten::native_layer_norm" not in ops and "aten::add" not in ops, ops
        for name, gv, wv in zip(("residual", "out", "mean", "rstd"), got, want):
            assert torch.equal(gv.cpu(), wv), name


def test_layer_norm_of_the_product_itself_after_an_epilogue_op():
    # The layer_norm reads the product, not the epilogue's last value: still one region.
    x, w, b = cpu_randn(40, 16, seed=67), cpu_randn(32, 16, seed=68), cpu_randn(32, seed=69)
    g, beta = cpu_randn(32, seed=70), cpu_randn(32, seed=71)

    def fn(x, w, b, g, beta):
        p = F.linear(x, w, b)
        return p.relu() * 2.0, F.layer_norm(p, (32,), g, beta)

    dev = [a.to("tpu") for a in (x, w, b, g, beta)]
    with torch_tpu_eager.profile() as prof:
        got = [t.cpu() for t in fn(*dev)]
    assert [k["name"] for k in prof.kernels] == ["fused_addmm_relu_mul_native_layer_norm"]
    for gv, wv in zip(got, fn(x, w, b, g, beta)):
        _same(gv, wv)


def test_a_bare_product_keeps_its_layer_norm_apart_and_consumers_start_a_region():
    # Without an epilogue the layer_norm of a product stays CPU's kernel (alone in its
    # region, as on main); an op after the layer_norm starts the next region.
    x, w, g = cpu_randn(24, 16, seed=72), cpu_randn(32, 16, seed=73), cpu_randn(32, seed=74)

    def fn(x, w, g, r):
        y = F.layer_norm(x @ w.t(), (32,), g)
        z = F.layer_norm(x @ w.t() + r, (32,), g) * 3.0
        return y, z

    r = cpu_randn(24, 32, seed=75)
    dev = [a.to("tpu") for a in (x, w, g, r)]
    with torch_tpu_eager.profile() as prof:
        got = [t.cpu() for t in fn(*dev)]
    names = [k["name"] for k in prof.kernels]
    assert names == ["kernel_mm", "kernel_native_layer_norm", "fused_mm_add_native_layer_norm", "kernel_mul"], names
    for gv, wv in zip(got, fn(x, w, g, r)):
        _same(gv, wv)


def test_gradients_through_the_fused_residual_layer_norm_match_cpu():
    # The backward reads the mean / rstd the epilogue loop wrote.
    x, w, b = cpu_randn(4, 16, 24, seed=76), cpu_randn(32, 24, seed=77), cpu_randn(32, seed=78)
    r, g, beta, dy = (
        cpu_randn(4, 16, 32, seed=79),
        cpu_randn(32, seed=80),
        cpu_randn(32, seed=81),
        cpu_randn(4, 16, 32, seed=82),
    )

    def prog(dev):
        leaves = [t.to(dev).requires_grad_() for t in (x, w, b, r, g, beta)]
        xs, ws, bs, rs, gs, betas = leaves
        y = F.layer_norm(rs + F.linear(xs, ws, bs), (32,), gs, betas)
        y.backward(dy.to(dev))
        return [y.detach()] + [t.grad for t in leaves]

    for got, want in zip(prog("tpu"), prog("cpu")):
        assert torch.equal(got.cpu(), want)


def test_bfloat16_residual_layer_norm_stays_cpu_equal():
    # 16-bit layer_norm is not a loop row op: it runs through CPU's kernel, values CPU's.
    x, w, r = cpu_randn(16, 8, seed=83), cpu_randn(24, 8, seed=84), cpu_randn(16, 24, seed=85)
    x, w, r = (t.to(torch.bfloat16) for t in (x, w, r))

    def fn(x, w, r):
        return F.layer_norm(x @ w.t() + r, (24,))

    got, _, _, _, _ = _run(fn, x, w, r)
    _same(got, fn(x, w, r))
