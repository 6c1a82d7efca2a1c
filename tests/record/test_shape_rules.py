"""Twin-free shape rules (OpTrait kShapeRule*, csrc/ops/shape_rules.h): batch norm.

native_batch_norm, _native_batch_norm_legit and native_batch_norm_backward infer their
results by small rules on meta twins for the calls the rules cover, instead of CPU's
kernel on zero-filled CPU twins (kInferOnCpu, ``metrics()["twin_inferences"]``). Results
(sizes, strides, dtypes, values), the running statistics written and the errors raised
at the call must be CPU's; calls outside a rule's domain keep CPU's kernel on twins.
Every case uses shapes of its own where it asserts on the counter (the meta cache is
per process: a cached call infers nothing).
"""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_tpu_eager as tte
from difftest import DEVICE, cpu_randn, run_both, run_both_at_call

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the record kernel is the tpu device's")


def twins():
    return tte.metrics()["twin_inferences"]


def layout(x, kind):
    """``x`` (CPU) in the layout named by ``kind``, the same values."""
    if kind == "channels_last":
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        return x.contiguous(memory_format=fmt)
    if kind == "transposed":  # dims 0 and -1 swapped, then swapped back as a view
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "channel_slice":  # every other channel of a wider tensor
        wide = torch.repeat_interleave(x, 2, dim=1)
        return wide[:, ::2]
    return x


# (sizes, layouts): 2-D to 5-D, channels-last, and sizes whose suggested memory format is
# ambiguous (N, C, 1, 1 and a transposed 5-D tensor with unit spatial dims).
SHAPES = [
    ((6, 3), ("contiguous", "transposed", "channel_slice")),
    ((4, 3, 5), ("contiguous", "transposed", "channel_slice")),
    ((2, 3, 4, 5), ("contiguous", "channels_last", "transposed", "channel_slice")),
    ((2, 3, 2, 3, 4), ("contiguous", "channels_last", "transposed")),
    ((3, 4, 1, 1), ("contiguous", "channels_last", "transposed")),
    ((5, 2, 1, 1, 1), ("contiguous", "transposed")),
]
CASES = [(s, k) for s, kinds in SHAPES for k in kinds]
# (input dtype, parameter dtype): CPU's loops, and 16-bit inputs with float32 parameters.
DTYPES = [
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
]


@pytest.mark.parametrize("sizes,kind", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_forward_geometry_values_and_running_stats(sizes, kind, training):
    for i, (dtype, pdtype) in enumerate(DTYPES):
        x = layout(cpu_randn(*sizes, seed=1 + i, dtype=dtype), kind)
        c = sizes[1]
        w, b = cpu_randn(c, seed=2, dtype=pdtype), cpu_randn(c, seed=3, dtype=pdtype)
        for affine in (True, False):

            def fn(dev):
                rm, rv = torch.zeros(c, dtype=pdtype, device=dev), torch.ones(c, dtype=pdtype, device=dev)
                p = (w.to(dev), b.to(dev)) if affine else (None, None)
                out = torch.native_batch_norm(x.to(dev), *p, rm, rv, training, 0.1, 1e-5)
                return (*out, rm, rv)

            before = twins()
            # float16 over a channel slice: the device's loop differs from CPU's by an ulp (main too).
            tol = {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
            run_both(fn, DEVICE, check_stride=True, **tol)
            assert twins() == before, (sizes, kind, dtype, affine)


@pytest.mark.parametrize("sizes,kind", CASES)
@pytest.mark.parametrize("grad_kind", ["same", "contiguous", "channels_last"])
def test_backward_geometry_and_values(sizes, kind, grad_kind):
    if grad_kind == "channels_last" and len(sizes) not in (4, 5):
        pytest.skip("channels-last needs 4 or 5 dims")
    c = sizes[1]
    for i, ((dtype, pdtype), train) in enumerate(itertools.product(DTYPES, (True, False))):
        x = layout(cpu_randn(*sizes, seed=4 + i, dtype=dtype), kind)
        g = cpu_randn(*sizes, seed=5, dtype=dtype)
        g = torch.empty_like(x).copy_(g) if grad_kind == "same" else layout(g, grad_kind)
        w = cpu_randn(c, seed=6, dtype=pdtype)
        rm, rv = cpu_randn(c, seed=7, dtype=pdtype), cpu_randn(c, seed=8, dtype=pdtype).abs() + 0.5
        xf = x.float()
        mean = xf.mean([d for d in range(x.dim()) if d != 1]).to(pdtype)
        invstd = (xf.var([d for d in range(x.dim()) if d != 1], unbiased=False) + 1e-5).rsqrt().to(pdtype)
        for mask in ([True, True, True], [True, False, False], [False, True, True]):

            def fn(dev):
                t = lambda a: a.to(dev)  # noqa: E731
                saved = (t(mean), t(invstd)) if train else (None, None)
                return torch.ops.aten.native_batch_norm_backward(
                    t(g), t(x), t(w), t(rm), t(rv), *saved, train, 1e-5, mask
                )

            before = twins()
            tol = {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
            run_both(fn, DEVICE, check_stride=True, **tol)
            assert twins() == before, (sizes, kind, dtype, train, mask)


def test_legit_overload_and_weightless_backward():
    x = cpu_randn(3, 7, 2, 5, seed=9).contiguous(memory_format=torch.channels_last)

    def fn(dev):
        rm, rv = torch.zeros(7, device=dev), torch.ones(7, device=dev)
        out = torch.ops.aten._native_batch_norm_legit(x.to(dev), None, None, rm, rv, True, 0.3, 1e-3)
        grads = torch.ops.aten.native_batch_norm_backward(
            out[0], x.to(dev), None, rm, rv, out[1], out[2], True, 1e-3, [True, True, True]
        )
        return (*out, rm, rv, *grads)

    before = twins()
    run_both(fn, DEVICE, check_stride=True)
    assert twins() == before


def test_training_step_through_autograd_infers_no_twins():
    # conv -> batch norm -> relu, one backward: the CNN step's batch norm calls.
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(2, 5, 3, padding=1), torch.nn.BatchNorm2d(5)
    x0 = cpu_randn(3, 2, 6, 7, seed=10)

    def fn(dev):
        c, n = copy.deepcopy(conv).to(dev), copy.deepcopy(bn).to(dev)
        y = F.relu(n(c(x0.to(dev))))
        y.square().mean().backward()
        return y.detach(), n.running_mean, n.running_var, n.weight.grad, n.bias.grad, c.weight.grad

    expected = fn("cpu")
    before = twins()
    actual = fn(DEVICE)
    assert twins() == before
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-4, atol=1e-5)
        assert a.stride() == e.stride()


@pytest.mark.parametrize(
    "case",
    [
        "float64_input_float32_weight",  # CPU: "mixed dtype (CPU): all inputs must share same datatype."
        "float32_input_bfloat16_weight",  # CPU: "mixed dtype (CPU): expect parameter to have scalar type of Float"
        "weight_and_bias_dtypes_differ",
    ],
)
def test_declined_dtype_mixes_raise_cpu_error_at_the_call(case):
    def build(dev):
        dx, dw, db = {
            "float64_input_float32_weight": (torch.float64, torch.float32, torch.float32),
            "float32_input_bfloat16_weight": (torch.float32, torch.bfloat16, torch.bfloat16),
            "weight_and_bias_dtypes_differ": (torch.float32, torch.float32, torch.bfloat16),
        }[case]
        return tuple(
            t.to(dev)
            for t in (
                cpu_randn(2, 3, 5, 2, seed=12, dtype=dx),
                cpu_randn(3, seed=13, dtype=dw),
                cpu_randn(3, seed=14, dtype=db),
            )
        )

    def act(x, w, b):
        return torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)

    assert run_both_at_call(build, act, DEVICE) is not None


def test_declined_calls_keep_cpu_kernel_on_twins():
    # A weight of more elements than channels: CPU's kernel reads the first C (no error);
    # outside the rule's domain, so CPU's kernel on twins decides, as before the rule.
    x, w = cpu_randn(4, 3, 5, 3, seed=15), cpu_randn(4, seed=16)
    before = twins()
    run_both(
        lambda dev: torch.native_batch_norm(x.to(dev), w.to(dev), None, None, None, True, 0.1, 1e-5),
        DEVICE,
        check_stride=True,
    )
    assert twins() == before + 1


# CPU's kernels crash the process on these calls (torch 2.13 reads the missing statistic
# without a check; measured: SIGSEGV for each), so there is no CPU behaviour to compare
# with: "tpu" raises at::batch_norm's RuntimeError at the call instead, and the queue and
# every other tensor stay valid. Run in this process: a crash fails the whole session.
def _raises_and_queue_stays_valid(call, pattern):
    """``call(x)`` on a (2, 3, 4) "tpu" input raises RuntimeError matching ``pattern`` at the
    call; a tensor recorded before it and a batch norm after it still give CPU's values."""
    keep = torch.randn(4, 3, device=DEVICE) * 2
    x = torch.randn(2, 3, 4, device=DEVICE)
    with pytest.raises(RuntimeError, match=pattern):
        call(x)
    torch.testing.assert_close(keep.cpu(), (keep / 2).cpu() * 2)
    y = torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[0]
    torch.testing.assert_close(y.cpu(), torch.native_batch_norm(x.cpu(), None, None, None, None, True, 0.1, 1e-5)[0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: torch.native_batch_norm(x, None, None, None, None, False, 0.1, 1e-5), "running_mean"),
        (
            lambda x: torch.native_batch_norm(x, None, None, torch.zeros(3, device=x.device), None, False, 0.1, 1e-5),
            "running_var",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x, x, None, None, None, None, None, False, 1e-5, [True, True, True]
            ),
            "running_mean",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x, x, None, None, None, None, None, True, 1e-5, [True, True, True]
            ),
            "save_mean",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x.to(torch.int64), x.to(torch.int64), None, None, None, None, None, True, 1e-5, [True, True, True]
            ),
            "save_mean",
        ),
    ],
    ids=["forward_eval", "forward_eval_no_var", "backward_eval", "backward_train", "backward_train_int64"],
)
def test_missing_statistics_raise_instead_of_crashing(call, message):
    _raises_and_queue_stays_valid(call, f"^{message} must be defined in (evaluation|training) mode")


# More calls on which CPU's kernels (torch 2.13) read or write past a tensor or divide by zero
# (measured on CPU: SIGSEGV or SIGFPE, or garbage values): every batch norm overload,
# the out= ones, no_stats and _batch_norm_with_update included, and calls that take the
# eager path (an empty input) raise at the call instead. Run in this process: on the main
# these were found on, each crashed the process.
def _e(*sizes):
    return torch.empty(*sizes, device=DEVICE)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda x: torch.ops.aten._native_batch_norm_legit.no_stats(x, None, None, False, 0.1, 1e-5),
            "running_mean must be defined in evaluation mode",
        ),
        (
            lambda x: torch.ops.aten._native_batch_norm_legit.no_stats_out(
                x, None, None, False, 0.1, 1e-5, out=_e(0), save_mean=_e(0), save_invstd=_e(0)
            ),
            "running_mean must be defined in evaluation mode",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm.out(
                x, None, None, None, None, False, 0.1, 1e-5, out=_e(0), save_mean=_e(0), save_invstd=_e(0)
            ),
            "running_mean must be defined in evaluation mode",
        ),
        (
            lambda x: torch.ops.aten._batch_norm_with_update(x, None, None, _e(0), _e(0), 0.1, 1e-5),
            "running_mean should contain 3 elements not 0",
        ),
        (
            lambda x: torch.native_batch_norm(x, None, None, torch.zeros(3, device=DEVICE), _e(2), True, 0.1, 1e-5),
            "running_var should contain 3 elements not 2",
        ),
        (
            lambda x: torch.native_batch_norm(x, _e(1), None, None, None, True, 0.1, 1e-5),
            "weight should contain 3 elements not 1",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x[:0], x[:0], None, None, None, _e(3), _e(3), True, 1e-5, [True, True, True]
            ),
            "native_batch_norm_backward: input has no elements",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x[:1], x, None, None, None, _e(3), _e(3), True, 1e-5, [True, True, True]
            ),
            "native_batch_norm_backward: grad_out has 12 elements, fewer than input's 24",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward(
                x, x, None, _e(3), _e(2), None, None, False, 1e-5, [True, True, True]
            ),
            "running_var should contain 3 elements not 2",
        ),
        (
            lambda x: torch.ops.aten.native_batch_norm_backward.out(
                x, x, None, None, None, None, None, True, 1e-5, [True, True, True], out0=_e(0), out1=_e(0), out2=_e(0)
            ),
            "save_mean must be defined in training mode",
        ),
    ],
    ids=[
        "no_stats_eval",
        "no_stats_out_eval",
        "out_eval_no_stats",
        "with_update_empty_stats",
        "running_var_short",
        "weight_short",
        "backward_empty_input",
        "backward_grad_out_short",
        "backward_eval_running_var_short",
        "backward_out_train_no_save",
    ],
)
def test_unchecked_reads_raise_instead_of_crashing(call, message):
    _raises_and_queue_stays_valid(call, f"^{message}")


def test_checks_keep_cpu_behaviour_where_cpu_is_safe():
    # A 0-dim statistic: CPU's accessor error; a longer weight: CPU reads its first C; eval
    # backward through autograd: the saved statistics are empty and not read.
    x = cpu_randn(2, 3, 4, seed=17)
    assert (
        run_both_at_call(
            lambda dev: (x.to(dev), torch.zeros((), device=dev), torch.ones(3, device=dev)),
            lambda x, rm, rv: torch.native_batch_norm(x, None, None, rm, rv, True, 0.1, 1e-5),
            DEVICE,
        )
        is not None
    )
    run_both(
        lambda dev: torch.native_batch_norm(x.to(dev), torch.ones(5, device=dev), None, None, None, True, 0.1, 1e-5),
        DEVICE,
    )

    def eval_backward(dev):
        xd = x.to(dev, copy=True).requires_grad_()
        w = torch.ones(3, device=dev, requires_grad=True)
        y = F.batch_norm(xd, torch.zeros(3, device=dev), torch.ones(3, device=dev), w, None, False)
        y.square().sum().backward()
        return y, xd.grad, w.grad

    run_both(eval_backward, DEVICE)
