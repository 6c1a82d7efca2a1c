"""Neighbours of the acceptance cases: more points of each case's class of programs.

Every test runs the same program on CPU and on the device under test (see
difftest.run_both) unless it checks a property CPU cannot serve as a reference for
(RNG streams, queue metrics).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from difftest import cpu_randn, requires_tpu, run_both, run_both_outcome

OVERLAP_MSG = "single memory location"


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


# ---------------------------------------------------------------------------
# ordering of queued writes (BR-03): program order, each write to its own offset
# ---------------------------------------------------------------------------


def test_fibonacci_writes_read_previous_pending(dev):
    def prog(d):
        x = torch.zeros(20, dtype=torch.int64, device=d)
        x[0] = 0
        x[1] = 1
        for i in range(2, 20):
            x[i] = x[i - 1] + x[i - 2]
        return x

    run_both(prog, dev)


def test_overlapping_slice_writes_in_order(dev):
    def prog(d):
        x = torch.zeros(8, device=d)
        x[0:4] = 1
        x[2:6] *= 3
        x[4:8] += x[0:4]  # disjoint ranges
        x[1:3] = x[5:7].clone()
        x[::3] -= 0.5
        return x

    run_both(prog, dev)


def test_tuple_swap_uses_views_like_cpu(dev):
    # `x[0], x[1] = x[1], x[0]` copies view x[1] into row 0, then view x[0] (already
    # overwritten) into row 1: both rows end equal to the old x[1]. A backend that
    # snapshots views at creation would swap them instead.
    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        x[0], x[1] = x[1], x[0]
        return x

    run_both(prog, dev)


def test_out_of_place_result_is_not_affected_by_later_write(dev):
    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        y = x * 2  # value captured now
        s = x.sum()
        c = x.clone()
        tc = x.t().contiguous()  # a copy
        tr = x.t().reshape(-1)  # reshape of a non-contiguous view copies
        r = x.reshape(-1)  # reshape of a contiguous tensor is a view
        x.add_(100)
        x[1, 1] = -1
        return x, y, s, c, tc, tr, r

    run_both(prog, dev)


def test_many_small_writes_same_element(dev):
    def prog(d):
        x = torch.zeros(3, device=d)
        for i in range(50):
            x[i % 3] += i
            x[(i + 1) % 3] *= 0.5
        return x

    run_both(prog, dev)


def test_write_read_write_through_different_aliases(dev):
    def prog(d):
        x = torch.zeros(4, 4, device=d)
        row, col, diag, flat = x[2], x[:, 1], x.diagonal(), x.view(-1)
        row.fill_(1)
        col.add_(row.sum())  # reads the pending row write
        diag.copy_(col * 2)  # reads the pending column write
        flat[::5] += 1  # touches the diagonal again through a flat alias
        s = x.sum(0)
        row.mul_(s)  # s was computed before this write
        return x, row, col, diag, flat, s

    run_both(prog, dev)


def test_interleaved_reads_and_writes(dev):
    def prog(d):
        x = torch.arange(10.0).to(d)
        out = []
        for i in range(5):
            x[i] = x[9 - i] + i
            out.append(x[i].item())  # forces a read between writes
            x[9 - i] = -x[i]
        return x, out

    run_both(prog, dev)


def test_index_put_then_view_read(dev):
    def prog(d):
        x = torch.zeros(3, 4, device=d)
        v = x[:, 1:3]
        x.index_put_((torch.tensor([0, 2]).to(d), torch.tensor([1, 2]).to(d)), torch.tensor([5.0, 6.0]).to(d))
        v.add_(1)
        return x, v

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# stale views with several aliases (BR-06)
# ---------------------------------------------------------------------------


def test_stale_views_many_aliases(dev):
    def prog(d):
        t0 = torch.arange(12.0, device=d).view(3, 4)
        a = t0[1]
        b = t0.view(-1)
        c = t0.t()
        e = t0[:, 1:]
        f = e[::2]  # view of a view
        b[5] = 50  # t0[1, 1]
        a[1] *= 2  # must read 50
        c[1, 2] += 1  # t0[2, 1]
        e[2, 0] -= 3  # t0[2, 1] again
        f[1] = f[0] + f[1]  # rows 0 and 2 of e
        t0.mul_(-1)
        a.add_(t0[0])  # another row of the same base, after the base-wide write
        a[:3].add_(c[3].clone())  # column 3 includes a[3]; clone avoids partial overlap
        return t0, a, b, c, e, f

    run_both(prog, dev)


def test_view_of_view_created_before_base_write(dev):
    def prog(d):
        t0 = torch.arange(8.0).to(d)
        v = t0[2:]
        vv = v[1::2]
        t0.mul_(2)
        vv.add_(1)
        w = t0.view(2, 4)
        w[:, -1] = 0
        return t0, v, vv, w

    run_both(prog, dev)


def test_alias_chain_through_detach_and_views(dev):
    def prog(d):
        t0 = torch.zeros(2, 3, device=d)
        d0 = t0.detach()
        dv = d0[1]
        t0[1, 2] = 4
        dv[0] = dv[2] + 1
        return t0, d0, dv

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# overlap (BR-15): in-place writes whose destination overlaps must raise like CPU
# ---------------------------------------------------------------------------

EXPANDED_WRITES = {
    "cos_": lambda y, d: y.cos_(),
    "add_": lambda y, d: y.add_(1),
    "mul_tensor": lambda y, d: y.mul_(torch.ones(y.shape, device=d)),
    "clamp_": lambda y, d: y.clamp_(max=0),
    "copy_": lambda y, d: y.copy_(torch.ones(y.shape, device=d)),
    "out": lambda y, d: torch.neg(torch.ones(y.shape, device=d), out=y),
    "fill_tensor": lambda y, d: y.fill_(torch.tensor(2.0, device=d)),
}

EXPANDED_VIEWS = {
    "expand_0dim": lambda d: torch.tensor(0.5).to(d).expand(3),
    "expand_rows": lambda d: torch.arange(4.0).to(d).expand(2, 4),
    "expand_cols": lambda d: torch.arange(3.0).to(d).unsqueeze(1).expand(3, 5),
    "as_strided_stride0": lambda d: torch.arange(4.0).to(d).as_strided((3, 3), (1, 0)),
}


@pytest.mark.parametrize("write", sorted(EXPANDED_WRITES))
@pytest.mark.parametrize("view", sorted(EXPANDED_VIEWS))
def test_inplace_on_internally_overlapping_raises(dev, view, write):
    y = EXPANDED_VIEWS[view](dev)
    with pytest.raises(RuntimeError, match=OVERLAP_MSG):
        EXPANDED_WRITES[write](y, dev)
        y.cpu()  # a lazy device may only notice at the flush; it must still raise


def test_failed_overlapping_write_leaves_base_unchanged(dev):
    def prog(d):
        base = torch.arange(4.0).to(d)
        y = base.expand(2, 4)
        try:
            y.add_(1)
        except RuntimeError:
            pass
        return base, y

    run_both(prog, dev)


def test_fill_on_expanded_is_allowed_like_cpu(dev):
    # CPU allows fill_/zero_ with a Python scalar on an expanded tensor (all writes agree).
    def prog(d):
        b = torch.zeros(1, 3, device=d)
        y = b.expand(4, 3)
        y.fill_(2)
        z = torch.ones(2, device=d)
        z.unsqueeze(0).expand(5, 2).zero_()
        return b, y, z

    run_both(prog, dev)


def test_select_write_into_expanded_reaches_base(dev):
    def prog(d):
        b = torch.zeros(1, device=d)
        y = b.expand(3)
        y[1] = 4  # a 0-dim view of the single shared element
        return b, y

    run_both(prog, dev)


PARTIAL_OVERLAP = {
    "add_shifted": lambda x: x[2:5].add_(x[0:3]),
    "copy_shifted": lambda x: x[1:].copy_(x[:-1]),
    "out_shifted": lambda x: torch.add(x[0:3], 1, out=x[1:4]),
    "out_prefix_of_input": lambda x: torch.add(x, 1, out=x[:3]),
    "add_transposed_self": lambda x: x[:9].view(3, 3).add_(x[:9].view(3, 3).t()),
}


@pytest.mark.parametrize("case", sorted(PARTIAL_OVERLAP))
def test_partial_overlap_between_input_and_output_raises(dev, case):
    x = torch.arange(10.0).to(dev)
    with pytest.raises(RuntimeError, match=OVERLAP_MSG):
        PARTIAL_OVERLAP[case](x)
        x.cpu()
    assert x.cpu().tolist() == torch.arange(10.0).tolist()


def test_full_overlap_and_disjoint_writes_are_fine(dev):
    def prog(d):
        x = torch.arange(10.0).to(d)
        torch.add(x, 1, out=x)  # identical input and output
        x[:5].copy_(x[5:])  # disjoint halves
        x[::2].mul_(x[1::2])  # interleaved, disjoint
        t = torch.arange(9.0, device=d).reshape(3, 3)
        t.t().add_(1)  # transposed write has no internal overlap
        return x, t

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# out= destinations (BR-12)
# ---------------------------------------------------------------------------

OUT_CASES = {
    "neg_into_transposed": lambda x, d: torch.neg(x, out=torch.empty(3, 3, device=d).t()),
    "add_into_stepped": lambda x, d: torch.add(x, 1, out=torch.zeros(3, 6, device=d)[:, ::2]),
    "mul_into_column_block": lambda x, d: torch.mul(x, x, out=torch.zeros(3, 5, device=d)[:, 1:4]),
    "mm_into_transposed": lambda x, d: torch.mm(x, x.t(), out=torch.empty(3, 3, device=d).t()),
    "sum_dim_into_slice": lambda x, d: torch.sum(x, 1, out=torch.zeros(6, device=d)[1::2]),
    "cumsum_into_transposed": lambda x, d: torch.cumsum(x, 0, out=torch.empty(3, 3, device=d).t()),
    "cat_into_stepped": lambda x, d: torch.cat([x, x[:1]], out=torch.zeros(8, 3, device=d)[::2]),
    "index_select_into_view": lambda x, d: torch.index_select(
        x, 1, torch.tensor([2, 0]).to(d), out=torch.zeros(3, 4, device=d)[:, 1:3]
    ),
    "where_into_transposed": lambda x, d: torch.where(x > 3, x, -x, out=torch.empty(3, 3, device=d).t()),
    "add_f32_into_f64": lambda x, d: torch.add(x, 0.25, out=torch.empty(3, 3, dtype=torch.float64, device=d)),
    "add_f32_into_f16_view": lambda x, d: torch.add(
        x, 0.1, out=torch.zeros(3, 6, dtype=torch.float16, device=d)[:, 2:5]
    ),
    "eq_into_float": lambda x, d: torch.eq(x, 4, out=torch.empty(3, 3, device=d)),
    "int_add_into_int64": lambda x, d: torch.add(
        x.to(torch.int32), 7, out=torch.empty(3, 3, dtype=torch.int64, device=d)
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_out_into_strided_destination(dev, case):
    def prog(d):
        x = torch.arange(9.0, device=d).reshape(3, 3)
        out = OUT_CASES[case](x, d)
        return out, out._base if out._base is not None else out

    run_both(prog, dev)


def test_out_returns_the_destination_and_writes_base(dev):
    def prog(d):
        z = torch.zeros(4, 4, device=d)
        dst = z[1:3, ::2]
        r = torch.add(torch.ones(2, 2, device=d), 2, out=dst)
        assert r is dst
        return z, dst

    run_both(prog, dev)


@pytest.mark.parametrize("shape", [(0,), (5,), (2, 3), (7, 1)])
def test_out_wrong_size_is_resized(dev, shape):
    def prog(d):
        out = torch.full(shape, -1.0, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CPU warns when a non-empty out= is resized
            torch.add(torch.arange(4.0, device=d).reshape(2, 2), 1, out=out)
        return out

    run_both(prog, dev, check_stride=True)


def test_out_wrong_size_transposed_destination_resized(dev):
    def prog(d):
        out = torch.empty(2, 2, device=d).t()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.mul(torch.arange(6.0, device=d).reshape(2, 3), 2, out=out)
        return out

    run_both(prog, dev, check_stride=True)


OUT_DTYPE_REJECTED = {
    "add_float_into_int": lambda d: torch.add(
        torch.tensor([1]).to(d), 1.5, out=torch.empty(1, dtype=torch.long, device=d)
    ),
    "neg_float_into_int": lambda d: torch.neg(
        torch.tensor([1.0]).to(d), out=torch.empty(1, dtype=torch.long, device=d)
    ),
    "mm_into_int": lambda d: torch.mm(
        torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=torch.empty(2, 2, dtype=torch.long, device=d)
    ),
    "add_int_into_bool": lambda d: torch.add(
        torch.ones(2, dtype=torch.int32, device=d), 1, out=torch.empty(2, dtype=torch.bool, device=d)
    ),
    "cat_float_into_int": lambda d: torch.cat(
        [torch.ones(2, device=d)], out=torch.empty(2, dtype=torch.long, device=d)
    ),
    "inplace_int_add_float": lambda d: torch.ones(2, dtype=torch.long, device=d).add_(1.5),
    "inplace_bool_add_int": lambda d: torch.ones(2, dtype=torch.bool, device=d).add_(1),
}


@pytest.mark.parametrize("case", sorted(OUT_DTYPE_REJECTED))
def test_out_dtype_rejected_like_cpu(dev, case):
    exc = run_both_outcome(OUT_DTYPE_REJECTED[case], dev)
    assert exc is not None, "CPU is expected to reject this out= dtype"


# ---------------------------------------------------------------------------
# alias/identity (BR-14): detach and friends alias; clone does not
# ---------------------------------------------------------------------------

ALIASES = {
    "detach": lambda a: a.detach(),
    "data": lambda a: a.data,
    "ellipsis": lambda a: a[...],
    "full_slice": lambda a: a[:],
    "view_as": lambda a: a.view_as(a),
    "aten_alias": lambda a: torch.ops.aten.alias(a),
    "contiguous_of_contiguous": lambda a: a.contiguous(),
    "reshape_same": lambda a: a.reshape(a.shape),
    "flatten_unflatten": lambda a: a.flatten().view(a.shape),
}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_alias_writes_are_visible(dev, alias):
    def prog(d):
        a = torch.arange(6.0, device=d).reshape(2, 3)
        v = ALIASES[alias](a)
        v.add_(1)
        a[0, 0] = -5
        return a, v

    run_both(prog, dev)


COPIES = {
    "clone": lambda a: a.clone(),
    "clone_contiguous_format": lambda a: a.clone(memory_format=torch.contiguous_format),
    "contiguous_of_transposed": lambda a: a.t().contiguous(),
    "reshape_of_transposed": lambda a: a.t().reshape(-1),
    "to_copy": lambda a: a.to(a.device, copy=True),
    "detach_clone": lambda a: a.detach().clone(),
    "flatten_of_transposed": lambda a: a.t().flatten(),
}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_copies_are_independent(dev, copy):
    def prog(d):
        a = torch.arange(6.0, device=d).reshape(2, 3)
        c = COPIES[copy](a)
        c.mul_(10)
        a.add_(1)
        return a, c

    run_both(prog, dev, check_stride=True)


def test_clone_of_transposed_preserves_strides(dev):
    run_both(lambda d: torch.arange(6.0, device=d).reshape(2, 3).t().clone(), dev, check_stride=True)


def test_detach_shares_version_counter(dev):
    # Writing through a detached alias invalidates a saved tensor, exactly as on CPU.
    def prog(d):
        leaf = torch.ones(3, device=d, requires_grad=True)
        a = leaf * 2
        b = a.sin()
        a.detach().add_(1)
        b.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prog("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prog(dev)


def test_no_grad_inplace_on_leaf_keeps_leaf(dev):
    def prog(d):
        p = torch.ones(2, 2, device=d, requires_grad=True)
        with torch.no_grad():
            p[0].mul_(3)
            p.add_(torch.ones(2, device=d))
        return p.detach(), p.is_leaf, p.requires_grad

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# H2D / D2H / device-to-device copies (BR-17)
# ---------------------------------------------------------------------------

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def _host_data(dtype):
    if dtype == torch.bool:
        return (torch.arange(24) % 3 == 0).reshape(4, 6)
    if dtype.is_floating_point:
        v = torch.tensor(
            [0.0, -0.0, 1.5, -2.25, float("inf"), -float("inf"), float("nan"), 1e-3, 65504.0, 3.0e4, -7.0, 0.1] * 2,
            dtype=torch.float64,
        )
        return v.to(dtype).reshape(4, 6)
    info = torch.iinfo(dtype)
    v = torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2, 7] * 4, dtype=torch.int64)
    return v.to(dtype).reshape(4, 6)


HOST_LAYOUTS = {
    "contiguous": lambda t: t,
    "zero_dim": lambda t: t[1, 2],
    "zero_dim_offset_view": lambda t: t.view(-1)[17],
    "empty_1d": lambda t: t[:, :0].reshape(0),
    "empty_2d": lambda t: t[:3, :0],
    "transposed": lambda t: t.t(),
    "stepped": lambda t: t[1::2, ::3],
    "offset_narrow": lambda t: t.narrow(1, 2, 3),
    "transposed_sliced": lambda t: t.t()[1:],
    "expanded": lambda t: t[:, :1].expand(4, 5),
    "diagonal": lambda t: t.diagonal(1),
}


def _same_bits(a, b):
    """Bitwise equality for floating tensors (catches lost -0.0, NaN payloads, flushed subnormals)."""
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(int_type), b.contiguous().view(int_type))


@pytest.mark.parametrize("layout", sorted(HOST_LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_h2d_d2h_round_trip(dev, dtype, layout):
    src = HOST_LAYOUTS[layout](_host_data(dtype))
    # to(copy=True) gives the strides preserve_format picks; the device copy must match.
    run_both(lambda d: src.to(d, copy=True), dev, check_stride=True)
    back = src.to(dev).cpu()
    assert back.dtype == src.dtype and back.shape == src.shape
    if dtype.is_floating_point:
        assert _same_bits(back, src)  # NaN, -0.0 and rounding-free transfer
    else:
        assert torch.equal(back, src)


def test_h2d_subnormals_preserved(dev):
    src = torch.tensor([1e-40, -1e-42, 1.0e-45], dtype=torch.float32)
    assert _same_bits(src.to(dev).cpu(), src)
    half = torch.tensor([6e-8, -3e-6], dtype=torch.float16)
    assert _same_bits(half.to(dev).cpu(), half)


D2H_VIEWS = {
    "transposed": lambda x: x.t(),
    "stepped": lambda x: x[:, ::2],
    "row_offset": lambda x: x[2],
    "zero_dim": lambda x: x[1, 3],
    "expanded": lambda x: x[:1].expand(3, 4),
    "diagonal": lambda x: x.diagonal(),
    "unfold_overlapping": lambda x: x.view(-1).unfold(0, 4, 3),
}


@pytest.mark.parametrize("view", sorted(D2H_VIEWS))
def test_d2h_of_device_views(dev, view):
    host = torch.arange(12.0).reshape(3, 4)
    x = host.clone().to(dev)  # clone: on CPU .to() would alias host
    x.mul_(2)  # pending write the read must observe
    got = D2H_VIEWS[view](x).cpu()
    want = D2H_VIEWS[view](host * 2)
    assert got.shape == want.shape and torch.equal(got, want)
    # The host copy gets the layout preserve_format picks for the source view, as on CPU.
    want_copy = D2H_VIEWS[view](host * 2).to("cpu", copy=True)
    got_copy = D2H_VIEWS[view](host.to(dev) * 2).to("cpu", copy=True)
    assert got_copy.device.type == "cpu" and got_copy.stride() == want_copy.stride()
    assert torch.equal(got_copy, want_copy)


def test_d2h_via_copy_into_cpu_destination(dev):
    def prog(d):
        src = torch.arange(6, dtype=torch.int32, device=d).reshape(2, 3)
        dst = torch.zeros(3, 3, dtype=torch.float64)  # always a CPU destination
        dst[:2].copy_(src)
        dst[2].copy_(src[1] * 0.5)  # broadcasting not needed; dtype conversion is
        dst2 = torch.zeros(2, 2, 3)
        dst2.copy_(src)  # broadcast over the leading dim
        return dst, dst2

    # Results live on CPU in both runs; compare values only.
    exp = [t.clone() for t in prog("cpu")]
    act = prog(dev)
    for e, a in zip(exp, act):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, e)


COPY_CASES = {
    "broadcast_row": (lambda d: torch.zeros(3, 4, device=d), lambda d: torch.arange(4.0).to(d)),
    "broadcast_col": (lambda d: torch.zeros(3, 4, device=d), lambda d: torch.arange(3.0).to(d).unsqueeze(1)),
    "broadcast_0dim": (lambda d: torch.zeros(2, 3, device=d), lambda d: torch.tensor(7.5).to(d)),
    "float_to_int_truncates": (
        lambda d: torch.zeros(4, dtype=torch.int64, device=d),
        lambda d: torch.tensor([-1.7, 2.5, -0.5, 300.0]).to(d),
    ),
    "float_to_bool": (
        lambda d: torch.zeros(4, dtype=torch.bool, device=d),
        lambda d: torch.tensor([0.0, -0.0, 0.1, float("nan")]).to(d),
    ),
    "bool_to_float": (lambda d: torch.zeros(3, device=d), lambda d: torch.tensor([True, False, True]).to(d)),
    "int_to_half_rounds": (
        lambda d: torch.zeros(4, dtype=torch.float16, device=d),
        lambda d: torch.tensor([2049, 4097, 65519, -3]).to(d),
    ),
    "f32_to_bf16_ties_even": (
        lambda d: torch.zeros(4, dtype=torch.bfloat16, device=d),
        lambda d: torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38]).to(d),
    ),
    "f64_to_f32": (
        lambda d: torch.zeros(3, device=d),
        lambda d: torch.tensor([1 / 3, 1e-300, 1e300], dtype=torch.float64).to(d),
    ),
    "bf16_to_f16": (
        lambda d: torch.zeros(3, dtype=torch.float16, device=d),
        lambda d: torch.tensor([1.5, 1e5, 3e-8], dtype=torch.bfloat16).to(d),
    ),
    "int64_to_int8_wraps": (
        lambda d: torch.zeros(3, dtype=torch.int8, device=d),
        lambda d: torch.tensor([300, -129, 127]).to(d),
    ),
    "noncontig_to_noncontig": (
        lambda d: torch.zeros(4, 6, device=d)[::2, 1::2],
        lambda d: torch.arange(20.0, device=d).reshape(5, 4).t()[1:3, ::2],
    ),
    "transposed_into_contig": (
        lambda d: torch.zeros(3, 2, device=d),
        lambda d: torch.arange(6.0, device=d).reshape(2, 3).t(),
    ),
    "from_cpu_broadcast_convert": (
        lambda d: torch.zeros(2, 3, dtype=torch.float16, device=d),
        lambda d: torch.tensor([1, 2, 3], dtype=torch.int32),
    ),
}


@pytest.mark.parametrize("case", sorted(COPY_CASES))
def test_device_copy_broadcast_and_convert(dev, case):
    make_dst, make_src = COPY_CASES[case]

    def prog(d):
        dst = make_dst(d)
        r = dst.copy_(make_src(d))
        assert r is dst
        return dst

    run_both(prog, dev)


def test_copy_non_blocking_then_read(dev):
    def prog(d):
        dst = torch.zeros(5, device=d)
        dst.copy_(torch.arange(5.0), non_blocking=True)
        src = torch.arange(5.0).to(d, non_blocking=True)
        return dst + src

    run_both(prog, dev)


CONVERSIONS = {
    "to_half": lambda x: x.half(),
    "to_bf16": lambda x: x.bfloat16(),
    "to_double": lambda x: x.double(),
    "to_int32": lambda x: x.to(torch.int32),
    "to_bool": lambda x: x.bool(),
    "to_uint8": lambda x: x.abs().to(torch.uint8),
    "type_int16": lambda x: x.type(torch.int16),
}


@pytest.mark.parametrize("conv", sorted(CONVERSIONS))
def test_dtype_conversion_on_device(dev, conv):
    host = torch.tensor([[-2.5, -1.5, -0.5, 0.0], [0.5, 1.5, 2.5, 100.7]])
    run_both(lambda d: CONVERSIONS[conv](host.to(d).t()[1:]), dev, check_stride=True)


FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_int": lambda d: torch.ones(3, dtype=torch.int32, device=d),
    "full_int_infers_int64": lambda d: torch.full((2,), 3, device=d),
    "full_bool": lambda d: torch.full((2,), True, device=d),
    "arange_float_step": lambda d: torch.arange(0, 1, 0.1, device=d),
    "arange_int": lambda d: torch.arange(-3, 10, 4, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
    "tensor_list": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_scalar": lambda d: torch.tensor(3.5, device=d),
    "zeros_like_transposed": lambda d: torch.zeros_like(torch.ones(2, 3, device=d).t()),
    "full_like_stepped": lambda d: torch.full_like(torch.ones(2, 6, device=d)[:, ::2], 4),
}


@pytest.mark.parametrize("case", sorted(FACTORIES))
def test_factories_match_cpu(dev, case):
    run_both(FACTORIES[case], dev, check_stride=True)


# On CPU these alias the numpy buffer (keeping its strides); on another device they copy.
# Only values, dtype and shape are comparable.
FROM_NUMPY = {
    "as_tensor_numpy_strided": lambda d: torch.as_tensor(torch.arange(12).reshape(3, 4).numpy()[:, ::2], device=d),
    "from_numpy_then_to": lambda d: torch.from_numpy(torch.arange(8.0).numpy()[1::3]).to(d),
    "tensor_from_numpy_f16": lambda d: torch.tensor(torch.arange(6.0).half().numpy()[::-1].copy(), device=d),
}


@pytest.mark.parametrize("case", sorted(FROM_NUMPY))
def test_from_numpy_values(dev, case):
    want = FROM_NUMPY[case]("cpu").clone()
    got = FROM_NUMPY[case](dev)
    assert got.device.type == torch.device(dev).type and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)


# ---------------------------------------------------------------------------
# indexing (BR-21, BR-22)
# ---------------------------------------------------------------------------


def test_boolean_mask_reads(dev):
    host = cpu_randn(4, 5, seed=1)

    def prog(d):
        x = host.to(d)
        return (
            x[x > 0],
            x[x > 0.5].sum(),
            torch.masked_select(x, x < 0),
            x[torch.tensor([True, False, True, True]).to(d)],
            x[:, torch.tensor([False, True, False, True, True]).to(d)],
            x.t()[x.t() > 0],
            x[x > 100],
        )

    run_both(prog, dev)


MASK_WRITES = {
    "scalar": lambda x, m, d: x.__setitem__(m, -1),
    "tensor_values": lambda x, m, d: x.__setitem__(m, torch.arange(int(m.sum().item()), dtype=x.dtype).to(d)),
    "zero_dim_value": lambda x, m, d: x.__setitem__(m, torch.tensor(9, dtype=x.dtype).to(d)),
    "cpu_zero_dim_value": lambda x, m, d: x.__setitem__(m, torch.tensor(8, dtype=x.dtype)),
    "masked_fill_": lambda x, m, d: x.masked_fill_(m, 5),
    "masked_scatter_": lambda x, m, d: x.masked_scatter_(m, torch.arange(100, 130, dtype=x.dtype).to(d)),
    "inplace_add_via_mask": lambda x, m, d: x.__setitem__(m, x[m] + 10),
    "row_mask": lambda x, m, d: x.__setitem__(m.any(1), 0),
}


@pytest.mark.parametrize("target", ["base", "transposed", "stepped"])
@pytest.mark.parametrize("write", sorted(MASK_WRITES))
def test_boolean_mask_writes(dev, write, target):
    def prog(d):
        base = torch.tensor([[1, 2, 2, 4], [1, 2, 3, 2], [0, 2, 5, 6]]).to(d)
        x = {"base": base, "transposed": base.t(), "stepped": base[:, ::2]}[target]
        m = x == 2
        MASK_WRITES[write](x, m, d)
        return base, x

    run_both(prog, dev)


def test_index_put_accumulate_duplicates_int_and_float(dev):
    def prog(d):
        a = torch.zeros(5, dtype=torch.int64, device=d)
        a.index_put_((torch.tensor([4, 1, 4, 4, 0]).to(d),), torch.tensor([1, 2, 3, 4, 5]).to(d), accumulate=True)
        b = torch.zeros(3, 4, device=d)
        rows = torch.tensor([0, 2, 0, 0, 1]).to(d)
        cols = torch.tensor([1, 3, 1, 1, 0]).to(d)
        b.index_put_((rows, cols), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).to(d), accumulate=True)
        c = torch.zeros(3, 4, dtype=torch.int32, device=d)
        c.index_put_(
            (torch.tensor([[0, 2], [0, 0]]).to(d),), torch.ones(4, dtype=torch.int32, device=d), accumulate=True
        )
        e = torch.zeros(4, device=d)
        e.index_put_((torch.tensor([3, 3, 3]).to(d),), torch.tensor(0.5).to(d), accumulate=True)
        f = torch.ones(2, 3, device=d)
        f.t().index_put_((torch.tensor([1, 1]).to(d),), torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(d), accumulate=True)
        g = torch.zeros(3, device=d)
        g.index_put_((torch.tensor([True, False, True]).to(d),), torch.tensor([1.0, 2.0]).to(d), accumulate=True)
        return a, b, c, e, f, g

    run_both(prog, dev)


def test_index_add_duplicates(dev):
    def prog(d):
        a = torch.zeros(5, device=d).index_add_(0, torch.tensor([1, 3, 1, 1]).to(d), torch.arange(4.0).to(d), alpha=2)
        b = torch.ones(3, 4, dtype=torch.int64, device=d)
        b.index_add_(1, torch.tensor([0, 0, 3]).to(d), torch.arange(9, device=d).reshape(3, 3))
        c = torch.zeros(4, 3, device=d)
        c.t().index_add_(0, torch.tensor([2, 2]).to(d), torch.ones(2, 4, device=d))
        return a, b, c

    run_both(prog, dev)


def test_scatter_add_and_gather(dev):
    def prog(d):
        src = torch.arange(1.0, 13.0, device=d).reshape(3, 4)
        idx = torch.tensor([[0, 1, 0, 0], [2, 2, 1, 0], [0, 0, 0, 0]]).to(d)
        sa0 = torch.zeros(3, 4, device=d).scatter_add_(0, idx, src)
        sa1 = torch.zeros(3, 3, device=d).scatter_add_(1, idx[:, :3], src[:, :3])
        si = torch.zeros(3, 4, dtype=torch.int64, device=d).scatter_add_(0, idx, src.long())
        g0 = torch.gather(src, 0, idx)
        g1 = torch.gather(src, 1, torch.tensor([[3, 3], [0, 1], [2, 0]]).to(d))
        gt = torch.gather(src.t(), 1, torch.tensor([[1, 2], [0, 0], [2, 1], [1, 1]]).to(d))
        sr = torch.zeros(3, device=d).scatter_reduce_(
            0,
            torch.tensor([0, 2, 0, 2]).to(d),
            torch.tensor([5.0, 1.0, 7.0, -2.0]).to(d),
            reduce="amax",
            include_self=False,
        )
        sc = torch.zeros(2, 4, device=d).scatter_(1, torch.tensor([[3, 0], [1, 2]]).to(d), 9.0)
        return sa0, sa1, si, g0, g1, gt, sr, sc

    run_both(prog, dev)


def test_advanced_indexing_reads_and_writes(dev):
    def prog(d):
        x = torch.arange(20.0, device=d).reshape(4, 5)
        r1 = x[torch.tensor([-1, 0, 2]).to(d)]
        r2 = x[torch.tensor([[0], [3]]).to(d), torch.tensor([1, 4]).to(d)]  # broadcast index tensors
        r3 = x[1:, torch.tensor([0, 0, 3]).to(d)]
        r4 = x[torch.tensor([0, 2], dtype=torch.int32).to(d)]
        r5 = torch.take(x, torch.tensor([[19, 0], [7, 7]]).to(d))
        r6 = x.index_select(1, torch.tensor([4, 4, 1]).to(d))
        x[torch.tensor([1, 3]).to(d), 2:] = torch.tensor([-1.0, -2.0, -3.0]).to(d)
        x.index_fill_(1, torch.tensor([0]).to(d), 0.5)
        x.index_copy_(0, torch.tensor([2, 0]).to(d), torch.full((2, 5), 7.0).to(d))
        return x, r1, r2, r3, r4, r5, r6

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# dtype promotion and integer semantics (BR-24)
# ---------------------------------------------------------------------------

PROMOTION = {
    "int32_plus_float_scalar": lambda d: torch.arange(3, dtype=torch.int32).to(d) + 1.5,
    "int64_times_float_scalar": lambda d: torch.arange(3).to(d) * 2.5,
    "int_true_div_int": lambda d: torch.arange(5).to(d) / 2,
    "int_floordiv_float_scalar": lambda d: torch.arange(-3, 4).to(d) // 2.0,
    "int_pow_int": lambda d: torch.arange(-3, 4).to(d) ** 2,
    "int_pow_float": lambda d: torch.arange(4).to(d) ** 0.5,
    "int_pow_negative_tensor": lambda d: torch.tensor([1, -1, 2, 0]).to(d) ** torch.tensor([-1, -1, -1, 2]).to(d),
    "bool_plus_bool_scalar": lambda d: torch.tensor([True, False]).to(d) + True,
    "bool_plus_int_scalar": lambda d: torch.tensor([True, False]).to(d) + 1,
    "bool_times_float_scalar": lambda d: torch.tensor([True, False]).to(d) * 2.5,
    "bool_and_scalar": lambda d: torch.tensor([True, False]).to(d) & True,
    "int8_plus_big_scalar_wraps": lambda d: torch.tensor([1, -100], dtype=torch.int8).to(d) + 1000,
    "int8_mul_wraps": lambda d: torch.tensor([100, -100], dtype=torch.int8).to(d) * 3,
    "uint8_minus_one_wraps": lambda d: torch.tensor([0, 5], dtype=torch.uint8).to(d) - 1,
    "uint8_minus_int8_promotes_int16": lambda d: (
        torch.tensor([1], dtype=torch.uint8).to(d) - torch.tensor([2], dtype=torch.int8).to(d)
    ),
    "int16_times_0dim_int64": lambda d: torch.tensor([300, -300], dtype=torch.int16).to(d) * torch.tensor(200).to(d),
    "int32_plus_0dim_f64": lambda d: (
        torch.arange(3, dtype=torch.int32).to(d) + torch.tensor(1.5, dtype=torch.float64).to(d)
    ),
    "f16_plus_0dim_f64": lambda d: (
        torch.ones(3, dtype=torch.float16).to(d) + torch.tensor(1e-3, dtype=torch.float64).to(d)
    ),
    "f16_plus_python_float": lambda d: torch.ones(3, dtype=torch.float16).to(d) + 1e-3,
    "bf16_times_f32_tensor": lambda d: torch.ones(3, dtype=torch.bfloat16).to(d) * torch.full((3,), 1.001).to(d),
    "int_compare_float_scalar": lambda d: torch.arange(4).to(d) > 1.5,
    "float_eq_int_tensor": lambda d: torch.tensor([1.0, 2.5]).to(d) == torch.tensor([1, 2]).to(d),
    "int32_wrap_mul": lambda d: torch.tensor([2**30, -(2**30)], dtype=torch.int32).to(d) * 4,
    "int32_add_wrap_tensor": lambda d: (
        torch.tensor([2**31 - 1], dtype=torch.int32).to(d) + torch.tensor([2], dtype=torch.int32).to(d)
    ),
    "int64_big_add_wraps": lambda d: torch.tensor([2**62, 2**63 - 1]).to(d) * 2,
    "int64_exact_above_2p53": lambda d: torch.tensor([2**53 + 1, -(2**60) - 7]).to(d) + 0,
    "int64_big_floordiv": lambda d: torch.tensor([2**62 + 1, -(2**62) - 1]).to(d) // 3,
    "int64_big_compare": lambda d: torch.tensor([2**53 + 1]).to(d) == torch.tensor([2**53]).to(d),
    "int_sum_dtype": lambda d: torch.arange(5, dtype=torch.int32).to(d).sum(),
    "bool_sum_dtype": lambda d: torch.tensor([True, True, False]).to(d).sum(),
    "int8_cumsum_dtype": lambda d: torch.tensor([100, 100, 100], dtype=torch.int8).to(d).cumsum(0),
    "int16_prod_dtype": lambda d: torch.tensor([300, 300, 300], dtype=torch.int16).to(d).prod(),
    "int32_big_sum_no_wrap": lambda d: torch.full((8,), 2**30, dtype=torch.int32).to(d).sum(),
    "bitwise_ops": lambda d: (
        torch.tensor([6, -7]).to(d) & 3,
        torch.tensor([6, -7]).to(d) ^ -1,
        torch.tensor([1, -8]).to(d) >> 1,
    ),
    "abs_int_min": lambda d: torch.tensor([-(2**31)], dtype=torch.int32).to(d).abs(),
}


@pytest.mark.parametrize("case", sorted(PROMOTION))
def test_promotion_and_integer_semantics(dev, case):
    run_both(PROMOTION[case], dev, rtol=0, atol=0)


def test_zero_dim_cpu_tensor_mixes_with_device_tensor(dev):
    def prog(d):
        x = torch.arange(4.0).to(d)
        i = torch.arange(4, dtype=torch.int32).to(d)
        s = torch.tensor(2.5)  # CPU 0-dim: allowed with any device
        k = torch.tensor(3)  # CPU 0-dim int64
        out = [
            x + s,
            s * x,
            x / s,
            x > s,
            i + k,
            i * s,
            torch.add(i, k),
            torch.mul(x, s),
            k - i,
            torch.maximum(x, torch.tensor(1.5)),
            x == torch.tensor(1.0),
        ]
        y = x.clone()
        y.mul_(s)
        y[1] = torch.tensor(-1)
        y[2:].add_(k)
        torch.add(x, s, out=x)
        return out, y, x

    out_cpu = run_both(prog, dev)
    assert out_cpu[0][0].device_type == torch.device(dev).type


def test_python_scalar_types_do_not_change_tensor_dtype(dev):
    def prog(d):
        f16 = torch.tensor([1.0, 2.0], dtype=torch.float16).to(d)
        i32 = torch.tensor([1, 2], dtype=torch.int32).to(d)
        return f16 * 3, f16 + True, i32 * True, i32 - 7, f16 / 3, i32.float() / 3

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# division modes (BR-27)
# ---------------------------------------------------------------------------


def test_division_modes_float_and_int(dev):
    def prog(d):
        a = torch.tensor([-7.0, 7.0, -1.0, 5.0, -0.5, 6.0]).to(d)
        b = torch.tensor([2.0, -2.0, 3.0, 3.0, 2.0, -4.0]).to(d)
        ai = torch.tensor([-7, 7, -1, 5, 0, -9, 9]).to(d)
        bi = torch.tensor([2, -2, 2, 3, 5, -3, -4]).to(d)
        trunc = torch.div(a, b, rounding_mode="trunc")
        floor = torch.div(a, b, rounding_mode="floor")
        return (
            trunc,
            floor,
            trunc.signbit(),
            floor.signbit(),
            a // b,
            a % b,
            torch.fmod(a, b),
            torch.remainder(a, b).signbit(),
            torch.div(ai, bi, rounding_mode="trunc"),
            torch.div(ai, bi, rounding_mode="floor"),
            ai // bi,
            ai % bi,
            torch.fmod(ai, bi),
            ai / bi,
            ai // -3,
            ai % -3,
            torch.fmod(ai, -3),
            torch.div(ai, 2.0, rounding_mode="trunc"),
            torch.div(ai, torch.tensor(2.0).to(d), rounding_mode="floor"),
            torch.tensor([-5.5, 5.5]).to(d) % -2,
            torch.remainder(ai.to(torch.int32), 4),
        )

    run_both(prog, dev)


def test_float_division_by_zero_and_non_finite(dev):
    def prog(d):
        a = torch.tensor([1.0, -1.0, 0.0, float("inf"), -float("inf"), float("nan"), 3.0]).to(d)
        z = torch.zeros(7, device=d)
        nz = torch.full((7,), -0.0, device=d)
        return (
            a / z,
            a / nz,
            a // z,
            torch.div(a, z, rounding_mode="trunc"),
            torch.remainder(a, z),
            torch.fmod(a, z),
            a // float("inf"),
            a % float("inf"),
            torch.div(a, -float("inf"), rounding_mode="floor"),
            torch.arange(3).to(d) / 0,
            (torch.arange(3).to(d) / 0).isnan(),
        )

    run_both(prog, dev)


INT_DIV_BY_ZERO = {
    "floor_divide_int64": lambda d: torch.tensor([1, 2]).to(d) // torch.tensor([1, 0]).to(d),
    "floor_divide_scalar_zero": lambda d: torch.tensor([1, 2]).to(d) // 0,
    "trunc_div_int32": lambda d: torch.div(
        torch.tensor([1], dtype=torch.int32).to(d), torch.tensor([0], dtype=torch.int32).to(d), rounding_mode="trunc"
    ),
    "remainder_int": lambda d: torch.remainder(torch.tensor([5]).to(d), torch.tensor([0]).to(d)),
    "fmod_int": lambda d: torch.fmod(torch.tensor([5]).to(d), torch.tensor([0]).to(d)),
    "floor_divide_uint8": lambda d: (
        torch.tensor([3], dtype=torch.uint8).to(d) // torch.tensor([0], dtype=torch.uint8).to(d)
    ),
    "inplace_floor_divide": lambda d: torch.tensor([4, 5]).to(d).floor_divide_(torch.tensor([2, 0]).to(d)),
    "true_div_int_by_zero_is_inf": lambda d: torch.tensor([1, 0, -1]).to(d) / torch.tensor([0, 0, 0]).to(d),
}


@pytest.mark.parametrize("case", sorted(INT_DIV_BY_ZERO))
def test_integer_division_by_zero_matches_cpu(dev, case):
    exc = run_both_outcome(INT_DIV_BY_ZERO[case], dev)
    if case == "true_div_int_by_zero_is_inf":
        assert exc is None
    else:
        assert isinstance(exc, RuntimeError), "CPU raises for integer division by zero"


def test_integer_division_by_zero_leaves_other_tensors_valid(dev):
    x = torch.arange(4).to(dev)
    y = x * 3  # pending when the failing op is recorded
    with pytest.raises(RuntimeError):
        (x // torch.zeros(4, dtype=torch.int64, device=dev)).cpu()
    assert y.cpu().tolist() == [0, 3, 6, 9]
    assert (x + 1).cpu().tolist() == [1, 2, 3, 4]


# ---------------------------------------------------------------------------
# bf16 / fp16 reductions accumulate wider than the storage type (BR-31)
# ---------------------------------------------------------------------------

LOWP = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_sum_of_ones_exact(dev, dtype):
    def prog(d):
        x = torch.ones(3000, dtype=dtype).to(d)
        y = torch.ones(6, 600, dtype=dtype).to(d)
        return (
            x.sum(),
            x.mean(),
            y.sum(1),
            y.t().sum(0),
            y.sum(dtype=torch.float32),
            x.cumsum(0)[-1],
            x[::2].sum(),
            y.mean(1, keepdim=True),
            x.view(3, 1000).sum(1),
        )

    run_both(prog, dev, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_reductions_of_random_data(dev, dtype):
    host = (cpu_randn(4, 1000, seed=3).abs() + 0.5).to(dtype)

    def prog(d):
        x = host.to(d)
        return (
            x.sum(),
            x.sum(1),
            x.mean(1),
            x.var(1),
            x.std(),
            torch.softmax(x, 1),
            torch.log_softmax(x, 1),
            torch.cumsum(x, 1),
            x.norm(dim=1),
            torch.logsumexp(x, 1),
            (x @ x.t()),
            F.layer_norm(x, (1000,)),
        )

    # Tolerances of the storage type: a bf16/fp16 accumulator would be off by far more.
    run_both(prog, dev, rtol=2e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-2)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_lowp_softmax_uniform_exact(dev, dtype):
    def prog(d):
        z = torch.zeros(3, 1024, dtype=dtype).to(d)
        return torch.softmax(z, -1), torch.log_softmax(z, -1), torch.softmax(z.t(), 0)

    run_both(prog, dev, rtol=0, atol=0)


def test_lowp_sum_grows_past_storage_precision(dev):
    # Each partial sum past 256 (bf16) / 2048 (fp16) is not representable exactly; a
    # narrow accumulator stalls there.
    for dtype, n, limit in ((torch.bfloat16, 4096, 256), (torch.float16, 8192, 2048)):
        s = torch.ones(n, dtype=dtype).to(dev).sum().item()
        assert s == float(n) and s > limit


# ---------------------------------------------------------------------------
# RNG (BR-33): reproducible, consumed at record time, distinct streams
# ---------------------------------------------------------------------------

RNG_OPS = {
    "rand": lambda d: torch.rand(6, device=d),
    "randn": lambda d: torch.randn(2, 3, device=d),
    "normal_": lambda d: torch.empty(5, device=d).normal_(2.0, 0.5),
    "uniform_": lambda d: torch.empty(5, device=d).uniform_(-3, 3),
    "bernoulli_p": lambda d: torch.bernoulli(torch.full((16,), 0.5, device=d)),
    "bernoulli_": lambda d: torch.empty(16, device=d).bernoulli_(0.3),
    "dropout": lambda d: F.dropout(torch.ones(32, device=d), p=0.5, training=True),
    "randint": lambda d: torch.randint(0, 1000, (8,), device=d),
    "randperm": lambda d: torch.randperm(20, device=d),
    "rand_like_bf16": lambda d: torch.rand_like(torch.empty(8, dtype=torch.bfloat16, device=d)),
    "multinomial": lambda d: torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4], device=d), 6, replacement=True),
    "exponential_": lambda d: torch.empty(6, device=d).exponential_(),
}


@pytest.mark.parametrize("op", sorted(RNG_OPS))
def test_rng_manual_seed_reproducible(dev, op):
    torch.manual_seed(123)
    a = RNG_OPS[op](dev)
    a2 = RNG_OPS[op](dev)
    torch.manual_seed(123)
    b = RNG_OPS[op](dev)
    b2 = RNG_OPS[op](dev)
    assert a.device.type == torch.device(dev).type
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a2.cpu(), b2.cpu())
    torch.manual_seed(124)
    c = RNG_OPS[op](dev)
    # Two draws (and draws under different seeds) differ: no stream is reused.
    assert not (torch.equal(a.cpu(), a2.cpu()) and torch.equal(a.cpu(), c.cpu()))


def test_rng_value_properties(dev):
    torch.manual_seed(7)
    u = torch.rand(4000, device=dev).cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.05
    n = torch.randn(4000, device=dev).cpu()
    assert abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1) < 0.1
    r = torch.randint(3, 9, (500,), device=dev).cpu()
    assert r.dtype == torch.int64 and r.min() >= 3 and r.max() <= 8 and len(r.unique()) == 6
    p = torch.randperm(50, device=dev).cpu()
    assert p.dtype == torch.int64 and sorted(p.tolist()) == list(range(50))
    b = torch.bernoulli(torch.full((1000,), 0.25, device=dev)).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.15 < b.mean().item() < 0.35
    x = torch.arange(1.0, 201.0).to(dev)
    y = F.dropout(x, p=0.4, training=True).cpu()
    kept = y != 0
    assert torch.allclose(y[kept], x.cpu()[kept] / 0.6) and 0.4 < kept.float().mean().item() < 0.8
    assert torch.equal(F.dropout(x, p=0.4, training=False).cpu(), x.cpu())


def test_rng_read_order_does_not_matter(dev):
    torch.manual_seed(5)
    a, b, c = torch.rand(4, device=dev), torch.randn(4, device=dev), torch.randint(0, 100, (4,), device=dev)
    fwd = [a.cpu(), b.cpu(), c.cpu()]
    torch.manual_seed(5)
    a, b, c = torch.rand(4, device=dev), torch.randn(4, device=dev), torch.randint(0, 100, (4,), device=dev)
    rev = [c.cpu(), b.cpu(), a.cpu()][::-1]
    assert all(torch.equal(x, y) for x, y in zip(fwd, rev))


def test_rng_unaffected_by_intervening_flush_or_other_ops(dev):
    torch.manual_seed(9)
    r1 = torch.rand(4, device=dev)
    r2 = torch.rand(4, device=dev)
    ref = [r1.cpu(), r2.cpu()]
    torch.manual_seed(9)
    s1 = torch.rand(4, device=dev)
    junk = (torch.arange(10.0).to(dev) * 2).sum().item()  # a flush between the draws
    _ = s1 * 3 + junk  # non-RNG ops consume no generator state
    s2 = torch.rand(4, device=dev)
    assert torch.equal(s1.cpu(), ref[0]) and torch.equal(s2.cpu(), ref[1])


def test_rng_explicit_generator(dev):
    g = torch.Generator(device=dev)
    g.manual_seed(11)
    a = torch.rand(5, generator=g, device=dev)
    g.manual_seed(11)
    b = torch.rand(5, generator=g, device=dev)
    state = g.get_state()
    c = torch.randn(5, generator=g, device=dev)
    g.set_state(state)
    e = torch.randn(5, generator=g, device=dev)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(c.cpu(), e.cpu())
    torch.manual_seed(11)
    torch.rand(100, device=dev)  # the default generator is separate from g
    g.manual_seed(11)
    assert torch.equal(torch.rand(5, generator=g, device=dev).cpu(), a.cpu())


def test_rng_fork_rng_restores_state(dev):
    # On "cpu" the CPU state is always forked; on a device, fork that device's state.
    kw = {"devices": []} if dev == "cpu" else {"device_type": torch.device(dev).type}
    torch.manual_seed(3)
    with torch.random.fork_rng(**kw):
        torch.rand(10, device=dev)
    a = torch.rand(4, device=dev)
    torch.manual_seed(3)
    b = torch.rand(4, device=dev)
    assert torch.equal(a.cpu(), b.cpu())


@requires_tpu
def test_tpu_manual_seed_and_rng_state_round_trip(dev):
    torch.tpu.manual_seed(42)
    a = torch.rand(6, device=dev)
    torch.tpu.manual_seed(42)
    b = torch.rand(6, device=dev)
    assert torch.equal(a.cpu(), b.cpu())
    state = torch.tpu.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.device.type == "cpu"
    c = torch.randn(6, device=dev)
    d = torch.bernoulli(torch.full((8,), 0.5, device=dev))
    torch.tpu.set_rng_state(state)
    c2 = torch.randn(6, device=dev)
    d2 = torch.bernoulli(torch.full((8,), 0.5, device=dev))
    assert torch.equal(c.cpu(), c2.cpu()) and torch.equal(d.cpu(), d2.cpu())
    torch.tpu.manual_seed_all(42)
    assert torch.equal(torch.rand(6, device=dev).cpu(), a.cpu())


@requires_tpu
def test_tpu_seed_independent_of_cpu_generator(dev):
    torch.manual_seed(1)
    a = torch.rand(4, device=dev)
    torch.manual_seed(1)
    torch.rand(50)  # draws on the CPU generator must not move the device stream
    b = torch.rand(4, device=dev)
    assert torch.equal(a.cpu(), b.cpu())


# ---------------------------------------------------------------------------
# lazy-runtime growth (BR-36)
# ---------------------------------------------------------------------------


def test_long_loop_mixed_ops_no_reads(dev):
    def prog(d):
        x = torch.zeros(4, 3, device=d)
        v = x[:, 1]
        for i in range(3000):
            x = x * 0.5 + 1 if i % 2 else x + v.unsqueeze(1)
            v = x[:, i % 3]
            x[i % 4, (i + 1) % 3] += 0.25
        return x

    run_both(prog, dev)


def test_long_chain_of_views_no_reads(dev):
    def prog(d):
        x = torch.zeros(8, device=d)
        for i in range(4000):
            x[i % 8] += 1
            x[(i * 3) % 8 : (i * 3) % 8 + 1].mul_(1.0)
        return x

    run_both(prog, dev)


def test_many_pending_tensors_kept_alive(dev):
    def prog(d):
        base = torch.arange(4.0).to(d)
        outs = [base * i for i in range(2000)]
        base.zero_()  # must not affect the values computed before
        return torch.stack(outs[::97]), outs[-1]

    run_both(prog, dev)


@requires_tpu
def test_queue_autoflushes_without_reads(dev):
    import torch_tpu_eager

    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    x = torch.zeros(4, device=dev)
    for _ in range(20000):
        x = x + 1
    m = torch_tpu_eager.metrics()
    assert m["ops_recorded"] >= 20000
    assert m["flushes"] >= 1, "20000 ops without a read must trigger an automatic flush"
    assert sum(m["flush_reasons"].values()) == m["flushes"]
    if hasattr(torch_tpu_eager, "queue_limits"):
        max_ops = torch_tpu_eager.queue_limits()[0]
        # Each flush drains at most max_ops pending ops, so the queue never held more.
        assert m["flushes"] >= 20000 // max_ops
    assert x.cpu().tolist() == [20000.0] * 4


@requires_tpu
def test_inplace_loop_autoflushes_and_stays_correct(dev):
    import torch_tpu_eager

    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    acc = torch.zeros(8, device=dev)
    views = [acc[i::4] for i in range(4)]
    for i in range(6000):
        views[i % 4].add_(1)
    assert torch_tpu_eager.metrics()["flushes"] >= 1
    assert acc.cpu().tolist() == [1500.0] * 8
