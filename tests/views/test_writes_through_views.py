"""View-mutation: writes through every kind of view (BR-01, BR-02, BR-08, BR-10).

Neighbours of the acceptance cases (BR-nn in the design's acceptance_cases.md): each test
runs one program on CPU and on the device under test (difftest.run_both) unless it checks a
property CPU cannot serve as a reference for."""

import pytest
import torch

from difftest import run_both, run_both_outcome


# ---------------------------------------------------------------------------
# view-mutation: writes through every kind of view (BR-01, BR-02, BR-08, BR-10)
# ---------------------------------------------------------------------------


def _base2d(d):
    return torch.arange(24.0, device=d).reshape(4, 6)


def _base3d(d):
    return torch.arange(24.0, device=d).reshape(2, 3, 4)


# name -> (base factory, view function). Every view is non-overlapping so writes are defined.
VIEWS = {
    "column": (_base2d, lambda b: b[:, 2]),
    "row": (_base2d, lambda b: b[1]),
    "step_rows": (_base2d, lambda b: b[::2]),
    "step_both": (_base2d, lambda b: b[1::2, ::3]),
    "step_offset": (_base2d, lambda b: b[1:, 1::2]),
    "transpose": (_base2d, lambda b: b.t()),
    "transpose_sliced": (_base2d, lambda b: b.t()[1:4, ::2]),
    "transpose_twice_stepped": (_base2d, lambda b: b.t()[::2].t()),
    "diagonal": (_base2d, lambda b: b.diagonal()),
    "diagonal_pos": (_base2d, lambda b: b.diagonal(offset=2)),
    "diagonal_neg": (_base2d, lambda b: b.diagonal(offset=-1)),
    "narrow": (_base2d, lambda b: b.narrow(1, 2, 3)),
    "unfold_tiles": (_base2d, lambda b: b.unfold(1, 2, 2)),
    "unfold_gaps": (_base2d, lambda b: b.unfold(1, 2, 3)),
    "as_strided": (_base2d, lambda b: b.as_strided((3, 2), (5, 2), 1)),
    "as_strided_colmajor": (_base2d, lambda b: b.as_strided((2, 3), (1, 6), 3)),
    "split": (_base2d, lambda b: b.split(2, dim=1)[1]),
    "split_sizes": (_base2d, lambda b: b.split([1, 3, 2], dim=1)[1]),
    "chunk": (_base2d, lambda b: b.chunk(2, dim=0)[1]),
    "unbind": (_base2d, lambda b: b.unbind(1)[3]),
    "squeeze": (_base2d, lambda b: b[1:2].squeeze(0)),
    "unsqueeze": (_base2d, lambda b: b[:, 1].unsqueeze(1)),
    "view_row": (_base2d, lambda b: b.view(2, 12)[1]),
    "view_flat_step": (_base2d, lambda b: b.view(-1)[3::5]),
    "reshape_view": (_base2d, lambda b: b.reshape(3, 8)[:, 2]),
    "unflatten": (_base2d, lambda b: b.unflatten(1, (2, 3))[:, 1]),
    "select_of_t": (_base2d, lambda b: b.t()[2]),
    "permute_select": (_base3d, lambda c: c.permute(2, 0, 1)[1]),
    "permute_step": (_base3d, lambda c: c.permute(1, 2, 0)[:, ::2]),
    "transpose02_slice": (_base3d, lambda c: c.transpose(0, 2)[1:, :, 1]),
    "mT": (_base3d, lambda c: c.mT),
    "movedim_diag": (_base3d, lambda c: c.movedim(0, 2).diagonal(dim1=0, dim2=1)),
    "select_select": (_base3d, lambda c: c[1][:, 2]),
    "view_of_permuted_contig": (_base3d, lambda c: c.permute(0, 1, 2)[:, 1:].view(2, 8)),
}

# name -> write function (view, device). Each is one ordinary in-place program step.
WRITES = {
    "fill": lambda v, d: v.fill_(-1),
    "setitem_ellipsis": lambda v, d: v.__setitem__(Ellipsis, 5),
    "setitem_first": lambda v, d: v.__setitem__(0, -3),
    "add_scalar": lambda v, d: v.add_(100),
    "mul_tensor": lambda v, d: v.mul_(torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape).to(d) + 1),
    "copy_broadcast": lambda v, d: v.copy_(torch.arange(v.shape[-1], dtype=torch.float64).to(d) * 10),
    "zero": lambda v, d: v.zero_(),
    "clamp": lambda v, d: v.clamp_(min=3, max=7),
    "addcmul_self": lambda v, d: v.addcmul_(v, v, value=0.5),
    "out_self": lambda v, d: torch.mul(v, -2, out=v),
    "iadd_then_imul": lambda v, d: v.__iadd__(1).__imul__(3),
}


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_write_through_view(dev, view, write):
    make_base, make_view = VIEWS[view]

    def prog(d):
        base = make_base(d)
        v = make_view(base)
        WRITES[write](v, d)
        return base, v, make_view(base)  # a fresh view must see the same data

    run_both(prog, dev)


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_read_through_view_after_base_write(dev, view):
    make_base, make_view = VIEWS[view]

    def prog(d):
        base = make_base(d)
        v = make_view(base)  # created before the write: must not be a snapshot
        base.mul_(-1)
        base[0].add_(0.5)
        return v, v.sum(), v * 2, v.contiguous()

    run_both(prog, dev)


def test_setitem_with_index_tensor_descending(dev):
    # Negative steps do not exist in torch; a descending index tensor is the flip-free way.
    def prog(d):
        x = torch.zeros(6, device=d)
        x[torch.arange(5, -1, -1).to(d)] = torch.arange(6.0).to(d)
        y = torch.arange(12.0, device=d).reshape(3, 4)
        y[:, torch.tensor([3, 1]).to(d)] = y[:, torch.tensor([0, 2]).to(d)] * -1
        return x, y

    run_both(prog, dev)


def test_negative_slice_step_rejected_like_cpu(dev):
    exc = run_both_outcome(lambda d: torch.arange(4).to(d)[::-1], dev)
    assert isinstance(exc, ValueError)
