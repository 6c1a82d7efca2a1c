"""The foreach shape rule (OpTrait kShapeRuleForeach, csrc/ops/shape_rules.h infer_foreach).

The foreach ops recorded whole (the optimizers' `_foreach_*_` ops, `_foreach_sqrt`, ...)
infer by running each per-tensor op's C++ meta function on meta twins, instead of CPU's
foreach kernel on zero-filled CPU twins (``metrics()["twin_inferences"]``). Results (sizes,
strides, dtypes, values), the tensors written and the errors raised at the call must be
CPU's; calls outside the rule's domain (another dtype than float32 / float64, lists of
unequal lengths) keep CPU's kernel on twins, and with it CPU's errors. Every case that
asserts on the counter uses shapes of its own (the meta cache is per process: a cached
call infers nothing).
"""

import copy
import itertools

import pytest
import torch

import torch_tpu_eager as tte
from difftest import DEVICE, cpu_randn, run_both, run_both_at_call

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the record kernel is the tpu device's")

_fresh = itertools.count(1)


def twins():
    return tte.metrics()["twin_inferences"]


def tensors(kind, dtype, k, seed, positive=False):
    """Three CPU tensors of sizes unique to `k`, in the layout named by `kind`."""
    n = 3 + k
    sizes = [(4, n), (n,), (2, n, 3)]
    out = []
    for i, s in enumerate(sizes):
        x = cpu_randn(*s, seed=seed + i, dtype=dtype)
        if positive:
            x = x.abs() + 0.5
        if kind == "transposed" and x.dim() >= 2:
            x = x.t().contiguous().t() if x.dim() == 2 else x.transpose(0, 2).contiguous().transpose(0, 2)
        elif kind == "sliced":
            x = torch.cat([x, x], dim=-1)[..., ::2]
        out.append(x)
    return out


def on(dev, xs):
    """Copies of `xs` on `dev` (copies on CPU too: the calls write them)."""
    return [x.to(dev, copy=True) for x in xs]


# name -> (call(dev, selfs, others, thirds) -> result, writes selfs, needs positive values).
CALLS = {
    "mul_.Scalar": lambda s, o, t: torch._foreach_mul_(s, 0.5),
    "mul_.ScalarList": lambda s, o, t: torch._foreach_mul_(s, [0.5, 2, 3.0]),
    "mul_.Tensor": lambda s, o, t: torch._foreach_mul_(s, o[0].sum() * 0 + 1.5),
    "mul_.List": lambda s, o, t: torch._foreach_mul_(s, o),
    "add_.Scalar": lambda s, o, t: torch._foreach_add_(s, 0.25),
    "add_.ScalarList": lambda s, o, t: torch._foreach_add_(s, [1, -0.5, 2.0]),
    "add_.List": lambda s, o, t: torch._foreach_add_(s, o, alpha=-2),
    "div_.Scalar": lambda s, o, t: torch._foreach_div_(s, 3.0),
    "div_.ScalarList": lambda s, o, t: torch._foreach_div_(s, [2.0, 4, 0.5]),
    "div_.List": lambda s, o, t: torch._foreach_div_(s, o),
    "lerp_.Scalar": lambda s, o, t: torch._foreach_lerp_(s, o, 0.3),
    "addcmul_.Scalar": lambda s, o, t: torch._foreach_addcmul_(s, o, t, value=-0.5),
    "addcmul_.ScalarList": lambda s, o, t: torch._foreach_addcmul_(s, o, t, [0.5, 1, 2.0]),
    "addcdiv_.Scalar": lambda s, o, t: torch._foreach_addcdiv_(s, o, t, value=0.1),
    "addcdiv_.ScalarList": lambda s, o, t: torch._foreach_addcdiv_(s, o, t, [0.5, 1, 2.0]),
    "sqrt": lambda s, o, t: torch._foreach_sqrt(s),
    "add.List": lambda s, o, t: torch._foreach_add(s, o, alpha=0.5),
    "maximum_.List": lambda s, o, t: torch._foreach_maximum_(s, o),
    "neg": lambda s, o, t: torch._foreach_neg(s),
}
# (selfs' dtype, the other lists' dtype): CPU promotes a float64 other into a float32 self.
DTYPES = [(torch.float32, torch.float32), (torch.float64, torch.float64), (torch.float32, torch.float64)]


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced"])
def test_geometry_values_and_no_twins(name, kind):
    call = CALLS[name]
    for dtype, other_dtype in DTYPES:
        if name == "lerp_.Scalar" and dtype != other_dtype:
            continue  # CPU refuses it (ERRORS, lerp_dtypes_differ)
        k = next(_fresh)
        s = tensors(kind, dtype, k, seed=1, positive=True)
        o = tensors("contiguous", other_dtype, k, seed=4, positive=True)
        t = tensors(kind, other_dtype, k, seed=7, positive=True)

        def fn(dev):
            selfs = on(dev, s)
            result = call(selfs, on(dev, o), on(dev, t))
            return selfs if result is None else (selfs, result)

        before = twins()
        run_both(fn, DEVICE, check_stride=True)
        assert twins() == before, (name, kind, dtype, other_dtype)


@pytest.mark.parametrize("name", ["mul_.List", "add_.List", "add.List", "maximum_.List"])
def test_broadcast_other(name):
    # Each other[i] of fewer dims than self[i]: in place it broadcasts into self; add.List's
    # result takes the broadcast shape.
    k = next(_fresh)
    s = tensors("contiguous", torch.float32, k, seed=10)
    o = [x[0] if x.dim() > 1 else x for x in tensors("contiguous", torch.float32, k, seed=13)]

    def fn(dev):
        selfs = on(dev, s)
        result = CALLS[name](selfs, on(dev, o), None)
        return selfs if result is None else (selfs, result)

    before = twins()
    run_both(fn, DEVICE, check_stride=True)
    assert twins() == before


@pytest.mark.parametrize("opt", ["adam", "adamw_amsgrad_maximize", "sgd_momentum_nesterov"])
def test_optimizer_steps_infer_no_twins(opt):
    k = next(_fresh)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5 + k, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    x = cpu_randn(4, 5 + k, seed=20)
    make = {
        "adam": lambda p: torch.optim.Adam(p, lr=0.1, foreach=True),
        "adamw_amsgrad_maximize": lambda p: torch.optim.AdamW(p, lr=0.1, amsgrad=True, maximize=True, foreach=True),
        "sgd_momentum_nesterov": lambda p: torch.optim.SGD(
            p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True
        ),
    }[opt]

    def fn(dev):
        m = copy.deepcopy(model).to(dev)
        o = make(m.parameters())
        for _ in range(2):
            o.zero_grad()
            m(x.to(dev)).square().mean().backward()
            o.step()
        return [p.detach() for p in m.parameters()]

    expected = fn("cpu")
    before = twins()
    actual = fn(DEVICE)
    assert twins() == before
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a.cpu(), e)


# Calls CPU refuses: the same exception type and message at the call, the tensors before the
# failing one written as CPU writes them (run_both_at_call compares them afterwards).
ERRORS = {
    "list_lengths_differ": lambda a, b, c: torch._foreach_add_([a, b], [a, b, c]),
    "scalar_list_length_differs": lambda a, b, c: torch._foreach_mul_([a, b, c], [1.0, 2.0]),
    "in_place_broadcast_grows_self": lambda a, b, c: torch._foreach_add_([b, a], [b, c]),
    "complex_scalar_into_float": lambda a, b, c: torch._foreach_add_([a, b, c], 1 + 2j),
    "scalar_tensor_not_0_dim": lambda a, b, c: torch._foreach_mul_([a, c], b),
    "complex_scalar_list_element": lambda a, b, c: torch._foreach_div_([a, b, c], [1.0, 2j, 3.0]),
    "lerp_dtypes_differ": lambda a, b, c: torch._foreach_lerp_([a, b], [a.double(), b.double()], 0.5),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_raise_cpu_error_at_the_call(case):
    act = ERRORS[case]
    k = next(_fresh)

    def build(dev):
        # a [4, n] after b [n] (the second's broadcast into the first fails in place), c [2, 4, n]
        n = 3 + k
        return (
            cpu_randn(4, n, seed=30).to(dev),
            cpu_randn(n, seed=31).to(dev),
            cpu_randn(2, 4, n, seed=32).to(dev),
        )

    assert run_both_at_call(build, act, DEVICE) is not None


def test_declined_dtypes_keep_cpu_kernel_on_twins():
    # int64 tensors: outside the rule's domain, CPU's kernel on twins decides (an int add
    # passes; a float scalar into them raises CPU's cast error at the call).
    k = next(_fresh)
    a = torch.arange(3 + k, dtype=torch.int64)
    b = torch.arange(6 + 2 * k, dtype=torch.int64).reshape(2, 3 + k).clone()

    def ints(dev):
        xs = [a.to(dev, copy=True), b.to(dev, copy=True)]
        torch._foreach_add_(xs, 2)
        return xs

    before = twins()
    run_both(ints, DEVICE, check_stride=True)
    assert twins() == before + 1
    assert run_both_at_call(lambda dev: (a.to(dev), b.to(dev)), lambda x, y: torch._foreach_mul_([x, y], 1.5), DEVICE)


def test_tensors_after_a_declined_call_stay_valid():
    # A refused call leaves the queue and other tensors valid; the next call is inferred by the rule.
    k = next(_fresh)
    xs = [torch.ones(3 + k, device=DEVICE), torch.ones(2, 3 + k, device=DEVICE)]
    with pytest.raises(RuntimeError):
        torch._foreach_add_(xs, [xs[1], xs[0]])
    before = twins()
    torch._foreach_mul_(xs, 3.0)
    assert twins() == before
    torch.testing.assert_close(xs[0].cpu(), torch.full((3 + k,), 3.0))
    torch.testing.assert_close(xs[1].cpu(), torch.full((2, 3 + k), 3.0))
