"""JAX / Pallas kernels on "tpu" (torch_tpu_eager.pallas): recorded at the call,
run at flush in Pallas's interpret mode, costed from the grid and BlockSpecs.
Every result is compared with the PyTorch computation on CPU."""

import pytest
import torch

jax = pytest.importorskip("jax", reason="JAX is the optional extra 'pallas' (pip install -e '.[pallas]')")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import torch_tpu_eager  # noqa: E402
from torch_tpu_eager.pallas import VmemExhaustedError, jax_op  # noqa: E402


@pytest.fixture
def tpu_target():
    """Tests of the TPU cost model (tiling records, VMEM) run on a TPU target."""
    before = torch_tpu_eager.get_target()
    if not before.startswith("tpu"):
        torch_tpu_eager.set_target("tpu-v5e")
    yield
    torch_tpu_eager.set_target(before)


def _add_op(m, n, bm):
    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...] * 2

    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return jax_op(
        add_kernel, jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(m // bm,), in_specs=[spec, spec], out_specs=spec
    )


def _softmax_op(m, n, bm):
    def softmax_kernel(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return jax_op(
        softmax_kernel,
        jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // bm,),
        in_specs=[spec],
        out_specs=spec,
        name="fused_softmax",
    )


def _matmul_op(m, k, n, b):
    def matmul_kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    return jax_op(
        matmul_kernel,
        jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // b, n // b, k // b),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, kk: (i, kk)), pl.BlockSpec((b, b), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, kk: (i, j)),
        flops=2 * m * n * k,
        mxu=True,
        name="tiled_matmul",
    )


def test_elementwise_kernel_recorded_and_equal_to_torch():
    x, y = torch.randn(64, 128), torch.randn(64, 128)
    op = _add_op(64, 128, 16)
    torch_tpu_eager.synchronize()
    before = torch_tpu_eager.metrics()["flushes"]
    z = op(x.to("tpu"), y.to("tpu"))
    assert z.device.type == "tpu" and z.shape == (64, 128) and z.dtype == torch.float32
    assert torch_tpu_eager.metrics()["flushes"] == before  # recorded, not run
    torch.testing.assert_close(z.cpu(), x + y * 2)
    torch.testing.assert_close(op(x, y), x + y * 2)  # CPU tensors run at once


def test_fused_softmax_equal_to_torch_and_profiled(tpu_target):
    x = torch.randn(32, 256)
    op = _softmax_op(32, 256, 8)
    xt = x.to("tpu")
    with torch_tpu_eager.profile() as prof:
        out = op(xt * 1.0).cpu()
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    k = next(k for k in prof.kernels if "fused_softmax" in k["name"])
    assert k["sim_time_s"] > 0 and k["tiling"]["kind"] == "pallas" and k["tiling"]["grid"] == [4]
    assert k["tiling"]["vmem_bytes"] == 2 * 2 * 8 * 256 * 4  # in + out blocks, two buffers each


def test_tiled_matmul_equal_to_torch_and_costs_refetched_blocks(tpu_target):
    m = k = n = 256
    b = 128
    x, y = torch.randn(m, k), torch.randn(k, n)
    op = _matmul_op(m, k, n, b)
    with torch_tpu_eager.profile() as prof:
        out = op(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(out, x @ y, rtol=1e-4, atol=1e-4)
    rec = next(r for r in prof.kernels if "tiled_matmul" in r["name"])
    assert rec["flops"] == 2 * m * n * k
    # grid (2, 2, 2), k fastest: x's block changes at every step (8 fetches), y's too (8),
    # the output's block once per (i, j) (4): 20 blocks of 64 KiB; the tensors once are 3 * 256 KiB.
    assert rec["tiling"]["hbm_reread_bytes"] == 20 * b * b * 4 - 3 * m * n * 4


def test_blocks_that_do_not_fit_vmem_raise_at_the_call():
    before = torch_tpu_eager.get_target()
    torch_tpu_eager.set_target("tpu-v4")  # 16 MiB of VMEM per core
    try:
        op = _add_op(1024, 2048, 1024)  # 3 operands x 2 buffers x 8 MiB blocks
        x = torch.zeros(1024, 2048, device="tpu")
        torch_tpu_eager.synchronize()
        recorded = torch_tpu_eager.metrics()["ops_recorded"]
        with pytest.raises(VmemExhaustedError, match=r"RESOURCE_EXHAUSTED.*vmem.*input 0: block \(1024, 2048\)"):
            op(x, x)
        assert torch_tpu_eager.metrics()["ops_recorded"] == recorded  # nothing recorded, nothing ran
        small = _add_op(1024, 2048, 128)
        torch.testing.assert_close(small(x, x).cpu(), torch.zeros(1024, 2048))
    finally:
        torch_tpu_eager.set_target(before)


def test_plain_jax_function():
    def f(x, y):
        return jnp.tanh(x) @ y, jnp.sum(x, axis=0)

    op = jax_op(f, (jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((32,), jnp.float32)))
    x, y = torch.randn(16, 32), torch.randn(32, 8)
    with torch_tpu_eager.profile() as prof:
        a, s = op(x.to("tpu"), y.to("tpu"))
        a, s = a.cpu(), s.cpu()
    torch.testing.assert_close(a, torch.tanh(x) @ y, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s, x.sum(0), rtol=1e-5, atol=1e-5)
    rec = next(r for r in prof.kernels if r["name"].startswith("tpu_jax::f_"))
    assert rec["flops"] > 0


def test_strided_input_is_copied_contiguous():
    x, y = torch.randn(128, 64), torch.randn(64, 128)
    op = _add_op(64, 128, 32)
    torch.testing.assert_close(op(x.to("tpu").t(), y.to("tpu")).cpu(), x.t() + y * 2)


def test_wrong_number_of_inputs_raises_at_the_call():
    op = _add_op(64, 128, 16)
    x = torch.randn(64, 128, device="tpu")
    with pytest.raises(TypeError, match="2 inputs"):
        op(x)
    torch.testing.assert_close(op(x, x).cpu(), x.cpu() * 3)


def test_kernel_that_does_not_trace_raises_at_the_call():
    def bad_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(3, -1)  # a shape error, found when the kernel is traced

    op = jax_op(bad_kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), pallas=True)
    good = torch.ones(4, device="tpu") + 1
    with pytest.raises((ValueError, TypeError), match="bad_kernel"):
        op(torch.randn(8, 128, device="tpu"))
    torch.testing.assert_close(good.cpu(), torch.full((4,), 2.0))


def test_input_not_matching_its_blockspec_raises_at_the_call_naming_the_block():
    op = _softmax_op(32, 256, 8)
    flat = torch.randn(32 * 256, device="tpu")
    short = torch.randn(16, 256, device="tpu")
    half = torch.randn(32, 256, device="tpu", dtype=torch.float16)
    wide = torch.randn(32, 256, device="tpu", dtype=torch.float64)
    torch_tpu_eager.synchronize()
    recorded = torch_tpu_eager.metrics()["ops_recorded"]
    # rank differs from the block's
    with pytest.raises(
        ValueError, match=r"input 0 of shape \(8192,\) float32 does not match its BlockSpec: block \(8, 256\)"
    ):
        op(flat)
    # grid (4,) x 8 rows: block 2 starts at row 16, outside a 16-row input
    with pytest.raises(ValueError, match=r"input 0 of shape \(16, 256\).*grid point \(2,\).*starts at 16"):
        op(short)
    # a dtype the kernel cannot store into its float32 output block
    with pytest.raises(ValueError, match="fused_softmax.*float16"):
        op(half)
    # float64 without jax_enable_x64
    with pytest.raises(TypeError, match="jax_enable_x64"):
        op(wide)
    assert torch_tpu_eager.metrics()["ops_recorded"] == recorded  # nothing recorded
    x = torch.randn(32, 256)
    torch.testing.assert_close(op(x.to("tpu")).cpu(), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_block_not_tileable_on_tpu_raises_at_the_call(tpu_target):
    def copy_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((8, 100), lambda i: (0, i))  # 100 lanes: not a multiple of 128, not the array's 200
    op = jax_op(copy_kernel, jax.ShapeDtypeStruct((8, 200), jnp.float32), grid=(2,), in_specs=[spec], out_specs=spec)
    with pytest.raises(ValueError, match=r"input 0.*block \(8, 100\).*multiple of 128"):
        op(torch.randn(8, 200, device="tpu"))


def test_plain_jax_function_whose_result_differs_from_out_shape_raises_at_the_call():
    op = jax_op(lambda x: x.sum(0), jax.ShapeDtypeStruct((4,), jnp.float32), name="colsum")
    with pytest.raises(ValueError, match=r"colsum.*returns \[\(\(5,\), torch.float32\)\] where out_shape"):
        op(torch.randn(3, 5, device="tpu"))


def test_autograd_of_plain_jax_function_through_vjp():
    def f(x, y):
        return jnp.tanh(x) @ y, jnp.sum(x * x, axis=0)

    op = jax_op(f, (jax.ShapeDtypeStruct((6, 3), jnp.float32), jax.ShapeDtypeStruct((5,), jnp.float32)))
    xc, yc = torch.randn(6, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    xt = xc.detach().to("tpu").requires_grad_()
    yt = yc.detach().to("tpu").requires_grad_()
    a, s = torch.tanh(xc) @ yc, (xc * xc).sum(0)
    ((a**2).sum() + (s * torch.arange(5.0)).sum()).backward()
    at, st = op(xt, yt)
    with torch_tpu_eager.profile() as prof:
        ((at**2).sum() + (st * torch.arange(5.0, device="tpu")).sum()).backward()
        gx, gy = xt.grad.cpu(), yt.grad.cpu()
    torch.testing.assert_close(gx, xc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gy, yc.grad, rtol=1e-4, atol=1e-5)
    assert any(k["name"].startswith("tpu_jax::f_vjp") for k in prof.kernels)  # the backward is recorded too


def test_autograd_of_pallas_kernel_with_a_given_backward():
    op = _softmax_op(32, 256, 8)
    bwd_spec = pl.BlockSpec((8, 256), lambda i: (i, 0))

    def softmax_bwd_kernel(y_ref, g_ref, o_ref):
        y, g = y_ref[...], g_ref[...]
        o_ref[...] = y * (g - jnp.sum(g * y, axis=-1, keepdims=True))

    bwd = jax_op(
        softmax_bwd_kernel,
        jax.ShapeDtypeStruct((32, 256), jnp.float32),
        grid=(4,),
        in_specs=[bwd_spec, bwd_spec],
        out_specs=bwd_spec,
    )

    @op.register_backward
    def _(inputs, outputs, grads):
        return (bwd(outputs[0], grads[0]),)

    xc = torch.randn(32, 256, requires_grad=True)
    w = torch.randn(32, 256)
    (torch.softmax(xc, -1) * w).sum().backward()
    xt = xc.detach().to("tpu").requires_grad_()
    (op(xt) * w.to("tpu")).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    xcpu = xc.detach().clone().requires_grad_()  # CPU tensors: the same autograd
    (op(xcpu) * w).sum().backward()
    torch.testing.assert_close(xcpu.grad, xc.grad, rtol=1e-5, atol=1e-6)


def test_pallas_kernel_without_backward_raises_at_backward():
    op = _add_op(64, 128, 16)
    x = torch.randn(64, 128, device="tpu", requires_grad=True)
    out = op(x, x)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="no backward for this Pallas kernel"):
        out.sum().backward()


def test_jax_op_under_torch_compile():
    op = _softmax_op(32, 256, 8)

    def f(x):
        return op(x * 2) + 1

    x = torch.randn(32, 256)
    got = torch.compile(f, fullgraph=True)(x.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.softmax(x * 2, -1) + 1, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match=r"input 0 of shape \(16, 256\).*grid point"):
        torch.compile(f, fullgraph=True)(torch.randn(16, 256, device="tpu"))  # checked at trace time
