"""Random aliasing programs run in lock step on CPU and on "tpu", compared after every read.

A program works on 2-4 base tensors (float32/64, int32/64, bool, complex64, bfloat16,
float16; on both chips; float leaves may require grad) and mixes views (view/reshape,
flatten, transpose/permute/movedim/mT, slices with steps, select, narrow, diagonal,
unfold, as_strided, expand, squeeze/unsqueeze, split/chunk/unbind, real/imag/conj of
complex, view_as_real/complex, view(dtype), _neg_view, detach), in-place writes through
views and bases (add_/sub_/mul_/div_, copy_ across dtypes and chips, fill_, zero_,
clamp_, index_put_/index_fill_/index_add_/index_copy_, scatter(_add)_, put_,
masked_fill_/masked_scatter_, setitem, addcmul_/lerp_, out= ops including a resized
out, sort/cumsum out=), in-place metadata ops (t_, transpose_, squeeze_/unsqueeze_,
as_strided_, set_, resize_, detach_, storage fill_), out-of-place ops, moves between
chips and host round trips, reads (item, tolist, repr, any), streams, backward,
retain_grad and autograd.grad. After reads and at the end every live tensor is compared
with its CPU twin: dtype, shape, strides, storage offset, values, conj/neg bits, version
counter, requires_grad / is_leaf / grad_fn, `_base` presence, storage size, storage
aliasing (`untyped_storage().data_ptr()` equality between every pair) and grads; each
step's exception type must be CPU's. Writes whose CPU result depends on its loop order
(a destination whose elements share memory, a source that partly overlaps it without
CPU rejecting it) are not drawn, or read from a clone.

Derandomized, with a bounded number of examples (a `slow` test, tests/tiers.py). To hunt
with other seeds and more programs:
``PYTHONPATH=. python tests/views/test_random_aliasing.py --examples 500 --seed 7``
(failures print as minimal programs, shrunk by hypothesis).
"""

import argparse
import collections
import contextlib
import math
import os
import sys
import traceback

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/ when run as a script
from difftest import ProgramLog, outcome_quietly, print_step_counts, requires_tpu, run_generated  # noqa: E402

FLOAT = (torch.float32, torch.float64)
BASE_DTYPES = [
    torch.float32,
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.complex64,
    torch.bfloat16,
    torch.float16,
]
BASE_SHAPES = [(24,), (4, 6), (2, 3, 4), (1, 6), (3, 1, 4), (2, 2, 2, 3), (), (0, 3), (5,)]

EXCLUDE: set = set()  # step kinds left out (the command line's --exclude), to look past a known failure
STATS: collections.Counter = collections.Counter()  # (outcome, step) counts, printed by the command line


class Failure(AssertionError):
    pass


def _storage_elems(t):
    return t.untyped_storage().nbytes() // t.element_size()


def byte_offsets(t):
    """Set of byte addresses (relative to the storage) t's elements cover."""
    if t.numel() == 0:
        return set()
    n = _storage_elems(t)
    offs = torch.arange(max(n, 1)).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)
    es = t.element_size()
    return {int(o) * es + b for o in offs.tolist() for b in range(es)}


def unique_locations(t):
    if t.numel() <= 1:
        return True
    n = _storage_elems(t)
    offs = torch.arange(max(n, 1)).as_strided(t.shape, t.stride(), t.storage_offset())
    return offs.unique().numel() == t.numel()


def zero_stride(t):
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.untyped_storage().nbytes() > 0


def nonoverlap_dense(t):
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return is_non_overlapping_and_dense_or_false(t)


def source_ok(dest, src):
    """True if reading src while writing dest is defined on CPU (disjoint, the same
    elements, or an overlap CPU itself rejects); otherwise the step clones src."""
    if not isinstance(src, torch.Tensor) or not same_storage(dest, src) or dest.numel() == 0 or src.numel() == 0:
        return True
    if (dest.shape, dest.stride(), dest.storage_offset(), dest.dtype) == (
        src.shape,
        src.stride(),
        src.storage_offset(),
        src.dtype,
    ):
        return True
    bd, bs = byte_offsets(dest), byte_offsets(src)
    if not (bd & bs):
        return True
    if nonoverlap_dense(dest) and nonoverlap_dense(src):
        return True  # CPU raises (partial overlap): compared as an error
    return False


# --------------------------------------------------------------------------------------
# the lock-step runner
# --------------------------------------------------------------------------------------


class Side:
    """One run of the program: "cpu" (the reference) or "tpu"."""

    def __init__(self, is_dev):
        self.is_dev = is_dev
        self.live = []  # tensors
        self.chip = []  # chip index of each live tensor (0 on CPU's side too, as recorded for the device)
        self.leaves = []  # indices of leaves requiring grad
        self.streams = {}

    def dev(self, chip):
        return f"tpu:{chip}" if self.is_dev else "cpu"

    def stream(self, chip):
        if not self.is_dev:
            return contextlib.nullcontext()
        if chip not in self.streams:
            self.streams[chip] = torch.tpu.Stream(device=f"tpu:{chip}")
        return torch.tpu.stream(self.streams[chip])


def _fmt_exc(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


class Program(ProgramLog):
    def __init__(self):
        super().__init__()
        self.cpu = Side(False)
        self.tpu = Side(True)
        self.msg_diffs = []

    def step(self, code, fn, *, new=None, chip=0, leaf=False, read_result=True):
        """Runs fn(side) on both sides. new: a name for the result added to live."""
        self.log(code)
        (rc, ec), (rd, ed) = outcome_quietly(fn, self.cpu), outcome_quietly(fn, self.tpu)
        if ec is not None and ed is None and read_result:
            # a lazy device may report a data-dependent error at the read of the result
            try:
                if isinstance(rd, torch.Tensor):
                    rd.cpu()
            except Exception as ex:  # noqa: BLE001
                ed = ex
        STATS[("err" if ec is not None else "ok", code.split("(")[0].split("=")[-1].strip()[:30])] += 1
        if ec is not None:
            if ed is None:
                raise Failure(f"[no-error] CPU raised {_fmt_exc(ec)}; tpu did not\n{self.where()}")
            if type(ed) is not type(ec):
                raise Failure(f"[error-type] CPU raised {_fmt_exc(ec)}, tpu {_fmt_exc(ed)}\n{self.where()}")
            if _norm(str(ec)) != _norm(str(ed)):
                self.msg_diffs.append((code, _fmt_exc(ec), _fmt_exc(ed)))
            return None
        if ed is not None and code.endswith(".tolist()") and "returns multiple views" in str(ed):
            return None  # tolist moves a device tensor through autograd's to(): CUDA raises here too
        if ed is not None:
            said = "".join(traceback.format_exception_only(ed)).strip()[:600]
            raise Failure(f"[spurious-error] tpu raised {said}\n{self.where()}")
        if new is not None and isinstance(rc, torch.Tensor):
            self.cpu.live.append(rc)
            self.tpu.live.append(rd)
            self.cpu.chip.append(chip)
            self.tpu.chip.append(chip)
            if leaf:
                self.cpu.leaves.append(len(self.cpu.live) - 1)
                self.tpu.leaves.append(len(self.tpu.live) - 1)
        return rc, rd

    # ---- comparisons ----
    def check(self, i):
        c, d = self.cpu.live[i], self.tpu.live[i]
        w = f"v{i}"
        if d.device != torch.device(f"tpu:{self.tpu.chip[i]}"):
            raise Failure(f"[device] {w} on {d.device}, expected tpu:{self.tpu.chip[i]}\n{self.where()}")
        for name, f in (
            ("dtype", lambda t: t.dtype),
            ("shape", lambda t: tuple(t.shape)),
            ("stride", lambda t: t.stride()),
            ("storage_offset", lambda t: t.storage_offset()),
            ("is_view", lambda t: t._base is not None),
            ("version", lambda t: t._version),
            ("requires_grad", lambda t: t.requires_grad),
            ("is_leaf", lambda t: t.is_leaf),
            ("grad_fn", lambda t: type(t.grad_fn).__name__ if t.grad_fn is not None else None),
            ("storage_nbytes", lambda t: t.untyped_storage().nbytes()),
            ("is_contiguous", lambda t: t.is_contiguous()),
            ("is_conj", lambda t: t.is_conj()),
            ("is_neg", lambda t: t.is_neg()),
        ):
            if "stride" in name and c.numel() == 0:
                continue
            vc, vd = _outcome(f, c), _outcome(f, d)
            if vc != vd:
                raise Failure(f"[{name}] {w}: cpu {vc} tpu {vd}\n{self.where()}")
        self.compare_values(w, c.data, d.data)
        if _outcome(lambda t: t.is_leaf, c) is True or _outcome(lambda t: t.retains_grad, c) is True:
            gc, gd = c.grad, d.grad
            if (gc is None) != (gd is None):
                raise Failure(f"[grad-none] {w}.grad: cpu {gc is None} tpu {gd is None}\n{self.where()}")
            if gc is not None:
                self.compare_values(w + ".grad", gc, gd)

    def compare_values(self, w, c, d):
        try:
            dv = d.cpu()
        except Exception as ex:  # noqa: BLE001
            raise Failure(f"[read-error] {w}.cpu() raised {_fmt_exc(ex)}\n{self.where()}") from None
        if dv.dtype != c.dtype or dv.shape != c.shape:
            raise Failure(
                f"[read-meta] {w}.cpu() {dv.dtype}{tuple(dv.shape)} vs {c.dtype}{tuple(c.shape)}\n{self.where()}"
            )
        c, dv = c.resolve_conj().resolve_neg(), dv.resolve_conj().resolve_neg()
        if c.is_floating_point() or c.is_complex():
            ok = torch.equal(
                torch.view_as_real(c) if c.is_complex() else c, torch.view_as_real(dv) if dv.is_complex() else dv
            ) or torch.allclose(c, dv, rtol=0, atol=0, equal_nan=True)
        else:
            ok = torch.equal(c, dv)
        if not ok:
            raise Failure(f"[values] {w}: cpu {c.tolist()} tpu {dv.tolist()}\n{self.where()}")

    def check_aliasing(self):
        n = len(self.cpu.live)
        for i in range(n):
            for j in range(i + 1, n):
                a, b = self.cpu.live[i], self.cpu.live[j]
                if a.untyped_storage().nbytes() == 0 or b.untyped_storage().nbytes() == 0:
                    continue
                ac = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                x, y = self.tpu.live[i], self.tpu.live[j]
                ad = x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
                if ac != ad:
                    raise Failure(f"[aliasing] v{i}, v{j}: cpu shares={ac} tpu shares={ad}\n{self.where()}")

    def check_all(self):
        for i in range(len(self.cpu.live)):
            self.check(i)
        self.check_aliasing()


def _outcome(f, t):
    try:
        return f(t)
    except Exception as ex:  # noqa: BLE001
        return type(ex).__name__


def _norm(s):
    s = s.replace("tpu:0", "cpu").replace("tpu:1", "cpu").replace("tpu", "cpu").replace("PrivateUse1", "CPU")
    return s.split("\n")[0]


# --------------------------------------------------------------------------------------
# step generators: each draws parameters from CPU's state and returns (code, fn(side))
# --------------------------------------------------------------------------------------


def make_base(dtype, shape, k):
    n = math.prod(shape)
    v = (torch.arange(n, dtype=torch.float64) * (1 + k) - 7).reshape(shape)
    if dtype == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(shape).clone()
    if dtype.is_complex:
        return torch.complex(v, -v).to(dtype).clone()
    return v.to(dtype).clone()


def draw_base(data, prog):
    dtype = data.draw(st.sampled_from(BASE_DTYPES), label="dtype")
    shape = data.draw(st.sampled_from(BASE_SHAPES), label="shape")
    chip = data.draw(st.sampled_from([0, 0, 0, 1]), label="chip") if "chip1" not in EXCLUDE else 0
    rg = dtype in FLOAT and data.draw(st.booleans(), label="requires_grad") and "grad" not in EXCLUDE
    k = len(prog.cpu.live)
    i = k
    code = f"v{i} = make_base({dtype}, {shape}, {k}).to('tpu:{chip}')" + (".requires_grad_()" if rg else "")

    def fn(side):
        t = make_base(dtype, shape, k).to(side.dev(chip))
        return t.requires_grad_() if rg else t

    prog.step(code, fn, new=True, chip=chip, leaf=rg)


def _dims(t):
    return max(t.dim(), 1)


def draw_view(data, prog, i):
    t = prog.cpu.live[i]
    nd = t.dim()
    kinds = ["view_shape", "reshape", "unsqueeze", "as_strided", "detach", "flatten", "ellipsis_none", "view_dtype"]
    if nd >= 1:
        kinds += ["select", "slice", "narrow", "expand", "unfold", "squeeze", "split", "chunk", "unbind", "movedim"]
    if nd >= 2:
        kinds += ["transpose", "permute", "diagonal", "t_mT"]
    if t.is_complex():
        kinds += ["real", "imag", "view_as_real", "conj", "conj"]
    if t.dtype.is_floating_point or t.is_complex():
        kinds += ["neg_view"]
    if t.dtype in FLOAT and nd >= 1 and t.shape[-1] == 2:
        kinds += ["view_as_complex"]
    kinds = [k for k in kinds if k not in EXCLUDE]
    kind = data.draw(st.sampled_from(kinds), label="view kind")
    dim = data.draw(st.integers(-nd, nd - 1), label="dim") if nd >= 1 else 0
    size = t.shape[dim] if nd >= 1 else 1
    e = f"v{i}"
    if kind == "view_shape" or kind == "reshape":
        n = t.numel()
        shape = []
        rest = n
        for _ in range(data.draw(st.integers(0, 3), label="ndims")):
            divs = [d for d in range(1, rest + 1) if rest % d == 0] if rest > 0 else [0, 1]
            d = data.draw(st.sampled_from(divs), label="factor")
            shape.append(d)
            rest = rest // d if d else rest
        shape.append(-1 if data.draw(st.booleans(), label="minus1") and rest != 0 else rest)
        if n == 0 and -1 in shape:
            shape[shape.index(-1)] = 0
        m = "view" if kind == "view_shape" else "reshape"
        return f"{e}.{m}({tuple(shape)})", lambda x: getattr(x, m)(tuple(shape))
    if kind == "flatten":
        a = data.draw(st.integers(0, max(nd - 1, 0)), label="start")
        b = data.draw(st.integers(a, max(nd - 1, 0)), label="end")
        return f"{e}.flatten({a}, {b})", lambda x: x.flatten(a, b)
    if kind == "unsqueeze":
        d = data.draw(st.integers(-nd - 1, nd), label="udim")
        return f"{e}.unsqueeze({d})", lambda x: x.unsqueeze(d)
    if kind == "detach":
        return f"{e}.detach()", lambda x: x.detach()
    if kind == "ellipsis_none":
        return f"{e}[..., None]", lambda x: x[..., None]
    if kind == "view_dtype":
        to = data.draw(
            st.sampled_from(
                [
                    torch.int32,
                    torch.float32,
                    torch.int64,
                    torch.float64,
                    torch.int16,
                    torch.uint8,
                    torch.bfloat16,
                    torch.int8,
                ]
            ),
            label="vdtype",
        )
        if t.dtype == torch.bool or t.is_complex():
            to = (
                data.draw(st.sampled_from([torch.uint8, torch.int8]), label="vdtype2")
                if t.dtype == torch.bool
                else torch.float64
                if t.element_size() == 8
                else to
            )
        return f"{e}.view({to})", lambda x: x.view(to)
    if kind == "select":
        if size == 0:
            return f"{e}.narrow({dim}, 0, 0)", lambda x: x.narrow(dim, 0, 0)
        j = data.draw(st.integers(-size, size - 1), label="index")
        if data.draw(st.booleans(), label="as_index") and dim == 0:
            return f"{e}[{j}]", lambda x: x[j]
        return f"{e}.select({dim}, {j})", lambda x: x.select(dim, j)
    if kind == "slice":
        start = data.draw(st.integers(-size - 1, size), label="start")
        stop = data.draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)), label="stop")
        step = data.draw(st.integers(1, 3), label="step")
        sl = (slice(None),) * (dim % nd) + (slice(start, stop, step),)
        return f"{e}[{_slice_txt(sl)}]", lambda x: x[sl]
    if kind == "narrow":
        start = data.draw(st.integers(0, size), label="nstart")
        length = data.draw(st.integers(0, size - start), label="nlen")
        return f"{e}.narrow({dim}, {start}, {length})", lambda x: x.narrow(dim, start, length)
    if kind == "transpose":
        d1 = data.draw(st.integers(-nd, nd - 1), label="dim1")
        return f"{e}.transpose({dim}, {d1})", lambda x: x.transpose(dim, d1)
    if kind == "t_mT":
        if nd == 2 and data.draw(st.booleans(), label="t"):
            return f"{e}.t()", lambda x: x.t()
        return f"{e}.mT", lambda x: x.mT
    if kind == "permute":
        perm = data.draw(st.permutations(range(nd)), label="perm")
        return f"{e}.permute{tuple(perm)}", lambda x: x.permute(*perm)
    if kind == "movedim":
        d1 = data.draw(st.integers(-nd, nd - 1), label="dst")
        return f"{e}.movedim({dim}, {d1})", lambda x: x.movedim(dim, d1)
    if kind == "diagonal":
        d1 = data.draw(st.integers(0, nd - 1).filter(lambda v: v != dim % nd), label="dim1")
        off = data.draw(st.integers(-2, 2), label="offset")
        return f"{e}.diagonal({off}, {dim}, {d1})", lambda x: x.diagonal(off, dim, d1)
    if kind == "squeeze":
        if data.draw(st.booleans(), label="all"):
            return f"{e}.squeeze()", lambda x: x.squeeze()
        return f"{e}.squeeze({dim})", lambda x: x.squeeze(dim)
    if kind == "expand":
        shape = list(t.shape)
        if size == 1:
            shape[dim] = 3
            return f"{e}.expand{tuple(shape)}", lambda x: x.expand(*shape)
        return f"{e}.expand(2, *{e}.shape)", lambda x: x.expand(2, *x.shape)
    if kind == "unfold":
        sz = data.draw(st.integers(0, max(size, 0)), label="usize")
        step = data.draw(st.integers(1, 3), label="ustep")
        return f"{e}.unfold({dim}, {sz}, {step})", lambda x: x.unfold(dim, sz, step)
    if kind in ("split", "chunk", "unbind"):
        k = data.draw(st.integers(0, 3), label="piece")
        if kind == "split":
            c = data.draw(st.integers(1, max(size, 1)), label="split")
            return f"{e}.split({c}, {dim})[{k}]", lambda x: _pick(x.split(c, dim), k)
        if kind == "chunk":
            c = data.draw(st.integers(1, 4), label="chunks")
            return f"{e}.chunk({c}, {dim})[{k}]", lambda x: _pick(x.chunk(c, dim), k)
        return f"{e}.unbind({dim})[{k}]", lambda x: _pick(x.unbind(dim), k)
    if kind == "conj":
        return f"{e}.conj()", lambda x: x.conj()
    if kind == "neg_view":
        return f"torch._neg_view({e})", lambda x: torch._neg_view(x)
    if kind == "real":
        return f"{e}.real", lambda x: x.real
    if kind == "imag":
        return f"{e}.imag", lambda x: x.imag
    if kind == "view_as_real":
        return f"torch.view_as_real({e})", lambda x: torch.view_as_real(x)
    if kind == "view_as_complex":
        return f"torch.view_as_complex({e})", lambda x: torch.view_as_complex(x)
    # as_strided inside the storage
    ns = _storage_elems(t)
    n = data.draw(st.integers(1, 3), label="as_ndim")
    sizes = [data.draw(st.integers(1, 3), label="as_size") for _ in range(n)]
    strides = [data.draw(st.integers(0, 4), label="as_stride") for _ in range(n)]
    extent = sum((s - 1) * k for s, k in zip(sizes, strides))
    if extent >= ns:
        sizes, strides = [1], [1]
        extent = 0
    off = data.draw(st.integers(0, max(ns - 1 - extent, 0)), label="as_offset")
    return f"{e}.as_strided({sizes}, {strides}, {off})", lambda x: x.as_strided(sizes, strides, off)


def _pick(parts, k):
    return parts[min(k, len(parts) - 1)]  # IndexError on both sides when there are no parts


def _slice_txt(sl):
    out = []
    for s in sl:
        if s == slice(None):
            out.append(":")
        else:
            out.append(f"{s.start}:{'' if s.stop is None else s.stop}:{s.step}")
    return ", ".join(out)


def _same_chip_partner(data, prog, i, label="src", shape_ok=None):
    """Index of a live tensor on i's chip whose shape broadcasts to live[i]'s, or None."""
    t = prog.cpu.live[i]
    cands = []
    for j, s in enumerate(prog.cpu.live):
        if prog.cpu.chip[j] != prog.cpu.chip[i]:
            continue
        try:
            if torch.broadcast_shapes(s.shape, t.shape) == t.shape:
                cands.append(j)
        except RuntimeError:
            pass
    if not cands:
        return None
    return data.draw(st.sampled_from(cands), label=label)


# Writes whose CPU result is defined on a destination whose elements are distinct, and
# which CPU rejects (internal overlap) or computes alike on an expanded one.
ELEMENTWISE_WRITES = (
    "add_scalar",
    "mul_scalar",
    "add_tensor",
    "copy_",
    "fill_",
    "zero_",
    "clamp_",
    "out_add",
    "out_neg",
    "sub_tensor",
    "cpu_scalar_add",
    "div_scalar",
    "copy_other_chip",
    "out_sum",
    "mul_tensor",
    "addcmul_",
    "lerp_",
    "out_wrong_shape",
    "resize_",
)
# Writes through indices, masks and rows: drawn only for destinations without a zero stride
# (CPU deprecates or rejects them on expanded tensors). Drawn by _draw_indexed_write except
# the first three.
INDEXED_WRITES = (
    "index_put_",
    "masked_fill_",
    "setitem",
    "index_fill_",
    "index_add_",
    "index_copy_",
    "scatter_",
    "scatter_add_",
    "put_",
    "masked_scatter_",
    "setitem_slice",
    "setitem_adv",
    "setitem_mask",
    "sort_out",
    "cumsum_out",
)


def draw_write(data, prog, i):
    t = prog.cpu.live[i]
    kinds = list(ELEMENTWISE_WRITES)  # on an expanded destination CPU rejects these or writes one value
    if not zero_stride(t):
        # Elements sharing memory without a zero stride: CPU's result depends on its loop
        # order, except for writes of one constant.
        kinds = kinds + list(INDEXED_WRITES) if unique_locations(t) else ["fill_", "zero_"]
    kinds = [k for k in kinds if k not in EXCLUDE]
    if not kinds:
        return None
    kind = data.draw(st.sampled_from(kinds), label="write kind")
    v = data.draw(st.integers(-3, 3), label="value")
    e = f"v{i}"
    nograd = data.draw(st.booleans(), label="no_grad") if t.requires_grad and "nograd" not in EXCLUDE else False

    def wrap(code, f):
        if nograd:
            return f"with torch.no_grad(): {code}", lambda L, s: _nograd(f, L, s)
        return code, f

    if kind == "add_scalar":
        return wrap(f"{e}.add_({v})", lambda L, s: L[i].add_(v))
    if kind == "mul_scalar":
        return wrap(f"{e}.mul_({v})", lambda L, s: L[i].mul_(v))
    if kind == "div_scalar":
        return wrap(f"{e}.div_(2)", lambda L, s: L[i].div_(2))
    if kind == "fill_":
        return wrap(f"{e}.fill_({v})", lambda L, s: L[i].fill_(v))
    if kind == "zero_":
        return wrap(f"{e}.zero_()", lambda L, s: L[i].zero_())
    if kind == "clamp_":
        return wrap(f"{e}.clamp_({v}, {v + 3})", lambda L, s: L[i].clamp_(v, v + 3))
    if kind == "cpu_scalar_add":
        return wrap(f"{e}.add_(torch.tensor({v}))", lambda L, s: L[i].add_(torch.tensor(v)))
    if kind == "masked_fill_":
        return wrap(f"{e}.masked_fill_({e} > {v}, {-v})", lambda L, s: L[i].masked_fill_(L[i] > v, -v))
    if kind == "index_put_":
        if t.dim() == 0 or t.shape[0] == 0:
            return wrap(f"{e}.add_({v})", lambda L, s: L[i].add_(v))
        acc = data.draw(st.booleans(), label="accumulate")
        idx = data.draw(
            st.lists(
                st.integers(-t.shape[0], t.shape[0] - 1),
                min_size=1,
                max_size=4,
                unique_by=(lambda x: x % t.shape[0]) if not acc else None,
            ),
            label="indices",
        )
        chip = prog.cpu.chip[i]
        return wrap(
            f"{e}.index_put_((tensor({idx}),), tensor({v}), accumulate={acc})",
            lambda L, s: L[i].index_put_(
                (torch.tensor(idx, device=s.dev(chip)),),
                torch.tensor(v, dtype=L[i].dtype, device=s.dev(chip)),
                accumulate=acc,
            ),
        )
    chip = prog.cpu.chip[i]

    if kind in INDEXED_WRITES[3:] + ("out_wrong_shape", "resize_"):
        n0 = t.shape[0] if t.dim() else 1
        if kind == "resize_":
            room = _storage_elems(t) - t.storage_offset()
            m = data.draw(st.integers(0, max(room, 0)), label="resize")  # growth holds uninitialized memory
            return wrap(f"{e}.resize_({m})", lambda L, s: L[i].resize_(m))
        if kind == "out_wrong_shape":
            m = data.draw(st.integers(0, 5), label="outn")
            return wrap(
                f"torch.add(torch.ones({m}), 1, out={e})",
                lambda L, s: torch.add(torch.ones(m, dtype=L[i].dtype, device=s.dev(chip)), 1, out=L[i]),
            )
        if kind == "cumsum_out":
            return wrap(f"torch.cumsum({e}.clone(), 0, out={e})", lambda L, s: torch.cumsum(L[i].clone(), 0, out=L[i]))
        if kind == "sort_out":
            idx_shape = tuple(t.shape)
            return wrap(
                f"torch.sort({e}.clone(), out=({e}, empty_long{idx_shape}))",
                lambda L, s: torch.sort(
                    L[i].clone(), out=(L[i], torch.empty(idx_shape, dtype=torch.long, device=s.dev(chip)))
                ),
            )
        if kind == "put_":
            idx = data.draw(
                st.lists(
                    st.integers(-max(t.numel(), 1), max(t.numel(), 1) - 1),
                    min_size=1,
                    max_size=3,
                    unique_by=lambda x: x % max(t.numel(), 1),
                ),
                label="put_idx",
            )
            acc = data.draw(st.booleans(), label="acc")
            return wrap(
                f"{e}.put_(tensor({idx}), full({len(idx)}, {v}), accumulate={acc})",
                lambda L, s: L[i].put_(
                    torch.tensor(idx, device=s.dev(chip)),
                    torch.full((len(idx),), v, dtype=L[i].dtype, device=s.dev(chip)),
                    accumulate=acc,
                ),
            )
        if kind == "masked_scatter_":
            return wrap(
                f"{e}.masked_scatter_({e} > {v}, arange_like({e}))",
                lambda L, s: L[i].masked_scatter_(
                    L[i] > v, (torch.arange(L[i].numel()) % 7).to(L[i].dtype).reshape(L[i].shape).to(s.dev(chip))
                ),
            )
        if kind == "setitem_mask":
            return wrap(f"{e}[{e} < {v}] = {v * 2}", lambda L, s: L[i].__setitem__(L[i] < v, v * 2))
        if t.dim() == 0:
            return wrap(f"{e}.fill_({v})", lambda L, s: L[i].fill_(v))
        idx = (
            data.draw(
                st.lists(st.integers(-n0, n0 - 1), min_size=0, max_size=3, unique_by=lambda x: x % max(n0, 1)),
                label="idx",
            )
            if n0
            else []
        )
        rest = tuple(t.shape[1:])
        if kind == "setitem_slice":
            a = data.draw(st.integers(0, n0), label="a")
            b = data.draw(st.integers(a, n0), label="b")
            return wrap(
                f"{e}[{a}:{b}] = ones_like({e}[{a}:{b}]) * {v}",
                lambda L, s: L[i].__setitem__(slice(a, b), torch.full_like(L[i][a:b], v)),
            )
        if kind == "setitem_adv":
            return wrap(f"{e}[{idx}] += {v}", lambda L, s: L[i].__setitem__(idx, L[i][idx] + v))
        if kind == "index_fill_":
            return wrap(
                f"{e}.index_fill_(0, tensor({idx}), {v})",
                lambda L, s: L[i].index_fill_(0, torch.tensor(idx, dtype=torch.long, device=s.dev(chip)), v),
            )
        src_shape = (len(idx),) + rest
        if kind in ("index_add_", "index_copy_"):
            kw = {"alpha": 2} if kind == "index_add_" else {}
            return wrap(
                f"{e}.{kind}(0, tensor({idx}), full({src_shape}, {v}){', alpha=2' if kw else ''})",
                lambda L, s: getattr(L[i], kind)(
                    0,
                    torch.tensor(idx, dtype=torch.long, device=s.dev(chip)),
                    torch.full(src_shape, v, dtype=L[i].dtype, device=s.dev(chip)),
                    **kw,
                ),
            )
        # scatter_ / scatter_add_ along dim 0 with a one-row index (unique targets per column)
        cols = rest
        row = data.draw(st.integers(0, max(n0 - 1, 0)), label="row")
        if kind == "scatter_":
            return wrap(
                f"{e}.scatter_(0, tensor(full((1,)+{cols}, {row})), {v})",
                lambda L, s: L[i].scatter_(0, torch.full((1,) + cols, row, dtype=torch.long).to(s.dev(chip)), v),
            )
        return wrap(
            f"{e}.scatter_add_(0, tensor(full((1,)+{cols}, {row})), ones((1,)+{cols}))",
            lambda L, s: L[i].scatter_add_(
                0,
                torch.full((1,) + cols, row, dtype=torch.long).to(s.dev(chip)),
                torch.ones((1,) + cols, dtype=L[i].dtype, device=s.dev(chip)),
            ),
        )
    if kind == "setitem":
        if t.dim() == 0 or t.shape[0] == 0:
            return wrap(f"{e}[...] = {v}", lambda L, s: L[i].__setitem__(Ellipsis, v))
        j = data.draw(st.integers(-t.shape[0], t.shape[0] - 1), label="row")
        return wrap(f"{e}[{j}] = {v}", lambda L, s: L[i].__setitem__(j, v))
    if kind == "copy_other_chip":
        j = data.draw(st.integers(0, len(prog.cpu.live) - 1), label="src")
        s_ = prog.cpu.live[j]
        try:
            ok = torch.broadcast_shapes(s_.shape, t.shape) == t.shape
        except RuntimeError:
            ok = False
        if not ok:
            return wrap(f"{e}.fill_({v})", lambda L, s: L[i].fill_(v))
        cl = "" if source_ok(t, s_) else ".clone()"
        return wrap(f"{e}.copy_(v{j}{cl})", lambda L, s: L[i].copy_(L[j].clone() if cl else L[j]))
    j = _same_chip_partner(data, prog, i)
    if j is None:
        return wrap(f"{e}.add_({v})", lambda L, s: L[i].add_(v))
    s_ = prog.cpu.live[j]
    cl = "" if source_ok(t, s_) else ".clone()"
    src = f"v{j}{cl}"

    def S(L):
        return L[j].clone() if cl else L[j]

    if kind == "add_tensor":
        return wrap(f"{e}.add_({src})", lambda L, s: L[i].add_(S(L)))
    if kind == "sub_tensor":
        return wrap(f"{e}.sub_({src})", lambda L, s: L[i].sub_(S(L)))
    if kind == "mul_tensor":
        return wrap(f"{e}.mul_({src})", lambda L, s: L[i].mul_(S(L)))
    if kind == "copy_":
        return wrap(f"{e}.copy_({src})", lambda L, s: L[i].copy_(S(L)))
    if kind == "addcmul_":
        return wrap(f"{e}.addcmul_({src}, {src}, value=2)", lambda L, s: L[i].addcmul_(S(L), S(L), value=2))
    if kind == "lerp_":
        return wrap(f"{e}.lerp_({src}, 0.5)", lambda L, s: L[i].lerp_(S(L), 0.5))
    if kind == "out_add":
        return wrap(f"torch.add({e}, {src}, out={e})", lambda L, s: torch.add(L[i], S(L), out=L[i]))
    if kind == "out_neg":
        return wrap(f"torch.neg({src}, out={e})", lambda L, s: torch.neg(S(L), out=L[i]))
    # out_sum: a reduction written into a view (resized if CPU resizes)
    if s_.dim() >= 1:
        return wrap(
            f"torch.sum({src}, 0, keepdim=True, out={e})", lambda L, s: torch.sum(S(L), 0, keepdim=True, out=L[i])
        )
    return wrap(f"torch.sum({src}, out={e})", lambda L, s: torch.sum(S(L), out=L[i]))


def _nograd(f, L, s):
    with torch.no_grad():
        return f(L, s)


def draw_meta_inplace(data, prog, i):
    t = prog.cpu.live[i]
    nd = t.dim()
    kinds = [
        "unsqueeze_",
        "squeeze_",
        "as_strided_",
        "set_tensor",
        "set_storage",
        "detach_",
        "storage_fill",
        "sync",
    ] + (["t_", "transpose_"] if nd >= 2 else [])
    kinds = [k for k in kinds if k not in EXCLUDE]
    kind = data.draw(st.sampled_from(kinds), label="meta kind")
    e = f"v{i}"
    if kind == "unsqueeze_":
        d = data.draw(st.integers(-nd - 1, nd), label="udim")
        return f"{e}.unsqueeze_({d})", lambda L, s: L[i].unsqueeze_(d)
    if kind == "squeeze_":
        return f"{e}.squeeze_()", lambda L, s: L[i].squeeze_()
    if kind == "t_":
        return f"{e}.t_()", lambda L, s: L[i].t_()
    if kind == "detach_":
        return f"{e}.detach_()", lambda L, s: L[i].detach_()
    if kind == "sync":
        return "torch.tpu.synchronize()", lambda L, s: torch.tpu.synchronize() if s.is_dev else None
    if kind == "storage_fill":
        b = data.draw(st.integers(0, 3), label="byte")
        return f"{e}.untyped_storage().fill_({b})", lambda L, s: L[i].untyped_storage().fill_(b)
    cands = [
        j
        for j in range(len(prog.cpu.live))
        if prog.cpu.chip[j] == prog.cpu.chip[i] and prog.cpu.live[j].dtype == t.dtype
    ]
    j = data.draw(st.sampled_from(cands), label="set_src")
    src = prog.cpu.live[j]
    if kind == "set_tensor":
        return f"{e}.set_(v{j})", lambda L, s: L[i].set_(L[j])
    if kind == "set_storage":
        ns2 = _storage_elems(src)
        m = data.draw(st.integers(0, max(ns2, 0)), label="set_n")
        o = data.draw(st.integers(0, max(ns2 - m, 0)), label="set_off")
        return f"{e}.set_(v{j}.untyped_storage(), {o}, ({m},), (1,))", lambda L, s: L[i].set_(
            L[j].untyped_storage(), o, (m,), (1,)
        )
    if kind == "transpose_":
        return f"{e}.transpose_(0, -1)", lambda L, s: L[i].transpose_(0, -1)
    ns = _storage_elems(t)
    n = max(1, min(ns, 4))
    off = data.draw(st.integers(0, max(ns - n, 0)), label="off")
    return f"{e}.as_strided_([{n}], [1], {off})", lambda L, s: L[i].as_strided_([n], [1], off)


OOP = {
    "mul_add": ("{e} * 2 + 1", lambda x, s, c: x * 2 + 1),
    "clone": ("{e}.clone()", lambda x, s, c: x.clone()),
    "contiguous": ("{e}.contiguous()", lambda x, s, c: x.contiguous()),
    "sum0": ("{e}.sum(0)", lambda x, s, c: x.sum(0)),
    "to_float64": ("{e}.to(torch.float64)", lambda x, s, c: x.to(torch.float64)),
    "to_int32": ("{e}.to(torch.int32)", lambda x, s, c: x.to(torch.int32)),
    "to_float32": ("{e}.float()", lambda x, s, c: x.float()),
    "flip": ("{e}.flip(0)", lambda x, s, c: x.flip(0)),
    "neg": ("-{e}", lambda x, s, c: -x),
    "cumsum": ("{e}.cumsum(0)", lambda x, s, c: x.cumsum(0)),
    "round_trip": (
        "{e}.cpu().to('tpu:{c}')",
        lambda x, s, c: x.cpu().to(s.dev(c)) if s.is_dev else x.to("cpu", copy=True),
    ),
    "to_same_chip": ("{e}.to('tpu:{c}')", lambda x, s, c: x.to(s.dev(c))),
    "to_same_dtype": ("{e}.to({e}.dtype)", lambda x, s, c: x.to(x.dtype)),
    "lazy_clone": ("torch._lazy_clone({e})", lambda x, s, c: torch._lazy_clone(x)),
    "view_as": ("{e}.view_as({e})", lambda x, s, c: x.view_as(x)),
    "grad_of": (
        "torch.autograd.grad(({e}.real * 1.5).sum(), first leaf on its chip)",
        lambda x, s, c: _grad_of(x, s, c),
    ),
    "where": ("torch.where({e} > 0, {e}, 0)", lambda x, s, c: torch.where(x > 0, x, 0)),
    "index_sel": ("{e}[[0, -1]]", lambda x, s, c: x[[0, -1]]),
    "cat": ("torch.cat([{e}, {e}])", lambda x, s, c: torch.cat([x, x])),
    "abs": ("{e}.abs()", lambda x, s, c: x.abs()),
    "square": ("{e} * {e}", lambda x, s, c: x * x),
    "relu": ("{e}.relu()", lambda x, s, c: x.relu()),
    "resolve_conj": ("{e}.resolve_conj()", lambda x, s, c: x.resolve_conj()),
    "resolve_neg": ("{e}.resolve_neg()", lambda x, s, c: x.resolve_neg()),
    "matmul_t": ("{e}.reshape(-1, 1) @ {e}.reshape(1, -1)", lambda x, s, c: x.reshape(-1, 1) @ x.reshape(1, -1)),
}


def draw_oop(data, prog, i):
    kinds = [k for k in sorted(OOP) if k not in EXCLUDE]
    kind = data.draw(st.sampled_from(kinds), label="oop")
    c = prog.cpu.chip[i]
    code, f = OOP[kind]
    return kind, code.format(e=f"v{i}", c=c), (lambda L, s: f(L[i], s, c))


def draw_move(data, prog, i):
    """v_new = v_i.to(other chip): a copy on the device; a clone on CPU."""
    c = 1 - prog.cpu.chip[i]
    return c, f"v{i}.to('tpu:{c}')", lambda L, s: L[i].to(s.dev(c)) if s.is_dev else L[i].to("cpu", copy=True)


def draw_read(data, prog, i):
    kind = data.draw(
        st.sampled_from([k for k in ["item", "tolist", "repr", "compare", "any"] if k not in EXCLUDE]), label="read"
    )
    t = prog.cpu.live[i]
    e = f"v{i}"
    if kind == "item" and t.numel() == 1:
        return f"{e}.item()", lambda L, s: L[i].item()
    if kind == "tolist":
        return f"{e}.tolist()", lambda L, s: L[i].tolist()
    if kind == "repr":
        return f"repr({e})", lambda L, s: _repr_norm(L[i])
    if kind == "any":
        return f"bool({e}.any())", lambda L, s: bool(L[i].any())
    return "check", None


def _repr_norm(t):
    r = " ".join(repr(t).split())
    for d in (", device='tpu:0'", ", device='tpu:1'"):
        r = r.replace(d, "")
    return " ".join(r.split())  # line breaks depend on the device suffix's width


def draw_backward(data, prog, i):
    e = f"v{i}"
    retain = data.draw(st.booleans(), label="retain_graph")
    return f"({e}.real * weights).sum().backward(retain_graph={retain})", lambda L, s: _backward(L[i], retain)


def _backward(t, retain):
    r = t.real if t.is_complex() else t
    w = (torch.arange(r.numel(), dtype=r.dtype) % 5 - 2).reshape(r.shape).to(r.device)
    (r * w).sum().backward(retain_graph=retain)


ACTIONS = [
    "base",
    "view",
    "view",
    "view",
    "write",
    "write",
    "write",
    "read",
    "oop",
    "meta",
    "move",
    "backward",
    "retain_grad",
    "stream_write",
    "check",
]


def run_program(data, n_steps_max=18):
    prog = Program()
    nb = data.draw(st.integers(2, 4), label="bases")
    for _ in range(nb):
        draw_base(data, prog)
    n = data.draw(st.integers(1, n_steps_max), label="steps")
    acts = [a for a in ACTIONS if a not in EXCLUDE]
    for _ in range(n):
        act = data.draw(st.sampled_from(acts), label="action")
        if act == "base":
            draw_base(data, prog)
            continue
        if act == "check":
            prog.check_all()
            continue
        i = data.draw(st.integers(0, len(prog.cpu.live) - 1), label="target")
        t = prog.cpu.live[i]
        if act == "view":
            code, f = draw_view(data, prog, i)
            prog.step(f"v{len(prog.cpu.live)} = {code}", lambda s, f=f: f(s.live[i]), new=True, chip=prog.cpu.chip[i])
        elif act in ("write", "stream_write"):
            w = draw_write(data, prog, i)
            if w is None:
                continue
            code, f = w
            if act == "stream_write":
                c = prog.cpu.chip[i]
                prog.step(f"with torch.tpu.stream(s{c}): {code}", lambda s, f=f, c=c: _in_stream(s, c, f))
            else:
                prog.step(code, lambda s, f=f: f(s.live, s))
        elif act == "meta":
            code, f = draw_meta_inplace(data, prog, i)
            prog.step(code, lambda s, f=f: f(s.live, s))
        elif act == "oop":
            kind, code, f = draw_oop(data, prog, i)
            prog.step(f"v{len(prog.cpu.live)} = {code}", lambda s, f=f: f(s.live, s), new=True, chip=prog.cpu.chip[i])
        elif act == "move":
            c, code, f = draw_move(data, prog, i)
            prog.step(f"v{len(prog.cpu.live)} = {code}", lambda s, f=f: f(s.live, s), new=True, chip=c)
        elif act == "read":
            code, f = draw_read(data, prog, i)
            if f is None:
                prog.check(i)
                continue
            r = prog.step(code, lambda s, f=f: f(s.live, s))
            if r is not None and repr(r[0]) != repr(r[1]):  # repr: NaN equals NaN, -0.0 differs from 0.0
                raise Failure(f"[read] {code}: cpu {r[0]!r} tpu {r[1]!r}\n{prog.where()}")
        elif act == "backward":
            if not t.requires_grad:
                continue
            code, f = draw_backward(data, prog, i)
            prog.step(code, lambda s, f=f: f(s.live, s))
        elif act == "retain_grad":
            if not t.requires_grad or _outcome(lambda x: x.is_leaf, t) is not False:  # raises for some views
                continue
            prog.step(f"v{i}.retain_grad()", lambda s: s.live[i].retain_grad())
    prog.check_all()
    return prog


def _grad_of(x, side, chip):
    """The gradient of a sum of x with respect to the first leaf on x's chip (zeros if unused)."""
    leaves = [side.live[k] for k in side.leaves if side.chip[k] == chip]
    if not leaves:
        return x + 0
    r = x.real if x.is_complex() else x
    (g,) = torch.autograd.grad((r * 1.5).sum(), leaves[0], retain_graph=True, allow_unused=True, materialize_grads=True)
    return g


def _in_stream(side, chip, f):
    with side.stream(chip):
        return f(side.live, side)


def _chips():
    import torch_tpu_eager  # noqa: F401

    return torch.tpu.device_count()


@requires_tpu
@settings(
    max_examples=80,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_random_aliasing_programs_match_cpu(data):
    if _chips() < 2:
        EXCLUDE.add("chip1")
    prog = run_program(data, 24)
    # Messages that differ after normalizing the device name (prog.msg_diffs) are not
    # judged here: tests/record/test_call_time_errors.py checks messages call by call.
    del prog


def main():
    ap = argparse.ArgumentParser(description="random aliasing programs, CPU against tpu")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exclude", default="", help="comma-separated step kinds to leave out")
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    from torch_tpu_eager import env

    if env.get("TORCH_TPU_QUICK"):
        args.examples = min(args.examples, 10)  # the docs' short form
    EXCLUDE.update(x for x in args.exclude.split(",") if x)
    if _chips() < 2:
        EXCLUDE.add("chip1")
    rc, _ = run_generated(lambda data: run_program(data, args.steps), examples=args.examples, seed=args.seed)
    if rc:
        return rc
    print_step_counts(STATS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
