"""JAX and Pallas kernels as recorded ops on "tpu" tensors (optional extra ``pallas``).

``jax_op`` turns a Pallas kernel (``pl.pallas_call``'s arguments) or a plain JAX
function into a callable on torch tensors. On "tpu" tensors each call is
recorded like any op (shapes and dtypes from ``out_shape``); at flush the kernel
runs on the host with Pallas's interpret mode (a JAX function: ``jax.jit`` on the
CPU backend), and the simulated TPU costs it from its grid and BlockSpecs::

    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl
    from torch_tpu_eager.pallas import jax_op

    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    add = jax_op(add_kernel, jax.ShapeDtypeStruct((1024, 512), jnp.float32), grid=(8,),
                 in_specs=[pl.BlockSpec((128, 512), lambda i: (i, 0))] * 2,
                 out_specs=pl.BlockSpec((128, 512), lambda i: (i, 0)))
    z = add(x, y)       # x, y: (1024, 512) float32 "tpu" tensors; z is recorded

Buffers go to JAX and back by DLPack: inputs without a copy when they are dense
and contiguous on the host (a contiguous copy otherwise; JAX itself copies a
buffer it finds misaligned), results without a copy from JAX to torch, then one
copy into the device buffer of a result that outlives the flush (as for every
library call).

Cost on a TPU target (``torch_tpu_eager.profile`` shows the kernel under its
name, kind ``"pallas"`` in ``tiling``): the grid runs in row-major order (last
axis fastest); an operand's block is copied between HBM and VMEM at each step
whose block index (its ``index_map``) differs from the previous step's, so HBM
bytes = the blocks moved over the whole grid; FLOPs are ``flops`` when given
(on the MXUs with ``mxu=True``), else one vector operation per output element.
VMEM footprint = every block, padded to the (8, 128) layout tile (16 rows for
16-bit types), times 2 buffers (Pallas double-buffers each operand); a
footprint above the chip's VMEM (the target's chip data) raises
:class:`VmemExhaustedError` at the call, before anything runs, naming the
largest blocks, as a TPU compile of the kernel fails.

Only this module imports JAX, when first used. Install it with
``pip install -e ".[pallas]"`` (jax[cpu]). JAX runs float64 only with
``jax.config.update("jax_enable_x64", True)``. Calls are differentiable: a JAX
function through ``jax.vjp``, a Pallas kernel through the ``backward`` given to
:func:`jax_op`.
"""

import itertools
import math
import re
from typing import NamedTuple

import torch

from . import _C
from .custom_ops import set_cost as _set_cost  # noqa: F401  (the module must be imported: it installs the hook)

_NS = "tpu_jax"
_lib = None
_ids = itertools.count()


class VmemExhaustedError(RuntimeError):
    """A Pallas kernel's double-buffered blocks do not fit the chip's VMEM
    (XLA/Mosaic's RESOURCE_EXHAUSTED at compile time)."""


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ImportError('torch_tpu_eager.pallas needs JAX: pip install -e ".[pallas]" (jax[cpu])') from e
    return jax, jnp


def _library():
    global _lib
    if _lib is None:
        _lib = torch.library.Library(_NS, "FRAGMENT")
    return _lib


def _torch_dtype(dtype):
    """The torch dtype of a JAX/numpy dtype."""
    import numpy as np

    name = np.dtype(dtype).name
    if name == "bfloat16":
        return torch.bfloat16
    return getattr(torch, name)


def _struct_list(out_shape):
    single = hasattr(out_shape, "shape") and hasattr(out_shape, "dtype")
    return [out_shape] if single else list(out_shape), single


def _block_dims(spec, ndim):
    """Block shape of a BlockSpec as ints (None / squeezed dims: 1)."""
    shape = getattr(spec, "block_shape", None)
    if shape is None:
        return None
    dims = []
    for d in shape:
        if d is None:
            dims.append(1)
        elif isinstance(d, int):
            dims.append(d)
        else:  # pl.Blocked / pl.Squeezed / pl.Element ... objects
            dims.append(int(getattr(d, "block_size", 1) or 1))
    return dims


def _tiled_bytes(block, itemsize):
    """Bytes of one VMEM buffer of `block`: last two dims padded to the layout tile."""
    dims = list(block) or [1]
    lanes = 128
    sublanes = 8 * max(1, 4 // itemsize)
    if len(dims) >= 1:
        dims[-1] = -(-dims[-1] // lanes) * lanes
    if len(dims) >= 2:
        dims[-2] = -(-dims[-2] // sublanes) * sublanes
    return math.prod(dims) * itemsize


def _index_tuple(v):
    if isinstance(v, (tuple, list)):
        return tuple(int(x) for x in v)
    return (int(v),)


class _Operand(NamedTuple):
    """Shape, dtype and device of an input (what the call-time checks read)."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device


class JaxOp:
    """A JAX function or Pallas kernel callable on torch tensors (see :func:`jax_op`)."""

    def __init__(
        self,
        fn,
        out_shape,
        *,
        grid=None,
        in_specs=None,
        out_specs=None,
        pallas=None,
        flops=None,
        mxu=False,
        name=None,
        backward=None,
    ):
        if out_shape is None:
            raise TypeError("jax_op: out_shape is required (a jax.ShapeDtypeStruct or a sequence of them)")
        self.fn = fn
        self.pallas = pallas if pallas is not None else any(v is not None for v in (grid, in_specs, out_specs))
        self.grid = tuple(grid) if isinstance(grid, (tuple, list)) else ((grid,) if grid is not None else ())
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.flops = flops
        self.mxu = mxu
        self.outs, self.single = _struct_list(out_shape)
        self.out_shape = out_shape
        base = re.sub(r"\W", "_", name or getattr(fn, "__name__", "kernel")) or "kernel"
        self.name = f"{base}_{next(_ids)}"
        self.qualname = f"{_NS}::{self.name}"
        self._compiled = None
        self._checked = {}  # (input shapes, dtypes, chip) -> cost dict
        self._traced = set()  # (input shapes, dtypes): the call was checked against the specs and traced
        self._backward = backward
        self._vjp_ops = {}  # (input shapes, dtypes) -> the JaxOp of jax.vjp(fn)
        lib = _library()
        lib.define(f"{self.name}(Tensor[] inputs) -> Tensor[]")
        lib.impl(self.name, self._run_host, "CPU")
        lib.impl(self.name, self._run_host, "PrivateUse1")  # recorded on tpu; runs at flush
        torch.library.register_fake(self.qualname, self._fake, lib=lib)
        self._op = getattr(getattr(torch.ops, _NS), self.name).default

    # -- the op's kernels -------------------------------------------------
    def _fake(self, inputs):
        if torch.compiler.is_compiling():
            # torch.compile traces the op, not __call__'s checks (JAX code): they run here,
            # at trace time, on the fake inputs' shapes and dtypes.
            # Symbolic sizes are specialized (int() guards on them): a kernel's BlockSpecs fix its shapes.
            specs = [_Operand(tuple(int(d) for d in t.shape), t.dtype, t.device) for t in inputs]
            self._check_call(specs)
            if any(t.device.type == "tpu" for t in inputs):
                _C._set_custom_op_cost(self.qualname, self._cost(specs))
        return [
            torch.empty(tuple(s.shape), dtype=_torch_dtype(s.dtype), device=inputs[0].device if inputs else "cpu")
            for s in self.outs
        ]

    def _callable(self):
        if self._compiled is None:
            jax, _ = _jax()
            if self.pallas:
                from jax.experimental import pallas as pl

                kw = {}
                if self.grid:
                    kw["grid"] = self.grid
                if self.in_specs is not None:
                    kw["in_specs"] = self.in_specs
                if self.out_specs is not None:
                    kw["out_specs"] = self.out_specs
                self._compiled = jax.jit(pl.pallas_call(self.fn, out_shape=self.out_shape, interpret=True, **kw))
            else:
                self._compiled = jax.jit(self.fn)
        return self._compiled

    def _run_host(self, inputs):
        """Runs the kernel on host tensors (DLPack both ways)."""
        jax, _ = _jax()
        # detach: CPU inputs of a differentiable call still require grad here (DLPack refuses them)
        arrays = [jax.dlpack.from_dlpack((t if t.is_contiguous() else t.contiguous()).detach()) for t in inputs]
        out = self._callable()(*arrays)
        outs = [out] if self.single else list(out)
        return [torch.from_dlpack(o) for o in outs]

    # -- cost and the VMEM check -----------------------------------------
    def _specs(self, specs, n):
        if specs is None:
            return [None] * n
        if isinstance(specs, (tuple, list)):
            return list(specs)
        return [specs] * n if n == 1 else list(specs)

    def _cost(self, inputs):
        """The kernel's cost dict for _C._set_custom_op_cost; raises VmemExhaustedError."""
        from .target import get_target

        chip = get_target()
        key = (tuple(tuple(t.shape) for t in inputs), tuple(t.dtype for t in inputs), chip)
        if key in self._checked:
            return self._checked[key]
        info = torch.tpu.get_device_properties()
        vmem = getattr(info, "vmem_bytes", 0) if chip.startswith("tpu") else 0
        operands = [
            ("input", i, tuple(t.shape), t.dtype, s)
            for i, (t, s) in enumerate(zip(inputs, self._specs(self.in_specs, len(inputs))))
        ]
        operands += [
            ("output", j, tuple(o.shape), _torch_dtype(o.dtype), s)
            for j, (o, s) in enumerate(zip(self.outs, self._specs(self.out_specs, len(self.outs))))
        ]
        steps = math.prod(self.grid) if self.grid else 1
        grid_points = list(itertools.product(*[range(g) for g in self.grid])) if steps <= 100_000 else None
        blocks, footprint, hbm = [], 0, 0
        for role, idx, shape, dtype, spec in operands:
            itemsize = torch.empty((), dtype=dtype).element_size()
            block = _block_dims(spec, len(shape)) if spec is not None else list(shape)
            if block is None:
                block = list(shape)
            buf = _tiled_bytes(block, itemsize)
            footprint += 2 * buf
            blocks.append(
                {
                    "role": role,
                    "index": idx,
                    "dtype": str(dtype).replace("torch.", ""),
                    "shape": list(shape),
                    "block": list(block),
                    "buffers": 2,
                    "vmem_bytes": 2 * buf,
                }
            )
            block_bytes = math.prod(block) * itemsize
            index_map = getattr(spec, "index_map", None) if spec is not None else None
            if not self.pallas or index_map is None or grid_points is None:
                moves = steps if (self.pallas and index_map is not None) else 1
            else:
                moves, prev = 0, None
                for p in grid_points:
                    cur = _index_tuple(index_map(*p))
                    moves += cur != prev
                    prev = cur
            hbm += moves * block_bytes
        if self.pallas and vmem and footprint > vmem:
            big = sorted(blocks, key=lambda b: -b["vmem_bytes"])[:3]
            parts = "; ".join(
                f"{b['role']} {b['index']}: block {tuple(b['block'])} of {tuple(b['shape'])} "
                f"{b['dtype']} x{b['buffers']} buffers = {b['vmem_bytes'] / 2**20:.2f}M"
                for b in big
            )
            raise VmemExhaustedError(
                f"RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while compiling Pallas kernel "
                f"'{self.name}' for {chip}: its blocks, double-buffered, need {footprint / 2**20:.2f}M of "
                f"{vmem / 2**20:.2f}M vmem (exceeded by {(footprint - vmem) / 2**20:.2f}M). Largest: {parts}. "
                f"Use smaller blocks in its BlockSpecs."
            )
        flops = self.flops
        if flops is None and not self.pallas:
            flops = self._xla_flops(inputs)
        cost = {
            "flops": flops,
            "mxu": bool(self.mxu),
            # The grid's block traffic is a TPU (VMEM) model; on Spyre the default rule applies.
            "hbm_bytes": hbm if self.pallas and chip.startswith("tpu") else None,
            "vmem_bytes": footprint if self.pallas else 0,
            "grid": list(self.grid) if self.pallas else [],
            "blocks": [{k: v for k, v in b.items() if k != "index"} for b in blocks] if self.pallas else [],
        }
        self._checked[key] = cost
        return cost

    def _xla_flops(self, inputs):
        """FLOPs of a plain JAX function from XLA's cost analysis (None if it has none)."""
        jax, _ = _jax()
        try:
            structs = [jax.ShapeDtypeStruct(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in inputs]
            analysis = self._callable().lower(*structs).compile().cost_analysis()
            if isinstance(analysis, (list, tuple)):
                analysis = analysis[0] if analysis else {}
            f = (analysis or {}).get("flops")
            return float(f) if f is not None and f >= 0 else None
        except Exception:  # cost analysis is optional; the default rule applies
            return None

    def _operand_checks(self, inputs):
        """Raises at the call when an operand does not fit its BlockSpec: a block whose
        rank differs from the array's, a block index (from its ``index_map``) whose
        block starts outside the array (interpret mode would clamp it and read the
        wrong elements; a TPU would read or write out of bounds), or, on a TPU
        target, a block whose last two dims are neither multiples of the (8, 128)
        layout tile nor the array's dims (the Mosaic TPU compiler's rule, Pallas
        TPU docs "Noteworthy properties and restrictions")."""
        from .target import get_target

        on_tpu = get_target().startswith("tpu")
        n_in = len(inputs)
        operands = [
            ("input", i, tuple(t.shape), t.dtype, s)
            for i, (t, s) in enumerate(zip(inputs, self._specs(self.in_specs, n_in)))
        ]
        operands += [
            ("output", j, tuple(o.shape), _torch_dtype(o.dtype), s)
            for j, (o, s) in enumerate(zip(self.outs, self._specs(self.out_specs, len(self.outs))))
        ]
        steps = math.prod(self.grid) if self.grid else 1
        for role, idx, shape, dtype, spec in operands:
            block = _block_dims(spec, len(shape)) if spec is not None else None
            if block is None:
                continue
            what = f"{self.name}: {role} {idx} of shape {shape} {str(dtype).replace('torch.', '')}"
            # Dims given as plain ints (or None, squeezed) are blocked; pl.Element etc. are left to Pallas.
            plain = [d is None or isinstance(d, int) for d in spec.block_shape]
            if len(block) != len(shape):
                raise ValueError(
                    f"{what} does not match its BlockSpec: block {tuple(block)} has {len(block)} dims, "
                    f"the array {len(shape)}"
                )
            if on_tpu and len(shape) >= 1:
                tiles = [(len(shape) - 1, 128)] + ([(len(shape) - 2, 8)] if len(shape) >= 2 else [])
                for d, tile in tiles:
                    if plain[d] and spec.block_shape[d] is not None and block[d] % tile and block[d] != shape[d]:
                        raise ValueError(
                            f"{what}: block {tuple(block)} cannot be laid out on the TPU: dim {d} of the block "
                            f"({block[d]}) must be a multiple of {tile} or equal the array's ({shape[d]})"
                        )
            index_map = getattr(spec, "index_map", None)
            if index_map is None or not self.pallas or steps > 100_000:
                continue
            for p in itertools.product(*[range(g) for g in self.grid]):
                bidx = _index_tuple(index_map(*p))
                for d, (b, bs, n) in enumerate(zip(bidx, block, shape)):
                    if plain[d] and (b < 0 or b * bs >= n):
                        raise ValueError(
                            f"{what}: at grid point {p} its BlockSpec maps to block {bidx}, whose dim {d} "
                            f"starts at {b * bs}, outside the array (size {n}); block {tuple(block)}"
                        )

    def _check_call(self, inputs):
        """Checks a call's inputs once per (shapes, dtypes): against the BlockSpecs, JAX's
        dtypes, and by tracing the kernel (``jax.eval_shape``: its shape and dtype errors,
        and a JAX function whose results differ from ``out_shape``), all at the call."""
        from .target import get_target

        key = (tuple(tuple(t.shape) for t in inputs), tuple(t.dtype for t in inputs), get_target())
        if key in self._traced:
            return
        jax, _ = _jax()
        wide = (torch.float64, torch.int64, torch.complex128, torch.uint64)
        for i, t in enumerate(inputs):
            if t.dtype in wide and not jax.config.jax_enable_x64:
                raise TypeError(
                    f"{self.name}: input {i} is {str(t.dtype).replace('torch.', '')}, which JAX handles only with "
                    f'jax.config.update("jax_enable_x64", True)'
                )
        self._operand_checks(inputs)
        structs = [jax.ShapeDtypeStruct(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in inputs]
        try:
            got = jax.eval_shape(self._callable(), *structs)
        except (ValueError, TypeError) as e:
            desc = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in structs)
            raise type(e)(f"{self.name}: the kernel does not trace for inputs [{desc}]: {e}") from e
        got = [got] if self.single else list(got) if isinstance(got, (tuple, list)) else [got]
        want = [(tuple(o.shape), _torch_dtype(o.dtype)) for o in self.outs]
        have = [(tuple(g.shape), _torch_dtype(g.dtype)) for g in got]
        if have != want:
            raise ValueError(f"{self.name}: the function returns {have} where out_shape says {want}")
        self._traced.add(key)

    def __call__(self, *inputs):
        """Runs (CPU tensors) or records (tpu tensors) the kernel; returns a tensor, or
        a tuple of them when ``out_shape`` is a sequence. At the call, raises TypeError
        for a wrong number of inputs, ValueError (naming the operand and its block)
        for an input that does not fit its BlockSpec, the kernel's own tracing errors,
        and VmemExhaustedError when the blocks do not fit the chip's VMEM. Differentiable
        when a backward is known (see :func:`jax_op`)."""
        if self.pallas and isinstance(self.in_specs, (tuple, list)) and len(self.in_specs) != len(inputs):
            raise TypeError(f"{self.name}: the kernel takes {len(self.in_specs)} inputs (in_specs), got {len(inputs)}")
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.name}: input {i} is a {type(t).__name__}, not a Tensor")
        if not torch.compiler.is_compiling():  # (compiling: the fake impl checks)
            self._check_call(inputs)
            if any(t.device.type == "tpu" for t in inputs):
                _C._set_custom_op_cost(self.qualname, self._cost(inputs))
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            out = _JaxOpFunction.apply(self, *inputs)
        else:
            out = self._op(list(inputs))
        return out[0] if self.single else tuple(out)

    def register_backward(self, backward):
        """Sets the backward (decorator form of ``jax_op(..., backward=...)``); returns it."""
        self._backward = backward
        return backward

    # -- autograd ----------------------------------------------------------
    def _grads(self, inputs, outputs, grads, needs):
        """Gradients of the inputs (None where not needed or not differentiable)."""
        grads = [torch.zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]
        if self._backward is not None:
            got = self._backward(tuple(inputs), tuple(outputs), tuple(grads))
            got = [got] if isinstance(got, torch.Tensor) or got is None else list(got)
            if len(got) != len(inputs):
                raise RuntimeError(f"{self.name}: its backward returned {len(got)} gradients for {len(inputs)} inputs")
            return [g if need else None for g, need in zip(got, needs)]
        if self.pallas:
            raise NotImplementedError(
                f"{self.name}: no backward for this Pallas kernel (JAX cannot differentiate a pallas_call); "
                f"pass jax_op(..., backward=fn) or call .register_backward(fn), with "
                f"fn(inputs, outputs, grad_outputs) -> a gradient (or None) per input"
            )
        diff = [i for i, t in enumerate(inputs) if needs[i] and (t.is_floating_point() or t.is_complex())]
        if not diff:
            return [None] * len(inputs)
        op = self._vjp_op(inputs, diff)
        got = op(*inputs, *grads)
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        out = [None] * len(inputs)
        for i, g in zip(diff, got):
            out[i] = g
        return out

    def _vjp_op(self, inputs, diff):
        """The JaxOp computing ``jax.vjp(fn)``'s cotangents of inputs ``diff`` (recorded
        on "tpu" like the forward); one per input shapes and dtypes."""
        key = (tuple(tuple(t.shape) for t in inputs), tuple(t.dtype for t in inputs), tuple(diff))
        if key in self._vjp_ops:
            return self._vjp_ops[key]
        jax, jnp = _jax()
        import numpy as np

        fn, n, single = self.fn, len(inputs), self.single
        out_dtypes = [np.dtype(o.dtype) for o in self.outs]

        def vjp(*args):
            primals, cts = list(args[:n]), list(args[n:])

            def of_diff(*d):
                p = list(primals)
                for i, v in zip(diff, d):
                    p[i] = v
                return fn(*p)

            _, pull = jax.vjp(of_diff, *[primals[i] for i in diff])
            cts = [
                ct if jnp.issubdtype(dt, jnp.inexact) else np.zeros(ct.shape, dtype=jax.dtypes.float0)
                for ct, dt in zip(cts, out_dtypes)
            ]
            return tuple(pull(cts[0] if single else tuple(cts)))

        structs = tuple(
            jax.ShapeDtypeStruct(tuple(inputs[i].shape), str(inputs[i].dtype).replace("torch.", "")) for i in diff
        )
        op = JaxOp(vjp, structs, name=f"{self.name.rsplit('_', 1)[0]}_vjp")
        self._vjp_ops[key] = op
        return op


class _JaxOpFunction(torch.autograd.Function):
    """Autograd of a JaxOp call: forward records the op; backward runs its backward
    (the user's, or jax.vjp of a JAX function), itself recorded on "tpu"."""

    @staticmethod
    def forward(ctx, jop, *inputs):
        outs = list(jop._op(list(inputs)))
        ctx.jop, ctx.n = jop, len(inputs)
        ctx.save_for_backward(*inputs, *outs)
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, outs = saved[: ctx.n], saved[ctx.n :]
        return (None, *ctx.jop._grads(inputs, outs, grads, ctx.needs_input_grad[1:]))


def jax_op(
    fn=None,
    out_shape=None,
    *,
    grid=None,
    in_specs=None,
    out_specs=None,
    pallas=None,
    flops=None,
    mxu=False,
    name=None,
    backward=None,
):
    """A Pallas kernel or JAX function as an op on torch tensors ("tpu": recorded).

    ``fn``: a Pallas kernel (``fn(*in_refs, *out_refs)``) when ``grid``,
    ``in_specs`` or ``out_specs`` is given or ``pallas=True``; otherwise a JAX
    function of arrays, run with ``jax.jit``. ``out_shape``: a
    ``jax.ShapeDtypeStruct`` or a sequence of them (the results' shapes and
    dtypes, as for ``pl.pallas_call``). ``grid``, ``in_specs``, ``out_specs``: as
    for ``pl.pallas_call``. ``flops``: FLOPs per call for the cost model (on the
    MXUs with ``mxu=True``; a JAX function defaults to XLA's cost analysis).
    ``name``: the kernel's name in the profiler (default: ``fn.__name__``).
    ``backward``: ``backward(inputs, outputs, grad_outputs)`` -> one gradient
    (or None) per input, written with torch ops or other ``jax_op`` kernels (run
    and recorded like any op); without it, a JAX function is differentiated with
    ``jax.vjp`` (its backward is another recorded ``jax_op``), and a Pallas kernel
    raises NotImplementedError at ``backward()`` (JAX cannot differentiate a
    ``pallas_call``). Without ``fn``, returns a decorator. The returned
    :class:`JaxOp` takes the input tensors positionally; inputs are checked
    against the BlockSpecs and the kernel traced at the call (errors there).
    """

    def make(f):
        return JaxOp(
            f,
            out_shape,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            pallas=pallas,
            flops=flops,
            mxu=mxu,
            name=name,
            backward=backward,
        )

    return make if fn is None else make(fn)
