"""Divergences from CPU PyTorch found in a QA pass; each test asserts CPU's behaviour.

Open bugs are xfail(strict=True): a fix turns one into an XPASS failure, so whoever
fixes the bug removes the marker. Tests without a marker are bugs already fixed.
"""

import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


# Fixed in record.cpp correct_meta_outcome: sort's meta kernel restrided a same-shaped out=.
@pytest.mark.parametrize("stable", [False, True])
def test_sort_into_transposed_out_matches_cpu(stable):
    x = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    got = {}
    for dev in ("cpu", "tpu"):
        v = torch.zeros(3, 2, device=dev)
        i = torch.zeros(3, 2, dtype=torch.long, device=dev)
        r = torch.sort(x.to(dev), stable=stable, dim=1, out=(v.t(), i.t()))
        got[dev] = (r[0].stride(), v.cpu(), i.cpu())
    assert got["tpu"][0] == got["cpu"][0]
    torch.testing.assert_close(got["tpu"][1], got["cpu"][1])
    torch.testing.assert_close(got["tpu"][2], got["cpu"][2])


def test_msort_into_strided_out_matches_cpu():
    x = torch.tensor([3.0, 1.0, 2.0, 0.0])
    got = {}
    for dev in ("cpu", "tpu"):
        buf = torch.full((8,), -1.0, device=dev)
        r = torch.msort(x.to(dev), out=buf[::2])
        got[dev] = (r.stride(), buf.cpu())
    assert got["tpu"][0] == got["cpu"][0]
    torch.testing.assert_close(got["tpu"][1], got["cpu"][1])


# conv2d on a channels_last input returning NCHW strides: fixed in ops/memory_format.cpp and
# torch_tpu_eager/meta_hints.py; its tests are in tests/test_channels_last.py.


# Fixed in record.cpp correct_meta_outcome (masked gradients are undefined, as on CPU).
def test_batch_norm_weight_grad_when_input_needs_no_grad():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 4, 4)
    w0 = torch.randn(3)
    grads = {}
    for dev in ("cpu", "tpu"):
        w = w0.clone().to(dev).requires_grad_()
        out = F.batch_norm(img.to(dev), None, None, w, None, training=True)
        (out.sin()).sum().backward()
        grads[dev] = w.grad.cpu()
    torch.testing.assert_close(grads["tpu"], grads["cpu"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.BatchNorm2d(3),
        lambda: torch.nn.BatchNorm2d(3).eval(),
        lambda: torch.nn.InstanceNorm2d(3, affine=True),
    ],
    ids=["batch_norm_train", "batch_norm_eval", "instance_norm_affine"],
)
def test_norm_module_parameter_grads_when_input_needs_no_grad(make):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    grads = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(1)
        m = make().to(dev)
        m(x.to(dev)).sin().sum().backward()
        grads[dev] = [p.grad.cpu() for p in m.parameters()]
    for g_tpu, g_cpu in zip(grads["tpu"], grads["cpu"]):
        torch.testing.assert_close(g_tpu, g_cpu)


def test_native_batch_norm_backward_masked_grad_input_is_none():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 4, 4)
    w = torch.randn(3)
    res = {}
    for dev in ("cpu", "tpu"):
        x, wd = img.to(dev), w.to(dev)
        _, mean, invstd = torch.native_batch_norm(x, wd, None, None, None, True, 0.1, 1e-5)
        r = torch.ops.aten.native_batch_norm_backward(
            torch.ones_like(x), x, wd, None, None, mean, invstd, True, 1e-5, [False, True, False]
        )
        res[dev] = r
    assert (res["tpu"][0] is None) == (res["cpu"][0] is None)
    torch.testing.assert_close(res["tpu"][1].cpu(), res["cpu"][1])


def _raises_at_call(fn):
    """True when fn() raises before any value is read back (CPU raises at the call)."""
    try:
        fn()
    except RuntimeError:
        return True
    return False


# Fixed in record.cpp key_ivalue: float Scalars keyed by type also key their sign and
# finiteness (value_class), which is what meta kernels check.
def test_renorm_negative_maxnorm_raises_at_call_after_a_cached_call():
    def call(dev, maxnorm):
        return torch.renorm(torch.ones(3, 3, device=dev), 2, 0, maxnorm)

    assert _raises_at_call(lambda: call("cpu", -1.0))
    call("tpu", 1.0).cpu()  # fills the meta cache for (renorm, float Scalar)
    assert _raises_at_call(lambda: call("tpu", -1.0))


def test_softshrink_negative_lambda_raises_at_call_after_a_cached_call():
    def call(dev, lambd):
        return F.softshrink(torch.ones(3, device=dev), lambd)

    assert _raises_at_call(lambda: call("cpu", -0.5))
    call("tpu", 0.5).cpu()
    assert _raises_at_call(lambda: call("tpu", -0.5))


def test_vector_norm_negative_ord_on_empty_raises_at_call_after_a_cached_call():
    def call(dev, ord):
        return torch.linalg.vector_norm(torch.ones(0, device=dev), ord)

    assert _raises_at_call(lambda: call("cpu", -1.0))
    call("tpu", 2.0).cpu()
    assert _raises_at_call(lambda: call("tpu", -1.0))


# Fixed in region_runner.cpp run_ops: CPU kernels' plain std::runtime_error (Scalar
# overflow in fill_/full/masked_fill) now also names the op and its Python line.
def test_overflow_error_at_flush_names_the_recording_line():
    # A fill value held in a device tensor is known only at the flush (a Python
    # Scalar is checked at the call: tests/test_scalar_overflow.py).
    value = torch.tensor(300, device="tpu")
    mask = torch.ones(3, dtype=torch.bool, device="tpu")
    line = sys._getframe().f_lineno + 1
    t = torch.zeros(3, dtype=torch.int8, device="tpu").masked_fill(mask, value)  # the line the error must name
    with pytest.raises(RuntimeError, match="without overflow") as info:
        t.cpu()
    assert f"{__file__}:{line}" in str(info.value)


# Fixed in record.cpp cpu_checks_at_call_time: sub/rsub with a bool operand runs CPU's check at the call.
def test_sub_with_a_bool_operand_raises_at_call():
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool), True))
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool, device="tpu"), True))
    assert _raises_at_call(lambda: torch.ones(3, dtype=torch.bool, device="tpu").sub_(True))
    assert _raises_at_call(lambda: torch.rsub(torch.ones(3, dtype=torch.bool, device="tpu"), True))
    # CPU also rejects a bool on either side with a non-bool tensor.
    assert _raises_at_call(lambda: torch.sub(torch.arange(3), True))
    assert _raises_at_call(lambda: torch.sub(torch.arange(3, device="tpu"), True))
    assert _raises_at_call(lambda: torch.sub(torch.ones(3, dtype=torch.bool, device="tpu"), 1))
    # Without a bool the op still records and matches CPU.
    torch.testing.assert_close(torch.sub(torch.arange(3, device="tpu"), 1).cpu(), torch.sub(torch.arange(3), 1))


def test_spyre_job_plan_has_no_h2d_for_values_the_flush_creates(spyre_target):
    from torch_tpu_eager import spyre

    # Every value of this flush is created on the device (zero_, then add):
    # docs/spyre.md: H2D only for "a value the flush has not written".
    (torch.zeros(64, 32, device="tpu") + 1).cpu()
    steps = spyre.job_plan()["steps"]
    assert [s for s in steps if s["kind"] == "H2D"] == []


# Fixed in ops/scalar_checks.cpp (checked at record time); sweep: tests/test_scalar_overflow.py.
def test_full_with_overflowing_fill_value_raises_at_call():
    assert _raises_at_call(lambda: torch.full((3,), 300, dtype=torch.int8))
    assert _raises_at_call(lambda: torch.full((3,), 300, dtype=torch.int8, device="tpu"))


# Fixed by an op-table row (tools/gen_op_table.py composite_reduction_out); sweep: tests/test_out_overloads.py.
def test_mode_with_out_matches_cpu():
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 0.0]])
    res = {}
    for dev in ("cpu", "tpu"):
        v = torch.empty(2, device=dev)
        i = torch.empty(2, dtype=torch.long, device=dev)
        torch.mode(x.to(dev), 1, out=(v, i))
        res[dev] = (v.cpu(), i.cpu())
    torch.testing.assert_close(res["tpu"][0], res["cpu"][0])
    torch.testing.assert_close(res["tpu"][1], res["cpu"][1])


# Fixed in ops/scalar_checks.cpp (float16/bfloat16/float32 rows); sweep: tests/test_scalar_overflow_float.py.
@pytest.mark.parametrize(
    "op",
    [
        lambda d: torch.full((3,), 1e6, dtype=torch.half, device=d),
        lambda d: torch.clamp(torch.zeros(3, dtype=torch.half, device=d), min=1e6),
    ],
    ids=["full", "clamp"],
)
def test_float16_overflowing_scalar_raises_at_call(op):
    assert _raises_at_call(lambda: op("cpu"))
    assert _raises_at_call(lambda: op("tpu"))


@pytest.mark.xfail(
    strict=True,
    reason="a dtype a CPU kernel does not implement (hardshrink on int8) raises at the "
    "call on CPU (its AT_DISPATCH); the meta kernel accepts it, so on tpu the "
    "NotImplementedError surfaces at the flush",
)
def test_unsupported_dtype_raises_at_call():
    def call(dev):
        return F.hardshrink(torch.zeros(3, dtype=torch.int8, device=dev), 0.5)

    with pytest.raises(NotImplementedError):
        call("cpu")
    with pytest.raises(NotImplementedError):
        call("tpu")


# Fixed in record.cpp: the snapshot of a CPU scalar argument (clone) dropped its
# wrapped-number flag, so the op-by-op CPU kernel promoted x * 0.1 to float64 and
# rounded differently; the meta cache keyed a wrapped number like a 0-dim tensor, so
# t * 0.01 and t * tensor(0.01, float64) shared one result dtype.
def test_python_scalar_operand_rounds_and_promotes_as_cpu():
    x = torch.arange(1000, dtype=torch.int32)
    assert torch.equal((x.to("tpu") * 0.1).cpu(), x * 0.1)
    c = torch.tensor(0.9999992847442627)
    s = c.to("tpu")
    s.mul_(0.01)
    assert torch.equal(s.cpu(), c * 0.01)
    t = c.to("tpu")
    for other in (torch.tensor(0.01, dtype=torch.float64), 0.01, torch.tensor(0.01, dtype=torch.float64)):
        got, want = t * other, c * other
        assert got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)


def test_foreach_asgd_matches_cpu():
    # ASGD's eta is computed by 0-dim device ops with Python scalars (the case above).
    p = [torch.nn.Parameter(torch.randn(64, generator=torch.Generator().manual_seed(0)))]
    q = [torch.nn.Parameter(p[0].detach().to("tpu"))]
    opt_cpu = torch.optim.ASGD(p, lr=1e-2, foreach=True)
    opt_tpu = torch.optim.ASGD(q, lr=1e-2, foreach=True)
    for step in range(3):
        g = torch.randn(64, generator=torch.Generator().manual_seed(step + 1))
        p[0].grad, q[0].grad = g, g.to("tpu")
        opt_cpu.step()
        opt_tpu.step()
    assert torch.equal(q[0].detach().cpu(), p[0].detach())


# Fixed in fused_elementwise.cpp: a fused loop took a bool alpha on a float add as 1,
# where CPU raises; the op now runs op by op and raises CPU's error (at the flush).
@pytest.mark.parametrize("form", ["in_place", "functional"])
def test_bool_alpha_on_float_add_raises_in_a_fused_region(form):
    a, b = torch.randn(40), torch.randn(40)
    with pytest.raises(RuntimeError, match="Boolean alpha") as cpu_err:
        torch.add(a, b, alpha=True)
    da, db = a.to("tpu"), b.to("tpu")
    with pytest.raises(type(cpu_err.value), match="Boolean alpha"):
        if form == "in_place":
            da.mul_(2.0)
            da.add_(db, alpha=True)
            da.cpu()
        else:
            (torch.add(da, db, alpha=True) * 2.0).cpu()
    assert torch.equal((db * 3.0).cpu(), b * 3.0)  # the queue and other tensors stay valid


# Fixed in record.cpp (seventh session's QA pass): torch 2.13's meta kernels let
# int32.mul_(0.5) and float16.add_(1j) through, where CPU raises at the call that its
# result type cannot be cast to self's dtype; the device deferred the error, so the
# call succeeded and every later read of self raised. Such calls now run eagerly.
@pytest.mark.parametrize(
    "dtype,op,other",
    [
        (torch.int32, "mul_", 0.5),
        (torch.bool, "mul_", 2),
        (torch.int32, "mul_", 1j),
        (torch.int32, "add_", 1j),
        (torch.int32, "sub_", 1j),
        (torch.float16, "mul_", 1j),
        (torch.float16, "add_", 1j),
        (torch.int32, "mul_", "cpu_scalar_tensor"),
        (torch.int32, "mul_", "tpu_tensor"),
    ],
)
def test_in_place_result_that_cannot_be_cast_raises_at_the_call(dtype, op, other):
    def run(dev):
        x = torch.tensor([1, 0, 1], dtype=dtype, device=dev)
        o = (
            torch.tensor(0.5)
            if other == "cpu_scalar_tensor"
            else torch.tensor([0.5, 1.5, 2.5], device=dev)
            if other == "tpu_tensor"
            else other
        )
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            getattr(x, op)(o)
        x.zero_()
        return x

    assert torch.equal(run("tpu").cpu(), run("cpu"))  # self is unchanged and still usable


def test_bool_tensor_to_a_bool_power_stays_bool():
    for exponent in (True, False):
        t = torch.tensor([True, False])
        got, want = t.to("tpu") ** exponent, t**exponent
        assert got.dtype == want.dtype == torch.bool
        assert torch.equal(got.cpu(), want)
