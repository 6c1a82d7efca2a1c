"""Foreach ops recorded as one node over all their tensors and expanded by the flush into the
per-tensor ops CPU's kernel calls (the op table's kExpandsPerTensor rows, tools/gen_op_table.py
FOREACH_EXPANDED; csrc/jit/foreach_expand.cpp): the optimizers' foreach paths (SGD, Adam,
AdamW, with amsgrad, weight decay and maximize) and clip_grad_norm_'s scale. Values, dtypes,
version counters, aliasing between list elements and errors at the call are CPU's; each
tensor's elementwise chain still fuses."""

import pytest
import torch

from difftest import DEVICE, aten_ops_during, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="what the tpu device records and its flush runs")

if DEVICE == "tpu":
    import torch_tpu_eager

SHAPES = [(5, 3), (17,), (), (32, 8)]


def _make(dtype=torch.float32, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in SHAPES]
    return [t.abs() + 0.25 for t in ts] if positive else ts


def _dev(ts):
    return [t.to(DEVICE) for t in ts]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == DEVICE and g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.cpu(), w), (g.cpu(), w)


def _ops_recorded(fn):
    """How many ops ``fn()`` records on the device."""
    torch.tpu.synchronize()
    before = torch_tpu_eager.metrics()["ops_recorded"]
    fn()
    return torch_tpu_eager.metrics()["ops_recorded"] - before


@pytest.fixture
def cpu_math():
    """Fused sqrt as CPU's routine, so an optimizer step is bit-equal to CPU's."""
    for set_ in restoring(torch_tpu_eager.fused_math, torch_tpu_eager.set_fused_math):
        set_("cpu")
        yield


# (name, call on lists (self, a, b) of one dtype, whether it is in place)
CALLS = [
    ("mul_.Scalar", lambda s, a, b: torch._foreach_mul_(s, 0.75)),
    ("mul_.ScalarList", lambda s, a, b: torch._foreach_mul_(s, [0.5, 2.0, -1.5, 3])),
    ("mul_.Tensor", lambda s, a, b: torch._foreach_mul_(s, a[2])),
    ("mul_.List", lambda s, a, b: torch._foreach_mul_(s, a)),
    ("add_.Scalar", lambda s, a, b: torch._foreach_add_(s, 1e-3)),
    ("add_.ScalarList", lambda s, a, b: torch._foreach_add_(s, [1, 2.5, -3.0, 0.125])),
    ("add_.List", lambda s, a, b: torch._foreach_add_(s, a)),
    ("add_.List_alpha", lambda s, a, b: torch._foreach_add_(s, a, alpha=-0.3)),
    ("div_.Scalar", lambda s, a, b: torch._foreach_div_(s, 3.0)),
    ("div_.ScalarList", lambda s, a, b: torch._foreach_div_(s, [0.3, 1.7, 2.0, 9.0])),
    ("div_.List", lambda s, a, b: torch._foreach_div_(s, b)),
    ("lerp_.Scalar", lambda s, a, b: torch._foreach_lerp_(s, a, 0.1)),
    ("addcmul_.Scalar", lambda s, a, b: torch._foreach_addcmul_(s, a, b, 0.01)),
    ("addcmul_.default_value", lambda s, a, b: torch._foreach_addcmul_(s, a, b)),
    ("addcmul_.ScalarList", lambda s, a, b: torch._foreach_addcmul_(s, a, b, [0.1, -0.2, 0.3, 4.0])),
    ("addcdiv_.Scalar", lambda s, a, b: torch._foreach_addcdiv_(s, a, b, -1e-3)),
    ("addcdiv_.ScalarList", lambda s, a, b: torch._foreach_addcdiv_(s, a, b, [-1e-3, 2.0, 0.5, -7.0])),
    ("sqrt", lambda s, a, b: torch._foreach_sqrt(b)),
    ("add.List", lambda s, a, b: torch._foreach_add(s, a)),
    ("add.List_alpha", lambda s, a, b: torch._foreach_add(s, b, alpha=0.1)),
    ("maximum_.List", lambda s, a, b: torch._foreach_maximum_(s, a)),
    ("neg", lambda s, a, b: torch._foreach_neg(a)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
def test_each_foreach_op_equal_to_cpu_and_one_recorded_op(name, call, dtype, cpu_math):
    cpu = [_make(dtype, 0), _make(dtype, 10), _make(dtype, 20, positive=True)]
    dev = [_dev(ts) for ts in cpu]
    want = call(*cpu)
    got = []
    assert _ops_recorded(lambda: got.append(call(*dev))) == 1  # fails on main: one op per tensor
    if want is not None:
        _assert_same(got[0], want)
    for d, c in zip(dev, cpu):
        _assert_same(d, c)


def test_mixed_dtypes_and_integer_lists_equal_to_cpu():
    cpu = [torch.arange(6).reshape(2, 3), torch.ones(4, dtype=torch.float16), torch.zeros(3, dtype=torch.bfloat16)]
    dev = _dev(cpu)
    for fn in (lambda s: torch._foreach_mul_(s, 3), lambda s: torch._foreach_add_(s, [1, 2, 3])):
        fn(cpu)
        fn(dev)
        _assert_same(dev, cpu)


def test_views_and_strided_tensors_equal_to_cpu():
    """List elements that are views of one base (a parameter that is a view of another),
    transposed and strided: the per-tensor ops run in CPU's order, each reading what the
    ones before it wrote."""
    base = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    views = lambda b: [b[:4], b[2:6], b.t(), b[::2, 1:]]  # noqa: E731
    others = [torch.full_like(v, 0.5) for v in views(base)]
    dev_base = base.to(DEVICE)
    dev_others = _dev(others)
    torch._foreach_mul_(views(base), [2.0, 3.0, -1.0, 0.5])
    torch._foreach_addcmul_(views(base), others, others, 0.25)
    torch._foreach_mul_(views(dev_base), [2.0, 3.0, -1.0, 0.5])
    torch._foreach_addcmul_(views(dev_base), dev_others, dev_others, 0.25)
    _assert_same([dev_base], [base])


def test_aliasing_between_list_elements_equal_to_cpu():
    """The same tensor twice in self, and self's elements as another list's (in another order)."""
    a, b = torch.randn(5), torch.randn(5)
    da, db = a.to(DEVICE), b.to(DEVICE)
    torch._foreach_mul_([a, a, b], 1.5)
    torch._foreach_mul_([da, da, db], 1.5)
    torch._foreach_add_([a, b], [b, a], alpha=2)
    torch._foreach_add_([da, db], [db, da], alpha=2)
    torch._foreach_lerp_([a, b], [b, a], 0.3)
    torch._foreach_lerp_([da, db], [db, da], 0.3)
    _assert_same([da, db], [a, b])


def test_same_tensor_in_self_and_other_at_one_index_equal_to_cpu():
    a = torch.randn(6)
    da = a.to(DEVICE)
    torch._foreach_addcmul_([a], [a], [a], 0.5)
    torch._foreach_addcmul_([da], [da], [da], 0.5)
    torch._foreach_mul_([a], [a])
    torch._foreach_mul_([da], [da])
    _assert_same([da], [a])


def test_partial_overlap_of_self_and_other_at_one_index_raises_as_cpu():
    """Views of one base at one index that share some elements: CPU's add_ raises; other
    bases at the other indices (other storages) do not stop the check."""
    base, c = torch.arange(10.0), torch.randn(3)
    dbase, dc = base.to(DEVICE), c.to(DEVICE)
    call = lambda b, o: torch._foreach_add_([o, b[:4]], [o.clone(), b[1:5]])  # noqa: E731
    _expect_same_error(lambda: call(base, c), lambda: call(dbase, dc))
    _assert_same([dbase, dc], [base, c])


def test_same_elements_through_another_view_at_one_index_equal_to_cpu():
    """Other at one index is self's elements through another view object (a full overlap,
    which CPU's in-place ops accept)."""
    base = torch.randn(2, 4, generator=torch.Generator().manual_seed(7))
    dbase = base.to(DEVICE)
    torch._foreach_addcmul_([base[0], base[1]], [base.view(8)[:4], base[0]], [base[1], base.view(8)[4:]], 0.5)
    torch._foreach_addcmul_([dbase[0], dbase[1]], [dbase.view(8)[:4], dbase[0]], [dbase[1], dbase.view(8)[4:]], 0.5)
    _assert_same([dbase], [base])


def test_tensor_list_keeps_a_host_scalar_read_at_the_call():
    """A Tensor[] with a 0-dim host tensor beside the device's: the recorded op keeps its value
    at the call (a later in-place write to it does not reach the flush)."""
    a, c = torch.tensor(1.5), torch.tensor(2.5)
    want = torch.stack([a, c])
    got = torch.stack([a.to(DEVICE), c])
    c.fill_(7.0)
    _assert_same([got], [want])


def test_reads_the_values_of_the_call():
    """A later in-place write to an input (before the flush) does not change the recorded op."""
    a, b = torch.randn(4), torch.randn(4)
    da, db = a.to(DEVICE), b.to(DEVICE)
    torch._foreach_add_([a], [b])
    torch._foreach_add_([da], [db])
    b.mul_(10)
    db.mul_(10)
    _assert_same([da, db], [a, b])


def test_version_counters_as_cpu():
    cpu, dev = _make(), _dev(_make())
    for fn in (lambda s: torch._foreach_mul_(s, 2.0), lambda s: torch._foreach_add_(s, s[:1] * 4)):
        try:
            fn(cpu)
        except Exception:
            pass
        try:
            fn(dev)
        except Exception:
            pass
    assert [t._version for t in dev] == [t._version for t in cpu]


def _expect_same_error(cpu_call, dev_call):
    with pytest.raises(Exception) as cpu_err:
        cpu_call()
    with pytest.raises(type(cpu_err.value)) as dev_err:
        dev_call()
    assert str(dev_err.value) == str(cpu_err.value)


ERRORS = [
    ("length mismatch", lambda s, o: torch._foreach_add_(s, o[:2])),
    ("scalar list length", lambda s, o: torch._foreach_mul_(s, [1.0, 2.0])),
    ("not a 0-dim tensor", lambda s, o: torch._foreach_mul_(s, o[0])),
    ("in place onto a broadcast", lambda s, o: torch._foreach_add_([s[0].expand(3, 5, 3)], [o[0].expand(3, 5, 3)])),
    ("broadcast other", lambda s, o: torch._foreach_add_(s[:1], [o[0].unsqueeze(-1).expand(5, 3, 2)])),
    ("functional add length", lambda s, o: torch._foreach_add(s, o[1:], alpha=2)),
    ("maximum_ length", lambda s, o: torch._foreach_maximum_(s[:3], o)),
    ("maximum_ onto a broadcast", lambda s, o: torch._foreach_maximum_([s[1].expand(2, 17)], [o[1]])),
    ("neg of a bool tensor", lambda s, o: torch._foreach_neg([s[0], o[0] > 0])),
]


@pytest.mark.parametrize("case,call", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_at_the_call_as_cpu(case, call):
    cpu_s, cpu_o = _make(), _make(seed=5)
    dev_s, dev_o = _dev(cpu_s), _dev(cpu_o)
    _expect_same_error(lambda: call(cpu_s, cpu_o), lambda: call(dev_s, dev_o))
    _assert_same(dev_s, cpu_s)
    _assert_same(dev_o, cpu_o)


def test_in_place_cast_error_writes_the_tensors_before_it_as_cpu():
    """CPU's loop writes the tensors before the one whose in-place result type cannot be cast."""
    make = lambda: [torch.ones(3), torch.ones(2) * 2, torch.arange(3), torch.ones(4)]  # noqa: E731
    cpu, dev = make(), _dev(make())
    _expect_same_error(lambda: torch._foreach_mul_(cpu, 1.5), lambda: torch._foreach_mul_(dev, 1.5))
    _assert_same(dev, cpu)
    # and the queue goes on
    torch._foreach_add_(cpu, 1)
    torch._foreach_add_(dev, 1)
    _assert_same(dev, cpu)


def test_maximum_in_place_cast_error_writes_the_tensors_before_it_as_cpu():
    """amsgrad's maximum_ is CPU's clamp_min_ per tensor: an integer self with a float other
    raises at that index, after the tensors before it are written."""
    make = lambda: [torch.zeros(3) - 1, torch.arange(3) - 1, torch.zeros(2)]  # noqa: E731
    other = [torch.full((3,), 0.5), torch.full((3,), 0.5), torch.ones(2)]
    cpu, dev = make(), _dev(make())
    _expect_same_error(lambda: torch._foreach_maximum_(cpu, other), lambda: torch._foreach_maximum_(dev, _dev(other)))
    _assert_same(dev, cpu)


def test_maximum_and_functional_add_with_nan_and_mixed_dtypes_equal_to_cpu():
    nan = float("nan")
    s = [torch.tensor([nan, 1.0, -2.0]), torch.tensor([3, -4]), torch.tensor([0.5, nan], dtype=torch.float16)]
    o = [torch.tensor([0.0, nan, -1.0]), torch.tensor([-1, 5]), torch.tensor([nan, 0.25], dtype=torch.float16)]
    want_sum = torch._foreach_add(s, o, alpha=2)
    got_sum = torch._foreach_add(_dev(s), _dev(o), alpha=2)
    for g, w in zip(got_sum, want_sum):
        assert g.dtype == w.dtype and torch.equal(g.cpu().nan_to_num(7.0), w.nan_to_num(7.0))
    dev = _dev(s)
    torch._foreach_maximum_(s, o)
    torch._foreach_maximum_(dev, _dev(o))
    for g, w in zip(dev, s):
        assert torch.equal(g.cpu().nan_to_num(7.0), w.nan_to_num(7.0))


def test_tensor_on_another_device_as_cpu():
    cpu = _make()
    dev = _dev(cpu)
    with pytest.raises(Exception):
        torch._foreach_add_(dev, [dev[0], cpu[1], dev[2], dev[3]])


def test_functional_sqrt_is_differentiable_as_cpu(cpu_math):
    cpu = [t.abs().add(0.5).requires_grad_() for t in _make()]
    dev = [t.detach().to(DEVICE).requires_grad_() for t in cpu]
    for xs in (cpu, dev):
        out = torch._foreach_sqrt(xs)
        sum(o.sum() for o in out).backward()
    _assert_same([d.grad for d in dev], [c.grad for c in cpu])


def test_in_place_foreach_on_leaf_requiring_grad_raises_as_cpu():
    cpu = [torch.ones(3, requires_grad=True)]
    dev = [torch.ones(3, device=DEVICE, requires_grad=True)]
    _expect_same_error(lambda: torch._foreach_mul_(cpu, 2.0), lambda: torch._foreach_mul_(dev, 2.0))


def test_each_tensors_chain_fuses_as_when_recorded_per_tensor():
    """The expanded nodes are the per-tensor calls' nodes: the same regions and the same ops
    run by the host (the 0-dim tensor's); the foreach node never reaches the executor."""
    state = [_dev(_make(seed=s, positive=True)) for s in (0, 10, 20)]

    def per_tensor(s, a, b):  # the calls CPU's foreach loop makes
        for x, y, z in zip(s, a, b):
            torch.ops.aten.mul_.Scalar(x, 0.9)
            x.addcmul_(y, z, value=0.1)
            torch.ops.aten.add_.Scalar(x, 1e-3)

    def foreach(s, a, b):
        torch._foreach_mul_(s, 0.9)
        torch._foreach_addcmul_(s, a, b, 0.1)
        torch._foreach_add_(s, 1e-3)

    assert _flush_counts(per_tensor, state) == _flush_counts(foreach, state)


def _flush_counts(fn, state):
    """The ops the host runs, regions, library calls and ops executed by the flush after ``fn(*state)``."""
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    fn(*state)
    ran = aten_ops_during(torch.tpu.synchronize)
    m = torch_tpu_eager.metrics()
    return sorted(set(ran)), m["regions_run"], m["library_calls"], m["ops_executed"]


def test_amsgrad_decay_and_maximize_chains_fuse_as_when_recorded_per_tensor():
    """Weight decay's functional add, amsgrad's maximum_ (CPU's clamp_min_ per tensor) and
    maximize's neg expand into the nodes of the per-tensor calls CPU's loop makes."""
    state = [_dev(_make(seed=s, positive=True)) for s in (0, 10, 20)]

    def per_tensor(s, a, b):
        grads = [x.add(y, alpha=0.1) for x, y in zip(a, s)]
        grads = [g.neg() for g in grads]
        for m, g in zip(b, grads):
            m.clamp_min_(g)

    def foreach(s, a, b):
        grads = torch._foreach_add(a, s, alpha=0.1)
        grads = torch._foreach_neg(grads)
        torch._foreach_maximum_(b, grads)

    assert _flush_counts(per_tensor, state) == _flush_counts(foreach, state)


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
    "adam_amsgrad_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True, foreach=True),
    "adam_maximize_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, maximize=True, foreach=True),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "sgd_nesterov_wd": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2, foreach=True
    ),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_foreach_steps_bit_equal_to_cpu(name, cpu_math):
    cpu = [torch.nn.Parameter(t) for t in _make(seed=1)]
    dev = [torch.nn.Parameter(t.detach().to(DEVICE)) for t in cpu]
    opts = [OPTIMIZERS[name](cpu), OPTIMIZERS[name](dev)]
    for step in range(3):
        for ps, opt in zip((cpu, dev), opts):
            for i, p in enumerate(ps):
                g = _make(seed=100 * step + 7)[i]
                p.grad = g.to(p.device)
            torch.nn.utils.clip_grad_norm_(ps, 0.5, foreach=True)
            opt.step()
        _assert_same([p.detach() for p in dev], [p.detach() for p in cpu])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_records_the_same_ops_for_more_parameters(name):
    """Every foreach call of the optimizers' foreach paths (amsgrad's maximum_, weight decay's
    functional add and maximize's neg too) records one op whatever the number of parameters
    (fails on main for adam_amsgrad_wd, adam_maximize_wd, adamw_amsgrad and sgd_nesterov_wd)."""
    recorded = []
    for copies in (1, 3):
        ps = [torch.nn.Parameter(t.to(DEVICE)) for _ in range(copies) for t in _make(seed=1)]
        opt = OPTIMIZERS[name](ps)
        for step in range(2):
            for p in ps:
                p.grad = torch.full_like(p, 0.5 + step)
            torch.tpu.synchronize()
            if step == 1:
                recorded.append(_ops_recorded(opt.step))
            else:
                opt.step()
    assert recorded[0] == recorded[1], recorded


def test_scalar_list_values_do_not_rerun_inference():
    """A Scalar[] keys the meta cache by type, as a Scalar does: Adam's bias corrections change
    every step, and a new value must not run CPU's kernel on twins again (fails on the first
    version of this change: every AdamW step re-inferred its ScalarList ops)."""
    xs = _dev(_make(positive=True))
    torch._foreach_div_(xs, [0.5, 0.6, 0.7, 0.8])
    torch.tpu.synchronize()
    ran = aten_ops_during(lambda: torch._foreach_div_(xs, [1.5, 1.6, 1.7, 1.8]))
    assert ran == ["aten::_foreach_div_"], ran
