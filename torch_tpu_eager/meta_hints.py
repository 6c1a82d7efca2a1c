"""Python meta kernels reason as for CPU while the record kernel infers shapes.

The record kernel infers each op's result geometry with its meta kernel on meta
twins of the "tpu" tensors; the executor then writes CPU's results into that
geometry. Several of PyTorch's Python meta kernels branch on
``torch._meta_registrations.device_hint``, which answers ``"cuda"`` for a bare
meta tensor: reflection/replication pads and pixel_shuffle then say contiguous
where CPU's kernels keep channels_last, and FFT/histc/eig checks follow CUDA's
rules. While the record kernel runs a meta kernel (``_C._in_device_meta_inference()``,
set per thread in csrc/ops/memory_format.h), meta tensors answer ``"cpu"``.
Meta tensors used directly by the program keep PyTorch's answer.

Many of those meta kernels (every elementwise reference of ``torch._refs``) are
wrapped in ``torch._disable_dynamo``, whose first call imports ``torch._dynamo``
(about 0.8 s). CPU never runs them, so an eager program on "tpu" would pay that
import on its first op. :func:`defer_dynamo_import` postpones it until Dynamo is
imported for a real reason.
"""

import sys

import torch
import torch._meta_registrations as _meta_registrations

from . import _C, _torch_patches

_WHY_DISABLE = "import Dynamo only when it traces"


def install():
    """Installs both adjustments: :func:`answer_cpu_for_device_hint` and
    :func:`defer_dynamo_import`."""
    answer_cpu_for_device_hint()
    defer_dynamo_import()


def answer_cpu_for_device_hint():
    """Wraps ``device_hint`` once. Looked up as a module global by the meta
    kernels (and imported at call time by torch._refs), so the wrapper applies
    to every call after this one."""
    original = _torch_patches.original("torch._meta_registrations.device_hint")

    def device_hint(tensor):
        if (
            _C._in_device_meta_inference()
            and isinstance(tensor, torch.Tensor)
            and not isinstance(tensor, torch._subclasses.FakeTensor)
            and tensor.device.type == "meta"
        ):
            return "cpu"
        return original(tensor)

    device_hint.__doc__ = original.__doc__
    _torch_patches.patch(_meta_registrations, "device_hint", device_hint, why="meta kernels reason as for CPU")


def _lazily_disabled(fn):
    """What ``torch._disable_dynamo``'s wrapper calls instead of ``torch._dynamo.disable(fn)``.

    Disabling Dynamo only matters while Dynamo traces, which needs ``torch._dynamo``
    imported; until then ``fn`` runs as is. Once Dynamo is imported, the real
    disabled function is built and cached where the wrapper looks for it.
    """

    def call(*args, **kwargs):
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):
            return fn(*args, **kwargs)
        disabled = dynamo.disable(fn, True, wrapping=False)
        _torch_patches.set_dynamo_disable_cache(fn, disabled, why=_WHY_DISABLE)
        return disabled(*args, **kwargs)

    return call


def defer_dynamo_import():
    """Keeps the meta kernels from importing ``torch._dynamo`` at the first "tpu" op.

    ``torch._disable_dynamo(fn)`` returns a wrapper that imports Dynamo on its first
    call and caches ``torch._dynamo.disable(fn)`` as ``fn.__dynamo_disable``. For each
    such wrapper reachable from PyTorch's meta kernels (the ``meta`` decomposition
    table, following ``__wrapped__`` and closures), the cache is pre-filled with
    :func:`_lazily_disabled`. Takes about 20 ms. Returns the number of functions
    adjusted (0 if torch's wrapper changed shape, which tests/device/test_startup.py reports).
    """
    from torch._decomp import global_decomposition_table

    wrapper_code = torch._disable_dynamo(lambda: None).__code__
    if "fn" not in wrapper_code.co_freevars:
        return 0
    fn_cell = wrapper_code.co_freevars.index("fn")
    seen = set()
    adjusted = 0
    stack = [f for table in global_decomposition_table.values() for f in table.values()]
    while stack:
        f = stack.pop()
        if id(f) in seen or not callable(f):
            continue
        seen.add(id(f))
        if getattr(f, "__code__", None) is wrapper_code:
            fn = f.__closure__[fn_cell].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                _torch_patches.set_dynamo_disable_cache(fn, _lazily_disabled(fn), why=_WHY_DISABLE)
                adjusted += 1
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            stack.append(wrapped)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return adjusted
