"""out= arguments that are views, empty or resized: values written where CPU writes them,
and the out tensor's shape, strides and offset afterwards as on CPU.

CPU keeps an out= tensor's geometry when it has the result's shape (the range factories:
when it has the result's numel) and writes through its strides; a resized out= tensor of
a structured (TensorIterator) kernel takes its inputs' layout."""

import warnings

import pytest
import torch

from difftest import cpu_randn, run_both, run_both_outcome


def _x(d, *shape, seed=0):
    return cpu_randn(*shape, seed=seed).to(d)


def _long0(d):
    return torch.empty(0, dtype=torch.long, device=d)


# name -> (fn(device, out) -> None, out shape)
OUT_OPS = {
    "arange": (lambda d, o: torch.arange(0, o.numel(), out=o), (2, 2)),
    "arange_step": (lambda d, o: torch.arange(1, 1 + 2 * o.numel(), 2, out=o), (2, 3)),
    "linspace": (lambda d, o: torch.linspace(0, 1, o.numel(), out=o), (2, 3)),
    "logspace": (lambda d, o: torch.logspace(0, 1, o.numel(), out=o), (2, 3)),
    "zeros": (lambda d, o: torch.zeros(o.shape, out=o), (2, 3)),
    "full": (lambda d, o: torch.full(o.shape, 3.0, out=o), (2, 3)),
    "eye": (lambda d, o: torch.eye(3, out=o), (3, 3)),
    "add": (lambda d, o: torch.add(_x(d, 2, 3), _x(d, 2, 3, seed=1), out=o), (2, 3)),
    "neg": (lambda d, o: torch.neg(_x(d, 2, 3), out=o), (2, 3)),
    "where": (lambda d, o: torch.where(_x(d, 2, 3) > 0, _x(d, 2, 3), _x(d, 2, 3, seed=1), out=o), (2, 3)),
    "clamp": (lambda d, o: torch.clamp(_x(d, 2, 3), -0.5, 0.5, out=o), (2, 3)),
    "sum_dim": (lambda d, o: torch.sum(_x(d, 2, 3, 4), 2, out=o), (2, 3)),
    "mean_dim": (lambda d, o: torch.mean(_x(d, 2, 3, 4), 2, out=o), (2, 3)),
    "amax": (lambda d, o: torch.amax(_x(d, 2, 3, 4), 2, out=o), (2, 3)),
    "logsumexp": (lambda d, o: torch.logsumexp(_x(d, 2, 3, 4), 2, out=o), (2, 3)),
    "std": (lambda d, o: torch.std(_x(d, 2, 3, 4), 2, out=o), (2, 3)),
    "norm": (lambda d, o: torch.linalg.vector_norm(_x(d, 2, 3, 4), dim=2, out=o), (2, 3)),
    "cumsum": (lambda d, o: torch.cumsum(_x(d, 2, 3), 1, out=o), (2, 3)),
    "cat": (lambda d, o: torch.cat([_x(d, 1, 3), _x(d, 1, 3, seed=1)], out=o), (2, 3)),
    "cat_dim1": (lambda d, o: torch.cat([_x(d, 2, 1), _x(d, 2, 2, seed=1)], 1, out=o), (2, 3)),
    "stack": (lambda d, o: torch.stack([_x(d, 3), _x(d, 3, seed=1)], out=o), (2, 3)),
    "mm": (lambda d, o: torch.mm(_x(d, 2, 4), _x(d, 4, 3, seed=1), out=o), (2, 3)),
    "bmm": (lambda d, o: torch.bmm(_x(d, 2, 2, 4), _x(d, 2, 4, 3, seed=1), out=o), (2, 2, 3)),
    "addmm": (lambda d, o: torch.addmm(_x(d, 2, 3, seed=2), _x(d, 2, 4), _x(d, 4, 3, seed=1), out=o), (2, 3)),
    "sort": (lambda d, o: torch.sort(_x(d, 2, 3), out=(o, _long0(d))), (2, 3)),
    "topk": (lambda d, o: torch.topk(_x(d, 2, 5), 3, out=(o, _long0(d))), (2, 3)),
    "max_dim": (lambda d, o: torch.max(_x(d, 2, 3, 4), 2, out=(o, _long0(d))), (2, 3)),
    "median_dim": (lambda d, o: torch.median(_x(d, 2, 3, 5), 2, out=(o, _long0(d))), (2, 3)),
    "kthvalue": (lambda d, o: torch.kthvalue(_x(d, 2, 3, 5), 2, 2, out=(o, _long0(d))), (2, 3)),
    "cummax": (lambda d, o: torch.cummax(_x(d, 2, 3), 1, out=(o, _long0(d))), (2, 3)),
    "index_select": (lambda d, o: torch.index_select(_x(d, 4, 3), 0, torch.tensor([2, 0], device=d), out=o), (2, 3)),
    "gather": (
        lambda d, o: torch.gather(_x(d, 2, 3), 1, torch.tensor([[2, 0, 1], [1, 1, 0]], device=d), out=o),
        (2, 3),
    ),
    "tril": (lambda d, o: torch.tril(_x(d, 3, 3), out=o), (3, 3)),
    "nonzero": (lambda d, o: torch.nonzero(torch.tensor([[1, 0, 1], [0, 1, 1]], device=d), out=o), (4, 2)),
    "masked_select": (
        lambda d, o: torch.masked_select(
            _x(d, 2, 3), torch.tensor([[True, False, True], [True, True, True]], device=d), out=o
        ),
        (5,),
    ),
}


def _out_view(d, shape, kind, dtype=torch.float32):
    """(base, view of base with `shape`): a narrow, a transpose or a stepped slice."""
    if kind == "narrow":
        base = torch.full(tuple(shape[:-1]) + (shape[-1] + 2,), -1.0, device=d).to(dtype)
        return base, base.narrow(-1, 1, shape[-1])
    if kind == "transposed":
        base = torch.full(tuple(reversed(shape)), -1.0, device=d).to(dtype)
        return base, base.permute(*reversed(range(len(shape))))
    base = torch.full(tuple(shape[:-1]) + (shape[-1] * 2,), -1.0, device=d).to(dtype)
    return base, base[..., ::2]


@pytest.mark.parametrize("kind", ["narrow", "transposed", "stepped"])
@pytest.mark.parametrize("op", sorted(OUT_OPS))
def test_out_view_writes_where_cpu_writes(dev, op, kind):
    fn, shape = OUT_OPS[op]

    def prog(d):
        base, o = _out_view(d, shape, kind, torch.long if op == "nonzero" else torch.float32)
        fn(d, o)
        return base, o

    run_both_outcome(prog, dev)


def test_issue_repro_arange_narrow(dev):
    def prog(d):
        x = torch.zeros(2, 3, device=d)
        torch.arange(0, 4, out=x.narrow(1, 1, 2))
        return x

    assert run_both(prog, dev).value.tolist() == [[0.0, 0.0, 1.0], [0.0, 2.0, 3.0]]


RANGE_RESIZES = {
    "arange_fewer": lambda b: torch.arange(3, out=b.narrow(1, 1, 2)),
    "arange_more": lambda b: torch.arange(6, out=b[:, ::2][:1]),
    "arange_into_empty": lambda b: torch.arange(5, out=b[0, :0]),
    "arange_to_zero": lambda b: torch.arange(0, out=b.narrow(1, 1, 2)),
    "arange_grows_storage": lambda b: torch.arange(40, out=torch.zeros(2, 3, device=b.device)),
    "linspace_strided_1d": lambda b: torch.linspace(0, 1, 4, out=b[:, 1]),
    "linspace_resized": lambda b: torch.linspace(0, 1, 7, out=b[:, 1]),
    "logspace_transposed": lambda b: torch.logspace(0, 2, 20, out=b.t()),
    "range_transposed": lambda b: torch.range(0, 19, out=b.t()),
    "arange_int_transposed": lambda b: torch.arange(6, out=torch.zeros(2, 3, dtype=torch.long, device=b.device).t()),
}


@pytest.mark.parametrize("case", sorted(RANGE_RESIZES))
def test_range_factory_out_geometry_and_warning(dev, case):
    """Same numel: the out keeps its geometry; other numel: resize_ to [n] at its offset,
    and arange (only) warns as CPU's kernel does."""

    def prog(d):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            base = torch.full((4, 5), -1.0, device=d)
            o = RANGE_RESIZES[case](base)
        msgs = [str(x.message) for x in w if "out tensor" in str(x.message)]
        return base, o, o.stride(), o.storage_offset(), [m.split(" (Triggered")[0] for m in msgs]

    run_both_outcome(prog, dev)


# Empty or wrongly shaped out= tensors: CPU restrides a resized out of a structured
# kernel like its inputs (transposed, channels_last); fft / batch_norm keep contiguous.
def _cl(d):
    return _x(d, 2, 3, 2, 4).to(memory_format=torch.channels_last)


RESIZED_OUT = {
    "neg_transposed": lambda d, o: torch.neg(_x(d, 3, 4).t(), out=o),
    "add_transposed": lambda d, o: torch.add(_x(d, 3, 4).t(), 1, out=o),
    "add_channels_last": lambda d, o: torch.add(_cl(d), 1, out=o),
    "exp_permuted": lambda d, o: torch.exp(_x(d, 2, 3, 4).permute(2, 0, 1), out=o),
    "mul_broadcast": lambda d, o: torch.mul(_x(d, 3, 1), _x(d, 4, 1).t(), out=o),
    "where_transposed": lambda d, o: torch.where(
        _x(d, 3, 4).t() > 0, _x(d, 4, 3), torch.zeros(4, 3, device=d).t().t(), out=o
    ),
    "clamp_channels_last": lambda d, o: torch.clamp(_cl(d), -0.1, 0.1, out=o),
    "lerp_transposed": lambda d, o: torch.lerp(_x(d, 3, 4).t(), _x(d, 4, 3), 0.3, out=o),
    "addcmul_transposed": lambda d, o: torch.addcmul(_x(d, 3, 4).t(), _x(d, 4, 3), _x(d, 4, 3, seed=1), out=o),
    "atan2_transposed": lambda d, o: torch.atan2(_x(d, 3, 4).t(), _x(d, 3, 4, seed=1).t(), out=o),
    "sum_transposed": lambda d, o: torch.sum(_x(d, 3, 4).t(), 1, out=o),
    "mm": lambda d, o: torch.mm(_x(d, 3, 4), _x(d, 4, 2), out=o),
    "cumsum_transposed": lambda d, o: torch.cumsum(_x(d, 3, 4).t(), 0, out=o),
    "cat_channels_last": lambda d, o: torch.cat([_cl(d), _cl(d)], 1, out=o),
}


def test_resized_fft_out_is_contiguous(dev):
    """fft's out= kernel computes the result, then resize_output + copy: contiguous."""

    def prog(d):
        o = torch.empty(0, dtype=torch.complex64, device=d)
        torch.fft.fft(_x(d, 3, 4).t().to(torch.complex64), out=o)
        return o, o.stride()

    run_both(prog, dev, check_stride=True)


@pytest.mark.parametrize("out_numel", [0, 5])
@pytest.mark.parametrize("case", sorted(RESIZED_OUT))
def test_resized_out_strides(dev, case, out_numel):
    def prog(d):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            o = torch.empty(out_numel, device=d)
            RESIZED_OUT[case](d, o)
        return o, o.stride()

    run_both(prog, dev, check_stride=True)


def test_empty_out_then_view_raises_as_cpu(dev):
    """A transposed layout survives: .view(-1) raises on both devices."""

    def prog(d):
        o = torch.empty(0, device=d)
        torch.neg(_x(d, 3, 4).t(), out=o)
        return o.view(-1)

    assert run_both_outcome(prog, dev) is not None


STRIDE_CASES = {
    "flip_size1": lambda d: torch.flip(_x(d, 1, 3, 1, 4), [0, 2]),
    "flip_transposed": lambda d: torch.flip(_x(d, 3, 1, 4).transpose(0, 2), [1]),
    "flip_channels_last": lambda d: torch.flip(_cl(d), [1]),
    "sort_size1": lambda d: torch.sort(_x(d, 1, 3, 1), 1),
    "sort_transposed": lambda d: torch.sort(_x(d, 3, 4).t(), 0),
    "sort_channels_last": lambda d: torch.sort(_cl(d), 1),
    "sort_stable_size1": lambda d: torch.sort(_x(d, 2, 1, 3).transpose(0, 2), dim=0, stable=True),
    "argsort_transposed": lambda d: torch.argsort(_x(d, 3, 4).t(), 1),
    "topk_transposed": lambda d: torch.topk(_x(d, 4, 5).t(), 2, 0),
    "topk_size1": lambda d: torch.topk(_x(d, 1, 5, 1), 2, 1),
    "cumsum_transposed": lambda d: torch.cumsum(_x(d, 3, 4).t(), 0),
    "cumsum_channels_last": lambda d: torch.cumsum(_cl(d), 1),
    "add_channels_last": lambda d: _cl(d) + 1,
    "add_mixed": lambda d: _x(d, 3, 4).t() + _x(d, 4, 3),
    "clone_channels_last": lambda d: _cl(d).clone(),
    "empty_like_transposed": lambda d: torch.empty_like(_x(d, 3, 4).t()).fill_(0),
    "sizes1_channels_last": lambda d: _x(d, 1, 4, 1, 1).to(memory_format=torch.channels_last) * 2,
    "sort_out_empty": lambda d: torch.sort(_x(d, 3, 4).t(), 0, out=(torch.empty(0, device=d), _long0(d))),
    "topk_out_empty": lambda d: torch.topk(_x(d, 4, 5).t(), 2, 0, out=(torch.empty(0, device=d), _long0(d))),
    "roll_transposed": lambda d: torch.roll(_x(d, 3, 4).t(), 1, 0),
    "softmax_transposed": lambda d: torch.softmax(_x(d, 3, 4).t(), 0),
    "max_dim_permuted": lambda d: torch.max(_x(d, 3, 4, 2).permute(2, 0, 1), 1),
    "kthvalue_transposed": lambda d: torch.kthvalue(_x(d, 3, 4).t(), 2, 0),
    "cummax_transposed": lambda d: torch.cummax(_x(d, 3, 4).t(), 0),
}


@pytest.mark.parametrize("case", sorted(STRIDE_CASES))
def test_result_strides_match_cpu(dev, case):
    run_both(lambda d: STRIDE_CASES[case](d), dev, check_stride=True)


@pytest.mark.parametrize("op", ["add", "eq", "exp", "mul_scalar"])
@pytest.mark.parametrize("layout", ["dense", "sliced", "size1_sliced"])
def test_strides_follow_every_input_permutation(dev, op, layout):
    """Functional and out=empty results of elementwise ops over every permutation of a
    dense, a sliced and a sliced-with-size-1-dims input, one- and two-sided broadcasts:
    CPU's strides (TensorIterator's layout rule)."""
    import itertools

    fns = {
        "add": torch.add,
        "eq": torch.eq,
        "exp": lambda a, out=None: torch.exp(a, out=out),
        "mul_scalar": lambda a, out=None: torch.mul(a, 2, out=out),
    }
    binary = op in ("add", "eq")

    def prog(d):
        base = {
            "dense": lambda: _x(d, 2, 3, 4),
            "sliced": lambda: _x(d, 2, 3, 8)[:, :, ::2],
            "size1_sliced": lambda: _x(d, 1, 1, 4, 12)[:, :, :, ::2],
        }[layout]()
        seen = []
        for p in itertools.permutations(range(base.dim())):
            xp = base.permute(p)
            cases = [(xp, xp), (xp, _x(d, xp.size(-1))), (_x(d, xp.size(-1)), xp)] if binary else [(xp,)]
            for args in cases:
                r = fns[op](*args)
                o = torch.empty(0, dtype=r.dtype, device=d)
                fns[op](*args, out=o)
                seen.append((r.shape, r.stride(), o.stride()))
        return seen

    run_both(prog, dev)


@pytest.mark.parametrize(
    "op", ["flip", "flip_all", "sort", "sort_stable", "argsort", "tril", "triu", "log_softmax", "masked_fill"]
)
@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (3, 1, 0, 2), (2, 0, 3, 1)])
def test_size1_dim_strides_after_flip_sort(dev, op, perm):
    """Permuted inputs with size-1 dims: flip / sort keep self's strides (empty_like
    with Preserve), tril / triu / log_softmax / masked_fill are contiguous, size-1 dims
    included."""
    fns = {
        "flip": lambda t: torch.flip(t, [1]),
        "flip_all": lambda t: torch.flip(t, [0, 1, 2, 3]),
        "sort": lambda t: torch.sort(t, 2),
        "sort_stable": lambda t: torch.sort(t, dim=1, stable=True),
        "argsort": lambda t: torch.argsort(t, 0),
        "tril": torch.tril,
        "triu": lambda t: torch.triu(t, 1),
        "log_softmax": lambda t: torch.log_softmax(t, 0),
        "masked_fill": lambda t: t.masked_fill(t > 0, 1.0),
    }

    def prog(d):
        t = _x(d, 3, 1, 2, 3).permute(*perm)
        r = fns[op](t)
        return [(x, x.stride()) for x in (r if isinstance(r, tuple) else (r,))]

    run_both(prog, dev, check_stride=True)


@pytest.mark.parametrize("layout", ["transposed_3d", "channels_last", "permuted_4d"])
def test_batch_norm_output_layout(dev, layout):
    """CPU's batch norm allocates in input.suggest_memory_format()."""

    def prog(d):
        x = {
            "transposed_3d": lambda: _x(d, 5, 5, 5).mT.contiguous().mT,
            "channels_last": lambda: _cl(d),
            "permuted_4d": lambda: _x(d, 2, 3, 4, 5).permute(0, 1, 3, 2),
        }[layout]()
        r = torch.nn.functional.batch_norm(x, None, None, training=True)
        return r, r.stride()

    run_both(prog, dev, check_stride=True)


# Structured elementwise ops whose Python reference lays out a mixed-layout result
# (a transposed operand with a contiguous one, size-1 dims, channels-last with a
# contiguous operand) differently from CPU's TensorIterator: the result takes the
# strides of the C++ meta function CPU's kernel runs.
MIXED_LAYOUT_OPS = {
    "copysign": torch.copysign,
    "clamp_tensor": lambda a, b: a.clamp(min=b),
    "atan2": torch.atan2,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "where_0dim": lambda a, b: torch.where(a > 0, a, b[(0,) * b.dim()]),
    "hypot": torch.hypot,
    "fmod": torch.fmod,
    "maximum": torch.maximum,
    "xlogy": torch.xlogy,
    "lerp_tensor": lambda a, b: torch.lerp(a, b, b),
    "heaviside": torch.heaviside,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}
MIXED_LAYOUTS = {
    "transposed_3d": lambda d: (_x(d, 3, 1, 2).transpose(0, 2), _x(d, 2, 1, 3, seed=1)),
    "transposed_4d_size1": lambda d: (_x(d, 2, 1, 3, 1).transpose(0, 3), _x(d, 1, 3, 1, 2, seed=1)),
    "channels_last_size1": lambda d: (
        _x(d, 1, 3, 1, 2).contiguous(memory_format=torch.channels_last),
        _x(d, 1, 3, 1, 2, seed=1),
    ),
    "second_transposed": lambda d: (_x(d, 2, 1, 3, seed=1), _x(d, 3, 1, 2).transpose(0, 2)),
}


@pytest.mark.parametrize("layout", sorted(MIXED_LAYOUTS))
@pytest.mark.parametrize("op", sorted(MIXED_LAYOUT_OPS))
def test_mixed_layout_elementwise_strides(dev, op, layout):
    run_both(lambda d: MIXED_LAYOUT_OPS[op](*MIXED_LAYOUTS[layout](d)), dev, check_stride=True)


# roll along dims is CPU's cat of two narrowed views of self: the result is in their
# common suggest_memory_format (channels-last stays channels-last unless a piece is
# empty or ambiguous); roll without dims rolls the flattened tensor (contiguous).
ROLL_INPUTS = {
    "channels_last": lambda d: _cl(d),
    "channels_last_size1": lambda d: _x(d, 1, 3, 1, 2).contiguous(memory_format=torch.channels_last),
    "channels_last_3d": lambda d: _x(d, 2, 3, 2, 2, 2).contiguous(memory_format=torch.channels_last_3d),
    "transposed": lambda d: _x(d, 3, 4).t(),
    "permuted_size1": lambda d: _x(d, 2, 1, 3, 1).permute(3, 1, 2, 0),
}
ROLLS = {
    "dim0": lambda x: x.roll(1, 0),
    "dim1": lambda x: x.roll(1, 1),
    "flat": lambda x: x.roll(3),
    "two_dims": lambda x: x.roll((1, 2), (0, 1)),
    "last_neg": lambda x: x.roll(-1, -1),
    "full_turn": lambda x: x.roll(x.shape[-1], -1),
}


@pytest.mark.parametrize("roll", sorted(ROLLS))
@pytest.mark.parametrize("inp", sorted(ROLL_INPUTS))
def test_roll_result_layout(dev, inp, roll):
    run_both(lambda d: ROLLS[roll](ROLL_INPUTS[inp](d)), dev, check_stride=True)
