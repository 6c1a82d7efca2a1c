"""View semantics against CPU: metadata, aliasing identity, in-place metadata ops, and
randomly generated programs of views, in-place writes and reads on one base tensor."""

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from difftest import run_both


def _meta(t, root):
    """Everything about a view that must match CPU, relative to its root tensor."""
    return {
        "shape": tuple(t.shape),
        "stride": t.stride(),
        "storage_offset": t.storage_offset(),
        "is_contiguous": t.is_contiguous(),
        "base_is_root": t._base is root,
        "ptr_delta": t.data_ptr() - root.data_ptr(),
        "same_storage": t.untyped_storage().data_ptr() == root.untyped_storage().data_ptr(),
        "storage_nbytes": t.untyped_storage().nbytes(),
    }


VIEW_FNS = {
    "view_flat": lambda x: x.view(-1),
    "view_2d": lambda x: x.view(4, 6),
    "reshape_view": lambda x: x.reshape(6, 4),
    "flatten": lambda x: x.flatten(1),
    "unflatten": lambda x: x.unflatten(2, (2, 2)),
    "select": lambda x: x[1],
    "select_mid": lambda x: x.select(1, 2),
    "slice_step": lambda x: x[:, 1:, ::2],
    "narrow": lambda x: x.narrow(2, 1, 2),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(1, 2, 0),
    "mT": lambda x: x.mT,
    "t_of_select": lambda x: x[0].t(),
    "diagonal": lambda x: x.diagonal(0, 1, 2),
    "diagonal_offset": lambda x: x.diagonal(1, 2, 1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:1].squeeze(0),
    "expand": lambda x: x[:, :1].expand(2, 5, 4),
    "unfold_overlap": lambda x: x.view(-1).unfold(0, 5, 2),
    "as_strided": lambda x: x.as_strided((3, 3), (4, 1), 5),
    "split": lambda x: x.split(3, dim=2)[1],
    "chunk": lambda x: x.chunk(3, dim=1)[2],
    "unbind": lambda x: x.unbind(2)[3],
    "movedim": lambda x: x.movedim(0, -1),
    "alias_ellipsis": lambda x: x[...],
    "detach": lambda x: x.detach(),
    "view_as_int32": lambda x: x.view(torch.int32),
    "view_as_uint8": lambda x: x.view(torch.uint8),
    "view_as_f16": lambda x: x.view(torch.float16),
    "view_of_view": lambda x: x[1].t()[::2, 1:],
    "contiguous_of_contiguous": lambda x: x.contiguous(),
}


@pytest.mark.parametrize("name", sorted(VIEW_FNS))
def test_view_metadata_matches_cpu(dev, name):
    def prog(d):
        root = torch.arange(24.0, device=d).reshape(2, 3, 4).clone()  # clone: a root with no _base
        v = VIEW_FNS[name](root)
        return _meta(v, root), v, v.is_contiguous(memory_format=torch.contiguous_format)

    run_both(prog, dev)


def test_view_pointer_identities(dev):
    x = torch.arange(12.0, device=dev).reshape(3, 4)
    assert x.view(-1).data_ptr() == x.data_ptr()
    assert x[1].data_ptr() == x.data_ptr() + 4 * x.element_size()
    assert x[:, 2].data_ptr() == x.data_ptr() + 2 * x.element_size()
    assert x.t().data_ptr() == x.data_ptr()
    assert x.untyped_storage().data_ptr() == x[2:].untyped_storage().data_ptr()
    y = x.clone()
    assert y.data_ptr() != x.data_ptr()
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert x.contiguous() is x
    assert x.t().contiguous() is not x and x.t().contiguous().is_contiguous()


def test_dtype_view_reinterprets_bits(dev):
    def prog(d):
        x = torch.tensor([1.0, -2.0, 0.5, 3.0]).to(d)
        i = x.view(torch.int32)
        b = x.view(torch.uint8)
        h = x.view(torch.int16)
        i[1] = 0x3F800000  # the bits of 1.0f
        b[0:4] = 0  # +0.0
        h[7] ^= -32768  # flips the sign bit of x[3] (little-endian high half)
        return x, i, b, h

    run_both(prog, dev)


def test_view_chain_writes_visible_everywhere(dev):
    def prog(d):
        root = torch.zeros(2, 3, 4, device=d)
        views = [
            f(root)
            for f in (
                VIEW_FNS["transpose"],
                VIEW_FNS["diagonal"],
                VIEW_FNS["split"],
                VIEW_FNS["view_of_view"],
                VIEW_FNS["view_flat"],
            )
        ]
        for k, v in enumerate(views):
            v.add_(k + 1)
        return [root] + views

    run_both(prog, dev)


def test_channels_last_layouts(dev):
    def prog(d):
        x = torch.arange(120.0, device=d).reshape(2, 3, 4, 5)
        cl = x.contiguous(memory_format=torch.channels_last)
        e = torch.empty(2, 3, 4, 5, device=d, memory_format=torch.channels_last)
        e.copy_(x)
        y = cl * 2  # elementwise ops preserve the layout
        return (
            cl,
            e,
            y,
            cl.is_contiguous(memory_format=torch.channels_last),
            e.is_contiguous(),
            y.is_contiguous(memory_format=torch.channels_last),
        )

    run_both(prog, dev, check_stride=True)


# ---------------------------------------------------------------------------
# in-place metadata ops
# ---------------------------------------------------------------------------

META_INPLACE = {
    "unsqueeze_": lambda x: x.unsqueeze_(1),
    "unsqueeze_neg": lambda x: x.unsqueeze_(-1),
    "squeeze_all": lambda x: x.unsqueeze_(0).unsqueeze_(2).squeeze_(),
    "squeeze_dim": lambda x: x.unsqueeze_(1).squeeze_(1),
    "transpose_": lambda x: x.transpose_(0, 1),
    "t_": lambda x: x.t_(),
    "swapdims_": lambda x: x.swapdims_(1, 0),
    "as_strided_": lambda x: x.as_strided_((2, 2), (1, 3), 2),
    "as_strided_stride0": lambda x: x.as_strided_((3, 2), (1, 0), 1),
    "t_then_unsqueeze_": lambda x: x.t_().unsqueeze_(0),
}


@pytest.mark.parametrize("op", sorted(META_INPLACE))
def test_inplace_metadata_op(dev, op):
    def prog(d):
        base = torch.arange(12.0, device=d).reshape(3, 4)
        x = base[:, :3]  # a view, so the op also has to keep the aliasing
        r = META_INPLACE[op](x)
        assert r is x
        snapshot = x.clone()
        if x.numel() and 0 not in x.stride():
            x.mul_(-1)  # writes must still land in the base through the new metadata
        return base, x, snapshot, (x.shape, x.stride(), x.storage_offset(), x.is_contiguous())

    run_both(prog, dev, check_stride=True)


@pytest.mark.parametrize("new_shape", [(2,), (2, 2), (3, 4), (5, 4), (0,), (7,)])
def test_resize_grow_and_shrink(dev, new_shape):
    def prog(d):
        x = torch.arange(12.0).to(d)
        x.add_(1)  # a pending value must survive the reallocation
        old = x.numel()
        x.resize_(new_shape)
        keep = min(old, x.numel())
        prefix = x.reshape(-1)[:keep].clone()
        meta = (tuple(x.shape), x.stride(), x.is_contiguous(), x.untyped_storage().nbytes())
        if x.numel():
            x.fill_(3)
        return prefix, meta, x

    run_both(prog, dev)


@pytest.mark.parametrize("size", [(0,), (0, 5), (3, 0)])
@pytest.mark.parametrize("offset", [6, 7, 30])
def test_resize_to_no_elements_keeps_the_storage(dev, size, offset):
    """resize_ to a size without elements never grows the storage, whatever the view's
    storage offset (CPU's maybe_resize_storage_cpu returns early); found by the random
    aliasing programs (tests/views/test_random_aliasing.py)."""

    def prog(d):
        base = torch.arange(6, device=d).reshape(1, 6)  # a 6-element storage; offsets past its end
        v = torch.empty(0, dtype=base.dtype, device=d).set_(base.untyped_storage(), offset, (0, 1), (6, 1))
        v.resize_(size)
        return base, v, v.untyped_storage().nbytes(), base.untyped_storage().nbytes()

    run_both(prog, dev)


def test_resize_of_an_empty_narrow_past_the_end(dev):
    def prog(d):
        x = torch.arange(6, device=d).reshape(1, 6)
        v = x.narrow(0, 1, 0).split(1, 1)[1]  # no elements, storage offset 7 of 6
        v.resize_(0)
        return x, v, x.untyped_storage().nbytes(), v.storage_offset()

    run_both(prog, dev)


def test_resize_as_and_resize_of_shared_storage(dev):
    def prog(d):
        a = torch.arange(6.0).to(d)
        b = torch.empty(0, device=d).resize_as_(torch.ones(2, 3))
        b.fill_(1)
        c = a.view(2, 3)
        a.resize_(3)  # shrinking keeps the storage, so c still sees a's writes
        a.mul_(10)
        return a, b, c, a.untyped_storage().nbytes()

    run_both(prog, dev)


SET_OVERLOADS = {
    "tensor": lambda x, src: x.set_(src),
    "storage": lambda x, src: x.set_(src.untyped_storage()),
    "storage_offset_size_stride": lambda x, src: x.set_(src.untyped_storage(), 2, (2, 3), (1, 2)),
    "storage_offset_size": lambda x, src: x.set_(src.untyped_storage(), 1, (3,)),
    "empty": lambda x, src: x.set_(),
}


@pytest.mark.parametrize("overload", sorted(SET_OVERLOADS))
def test_set_overloads(dev, overload):
    def prog(d):
        src = torch.arange(10.0).to(d)
        src.mul_(2)  # pending value shared through set_
        x = torch.zeros(4, device=d)
        r = SET_OVERLOADS[overload](x, src)
        assert r is x
        shares = x.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
        x_before = x.clone()
        if x.numel():
            x.add_(100)  # must land in src's storage
        return x, src, x_before, shares, (tuple(x.shape), x.stride(), x.storage_offset())

    run_both(prog, dev, check_stride=True)


def test_set_then_view_writes_both_ways(dev):
    def prog(d):
        src = torch.zeros(3, 4, device=d)
        x = torch.empty(0, device=d).set_(src)
        xv = x[:, 1]
        src[1].fill_(5)
        xv.add_(1)
        return src, x, xv

    run_both(prog, dev)


# ---------------------------------------------------------------------------
# random programs: views + in-place writes + reads on one base, checked against CPU
# ---------------------------------------------------------------------------


def _unique_locations(t):
    """True if every element of t maps to its own storage location."""
    if t.numel() <= 1:
        return True
    n = t.untyped_storage().nbytes() // t.element_size()
    offs = torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset())
    return offs.unique().numel() == t.numel()


def _has_zero_stride(t):
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


class _Program:
    """Lock-step runner: every step is applied to the CPU tensors and the device tensors."""

    def __init__(self, dev, base):
        self.dev = dev
        # (cpu tensor, device tensor) pairs; copy=True keeps the two runs apart when dev is "cpu".
        self.live = [(base, base.to(dev, copy=True))]
        self.log = []

    def apply(self, desc, fn, add=True):
        self.log.append(desc)
        note(desc)
        try:
            rc = fn(self.live_cpu)
            ec = None
        except Exception as e:  # noqa: BLE001
            rc, ec = None, e
        try:
            rd = fn(self.live_dev)
            if ec is not None:  # a lazy device may report only when the result is read
                rd.cpu() if isinstance(rd, torch.Tensor) else None
            ed = None
        except Exception as e:  # noqa: BLE001
            rd, ed = None, e
        if ec is not None:
            assert ed is not None, f"{desc}: CPU raised {type(ec).__name__}: {ec}; device did not"
            assert isinstance(ed, type(ec)), f"{desc}: CPU raised {type(ec).__name__}, device {type(ed).__name__}: {ed}"
            return
        assert ed is None, f"{desc}: device raised {type(ed).__name__} where CPU did not: {ed}"
        if add and isinstance(rc, torch.Tensor):
            self.live.append((rc, rd))

    @property
    def live_cpu(self):
        return [c for c, _ in self.live]

    @property
    def live_dev(self):
        return [d for _, d in self.live]

    def check(self, i):
        c, d = self.live[i]
        where = f"live[{i}] after {self.log}"
        assert d.device.type == torch.device(self.dev).type, where
        assert (d.shape, d.storage_offset(), d.dtype) == (c.shape, c.storage_offset(), c.dtype), where
        # The stride of a size-1 dim never changes which element is addressed; out-of-place
        # results may pick any value there, so only dims of size > 1 are compared.
        if c.numel() > 0:
            assert [s for s, n in zip(d.stride(), d.shape) if n > 1] == [
                s for s, n in zip(c.stride(), c.shape) if n > 1
            ], f"{where}: stride {d.stride()} != {c.stride()}"
        assert (d._base is None) == (c._base is None), where
        torch.testing.assert_close(d.cpu(), c, equal_nan=True, msg=lambda m: f"{where}: {m}")


def _draw_view(data, t):
    """A view step valid (or deliberately invalid, like CPU would reject) for t's shape."""
    nd = t.dim()
    kinds = ["as_strided", "unsqueeze", "view_flat", "reshape"]
    if nd >= 1:
        kinds += ["select", "slice", "expand", "unfold", "squeeze", "split"]
    if nd >= 2:
        kinds += ["transpose", "permute", "diagonal"]
    kind = data.draw(st.sampled_from(kinds), label="view kind")
    dim = data.draw(st.integers(0, nd - 1), label="dim") if nd >= 1 else 0
    size = t.shape[dim] if nd >= 1 else 1
    if kind == "select":
        if size == 0:
            return "narrow0", lambda x: x.narrow(dim, 0, 0)
        i = data.draw(st.integers(-size, size - 1), label="index")
        return f"select({dim},{i})", lambda x: x.select(dim, i)
    if kind == "slice":
        start = data.draw(st.integers(0, size), label="start")
        stop = data.draw(st.integers(start, size), label="stop")
        step = data.draw(st.integers(1, 3), label="step")
        sl = (slice(None),) * dim + (slice(start, stop, step),)
        return f"[{sl}]", lambda x: x[sl]
    if kind == "transpose":
        d1 = data.draw(st.integers(0, nd - 1), label="dim1")
        return f"transpose({dim},{d1})", lambda x: x.transpose(dim, d1)
    if kind == "permute":
        perm = data.draw(st.permutations(range(nd)), label="perm")
        return f"permute{tuple(perm)}", lambda x: x.permute(*perm)
    if kind == "diagonal":
        d1 = data.draw(st.integers(0, nd - 1).filter(lambda v: v != dim), label="dim1")
        off = data.draw(st.integers(-2, 2), label="offset")
        return f"diagonal({off},{dim},{d1})", lambda x: x.diagonal(off, dim, d1)
    if kind == "unsqueeze":
        d = data.draw(st.integers(-nd - 1, nd), label="udim")
        return f"unsqueeze({d})", lambda x: x.unsqueeze(d)
    if kind == "squeeze":
        return f"squeeze({dim})", lambda x: x.squeeze(dim)
    if kind == "view_flat":
        return "view(-1)", lambda x: x.view(-1)  # raises like CPU when not viewable
    if kind == "reshape":
        return "reshape(-1)", lambda x: x.reshape(-1)  # a view or a copy, as CPU decides
    if kind == "expand":
        shape = list(t.shape)
        if size == 1:
            shape[dim] = 3
            return f"expand{tuple(shape)}", lambda x: x.expand(*shape)
        return "unsqueeze(0).expand(2,...)", lambda x: x.unsqueeze(0).expand(2, *x.shape)
    if kind == "unfold":
        sz = data.draw(st.integers(0, max(size, 0)), label="usize")
        step = data.draw(st.integers(1, 3), label="ustep")
        return f"unfold({dim},{sz},{step})", lambda x: x.unfold(dim, sz, step)
    if kind == "split":
        chunk = data.draw(st.integers(1, max(size, 1)), label="split")
        k = data.draw(st.integers(0, 3), label="piece")
        return f"split({chunk},{dim})[{k}]", lambda x: x.split(chunk, dim)[min(k, len(x.split(chunk, dim)) - 1)]
    # as_strided anywhere inside the 24-element storage
    n = data.draw(st.integers(1, 2), label="as_ndim")
    sizes = [data.draw(st.integers(1, 3), label="as_size") for _ in range(n)]
    strides = [data.draw(st.integers(0, 4), label="as_stride") for _ in range(n)]
    extent = sum((s - 1) * k for s, k in zip(sizes, strides))
    off = data.draw(st.integers(0, 23 - extent), label="as_offset")
    return f"as_strided({sizes},{strides},{off})", lambda x: x.as_strided(sizes, strides, off)


WRITE_KINDS = [
    "add_",
    "mul_",
    "fill_",
    "zero_",
    "clamp_",
    "copy_clone",
    "add_clone",
    "neg_out",
    "masked_fill_",
    "index_put_acc",
    "setitem_first",
]


def _draw_write(data, t, n_live):
    """An in-place step on t as fn(x, live); only writes whose result CPU defines."""
    kinds = WRITE_KINDS
    if _has_zero_stride(t):
        # CPU raises for these (internal overlap) or writes one constant everywhere;
        # masked_fill_/index_put_ on expanded tensors are deprecated, so not drawn.
        kinds = ["add_", "mul_", "clamp_", "copy_clone", "add_clone", "neg_out", "fill_", "zero_", "setitem_first"]
    elif not _unique_locations(t):
        # Overlap without a zero stride: CPU does not raise and the result depends on its
        # loop order, so only writes of one constant are well defined.
        kinds = ["fill_", "zero_"]
    kind = data.draw(st.sampled_from(kinds), label="write kind")
    v = data.draw(st.integers(-3, 3), label="value")
    if kind == "add_":
        return f"add_({v})", lambda x, L: x.add_(v)
    if kind == "mul_":
        return f"mul_({v})", lambda x, L: x.mul_(v)
    if kind == "fill_":
        return f"fill_({v})", lambda x, L: x.fill_(v)
    if kind == "zero_":
        return "zero_()", lambda x, L: x.zero_()
    if kind == "clamp_":
        return f"clamp_({v}, {v + 4})", lambda x, L: x.clamp_(v, v + 4)
    if kind == "neg_out":
        return "neg(out=self)", lambda x, L: torch.neg(x, out=x)
    if kind == "masked_fill_":
        return f"masked_fill_(>{v}, {-v})", lambda x, L: x.masked_fill_(x > v, -v)
    if kind == "setitem_first":
        return f"[0]={v}", lambda x, L: x.__setitem__(0, v)
    if kind == "index_put_acc":
        if t.dim() == 0 or t.shape[0] == 0:
            return f"add_({v})", lambda x, L: x.add_(v)
        idx = data.draw(st.lists(st.integers(0, t.shape[0] - 1), min_size=1, max_size=4), label="indices")
        return (
            f"index_put_({idx}, 1., accumulate=True)",
            lambda x, L: x.index_put_(
                (torch.tensor(idx).to(x.device),), torch.tensor(1.0).to(x.device), accumulate=True
            ),
        )
    j = data.draw(st.integers(0, n_live - 1), label="source")
    # The source is cloned first: an overlapping source would make the write undefined.
    if kind == "copy_clone":
        return f"copy_(live[{j}].clone())", lambda x, L: x.copy_(L[j].clone())
    return f"add_(live[{j}].clone())", lambda x, L: x.add_(L[j].clone())


OUT_OF_PLACE = {
    "mul_add": lambda x: x * 2 + 1,
    "clone": lambda x: x.clone(),
    "sum0": lambda x: x.sum(0) if x.dim() else x + 0,
    "t_contiguous": lambda x: x.t().contiguous() if x.dim() == 2 else x.contiguous(),
}

BASE_SHAPES = [(24,), (4, 6), (2, 3, 4), (2, 2, 2, 3), (1, 24)]


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_view_programs_match_cpu(dev, data):
    shape = data.draw(st.sampled_from(BASE_SHAPES), label="base shape")
    prog = _Program(dev, torch.arange(24.0).reshape(shape) - 8)
    n_steps = data.draw(st.integers(1, 14), label="steps")
    for _ in range(n_steps):
        i = data.draw(st.integers(0, len(prog.live) - 1), label="target")
        t = prog.live_cpu[i]
        action = data.draw(st.sampled_from(["view", "view", "write", "write", "read", "out_of_place"]), label="action")
        if action == "view":
            desc, fn = _draw_view(data, t)
            prog.apply(f"v{len(prog.live)} = live[{i}].{desc}", lambda L, fn=fn, i=i: fn(L[i]))
        elif action == "write":
            desc, fn = _draw_write(data, t, len(prog.live))
            prog.apply(f"live[{i}].{desc}", lambda L, fn=fn, i=i: fn(L[i], L), add=False)
        elif action == "read":
            prog.check(i)  # a read in the middle of the program (flushes a lazy device)
        else:
            op = data.draw(st.sampled_from(sorted(OUT_OF_PLACE)), label="op")
            prog.apply(f"v{len(prog.live)} = live[{i}].{op}", lambda L, f=OUT_OF_PLACE[op], i=i: f(L[i]))
    for k in range(len(prog.live)):
        prog.check(k)


# Printing a view with more elements than its storage copies the storage, not the
# logical size (issue 17: expand(2**16, 2**16) tried to copy 16 GiB to the host).
PRINT_VIEWS = {
    "expand_huge": lambda d: torch.zeros(1, device=d).expand(2**16, 2**16),
    "expand_rows": lambda d: torch.arange(5.0, device=d).expand(3000, 5),
    "unfold_overlapping": lambda d: torch.arange(20000.0, device=d).unfold(0, 4096, 1),
    "as_strided_overlap": lambda d: torch.arange(10.0, device=d).as_strided((4, 4), (1, 1), 2),
    "stride0_offset": lambda d: torch.arange(6.0, device=d)[2:].as_strided((3, 1000), (1, 0)),
    "small_view_of_big": lambda d: torch.arange(100000.0, device=d)[10:13],
    "transposed": lambda d: torch.arange(6.0, device=d).view(2, 3).t(),
}


@pytest.mark.parametrize("case", sorted(PRINT_VIEWS))
def test_print_view_reads_storage_like_cpu(dev, case):
    cpu = repr(PRINT_VIEWS[case]("cpu"))
    got = repr(PRINT_VIEWS[case](dev))
    if torch.device(dev).type != "cpu":
        got = got.replace(", device='tpu:0'", "")
    assert got == cpu


# Ops run by CPU kernels at the flush read a gathering view (overlapping unfold
# windows, an overlapping as_strided, stride 0) as the strided view over its
# storage, as CPU does, not as a copy of its whole logical size (issue 17: a
# reduction over x.unfold(0, 4096, 1) copied ~0.5 GB for a 128 KB storage).
READ_VIEWS = {
    "unfold_sum_rows": lambda d: torch.arange(3000.0, device=d).unfold(0, 512, 1).sum(1),
    "unfold_amax": lambda d: torch.arange(3000.0, device=d).unfold(0, 512, 3).amax(),
    "unfold_mean_dim0": lambda d: torch.arange(300.0, device=d).unfold(0, 40, 7).mean(0),
    "as_strided_overlap_cumsum": lambda d: torch.arange(10.0, device=d).as_strided((4, 4), (1, 1), 2).cumsum(1),
    "expand_then_matmul": lambda d: torch.arange(5.0, device=d).expand(7, 5) @ torch.ones(5, 2, device=d),
    "unfold_sort": lambda d: torch.arange(50.0, device=d).flip(0).unfold(0, 6, 2).sort(1).values,
}


@pytest.mark.parametrize("case", sorted(READ_VIEWS))
def test_reads_of_gathering_views_match_cpu(dev, case):
    torch.testing.assert_close(READ_VIEWS[case](dev).cpu(), READ_VIEWS[case]("cpu"))


def test_reduction_over_unfolded_view_reads_the_storage(dev):
    if torch.device(dev).type == "cpu":
        pytest.skip("measures the device's host copies")
    import resource

    x = torch.randn(2**15, device=dev)
    torch.tpu.synchronize()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = x.unfold(0, 4096, 1).sum(1)  # logical size 470 MB over a 128 KB storage
    torch.testing.assert_close(s.cpu(), x.cpu().unfold(0, 4096, 1).sum(1))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, f"peak memory grew by {grown_mb:.0f} MB"
