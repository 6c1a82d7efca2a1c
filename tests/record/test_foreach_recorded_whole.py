"""clip_grad_norm_'s multi-tensor ops recorded as one op each (the op table's
COMPOSITE_RECORDED, tools/gen_op_table.py): ``_foreach_norm.Scalar`` and ``stack``
record one node over all their tensors instead of one ``linalg_vector_norm`` per
tensor and an ``unsqueeze`` per tensor plus a ``cat``. CPU's kernel on zero-filled
twins infers them (kInferOnCpu), so CPU's call-time errors hold; the flush runs the
foreach norm through the host's norm kernel per tensor (executors/direct_kernels.cpp,
``foreach_norm``). Values, dtypes and shapes equal CPU's."""

import pytest
import torch
import torch_tpu_eager

from difftest import DEVICE, aten_ops_during

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="what the tpu device records and its flush runs")


def _spread(shape, dtype, seed):
    """randn values scaled over 2^-10..2^10 (sums whose bits depend on the order)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-10, 11, shape, generator=g).double())
    return x.to(dtype)


LISTS = {
    "f32": [((65, 64), torch.float32), ((64,), torch.float32), ((3,), torch.float32), ((1,), torch.float32)],
    "f64": [((12, 7), torch.float64), ((31,), torch.float64)],
    "bf16": [((12, 7), torch.bfloat16), ((31,), torch.bfloat16)],
    "mixed": [((12, 7), torch.float32), ((31,), torch.float64), ((4, 4), torch.bfloat16), ((10,), torch.float16)],
    "one": [((37,), torch.float32)],
    "empty_tensor": [((0,), torch.float32), ((5,), torch.float32)],
    "zero_dim": [((), torch.float32), ((2,), torch.float32)],
}


def _list(name):
    return [_spread(s, d, seed=i) for i, (s, d) in enumerate(LISTS[name])]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == DEVICE and g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.cpu(), w), (g.cpu(), w)


@pytest.mark.parametrize("name", list(LISTS))
@pytest.mark.parametrize("ord", [2, 2.0, 1, float("inf"), 3, 0])
def test_foreach_norm_equal_to_cpu(name, ord):
    xs = _list(name)
    if ord == float("inf") and name == "empty_tensor":
        pytest.skip("raises: test_foreach_norm_errors_at_the_call")
    _assert_same(torch._foreach_norm([x.to(DEVICE) for x in xs], ord), torch._foreach_norm(xs, ord))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_foreach_norm_dtype_argument(dtype):
    xs = _list("f32")
    _assert_same(
        torch._foreach_norm([x.to(DEVICE) for x in xs], 2, dtype=dtype), torch._foreach_norm(xs, 2, dtype=dtype)
    )


def test_foreach_norm_of_views_and_non_contiguous():
    base = _spread((40, 24), torch.float32, seed=7)
    views = lambda b: [b.t(), b[::3], b[5:9, 2:20], b[:, 1], b.view(-1)[7:200], b[0:1].expand(6, 24)]  # noqa: E731
    dev = base.to(DEVICE)
    _assert_same(torch._foreach_norm(views(dev)), torch._foreach_norm(views(base)))


def test_foreach_norm_reads_the_values_before_a_later_in_place_write():
    """The node reads its tensors as they were at the call: an in-place write to a view of
    them after the call (before the flush) does not change the recorded norms."""
    base = _spread((16, 8), torch.float32, seed=3)
    dev = base.to(DEVICE)
    want = torch._foreach_norm([base[:4], base.t()])
    got = torch._foreach_norm([dev[:4], dev.t()])
    dev[:2].mul_(3.0)
    base[:2].mul_(3.0)
    _assert_same(got, want)
    assert torch.equal(dev.cpu(), base)


def test_foreach_norm_is_one_recorded_op():
    xs = [x.to(DEVICE) for x in _list("f32")]
    torch.tpu.synchronize()
    assert _ops_recorded(lambda: torch._foreach_norm(xs)) == 1  # fails on main: one per tensor
    ran = aten_ops_during(torch.tpu.synchronize)
    # The flush runs the host's norm kernel on the float32 2-norms (none of CPU's norm ops)
    # where CPU's norm kernel is the AVX2 one it reproduces.
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert not any("norm" in op for op in ran), ran


@pytest.mark.parametrize(
    "make,ord",
    [
        (lambda: [torch.arange(3)], 2),  # integer input
        (lambda: [torch.ones(3), torch.arange(3)], 2),
        (lambda: [torch.empty(0), torch.ones(2)], float("inf")),  # no identity for the inf norm
        (lambda: [torch.ones(2, dtype=torch.float64)], 2),  # dtype argument narrower than the input
    ],
)
def test_foreach_norm_errors_at_the_call(make, ord):
    kw = {"dtype": torch.float32} if make()[0].dtype == torch.float64 else {}
    with pytest.raises(Exception) as cpu_err:
        torch._foreach_norm(make(), ord, **kw)
    dev = [t.to(DEVICE) for t in make()]
    torch.tpu.synchronize()
    with pytest.raises(type(cpu_err.value)) as dev_err:
        torch._foreach_norm(dev, ord, **kw)
    assert str(dev_err.value) == str(cpu_err.value)
    assert torch_tpu_eager._C._pending_ops() == 0  # nothing recorded


STACKS = {
    "scalars": ([(), (), ()], [torch.float32] * 3),
    "matrices": ([(3, 4)] * 4, [torch.float32] * 4),
    "promoted": ([(5,), (5,), (5,)], [torch.float32, torch.float64, torch.bfloat16]),
    "ints": ([(2, 3), (2, 3)], [torch.int64, torch.int32]),
    "empty": ([(0, 3), (0, 3)], [torch.float32] * 2),
}


@pytest.mark.parametrize("name", list(STACKS))
@pytest.mark.parametrize("dim", [0, -1, 1])
def test_stack_equal_to_cpu(name, dim):
    shapes, dtypes = STACKS[name]
    xs = [_spread(s, torch.float64, seed=i).to(d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    if dim == 1 and not shapes[0]:
        dim = 0
    want = torch.stack(xs, dim)
    got = torch.stack([x.to(DEVICE) for x in xs], dim)
    _assert_same([got], [want])


def _ops_recorded(fn):
    """How many ops ``fn()`` records on the device."""
    before = torch_tpu_eager.metrics()["ops_recorded"]
    fn()
    return torch_tpu_eager.metrics()["ops_recorded"] - before


def test_stack_of_views_is_one_recorded_op():
    base = _spread((6, 6), torch.float32, seed=1)
    dev = base.to(DEVICE)
    views = [dev.t(), dev[::2].repeat(2, 1)[:6], dev[:, 1:4].expand(2, 6, 3).reshape(6, 6)]
    got = []
    assert _ops_recorded(lambda: got.append(torch.stack(views, 1))) == 1
    _assert_same(
        got, [torch.stack([base.t(), base[::2].repeat(2, 1)[:6], base[:, 1:4].expand(2, 6, 3).reshape(6, 6)], 1)]
    )


@pytest.mark.parametrize(
    "make,dim",
    [
        (lambda: [torch.zeros(2), torch.zeros(3)], 0),
        (lambda: [torch.zeros(2)], 3),
        (lambda: [torch.zeros(2, 2), torch.zeros(2, 2).t()], -4),
    ],
)
def test_stack_errors_at_the_call(make, dim):
    with pytest.raises(Exception) as cpu_err:
        torch.stack(make(), dim)
    dev = [t.to(DEVICE) for t in make()]
    with pytest.raises(type(cpu_err.value)) as dev_err:
        torch.stack(dev, dim)
    assert str(dev_err.value) == str(cpu_err.value)


def test_stack_out_equal_to_cpu():
    xs = [_spread((3, 2), torch.float32, seed=i) for i in range(3)]
    want = torch.empty(3, 3, 2)
    torch.stack(xs, out=want)
    got = torch.empty(3, 3, 2, device=DEVICE)
    torch.stack([x.to(DEVICE) for x in xs], out=got)
    _assert_same([got], [want])


@pytest.mark.parametrize("foreach", [None, True, False])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("name", ["f32", "mixed", "bf16"])
def test_clip_grad_norm_equal_to_cpu(name, norm_type, foreach):
    grads = [g for g in _list(name)]
    cpu_params = [torch.zeros_like(g).requires_grad_() for g in grads]
    dev_params = [torch.zeros_like(g, device=DEVICE).requires_grad_() for g in grads]
    for p, q, g in zip(cpu_params, dev_params, grads):
        p.grad = g.clone()
        q.grad = g.to(DEVICE)
    want = torch.nn.utils.clip_grad_norm_(cpu_params, 0.5, norm_type=norm_type, foreach=foreach)
    got = torch.nn.utils.clip_grad_norm_(dev_params, 0.5, norm_type=norm_type, foreach=foreach)
    _assert_same([got], [want])
    _assert_same([q.grad for q in dev_params], [p.grad for p in cpu_params])


def test_clip_grad_norm_records_one_norm_op_and_one_stack():
    """The foreach path records one _foreach_norm and one stack (fails on main: a norm per
    gradient, and the stack as a cat)."""
    params = [torch.zeros(4, 3, device=DEVICE, requires_grad=True) for _ in range(6)]
    for i, p in enumerate(params):
        p.grad = _spread((4, 3), torch.float32, seed=i).to(DEVICE)
    torch.nn.utils.clip_grad_norm_(params, 1.0)  # first call: CPU infers on twins
    torch.tpu.synchronize()
    recorded = aten_ops_during(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))
    assert recorded.count("aten::linalg_vector_norm") == 1, recorded  # the total norm
    assert "aten::unsqueeze" not in recorded and "aten::cat" not in recorded, recorded
