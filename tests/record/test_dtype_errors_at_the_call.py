"""Dtypes that CPU's kernel rejects raise at the call on "tpu", with CPU's type and message.

CPU's kernels pick their loop by dtype (AT_DISPATCH) after the meta function ran, and
raise NotImplementedError '"bitwise_and_cpu" not implemented for 'Float'' there; the meta
kernels accept such dtypes. csrc/ops/cpu_probe.cpp runs CPU's kernel once per (op,
dtypes) on tiny CPU twins of the arguments on a meta-cache miss; when it rejects them,
the call runs CPU's kernel at the call (its exact error), and nothing is recorded.

The ops here are the ones tools/sweep_dtype_errors.py found raising late (at the read)
before the probe; test_sweep_finds_no_late_errors reruns the sweep on some of them.
"""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from difftest import REPO_ROOT, requires_tpu, run_both_at_call

BINARY = ["bitwise_and", "bitwise_or", "bitwise_xor", "gcd", "lcm", "bitwise_left_shift", "bitwise_right_shift"]
OPERATORS = {"bitwise_and": "__and__", "bitwise_or": "__or__", "bitwise_xor": "__xor__"}
OPERATORS.update({"bitwise_left_shift": "__lshift__", "bitwise_right_shift": "__rshift__"})
FORMS = ["tensor", "scalar", "in_place", "in_place_scalar", "out", "operator"]


def _values(d, dtype):
    return (torch.arange(1, 7, device=d) % 4).reshape(2, 3).to(dtype)


def _act(op, form):
    def act(a, b, o):
        if form == "tensor":
            return getattr(torch, op)(a, b)
        if form == "scalar":
            return getattr(torch, op)(a, 2)
        if form == "in_place":
            return getattr(a, op + "_")(b)
        if form == "in_place_scalar":
            return getattr(a, op + "_")(2)
        if form == "out":
            return getattr(torch, op)(a, b, out=o)
        return getattr(a, OPERATORS.get(op, op))(b)

    return act


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64, torch.bool, torch.int32], ids=str)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op", BINARY)
def test_binary_integer_ops(dev, op, form, dtype):
    if form == "operator" and op not in OPERATORS:
        pytest.skip(f"{op} has no operator")

    def build(d):
        return _values(d, dtype), _values(d, dtype).flip(0), torch.zeros(2, 3, device=d, dtype=dtype)

    # int32 is CPU-supported: it must compute (and match CPU), not raise.
    run_both_at_call(build, _act(op, form), dev)


@pytest.mark.parametrize("mixed", ["int_tensor_float_scalar", "int_tensor_float_tensor", "float_out"])
def test_promotion_to_an_unsupported_dtype(dev, mixed):
    """The dtype the kernel sees is the promoted one: int64 & 1.5 runs the Float loop."""

    def build(d):
        return _values(d, torch.int64), _values(d, torch.float32), torch.zeros(2, 3, device=d)

    def act(i, f, o):
        if mixed == "int_tensor_float_scalar":
            return i & 1.5
        if mixed == "int_tensor_float_tensor":
            return torch.gcd(i, f)
        return torch.bitwise_and(i, i, out=o)  # int64 result into a float32 out=: CPU's cast check

    run_both_at_call(build, act, dev)


def test_empty_tensors_raise_too(dev):
    """CPU dispatches on the dtype before it looks at the element count."""

    def build(d):
        return (torch.empty(0, device=d),)

    run_both_at_call(build, lambda a: a & a, dev)


def _volume(t, dtype):
    """`t`'s values repeated into a (1, 1, 2, 4, 3) volume of `dtype`."""
    return t.repeat(2, 2).reshape(1, 1, 2, 4, 3).to(dtype)


def _pdist_grads(t, dtype):
    """_pdist_backward's arguments (grad, self, p, pdist) for the rows of `t` in `dtype`."""
    n = t.shape[0] * (t.shape[0] - 1) // 2
    ones = torch.ones(n, device=t.device, dtype=dtype)
    return ones, t.to(dtype), 2.0, ones


@pytest.mark.parametrize(
    "case",
    [
        ("hardshrink_int8", lambda t: F.hardshrink(t.to(torch.int8), 0.5)),
        ("softshrink_int32", lambda t: F.softshrink(t.to(torch.int32), 0.5)),
        ("logit_bool", lambda t: torch.logit(t.to(torch.bool))),
        ("erfinv_int64", lambda t: torch.erfinv(t.to(torch.int64))),
        ("heaviside_mixed", lambda t: torch.heaviside(t, t.to(torch.float64))),
        # Errors that are not NotImplementedError but name the call's dtype.
        ("sdpa_int32", lambda t: F.scaled_dot_product_attention(*[t.to(torch.int32).reshape(1, 1, 2, 3)] * 3)),
        ("hardtanh_complex", lambda t: F.hardtanh(t.to(torch.complex64))),
        ("mvlgamma_bool", lambda t: torch.mvlgamma(t.to(torch.bool), 1)),
        ("renorm_int64", lambda t: torch.renorm(t.to(torch.int64), 2, 0, 1.0)),
        ("stft_half", lambda t: torch.stft(t.reshape(-1).repeat(8).half(), 16, return_complex=True)),
        # Twins of size 1 fail on their shapes first; full-size twins (small calls) tell.
        ("glu_int64", lambda t: F.glu(t.to(torch.int64).repeat(2, 2))),
        ("max_pool2d_bool", lambda t: F.max_pool2d(t.to(torch.bool).repeat(2, 2).reshape(1, 1, 4, 6), 2)),
        ("avg_pool2d_int32", lambda t: F.avg_pool2d(t.to(torch.int32).repeat(2, 2).reshape(1, 1, 4, 6), 2)),
        ("unfold_int32", lambda t: F.unfold(t.to(torch.int32).repeat(2, 2).reshape(1, 1, 4, 6), 2)),
        ("cross_bool", lambda t: torch.linalg.cross(t.to(torch.bool), t.to(torch.bool).flip(0))),
        ("kthvalue_bool", lambda t: torch.kthvalue(t.to(torch.bool), 1)),
        ("group_norm_complex", lambda t: F.group_norm(t.to(torch.complex64).reshape(1, 2, 3), 2)),
        ("std_int64", lambda t: torch.std(t.to(torch.int64))),
        ("var_mean_bool", lambda t: torch.var_mean(t.to(torch.bool), 0)),
        # "Boolean inputs not supported for relu" (capitalized): relu_ raised at the read
        # (relu's own check is CPU's kernel at the call); found by test_random_fused.py.
        ("relu__bool", lambda t: t.to(torch.bool).relu_()),
        ("relu__bool_expanded", lambda t: t.to(torch.bool)[:1].expand(2, 3).clone().relu_()),
        # pdist's kernel returns an empty result before its dtype dispatch for fewer than
        # two rows: twins of one row accepted float16 (test_ops.py test_dtypes).
        ("pdist_half", lambda t: F.pdist(t.half())),
        ("pdist_bfloat16", lambda t: F.pdist(t.bfloat16())),
        ("pdist_float32", lambda t: F.pdist(t)),
        # One row computes on CPU (an empty result); the verdict must not carry over.
        ("pdist_half_after_one_row", lambda t: (F.pdist(t[:1].half()), F.pdist(t.half()))),
        ("pdist_backward_half", lambda t: torch.ops.aten._pdist_backward(*_pdist_grads(t, torch.half))),
        # avg_pool3d has no 16-bit loop and its window does not fit twins of size 1.
        ("avg_pool3d_half", lambda t: F.avg_pool3d(_volume(t, torch.half), 2)),
        ("avg_pool3d_bfloat16", lambda t: F.avg_pool3d(_volume(t, torch.bfloat16), 2)),
        ("avg_pool3d_float32", lambda t: F.avg_pool3d(_volume(t, torch.float32), 2)),
        (
            "avg_pool3d_backward_half",
            lambda t: torch.ops.aten.avg_pool3d_backward(
                _volume(t, torch.half)[..., ::2, ::2, :1],
                _volume(t, torch.half),
                [2, 2, 2],
                [2, 2, 2],
                [0, 0, 0],
                False,
                True,
                None,
            ),
        ),
        # An int `size` is unfold_backward's window: clamped to 1 (= the step) the probe
        # took the kernel's copy path, which has no dtype dispatch, and accepted complex32.
        ("unfold_backward_complex32", lambda t: torch.ops.aten.unfold_backward(t.to(torch.complex32), [4], 0, 2, 1)),
        ("unfold_backward_float32", lambda t: torch.ops.aten.unfold_backward(t, [4], 0, 2, 1)),
        # MKL's FFT names the real type of a complex32 tensor ("tensors of type: Half"):
        # the probe read that as the twins' doing and accepted ComplexHalf.
        ("fft_complex32", lambda t: torch.fft.fft(t.to(torch.complex32))),
        ("ifft2_complex32", lambda t: torch.fft.ifft2(t.to(torch.complex32))),
        ("irfft_complex32", lambda t: torch.fft.irfft(t.to(torch.complex32))),
        ("fft_complex64", lambda t: torch.fft.fft(t.to(torch.complex64))),
        # flip's kernel copies when no flipped dim has two elements: size-1 twins took
        # that path, which has no dtype dispatch, and accepted ComplexHalf.
        ("flip_complex32", lambda t: t.to(torch.complex32).flip(0)),
        ("flip_complex32_dims", lambda t: t.to(torch.complex32).flip(0, 1)),
        ("flip_complex32_one_row", lambda t: t[:1].to(torch.complex32).flip(0)),
        ("flip_one_row_then_two", lambda t: (t[:1].to(torch.complex32).flip(0), t.to(torch.complex32).flip(0))),
        ("flip_half", lambda t: t.half().flip(1)),
    ],
    ids=lambda c: c[0],
)
def test_other_ops_the_probe_covers(dev, case):
    def build(d):
        return (_values(d, torch.float32),)

    run_both_at_call(build, case[1], dev)


@pytest.mark.parametrize("dtype", [torch.complex32, torch.complex64])
@pytest.mark.parametrize("op", ["unfold", "unfold_copy"])
def test_unfold_gradient_dtypes(dev, op, dtype):
    """CPU's unfold_backward has no ComplexHalf loop: the backward raises in the
    backward call (it raised at the next read, of whatever tensor came first)."""

    def build(d):
        return (torch.arange(6.0, device=d).to(dtype).requires_grad_(),)

    def act(x):
        y = x.unfold(0, 2, 1) if op == "unfold" else torch.unfold_copy(x, 0, 2, 1)
        y.backward(torch.ones_like(y))
        return x.grad

    run_both_at_call(build, act, dev)


@pytest.mark.parametrize(
    "dtype",
    [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64, torch.float32, torch.float16, torch.bfloat16],
    ids=str,
)
@pytest.mark.parametrize("call", ["functional", "return_indices", "torch", "bad_kernel"])
def test_max_pool1d_dtypes(dev, call, dtype):
    """CPU's max_pool1d (no gradient needed) runs its own loop, which has floating types
    only: "max_pool1d_impl" not implemented for 'Long'. On any other device the same
    composite takes max_pool1d_with_indices (max_pool2d's kernel, which has integer loops),
    so "tpu" computed integer max_pool1d. return_indices takes that path on CPU too."""

    def build(d):
        return (torch.arange(12.0, device=d).reshape(1, 2, 6).remainder(5).to(dtype),)

    def act(x):
        if call == "functional":
            return F.max_pool1d(x, 2)
        if call == "return_indices":
            return F.max_pool1d(x, 3, 2, return_indices=True)
        if call == "torch":
            return torch.max_pool1d(x, 3, 2, 1, 1, True)
        return torch.max_pool1d(x, [2, 2])  # CPU checks the kernel size before the dtype

    run_both_at_call(build, act, dev)


def test_max_pool1d_gradient(dev):
    """A float max_pool1d that needs its gradient still differentiates (CPU's with_indices path)."""

    def build(d):
        return (torch.tensor([[[1.0, 3.0, 2.0, 5.0, 4.0, 0.0]]], device=d).requires_grad_(),)

    def act(x):
        y = F.max_pool1d(x, 2, 1)
        y.backward(torch.arange(5.0, device=x.device).reshape(1, 1, 5))
        return y, x.grad

    run_both_at_call(build, act, dev)


@requires_tpu
def test_rejected_gradient_reaches_no_later_read():
    """test_ops.py's test_dtypes of `where` (every dtype) failed with the ComplexHalf
    unfold_backward error of the unfold test before it: the gradient died unread, and
    its error was reported at the next read of any tensor (lazy/async_errors.h)."""
    x = torch.arange(6.0, device="tpu").to(torch.complex32).requires_grad_()
    y = x.unfold(0, 2, 1)
    with pytest.raises(NotImplementedError, match="unfold_backward_cpu"):
        y.backward(torch.ones_like(y))
    del x, y
    assert torch.equal(torch.where(torch.tensor([True, False], device="tpu"), 1.0, 2.0).cpu(), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int64], ids=str)
@pytest.mark.parametrize(
    "factory",
    [
        lambda d, dt: torch.triu_indices(3, 3, dtype=dt, device=d),
        lambda d, dt: torch.tril_indices(3, 4, 1, dtype=dt, device=d),
        lambda d, dt: torch.arange(0, 3, dtype=dt, device=d),
        lambda d, dt: torch.linspace(0, 3, 4, dtype=dt, device=d),
    ],
    ids=["triu_indices", "tril_indices", "arange", "linspace"],
)
def test_factories(dev, factory, dtype):
    """Factories with a dtype CPU's kernel rejects raise it at the call (triu_indices in
    float32 used to recurse until the stack overflowed: the eager run kept device="tpu")."""

    def build(d):
        return (torch.zeros(1, device=d),)  # names the device; also checked readable afterwards

    run_both_at_call(build, lambda t: factory(t.device, dtype), dev)


@requires_tpu
def test_queue_stays_usable_after_the_error():
    """Work queued before the rejected call still computes; later calls still record."""
    x = torch.arange(6.0, device="tpu")
    y = x * 2 + 1  # queued
    with pytest.raises(NotImplementedError, match=r"\"bitwise_xor_cpu\" not implemented for 'Float'"):
        y ^ y
    z = torch.arange(6, device="tpu") ^ 3
    assert torch.equal(y.cpu(), torch.arange(6.0) * 2 + 1)
    assert torch.equal(z.cpu(), torch.arange(6) ^ 3)
    with pytest.raises(NotImplementedError, match=r"\"bitwise_xor_cpu\" not implemented for 'Float'"):
        y ^ y  # the second time from the probe's cached verdict


@requires_tpu
def test_accepted_dtypes_still_record():
    """The probe runs on a meta-cache miss only; an accepted call is recorded, not run eagerly."""
    import torch_tpu_eager

    a = torch.arange(6, device="tpu").reshape(2, 3)
    (a & a).cpu()  # warm: the meta cache and the probe's verdict
    torch_tpu_eager.synchronize()
    before = torch_tpu_eager.metrics()["eager_ops"]
    r = (a & a) | (a ^ 5)
    assert torch_tpu_eager.metrics()["eager_ops"] == before
    assert torch.equal(r.cpu(), (a.cpu() & a.cpu()) | (a.cpu() ^ 5))


def _load_sweep():
    spec = importlib.util.spec_from_file_location(
        "sweep_dtype_errors", os.path.join(REPO_ROOT, "tools", "sweep_dtype_errors.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@requires_tpu
def test_sweep_finds_no_late_errors():
    rows = _load_sweep().sweep(ops=["bitwise_and", "gcd", "nn.functional.hardshrink", "add"])
    assert [r for r in rows if r["kind"] == "late"] == []
