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
``jax.config.update("jax_enable_x64", True)``. Calls are not differentiable
(no autograd formula is registered).
"""

import itertools
import math
import re

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


class JaxOp:
    """A JAX function or Pallas kernel callable on torch tensors (see :func:`jax_op`)."""

    def __init__(
        self, fn, out_shape, *, grid=None, in_specs=None, out_specs=None, pallas=None, flops=None, mxu=False, name=None
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
        self._checked = {}  # (input dtypes, chip) -> cost dict
        lib = _library()
        lib.define(f"{self.name}(Tensor[] inputs) -> Tensor[]")
        lib.impl(self.name, self._run_host, "CPU")
        lib.impl(self.name, self._run_host, "PrivateUse1")  # recorded on tpu; runs at flush
        torch.library.register_fake(self.qualname, self._fake, lib=lib)
        self._op = getattr(getattr(torch.ops, _NS), self.name).default

    # -- the op's kernels -------------------------------------------------
    def _fake(self, inputs):
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
        arrays = [jax.dlpack.from_dlpack(t if t.is_contiguous() else t.contiguous()) for t in inputs]
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
        dtypes = tuple(t.dtype for t in inputs)
        key = (dtypes, chip)
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
            "hbm_bytes": hbm if self.pallas else None,
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

    def __call__(self, *inputs):
        """Runs (CPU tensors) or records (tpu tensors) the kernel; returns a tensor, or
        a tuple of them when ``out_shape`` is a sequence. Raises VmemExhaustedError at
        the call when the blocks do not fit the chip's VMEM."""
        if self.pallas and isinstance(self.in_specs, (tuple, list)) and len(self.in_specs) != len(inputs):
            raise TypeError(f"{self.name}: the kernel takes {len(self.in_specs)} inputs (in_specs), got {len(inputs)}")
        if any(t.device.type == "tpu" for t in inputs):
            _C._set_custom_op_cost(self.qualname, self._cost(inputs))
        out = self._op(list(inputs))
        return out[0] if self.single else tuple(out)


def jax_op(
    fn=None, out_shape=None, *, grid=None, in_specs=None, out_specs=None, pallas=None, flops=None, mxu=False, name=None
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
    Without ``fn``, returns a decorator. The returned :class:`JaxOp` takes the
    input tensors positionally.
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
        )

    return make if fn is None else make(fn)
