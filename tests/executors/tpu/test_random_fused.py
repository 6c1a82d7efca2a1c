"""Random programs of the ops partition fuses, run on CPU and on "tpu", compared bit for bit.

A program draws 2-4 inputs of one program shape (or shapes that broadcast to it) in
float32/bfloat16/float16/float64/int32/int64/uint8/bool, with layouts transposed,
permuted, sliced with a step, expanded or channels_last, values with sprinkled
inf/NaN/-0.0, shapes from 0-size and 1-element to rows crossing the tile and grain sizes
and more than 32,768 elements (the threaded paths). It then chains 6-16 steps:
unary/binary/ternary elementwise ops (where, clamp, pow, erf, gelu both forms,
sigmoid/silu, casts, comparisons, integer division/remainder, bitwise), reductions
(sum/mean/amax/amin/var/std/prod/argmax/any over random dims, keepdim), row ops
(softmax/log_softmax/layer_norm/rms_norm/logsumexp/cross_entropy), matmul/linear/addmm
(whose results feed the next elementwise and row steps: bias, activation, residual add,
layer_norm epilogues), in-place ops and out=, chains of unary ops in one float type
(bfloat16 / float16 half the time) ending in a reduction, and reads that flush part of the program.
Nothing is read between steps except by a read step, so the device records the whole
chain and partition fuses what it can.

Each step runs on both sides; an exception must be CPU's type, raised at the call.
Every result's dtype, shape and strides are compared at the call, its values at the end:
bit for bit (a NaN equals any NaN: CPU's own kernels give NaNs of other signs on two
threads, docs/tpu_target.md). The program runs with torch's intra-op threads at 1 or 2
(drawn) and under ``set_fused_math("cpu")``, where a fused exp/log/sin/cos/tanh/sqrt is
CPU's routine; under the default ``"sleef"`` those six differ by 1-2 ulp by design
(docs/tpu_target.md), so bit-equality is judged in the ``"cpu"`` mode only. At the end,
backward runs through every float result that requires grad (random output gradients)
and the leaves' grads are compared the same way.

Fast tier: a few dozen derandomized programs; slow tier: hundreds. To hunt with other
seeds: ``PYTHONPATH=. python tests/executors/tpu/test_random_fused.py --examples 300 --seed 3``
(failures print as minimal programs, shrunk by hypothesis). docs/random_programs.md.
"""

import argparse
import collections
import math
import os
import sys
import traceback

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from difftest import DEVICE, ProgramLog, outcome_quietly, print_step_counts, run_generated  # noqa: E402

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fused loops exist only on the tpu device")

FLOATS = [torch.float32, torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int32, torch.int64, torch.uint8]
DTYPES = FLOATS + FLOATS + INTS + [torch.bool]
# program shapes: 0-size, 1-element, odd rows, rows crossing 8/16/32-lane tiles, > 32768 elements
SHAPES = [
    (6, 5),
    (4, 33),
    (3, 17),
    (2, 3, 8),
    (1,),
    (7,),
    (0, 5),
    (2, 0, 3),
    (1, 1),
    (5, 64),
    (2, 3, 4, 5),
    (2, 4, 3, 3),
    (9, 257),
    (3, 2, 31),
]
LARGE_SHAPES = [(40, 1000), (257, 130), (3, 2, 5600), (2, 8, 48, 48)]
STATS: collections.Counter = collections.Counter()
SURVEY: collections.Counter = collections.Counter()  # --survey: failing programs by kind and last step
EXCLUDE: set = set()  # op names and step kinds left out (--exclude), to look past a known failure


def names(table):
    return sorted(k for k in table if k not in EXCLUDE)


class Failure(AssertionError):
    pass


def _fmt(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# --------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------


def make_values(dtype, shape, seed, special):
    """Deterministic CPU values of dtype and shape; special: sprinkle inf/-inf/NaN/-0.0."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=dtype)
    if not dtype.is_floating_point:
        return torch.randint(-20, 21, shape, generator=g, dtype=dtype)
    v = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if special and v.numel():
        flat = v.view(-1)
        # distinct positions: CPU's index_put_ of repeated indices picks a winner by thread timing
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 16)]
        pick = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0], dtype=torch.float64)
        flat[idx] = pick[torch.randint(0, 5, idx.shape, generator=g)]
    return v.to(dtype)


def layout_of(data, shape):
    opts = ["contiguous", "contiguous", "sliced", "expanded"]
    if len(shape) >= 2:
        opts += ["transposed", "permuted"]
    if len(shape) == 4:
        opts += ["channels_last"]
    return data.draw(st.sampled_from(opts), label="layout")


def base_and_view(layout, shape, data):
    """(shape of the base to create, code, fn(base) -> the input with `layout` and `shape`)."""
    nd = len(shape)
    if layout == "transposed":
        s = list(shape)
        s[-1], s[-2] = s[-2], s[-1]
        return tuple(s), ".transpose(-1, -2)", lambda b: b.transpose(-1, -2)
    if layout == "permuted":
        perm = data.draw(st.permutations(range(nd)), label="perm")
        inv = [perm.index(i) for i in range(nd)]
        base = tuple(shape[p] for p in perm)  # base.permute(inv) has `shape`
        return base, f".permute({inv})", lambda b: b.permute(inv)
    if layout == "sliced" and nd >= 1:
        d = data.draw(st.integers(0, nd - 1), label="slice_dim")
        s = list(shape)
        s[d] = 2 * s[d] + 1
        idx = (slice(None),) * d + (slice(1, None, 2),)
        return tuple(s), f"[{':, ' * d}1::2]", lambda b: b[idx]
    if layout == "expanded" and nd >= 1:
        d = data.draw(st.integers(0, nd - 1), label="expand_dim")
        s = list(shape)
        s[d] = 1
        return tuple(s), f".expand({list(shape)})", lambda b: b.expand(shape)
    if layout == "channels_last":
        return (
            shape,
            ".contiguous(memory_format=torch.channels_last)",
            lambda b: b.contiguous(memory_format=torch.channels_last),
        )
    return shape, "", lambda b: b


# --------------------------------------------------------------------------------------
# the lock-step runner
# --------------------------------------------------------------------------------------


class Program(ProgramLog):
    def __init__(self):
        super().__init__()
        self.live = {"cpu": [], "tpu": []}
        self.leaves = {"cpu": [], "tpu": []}

    def cpu(self, i):
        return self.live["cpu"][i]

    def n(self):
        return len(self.live["cpu"])

    def step(self, code, fn, new=True):
        """Runs fn(live, device) on CPU and on "tpu"; new: the result joins the live tensors."""
        name = f"v{self.n()}" if new else None
        self.log(f"{name} = {code}" if new else code)
        res = {dev: outcome_quietly(fn, self.live[dev], dev) for dev in ("cpu", "tpu")}
        (rc, ec), (rd, ed) = res["cpu"], res["tpu"]
        if ec is not None and ed is None and isinstance(rd, torch.Tensor):
            # an error that depends on device values (integer division by zero) is raised at
            # the read of the result, as a CUDA device-side error (docs/errors.md)
            try:
                rd.cpu()
            except Exception as ex:  # noqa: BLE001
                ed = ex
                STATS[("deferred", code.split("(")[0][:24])] += 1
        STATS[("err" if ec is not None else "ok", code.split("(")[0][:24])] += 1
        if ec is not None:
            if ed is None:
                raise Failure(f"[no-error] CPU raised {_fmt(ec)} at the call; tpu did not\n{self.where()}")
            if type(ed) is not type(ec):
                raise Failure(f"[error-type] CPU raised {_fmt(ec)}, tpu {_fmt(ed)}\n{self.where()}")
            return None
        if ed is not None:
            said = "".join(traceback.format_exception_only(ed)).strip()[:600]
            raise Failure(f"[spurious-error] tpu raised {said}\n{self.where()}")
        if new and isinstance(rc, torch.Tensor):
            self.check_meta(name, rc, rd)
            self.live["cpu"].append(rc)
            self.live["tpu"].append(rd)
        return rc, rd

    def check_meta(self, w, c, d):
        for what, f in (
            ("dtype", lambda t: t.dtype),
            ("shape", lambda t: tuple(t.shape)),
            ("stride", torch.Tensor.stride),
        ):
            if what == "stride" and c.numel() == 0:
                continue
            if f(c) != f(d):
                raise Failure(f"[{what}] {w}: cpu {f(c)} tpu {f(d)}\n{self.where()}")
        if d.device.type != "tpu":
            raise Failure(f"[device] {w} on {d.device}\n{self.where()}")
        if c.requires_grad != d.requires_grad:
            raise Failure(f"[requires_grad] {w}: cpu {c.requires_grad} tpu {d.requires_grad}\n{self.where()}")

    def compare(self, w, c, d):
        try:
            dv = d.detach().cpu()
        except Exception as ex:  # noqa: BLE001
            raise Failure(f"[read-error] {w}.cpu() raised {_fmt(ex)}\n{self.where()}") from None
        c = c.detach()
        if dv.dtype != c.dtype or dv.shape != c.shape:
            raise Failure(f"[read-meta] {w}: {dv.dtype}{tuple(dv.shape)} vs {c.dtype}{tuple(c.shape)}\n{self.where()}")
        if not same_bits(c, dv):
            bad = first_difference(c, dv)
            raise Failure(f"[values] {w} ({c.dtype}{tuple(c.shape)}): {bad}\n{self.where()}")

    def check_all(self):
        for i in range(self.n()):
            self.compare(f"v{i}", self.live["cpu"][i], self.live["tpu"][i])


def same_bits(c, d):
    """Bit-equal, except that a NaN equals any NaN (sign and payload are not judged)."""
    if c.numel() == 0:
        return True
    if not c.is_floating_point():
        return torch.equal(c, d)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[c.element_size()]
    ci, di = c.contiguous().view(ints), d.contiguous().view(ints)
    return bool(((ci == di) | (c.isnan() & d.isnan())).all())


def first_difference(c, d):
    if c.is_floating_point():
        bad = ~((c == d) & (c.signbit() == d.signbit()) | (c.isnan() & d.isnan()))
    else:
        bad = c != d
    idx = bad.nonzero()
    n = idx.shape[0]
    at = tuple(idx[0].tolist())
    return f"{n} of {c.numel()} differ; first at {at}: cpu {c[at].item()!r} tpu {d[at].item()!r}"


# --------------------------------------------------------------------------------------
# step generators: each returns (code, fn(live, device)) or None when nothing fits
# --------------------------------------------------------------------------------------


def pick(data, prog, pred=lambda t: True, label="x"):
    ok = [i for i in range(prog.n()) if pred(prog.cpu(i))]
    if not ok:
        return None
    return data.draw(st.sampled_from(ok), label=label)


def is_float(t):
    return t.is_floating_point()


def draw_input(data, prog, shape, dtype=None, grad=None, label="input"):
    """Adds a new input (a leaf, or a view of one) of shape; returns its index."""
    dtype = dtype or data.draw(st.sampled_from(DTYPES), label=label + "_dtype")
    layout = layout_of(data, shape)
    base_shape, view_code, view = base_and_view(layout, shape, data)
    seed = data.draw(st.integers(0, 9999), label="seed")
    special = dtype.is_floating_point and data.draw(st.integers(0, 5), label="special") == 0
    rg = dtype.is_floating_point and (grad if grad is not None else data.draw(st.booleans(), label="grad"))
    j = prog.n()

    def fn(live, dev):
        b = make_values(dtype, base_shape, seed, special).to(dev)
        if rg:
            b.requires_grad_()
            prog.leaves[dev].append(b)
        return view(b)

    rgc = ".requires_grad_()" if rg else ""
    prog.step(f"make_values({dtype}, {base_shape}, {seed}, {special}).to(dev){rgc}{view_code}", fn)
    return j


UNARY_FLOAT = {
    "neg": lambda x: x.neg(),
    "abs": lambda x: x.abs(),
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "erf": torch.erf,
    "exp": torch.exp,
    "log": torch.log,
    "tanh": torch.tanh,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "reciprocal": torch.reciprocal,
    "square": torch.square,
    "x * x": lambda x: x * x,
    "pow 2": lambda x: x.pow(2),
    "pow 0.5": lambda x: x.pow(0.5),
    "pow 3": lambda x: torch.pow(x, 3),
    "clamp(-1, 2)": lambda x: x.clamp(-1, 2),
    "clamp_min 0.5": lambda x: x.clamp_min(0.5),
    "leaky_relu": F.leaky_relu,
    "hardtanh": F.hardtanh,
    "softplus": F.softplus,
    "x * 0.5 + 1": lambda x: x * 0.5 + 1,
    "(x - 3) / 7": lambda x: (x - 3) / 7,
    "logical_not": torch.logical_not,
    "sign": torch.sign,
    "floor": torch.floor,
    "isnan": torch.isnan,
    "nan_to_num": torch.nan_to_num,
    "bitwise_not": torch.bitwise_not,
    "float()": lambda x: x.float(),
    "half()": lambda x: x.half(),
    "bfloat16()": lambda x: x.bfloat16(),
    "double()": lambda x: x.double(),
    "int()": lambda x: x.int(),
    "long()": lambda x: x.long(),
    "bool()": lambda x: x.bool(),
    "to(uint8)": lambda x: x.to(torch.uint8),
}

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "add alpha=2": lambda a, b: torch.add(a, b, alpha=2),
    "div floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "floor_divide": torch.floor_divide,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "atan2": torch.atan2,
    "eq": torch.eq,
    "lt": torch.lt,
    "ge": torch.ge,
    "ne": torch.ne,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}
SCALARS = [2, -3, 0.5, 1.5, 0, True, -0.25]
DIVISIONS = ("div floor", "div trunc", "remainder", "fmod", "floor_divide")


def draw_unary(data, prog):
    i = pick(data, prog)
    name = data.draw(st.sampled_from(names(UNARY_FLOAT)), label="unary")
    f = UNARY_FLOAT[name]
    return f"{name}(v{i})", lambda L, d: f(L[i])


def guard(name, t):
    """An integer divisor made nonzero (CPU raises ZeroDivisionError from its kernel)."""
    if name in DIVISIONS and not t.is_floating_point() and t.dtype != torch.bool:
        return t.abs() + 1 if t.dtype != torch.uint8 else t | 1
    return t


def draw_binary(data, prog):
    i = pick(data, prog, label="a")
    name = data.draw(st.sampled_from(names(BINARY)), label="binary")
    f = BINARY[name]
    form = data.draw(st.sampled_from(["tensor", "tensor", "scalar", "new"]), label="form")
    if form == "scalar":
        s = data.draw(st.sampled_from(SCALARS), label="scalar")
        if name in DIVISIONS and s in (0, False):
            s = 2
        return f"{name}(v{i}, {s!r})", lambda L, d: f(L[i], s)
    if form == "new":
        t = prog.cpu(i)
        shape = list(t.shape)
        for k in range(len(shape)):
            if data.draw(st.integers(0, 3), label="bcast") == 0:
                shape[k] = 1
        cut = data.draw(st.integers(0, len(shape)), label="suffix")
        j = draw_input(data, prog, tuple(shape[cut:]) if cut < len(shape) else (), label="b")
    else:
        j = pick(data, prog, label="b")
    swap = data.draw(st.booleans(), label="swap")
    a, b = (j, i) if swap else (i, j)
    g = "guard" if name in DIVISIONS else ""
    return f"{name}(v{a}, {g}(v{b}))", lambda L, d: f(L[a], guard(name, L[b]))


TERNARY_KINDS = ["where", "where_scalar", "clamp_t", "addcmul", "addcdiv", "lerp"]
ROW_KINDS = ["softmax", "log_softmax", "layer_norm", "rms_norm", "logsumexp", "cross_entropy"]
MATMUL_KINDS = ["linear", "linear_bias", "matmul", "addmm", "mm_t"]


def draw_ternary(data, prog):
    kind = data.draw(st.sampled_from(names(TERNARY_KINDS)), label="ternary")
    a, b, c = (pick(data, prog, label=x) for x in "abc")
    if kind == "where":
        return f"torch.where(v{a} > 0, v{b}, v{c})", lambda L, d: torch.where(L[a] > 0, L[b], L[c])
    if kind == "where_scalar":
        return f"torch.where(v{a} != 0, v{b}, -1.5)", lambda L, d: torch.where(L[a] != 0, L[b], -1.5)
    if kind == "clamp_t":
        return f"torch.clamp(v{a}, min=v{b}, max=v{c})", lambda L, d: torch.clamp(L[a], min=L[b], max=L[c])
    if kind == "addcmul":
        return f"torch.addcmul(v{a}, v{b}, v{c}, value=0.5)", lambda L, d: torch.addcmul(L[a], L[b], L[c], value=0.5)
    if kind == "addcdiv":
        return f"torch.addcdiv(v{a}, v{b}, v{c}, value=2)", lambda L, d: torch.addcdiv(L[a], L[b], L[c], value=2)
    return f"torch.lerp(v{a}, v{b}, 0.3)", lambda L, d: torch.lerp(L[a], L[b], 0.3)


REDUCTIONS = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
    "amin": torch.amin,
    "var": torch.var,
    "std": torch.std,
    "prod": torch.prod,
    "argmax": torch.argmax,
    "any": torch.any,
    "sum dtype=f64": lambda x, dim=None, keepdim=False: torch.sum(x, dim, keepdim=keepdim, dtype=torch.float64),
    "nansum": torch.nansum,
}


def draw_reduction(data, prog):
    i = pick(data, prog)
    t = prog.cpu(i)
    name = data.draw(st.sampled_from(names(REDUCTIONS)), label="reduction")
    f = REDUCTIONS[name]
    keep = data.draw(st.booleans(), label="keepdim")
    nd = t.dim()
    if nd == 0 or data.draw(st.integers(0, 4), label="all") == 0:
        if name in ("amax", "amin"):
            return f"{name}(v{i})", lambda L, d: f(L[i])
        return f"{name}(v{i})", lambda L, d: f(L[i])
    dims = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=min(nd, 2), unique=True), label="dims")
    single = name in ("argmax", "prod", "any") or len(dims) == 1
    dim = dims[0] if single else tuple(dims)
    return f"{name}(v{i}, {dim}, keepdim={keep})", lambda L, d: f(L[i], dim, keepdim=keep)


def draw_row(data, prog):
    i = pick(data, prog, lambda t: t.dim() >= 1, label="x")
    if i is None:
        return None
    t = prog.cpu(i)
    kind = data.draw(st.sampled_from(names(ROW_KINDS)), label="row")
    nd = t.dim()
    if kind in ("softmax", "log_softmax"):
        dim = data.draw(st.sampled_from([-1, -1, 0, nd - 1, -nd]), label="dim")
        dt = data.draw(st.sampled_from([None, None, torch.float32]), label="dtype")
        f = getattr(F, kind)
        return f"F.{kind}(v{i}, {dim}, dtype={dt})", lambda L, d: f(L[i], dim, dtype=dt)
    if kind == "logsumexp":
        dim = data.draw(st.sampled_from([-1, 0]), label="dim")
        keep = data.draw(st.booleans(), label="keepdim")
        return f"torch.logsumexp(v{i}, {dim}, {keep})", lambda L, d: torch.logsumexp(L[i], dim, keep)
    if kind == "cross_entropy":
        if nd != 2:
            return None
        n, c = t.shape
        tgt = draw_input(data, prog, (n,), dtype=torch.int64, grad=False, label="target")
        red = data.draw(st.sampled_from(["mean", "sum", "none"]), label="reduction")
        ls = data.draw(st.sampled_from([0.0, 0.0, 0.1]), label="label_smoothing")

        def ce(L, d):
            target = L[tgt].remainder(max(c, 1))
            return F.cross_entropy(L[i], target, reduction=red, label_smoothing=ls)

        return f"F.cross_entropy(v{i}, v{tgt} % {c}, reduction={red!r}, label_smoothing={ls})", ce
    k = data.draw(st.integers(1, min(nd, 2)), label="normalized_dims")
    ns = tuple(t.shape[nd - k :])
    affine = data.draw(st.sampled_from(["none", "weight", "both"]), label="affine")
    w = (
        draw_input(data, prog, ns, dtype=t.dtype if t.is_floating_point() else None, label="w")
        if affine != "none"
        else None
    )
    b = (
        draw_input(data, prog, ns, dtype=t.dtype if t.is_floating_point() else None, label="b")
        if affine == "both"
        else None
    )
    eps = data.draw(st.sampled_from([1e-5, None]), label="eps") if kind == "rms_norm" else 1e-5
    f = F.layer_norm if kind == "layer_norm" else F.rms_norm
    code = f"F.{kind}(v{i}, {ns}, {'v%d' % w if w is not None else None}, "
    if kind == "layer_norm":
        code += f"{'v%d' % b if b is not None else None})"
        return code, lambda L, d: f(L[i], ns, L[w] if w is not None else None, L[b] if b is not None else None)
    code += f"eps={eps})"
    return code, lambda L, d: f(L[i], ns, L[w] if w is not None else None, eps=eps)


def draw_matmul(data, prog):
    i = pick(data, prog, lambda t: 1 <= t.dim() <= 3 and t.shape[-1] <= 300 and t.numel() <= 40000, label="x")
    if i is None:
        return None
    t = prog.cpu(i)
    k = t.shape[-1]
    dt = t.dtype if t.is_floating_point() else torch.float32
    kind = data.draw(st.sampled_from(names(MATMUL_KINDS)), label="matmul")
    w = draw_input(data, prog, (k, k), dtype=dt, label="weight")
    if kind == "linear":
        return f"F.linear(v{i}, v{w})", lambda L, d: F.linear(L[i], L[w])
    if kind == "linear_bias":
        b = draw_input(data, prog, (k,), dtype=dt, label="bias")
        return f"F.linear(v{i}, v{w}, v{b})", lambda L, d: F.linear(L[i], L[w], L[b])
    if kind == "matmul":
        return f"v{i} @ v{w}", lambda L, d: L[i] @ L[w]
    if kind == "mm_t":
        return f"v{i} @ v{w}.t()", lambda L, d: L[i] @ L[w].t()
    b = draw_input(data, prog, (k,), dtype=dt, label="bias")
    beta, alpha = data.draw(st.sampled_from([(1, 1), (0.5, 2), (0, 1)]), label="beta_alpha")
    return (
        f"torch.addmm(v{b}, v{i}, v{w}, beta={beta}, alpha={alpha})",
        lambda L, d: torch.addmm(L[b], L[i], L[w], beta=beta, alpha=alpha),
    )


INPLACE = {
    "add_": lambda x, y: x.add_(y),
    "mul_": lambda x, y: x.mul_(y),
    "sub_ alpha": lambda x, y: x.sub_(y, alpha=0.5),
    "div_": lambda x, y: x.div_(y),
    "copy_": lambda x, y: x.copy_(y),
    "clamp_": lambda x, y: x.clamp_(-1, 1),
    "relu_": lambda x, y: x.relu_(),
    "sigmoid_": lambda x, y: x.sigmoid_(),
    "masked_fill_": lambda x, y: x.masked_fill_(y > 0, 2.5),
    "lerp_": lambda x, y: x.lerp_(y, 0.25),
    "addcmul_": lambda x, y: x.addcmul_(y, y, value=-0.5),
    "bitwise_and_": lambda x, y: x.bitwise_and_(y),
    "fill_": lambda x, y: x.fill_(3),
}


def draw_inplace(data, prog):
    i = pick(data, prog, label="dest")
    j = pick(data, prog, label="src")
    name = data.draw(st.sampled_from(names(INPLACE)), label="inplace")
    f = INPLACE[name]
    return False, f"{name}(v{i}, v{j})", lambda L, d: f(L[i], L[j])


OUT_OPS = {
    "add": lambda a, b, o: torch.add(a, b, out=o),
    "mul": lambda a, b, o: torch.mul(a, b, out=o),
    "sigmoid": lambda a, b, o: torch.sigmoid(a, out=o),
    "silu": lambda a, b, o: torch.ops.aten.silu.out(a, out=o),
    "gelu": lambda a, b, o: torch.ops.aten.gelu.out(a, out=o),
    "gelu_tanh": lambda a, b, o: torch.ops.aten.gelu.out(a, approximate="tanh", out=o),
    "sum": lambda a, b, o: torch.sum(a, -1, out=o),
    "where": lambda a, b, o: torch.where(a > 0, a, b, out=o),
    "softmax": lambda a, b, o: torch.softmax(a, -1, out=o),
}


def draw_out(data, prog):
    a = pick(data, prog, label="a")
    b = pick(data, prog, label="b")
    name = data.draw(st.sampled_from(names(OUT_OPS)), label="out_op")
    f = OUT_OPS[name]
    shape_src = pick(data, prog, label="out_shape")
    shape = tuple(prog.cpu(shape_src).shape)
    dt = data.draw(st.sampled_from(DTYPES), label="out_dtype")

    def fn(L, d):
        o = torch.empty(shape, dtype=dt, device=d)
        f(L[a].detach(), L[b].detach(), o)
        return o

    return True, f"torch.{name}(v{a}, v{b}, out=torch.empty({shape}, dtype={dt}))", fn


CHAIN_OPS = ["neg", "abs", "relu", "sigmoid", "silu", "gelu", "gelu_tanh", "erf", "exp", "tanh", "square"]
CHAIN_OPS += ["x * 0.5 + 1", "(x - 3) / 7", "softplus", "leaky_relu", "clamp(-1, 2)", "reciprocal", "log"]
CHAIN_REDUCTIONS = [None, None, "sum", "mean", "amax", "sum dtype=f64", "var"]


def draw_chain(data, prog):
    """2-4 unary ops in a row in one float type (bfloat16 / float16 half the time), then maybe a
    reduction over the last dim or all dims: the loop's elementwise chain feeding a reduction."""
    i = pick(data, prog, is_float, label="x")
    if i is None:
        return None
    dt = data.draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, None]), label="chain_dtype")
    ops = data.draw(st.lists(st.sampled_from([n for n in CHAIN_OPS if n not in EXCLUDE]), min_size=2, max_size=4))
    red = data.draw(st.sampled_from(CHAIN_REDUCTIONS), label="chain_reduce")
    last = prog.cpu(i).dim() > 0 and data.draw(st.booleans(), label="chain_last_dim")

    def fn(L, d):
        x = L[i] if dt is None else L[i].to(dt)
        for name in ops:
            x = UNARY_FLOAT[name](x)
        if red is None:
            return x
        return REDUCTIONS[red](x, -1) if last else REDUCTIONS[red](x)

    code = f"v{i}" if dt is None else f"v{i}.to({dt})"
    for name in ops:
        code = f"{name}({code})"
    if red is not None:
        code = f"{red}({code}{', -1' if last else ''})"
    return code, fn


def draw_read(data, prog):
    i = pick(data, prog, label="read")
    return False, f"v{i}.cpu()  # read", lambda L, d: L[i].detach().cpu() if d == "tpu" else L[i]


def draw_cast(data, prog):
    i = pick(data, prog)
    dt = data.draw(st.sampled_from(DTYPES), label="to")
    return f"v{i}.to({dt})", lambda L, d: L[i].to(dt)


KINDS = [
    "unary",
    "unary",
    "binary",
    "binary",
    "binary",
    "ternary",
    "reduction",
    "row",
    "row",
    "matmul",
    "inplace",
    "out",
    "read",
    "cast",
    "chain",
]


# step kinds whose (code, fn) gives a new live tensor
RESULT_STEPS = {
    "unary": draw_unary,
    "binary": draw_binary,
    "ternary": draw_ternary,
    "reduction": draw_reduction,
    "row": draw_row,
    "matmul": draw_matmul,
    "cast": draw_cast,
    "chain": draw_chain,
}


def run_program(data, max_steps=14):
    prog = Program()
    threads = data.draw(st.sampled_from([1, 2]), label="threads")
    torch.set_num_threads(threads)
    prog.log(f"torch.set_num_threads({threads})")
    large = data.draw(st.integers(0, 9), label="large") == 0
    shape = data.draw(st.sampled_from(LARGE_SHAPES if large else SHAPES), label="shape")
    for _ in range(data.draw(st.integers(1, 3), label="inputs")):
        draw_input(data, prog, shape)
    steps = data.draw(st.integers(3, max_steps), label="steps")
    for _ in range(steps):
        kind = data.draw(st.sampled_from([k for k in KINDS if k not in EXCLUDE]), label="kind")
        new = True
        if kind in RESULT_STEPS:
            r = RESULT_STEPS[kind](data, prog)
        else:
            r = {"inplace": draw_inplace, "out": draw_out, "read": draw_read}[kind](data, prog)
            if r is not None:
                new, r = r[0], r[1:]
        if r is None:
            continue
        code, fn = r
        prog.step(code, fn, new=new)
    prog.check_all()
    backward(prog, data)
    return prog


def backward(prog, data):
    """Backward through every float result that requires grad, random output gradients; leaves' grads compared."""
    outs = [i for i in range(prog.n()) if prog.cpu(i).requires_grad and prog.cpu(i).grad_fn is not None]
    if not outs:
        return
    seed = data.draw(st.integers(0, 9999), label="grad_seed")

    def fn(L, d):
        ts = [L[i] for i in outs]
        gs = [make_values(t.dtype, tuple(t.shape), seed + k, False).to(d) for k, t in enumerate(ts)]
        torch.autograd.backward(ts, gs)

    prog.step(f"torch.autograd.backward([{', '.join(f'v{i}' for i in outs)}], grads)", fn, new=False)
    for k, (c, d) in enumerate(zip(prog.leaves["cpu"], prog.leaves["tpu"])):
        if (c.grad is None) != (d.grad is None):
            raise Failure(f"[grad-none] leaf {k}: cpu {c.grad is None} tpu {d.grad is None}\n{prog.where()}")
        if c.grad is not None:
            prog.compare(f"leaf{k}.grad", c.grad, d.grad)


# --------------------------------------------------------------------------------------
# pytest and the command line
# --------------------------------------------------------------------------------------


def _settings(n):
    return settings(
        max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )


@pytest.fixture
def cpu_fused_math():
    import torch_tpu_eager

    before, threads = torch_tpu_eager.fused_math(), torch.get_num_threads()
    torch_tpu_eager.set_fused_math("cpu")
    yield
    torch_tpu_eager.set_fused_math(before)
    torch.set_num_threads(threads)


@_settings(24)
@given(data=st.data())
def test_random_fused_programs_match_cpu(cpu_fused_math, data):
    run_program(data, 8)


@_settings(300)
@given(data=st.data())
def test_random_fused_programs_match_cpu_long(cpu_fused_math, data):
    run_program(data, 16)


def main():
    ap = argparse.ArgumentParser(description="random fused programs, CPU against tpu")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--exclude", default="", help="comma-separated op names and step kinds to leave out")
    ap.add_argument("--survey", action="store_true", help="run every program, count failures by kind (no shrinking)")
    args = ap.parse_args()
    EXCLUDE.update(x for x in args.exclude.split(",") if x)
    import torch_tpu_eager
    from torch_tpu_eager import env

    if env.get("TORCH_TPU_QUICK"):
        args.examples = min(args.examples, 10)  # the docs' short form
    torch_tpu_eager.set_fused_math("cpu")

    def body(data):
        if not args.survey:
            run_program(data, args.steps)
            return
        try:
            run_program(data, args.steps)
        except Failure as f:
            text = str(f)
            SURVEY[text.split("]")[0] + "] " + text.splitlines()[-1].split("=")[-1].strip()[:40]] += 1

    rc, count = run_generated(body, examples=args.examples, seed=args.seed)
    if rc:
        return rc
    if args.survey:
        print(f"programs failing: {sum(SURVEY.values())} of {count}")
        for what, n in SURVEY.most_common():
            print(f"  {n:4d}  {what}")
    print_step_counts(STATS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
