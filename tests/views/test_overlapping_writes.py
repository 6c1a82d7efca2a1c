"""Writes through views whose elements share memory (DESIGN §3).

CPU applies an in-place op on a self-overlapping view (unfold with step < size, an
overlapping as_strided) element by element in memory order, so later elements see
earlier writes; a stride-0 (expanded) view makes most ops raise instead. The device must
give exactly CPU's result or CPU's exception, never a gathered copy written back."""

import random

import pytest
import torch

from difftest import run_both, run_both_outcome

# In-place ops, each f(view, device) -> None; the operand shapes follow the view's.
INPLACE_OPS = {
    "add_tensor": lambda v, d: v.add_(torch.arange(v.numel(), dtype=v.dtype, device=d).view(v.shape) + 1),
    "add_scalar": lambda v, d: v.add_(1.5),
    "sub_alpha": lambda v, d: v.sub_(torch.ones(v.shape[-1:], device=d), alpha=2),
    "mul_scalar": lambda v, d: v.mul_(2),
    "mul_broadcast": lambda v, d: v.mul_(torch.linspace(0.5, 2, v.shape[-1], device=d)),
    "div_": lambda v, d: v.div_(3),
    "tanh_": lambda v, d: v.tanh_(),
    "exp_": lambda v, d: v.exp_(),
    "neg_": lambda v, d: v.neg_(),
    "sigmoid_": lambda v, d: v.sigmoid_(),
    "clamp_": lambda v, d: v.clamp_(0.2, 0.6),
    "pow_": lambda v, d: v.pow_(2),
    "addcmul_": lambda v, d: v.addcmul_(torch.full(v.shape, 2.0, device=d), torch.full(v.shape, 0.5, device=d)),
    "lerp_": lambda v, d: v.lerp_(torch.ones(v.shape, device=d), 0.5),
    "masked_fill_": lambda v, d: v.masked_fill_(torch.arange(v.shape[-1], device=d) % 2 == 0, 5.0),
    "index_fill_": lambda v, d: v.index_fill_(v.dim() - 1, torch.tensor([0], device=d), 7.0),
    "index_put_": lambda v, d: v.__setitem__(torch.tensor([0], device=d), 1.0),
    "index_put_accumulate": lambda v, d: v.index_put_(
        (torch.tensor([0], device=d),), torch.tensor(2.0, device=d), accumulate=True
    ),
    "setitem_slice": lambda v, d: v.__setitem__(slice(None), 3.0),
    "copy_": lambda v, d: v.copy_(torch.arange(v.numel(), dtype=v.dtype, device=d).view(v.shape)),
    "fill_": lambda v, d: v.fill_(4.0),
    "zero_": lambda v, d: v.zero_(),
    "relu_": lambda v, d: torch.relu_(v),
    "where_out": lambda v, d: torch.where(torch.arange(v.shape[-1], device=d) % 2 == 0, v, -v, out=v),
    "add_out": lambda v, d: torch.add(v, 1, out=v),
    "cumsum_": lambda v, d: v.cumsum_(v.dim() - 1),
}


def _base(d, n):
    return (torch.arange(n, dtype=torch.float32, device=d) / n + 0.1).clone()


@pytest.mark.parametrize("op", sorted(INPLACE_OPS))
@pytest.mark.parametrize("view", ["unfold", "as_strided_rows", "as_strided_3d"])
def test_inplace_on_self_overlapping_view(dev, op, view):
    """The repros of the crash-free issue and their neighbours: one op, one view."""

    def prog(d):
        b = _base(d, 12)
        v = {
            "unfold": lambda: b.unfold(0, 3, 1),
            "as_strided_rows": lambda: b.as_strided((2, 4), (2, 1)),
            "as_strided_3d": lambda: b.as_strided((2, 3, 3), (3, 2, 1), 1),
        }[view]()
        INPLACE_OPS[op](v, d)
        return b

    run_both_outcome(prog, dev)


def test_issue_repro_index_put(dev):
    def prog(d):
        b = torch.zeros(10, device=d)
        v = b.as_strided((2, 4), (2, 1))
        v[torch.tensor([0], device=d)] = 1
        return b

    out = run_both(prog, dev)
    assert out.value.tolist()[:4] == [1.0, 1.0, 1.0, 1.0]


def _random_view(rng, n):
    """A random (sizes, strides, offset) inside a storage of n elements; most overlap."""
    while True:
        dim = rng.randint(1, 3)
        sizes = [rng.randint(1, 4) for _ in range(dim)]
        strides = [rng.randint(0, 4) for _ in range(dim)]
        span = sum((s - 1) * st for s, st in zip(sizes, strides))
        if span < n:
            return sizes, strides, rng.randint(0, n - 1 - span)


@pytest.mark.parametrize("seed", range(24))
def test_random_programs_on_overlapping_views(dev, seed):
    """Random as_strided / unfold views of one storage, several in-place ops in a row
    (recorded together, flushed once), then the whole storage read: CPU's values or
    CPU's exception at the same op."""
    rng = random.Random(seed)
    names = sorted(INPLACE_OPS)
    steps = []
    for _ in range(6):
        if rng.random() < 0.3:
            size = rng.randint(2, 4)
            steps.append(("unfold", size, rng.randint(1, size), rng.choice(names)))
        else:
            steps.append(("as_strided", _random_view(rng, 16), rng.choice(names)))

    for cut in range(1, len(steps) + 1):

        def prog(d, cut=cut):
            b = _base(d, 16)
            for step in steps[:cut]:
                if step[0] == "unfold":
                    v = b.unfold(0, step[1], step[2])
                else:
                    v = b.as_strided(*step[1])
                INPLACE_OPS[step[-1]](v, d)
            return b

        if run_both_outcome(prog, dev) is not None:
            break  # CPU raised at this step: later steps repeat it


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_overlapping_write_in_each_eager_mode(dev, mode):
    if dev != "tpu":
        pytest.skip("eager modes are a tpu setting")
    import torch_tpu_eager as tte

    def prog(d):
        b = _base(d, 10)
        b.unfold(0, 3, 1).mul_(2)
        b.unfold(0, 4, 2).add_(torch.ones(4, device=d))
        return b * 1, b

    with tte.set_eager_mode(mode):
        run_both(prog, dev)


def test_overlapping_write_on_spyre(spyre_target, dev):
    """Spyre rounds written 16-bit values after the op: through the same strided alias."""

    def prog(d):
        b = torch.arange(10, device=d).to(torch.float16)
        b.unfold(0, 3, 1).mul_(2)
        return b

    run_both(prog, dev)


def test_integer_and_bool_dtypes(dev):
    def prog(d):
        a = torch.arange(10, device=d)
        a.unfold(0, 3, 1).add_(1)
        m = torch.zeros(10, dtype=torch.bool, device=d)
        m.as_strided((3, 3), (2, 1)).logical_not_()
        return a, m

    run_both(prog, dev)
