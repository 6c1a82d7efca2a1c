"""Custom ops (``torch.library``) on "tpu": recorded like ATen ops, run at flush.

An op defined with ``torch.library.custom_op`` (or ``Library.define``) whose
author registers a "tpu" kernel — ``op.register_kernel("tpu", fn)``,
``torch.library.register_kernel(op, "tpu", fn)``, ``torch.library.impl(op,
"tpu", fn)`` or ``Library.impl(name, fn, "PrivateUse1")`` — is **recorded** on
"tpu" tensors like any ATen op:

- at the call, its fake impl (``register_fake``) gives the results' shapes,
  strides and dtypes, and its errors are raised there; one node joins the
  queue (``metrics_report()`` counts it as ``custom_op.<ns>::<name>``);
- at flush, ``fn`` runs as one library-call kernel, named ``"<ns>::<name>"``
  in :class:`torch_tpu_eager.profile`, on **CPU tensors that hold the device
  buffers**: arguments are CPU views of them (no copy for views the device
  stores densely; a gathered copy otherwise), arguments in ``mutates_args`` are
  written in place (a copy is scattered back when the view needed one), and
  the tensors ``fn`` returns are stored into the results recorded at the call
  (their shapes and dtypes must be what the fake impl said, else the flush
  raises for the results' reads).

Why CPU tensors: that is the contract of every library call of the device
(ATen ops without a fused lowering run CPU kernels on the host buffers), so a
kernel body written with torch ops runs unchanged and costs nothing extra; and
it runs inside the flush, where "tpu" tensors cannot be used: recording or
reading one there would re-enter the queue being flushed, so it raises
RuntimeError naming the op. (A kernel registered for all devices, with
``device_types=None`` / ``CompositeExplicitAutograd``, is not intercepted: it
runs at the call on the "tpu" tensors and its ops are recorded and fused; so does
the "tpu" kernel of an op with a TorchScript class in its schema, such as c10d's
collectives, which a queued node cannot hold.)

``register_autograd``, ``mutates_args`` (the mutation is seen by later reads and
by every view of the mutated tensor), several results, Tensor[] arguments and
results, view results (a schema ``Tensor(a) -> Tensor(a)``: metadata over the
argument's storage, nothing recorded) and ``torch.compile`` (fullgraph) work as
on CPU. A fake impl that needs data (``get_ctx().new_dynamic_size()``) or a
custom op without one runs the op at the call, after a flush, as ``nonzero``
does. An op without a "tpu" kernel raises NotImplementedError naming it, or
runs its CPU kernel with ``TORCH_TPU_CPU_FALLBACK=1``.

Registration is intercepted by one patch of ``torch.library.Library.impl``
(see :mod:`torch_tpu_eager._torch_patches`), installed at import: a "tpu"
kernel registered before ``torch_tpu_eager`` was imported (possible only with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) is, to the dispatcher, a kernel like a C++
one: it is adopted as below (then it runs at flush on host tensors), or, until then,
runs at the call on "tpu" tensors.

**C++ kernels.** A "tpu" kernel registered in C++ by a user's extension
(``TORCH_LIBRARY_IMPL(ns, PrivateUse1, m)``) never passes through Python; it is
*adopted* (:func:`adopt_cpp_kernels`): the record kernel is registered over it
and the C++ kernel, taken from the dispatcher (``torch.library.get_kernel``'s
``SafeKernelFunction``), runs at flush, boxed, on CPU tensors holding the device
buffers — the contract of Python kernels, so a kernel that computes on
``data_ptr()`` and allocates its results with its arguments' options runs
unchanged (one that insists on ``is_privateuseone()`` arguments fails at flush
with its own error). Shapes come from its fake impl (Python ``register_fake``
or a C++ ``Meta`` kernel); without one it runs at the call after a flush.
Adoption happens when the library is loaded with ``torch.ops.load_library``
(so ``torch.utils.cpp_extension.load(..., is_python_module=False)``), when the
op is first looked up as ``torch.ops.<ns>.<name>``, and on a call of
:func:`adopt_cpp_kernels`; an extension imported as a Python module that calls
its op only from its own C++ code must call ``adopt_cpp_kernels(ns)`` once after
import, or its kernel runs at the call on "tpu" tensors whose buffers are not
computed yet.
"""

import torch
from torch._library.utils import RegistrationHandle

from . import _C, _torch_patches

_TARGET = "torch.library.Library.impl"
_GETATTR_TARGET = "torch._ops._OpNamespace.__getattr__"
_LOAD_TARGET = "torch._ops._Ops.load_library"
_DEVICE_KEY = "PrivateUse1"


def _qualname(lib, op_name):
    name = lib._resolve_op_name(op_name, "impl")
    return name if "::" in name else f"{lib.ns}::{name}"


def _recordable(qualname):
    """Whether the op's schema can be recorded: no TorchScript class (``__torch__.*``,
    e.g. c10d's ProcessGroup and Work) among its arguments or results, whose objects a
    queued node cannot hold and a fake impl cannot produce. Kernels of other ops run at
    the call (torch_tpu_eager.distributed registers its collectives' kernels so)."""
    name, _, overload = qualname.partition(".")
    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:  # not defined yet: torch's own registration reports it
        return True
    types = [a.type for a in schema.arguments] + [r.type for r in schema.returns]
    return not any("__torch__." in str(t) for t in types)


def _impl(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=True):
    """``Library.impl`` with "tpu" (PrivateUse1) kernels of non-ATen ops registered
    as recorded ops; every other registration is torch's own."""
    original = _torch_patches.original(_TARGET)
    key = dispatch_key if dispatch_key != "" else self.dispatch_key
    if key != _DEVICE_KEY or not callable(fn) or fn is torch.library.fallthrough_kernel:
        return original(self, op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=allow_override)
    qualname = _qualname(self, op_name)
    if qualname.startswith("aten::") or not _recordable(qualname):
        # An ATen override, or an op the queue cannot hold: the user's kernel runs at the call.
        return original(self, op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=allow_override)
    # torch.library's own bookkeeping of Python registrations (Library.impl).
    impl_key = self.ns + "/" + qualname.split("::")[-1] + "/" + key
    if not allow_override and impl_key in torch.library._impls:
        raise RuntimeError(
            "This is not allowed since there's already a kernel registered from python overriding {}"
            "'s behavior for {} dispatch key and {} namespace.".format(qualname.split("::")[-1], key, self.ns)
        )
    if self.m is None:
        raise AssertionError("Library object has been destroyed")
    handle = _C._register_custom_op(qualname, fn, with_keyset)
    self._registration_handles.append(RegistrationHandle(lambda: _C._deregister_custom_op(handle)))
    torch.library._impls.add(impl_key)
    self._op_impls.add(impl_key)


def _in_dispatcher(qualname):
    """Whether the overload ``"ns::name[.overload]"`` is a dispatcher operator. TorchScript's
    own operators (``prim::layout``, ...) have schemas (``torch.ops.prim.layout``) but no
    dispatcher entry, hence no kernels to adopt."""
    name, _, overload = qualname.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(name, overload)
    except RuntimeError:
        return False
    return True


def _adopt(qualname):
    """Adopts the C++ "tpu" kernel of one overload; True when it was adopted."""
    if qualname.startswith("aten::") or not _in_dispatcher(qualname):
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, _DEVICE_KEY):
        return False
    return _recordable(qualname) and _C._adopt_cpp_kernel(qualname) != 0


def _adopt_overloads(name):
    """Adopts the C++ "tpu" kernels of every overload of ``"ns::name"``."""
    n = 0
    for schema in torch._C._jit_get_schemas_for_operator(name):
        n += _adopt(name + ("." + schema.overload_name if schema.overload_name else ""))
    return n


def adopt_cpp_kernels(namespace=None):
    """Records the ops whose "tpu" (PrivateUse1) kernel was registered in C++.

    ``namespace``: only ops of this namespace (``"mylib"``); None: every
    non-aten op. Each op whose PrivateUse1 kernel is a C++ kernel (not a
    composite or fallthrough one, not already recorded, and no TorchScript
    class in its schema) is recorded from then on, its C++ kernel running at
    flush on host tensors (see the module docstring). Called automatically
    after ``torch.ops.load_library`` and at the first ``torch.ops.<ns>.<name>``
    lookup; call it after importing an extension module that registers such
    kernels and calls them from C++. Cost: one pass over the dispatcher's
    ~3,600 op names (about 50 ms). Returns how many overloads were adopted.
    """
    prefix = None if namespace is None else namespace + "::"
    n = 0
    for name in torch._C._dispatch_get_all_op_names():
        if prefix is not None and not name.startswith(prefix):
            continue
        n += _adopt(name)
    return n


def _namespace_getattr(self, op_name):
    """``torch.ops.<ns>.<name>`` lookup, adopting the op's C++ "tpu" kernels first."""
    packet = _torch_patches.original(_GETATTR_TARGET)(self, op_name)
    if self.name != "aten":
        _adopt_overloads(f"{self.name}::{op_name}")
    return packet


def _load_library(self, path):
    """``torch.ops.load_library``, adopting the C++ "tpu" kernels the library registered."""
    result = _torch_patches.original(_LOAD_TARGET)(self, path)
    adopt_cpp_kernels()
    return result


def set_cost(op, flops=None, *, mxu=False, hbm_bytes=None):
    """Sets what one call of custom op ``op`` costs on the simulated TPU.

    ``op``: ``"ns::name[.overload]"``, an ``OpOverload`` or a ``custom_op``
    object. ``flops``: operations per call (None: the default rule for library
    calls, one vector-unit operation per result element); ``mxu``: they run on
    the MXUs at the chip's bf16 peak (else on the vector unit). ``hbm_bytes``:
    HBM bytes per call (None: the bytes of its tensors, read and written once).
    Applies to every later flush; ``set_cost(op)`` restores the defaults.
    """
    _C._set_custom_op_cost(
        _op_qualname(op),
        None if flops is None and hbm_bytes is None else {"flops": flops, "mxu": bool(mxu), "hbm_bytes": hbm_bytes},
    )


def _op_qualname(op):
    if isinstance(op, str):
        return op
    if hasattr(op, "_qualname"):  # torch.library.custom_op's CustomOpDef
        return op._qualname
    if isinstance(op, torch._ops.OpOverload):
        name = op._schema.name
        return name + ("." + op._overloadname if op._overloadname != "default" else "")
    raise TypeError(f"set_cost: expected an op name, OpOverload or custom op, got {type(op).__name__}")


def install():
    """Intercepts "tpu" kernel registrations (called once at import)."""
    _torch_patches.patch(torch.library.Library, "impl", _impl, why="record custom ops on tpu")
    _torch_patches.patch(torch._ops._OpNamespace, "__getattr__", _namespace_getattr, why="adopt C++ tpu kernels")
    _torch_patches.patch(torch._ops._Ops, "load_library", _load_library, why="adopt C++ tpu kernels")
