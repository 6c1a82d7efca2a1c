"""The only module of torch_tpu_eager that changes torch's own objects.

torch 2.13 has public extension points for most of what a PrivateUse1 backend
needs (``rename_privateuse1_backend``, ``_register_device_module``,
``generate_methods_for_privateuse1_backend``, ``torch.library``,
``register_interface_for_device``, ``register_backend``); the project uses
those. What they do not cover is listed in :data:`PATCHES`: for each patch, the
torch object replaced, the torch version it was checked against, the shape of
the original it expects (``inspect.signature`` text, or a description of the
code it relies on) and why it exists. Every change goes through :func:`patch`
(or one of the small helpers below, one per kind of change), which refuses a
name missing from the table. tests/device/test_torch_patches.py fails, naming the
patch, when the installed torch's original no longer has the expected shape,
and fails when another module of the package assigns attributes of torch.

At import, a shape mismatch gives one :class:`TorchPatchWarning` per patch and
the patch is still applied (the project pins torch==2.13.0; a mismatch means a
different torch, where the test names what to re-check).
"""

import dataclasses
import importlib.abc
import importlib.util
import inspect
import sys
import warnings

CHECKED_AGAINST = "2.13.0"


@dataclasses.dataclass(frozen=True)
class TorchPatch:
    """One change to a torch object.

    ``target`` is ``"<module>.<attr>"`` or ``"<module>.<Class>.<attr>"``;
    ``expect`` is what :func:`shape_of` returns for torch's original in the
    version ``checked``; ``why`` says what no public extension point provides.
    """

    target: str
    expect: str
    why: str
    checked: str = CHECKED_AGAINST


_DISABLE_DYNAMO_SHAPE = "closure over fn; caches fn.__dynamo_disable"

PATCHES = {
    p.target: p
    for p in [
        TorchPatch(
            "torch._tensor_str._tensor_str",
            "(self, indent)",
            "Printing a tensor runs ~23 ops on its device (PRIVATEUSE1_NOTES pitfall 7); the "
            "replacement formats a 'tpu' tensor from one host copy (one flush). _str_intern moves "
            "only a hard-coded list of device types (xla, lazy, ipu, mtia) to the CPU first, and "
            "torch has no printing hook for other devices.",
        ),
        TorchPatch(
            "torch._TorchCompileInductorWrapper.__call__",
            "(self, model_, inputs_, *, config_patches=None)",
            "torch.compile's default backend is this wrapper object, not a registry lookup, and "
            "Inductor maps 'tpu' to its Pallas code generator (needs JAX, reads device memory "
            "directly). Graphs with 'tpu' inputs go to torch_tpu_eager.dynamo.tpu_backend instead. "
            "Inductor's register_backend_for_device replaces code generation, not the whole "
            "compile, so it cannot route a graph to the device's own JIT.",
        ),
        TorchPatch(
            "torch._meta_registrations.device_hint",
            "(tensor) -> 'str'",
            "PyTorch's Python meta kernels branch on device_hint, which answers 'cuda' for a bare "
            "meta tensor; while the record kernel infers shapes for a 'tpu' op the answer must be "
            "'cpu' (CPU's kernels produce the results). See torch_tpu_eager.meta_hints.",
        ),
        TorchPatch(
            "torch._disable_dynamo",
            _DISABLE_DYNAMO_SHAPE,
            "Its wrappers import torch._dynamo (~0.8 s) on their first call; the meta kernels of "
            "every 'tpu' op are such wrappers. Pre-filling the fn.__dynamo_disable cache of each "
            "keeps an eager program from importing Dynamo (torch_tpu_eager.meta_hints).",
        ),
        TorchPatch(
            "torch._dynamo.device_interface.init_device_reg",
            "() -> None",
            "Not replaced: a sys.meta_path hook runs our registration right after torch._dynamo "
            "is imported. init_device_reg registers torch's own 'tpu' interface (for Google's "
            "torch_tpu) the first time Dynamo looks one up, replacing one registered earlier with "
            "the public register_interface_for_device; the hook forces that first and then "
            "registers ours, without importing Dynamo at `import torch_tpu_eager`.",
        ),
        TorchPatch(
            "torch._storage_classes",
            "set",
            "Not replaced: torch.tpu.<Type>Storage classes are added to this set, which "
            "torch.is_storage consults (torch.cuda adds its own the same way; no public API).",
        ),
        TorchPatch(
            "torch.UntypedStorage._byteswap",
            "<builtin method_descriptor>",
            "The C++ method swaps the host bytes in place, which for a 'tpu' storage may not hold "
            "the value yet (queued ops); the replacement swaps a host copy and copies it back.",
        ),
        TorchPatch(
            "torch.Tensor.__dlpack__",
            "(self, *, stream: typing.Any | None = -1, max_version: tuple[int, int] | None = None, "
            "dl_device: tuple[enum.IntEnum, int] | None = None, copy: bool | None = None)",
            "Exporting a 'tpu' tensor first runs the queued ops on its storage and pins its address.",
        ),
        TorchPatch(
            "torch.Tensor.__dlpack_device__",
            "(self) -> tuple[enum.IntEnum, int]",
            "torch 2.13 compares the device type with the literal 'privateuse1' and so rejects a "
            "renamed backend; the replacement answers (kDLExtDev, index) as later releases do.",
        ),
        TorchPatch(
            "torch.utils.dlpack.to_dlpack",
            "<builtin builtin_function_or_method>",
            "Same as Tensor.__dlpack__: run the queued ops and pin the address first.",
        ),
        TorchPatch(
            "torch.distributed.distributed_c10d._new_process_group_helper",
            "(group_size, group_rank, global_ranks_in_group, backend, store, group_name: "
            "torch.distributed.distributed_c10d.GroupName, backend_options=None, timeout=None, "
            "pg_tag=None, device_id=None, group_desc=None)",
            "With no backend argument (init_process_group()), torch 2.13 picks the accelerator's "
            "backend ('tpu_ccl', registered with Backend.register_backend) but sets the group's "
            "default backend type to GLOO unless it is NCCL, so DDP's logger fails with 'Could not "
            "find backend type 1'. The replacement passes 'tpu_ccl' by name when that is the "
            "backend torch picked, which is what init_process_group('tpu_ccl') does "
            "(torch_tpu_eager.distributed.backend).",
        ),
        TorchPatch(
            "torch.library.Library.impl",
            "(self, op_name, fn, dispatch_key='', *, with_keyset=False, allow_override=True)",
            "A Python kernel registered for PrivateUse1 (custom_op's register_kernel('tpu'), "
            "torch.library.impl/register_kernel) becomes the dispatcher's kernel and would run at the "
            "call on 'tpu' tensors; the device must record the op instead and run that kernel at "
            "flush. torch.library has no hook for a backend to wrap its kernels; the replacement "
            "registers the device's record kernel with the user's function as what runs at flush "
            "(torch_tpu_eager.custom_ops), and leaves every other registration to torch.",
        ),
        TorchPatch(
            "torch._ops._OpNamespace.__getattr__",
            "(self, op_name: str) -> torch._ops.OpOverloadPacket",
            "A 'tpu' kernel registered in C++ (TORCH_LIBRARY_IMPL(ns, PrivateUse1, m) in a user's "
            "extension) bypasses Library.impl and would run at the call on 'tpu' tensors whose "
            "buffers are not computed yet; the dispatcher has no hook on kernel registration. The "
            "first torch.ops.<ns>.<name> lookup is where Python code reaches such an op: the "
            "replacement adopts its C++ kernel (torch_tpu_eager.custom_ops.adopt_cpp_kernels) so the "
            "op is recorded and the kernel runs at flush.",
        ),
        TorchPatch(
            "torch._ops._Ops.load_library",
            "(self, path)",
            "Loading a library (torch.ops.load_library, cpp_extension.load(is_python_module=False)) "
            "can register C++ 'tpu' kernels of custom ops; the replacement adopts them afterwards "
            "(torch_tpu_eager.custom_ops.adopt_cpp_kernels), as for the lookup above.",
        ),
        TorchPatch(
            "torch.use_deterministic_algorithms",
            "(mode: bool, *, warn_only: bool = False) -> None",
            "CPU's index-writing kernels read the mode when they run; 'tpu' queues them while the "
            "mode is off, so a later mode change must first run the queue, or they would run under "
            "the new mode (put_ raising its alert at a read). torch has no hook on the mode's "
            "change (at::Context's setter is not virtual). torch_tpu_eager._deterministic.",
        ),
        TorchPatch(
            "torch.set_default_dtype",
            "(d: 'torch.dtype', /) -> None",
            "CPU's kernels read the default dtype when they run (integer true division, float "
            "functions of integers); 'tpu' queues them, so a change of the default dtype must first "
            "run the queue, or they would compute in the new dtype. torch has no hook on the change. "
            "torch_tpu_eager._default_dtype.",
        ),
        TorchPatch(
            "torch.set_default_tensor_type",
            "(t: type['torch.Tensor'] | str, /) -> None",
            "Also sets the default dtype; replaced together with torch.set_default_dtype.",
        ),
        TorchPatch(
            "torch.to_dlpack",
            "<builtin builtin_function_or_method>",
            "The same function as torch.utils.dlpack.to_dlpack, re-exported; replaced together.",
        ),
    ]
}


class TorchPatchWarning(UserWarning):
    """The installed torch's original does not have the shape a patch was written for."""


def shape_of(obj):
    """What a patch expects of torch's original: its ``inspect.signature`` text for a
    Python function, ``"<builtin TYPE>"`` for a C function, the type name for data."""
    if obj is _torch_disable_dynamo():
        code = obj(lambda: None).__code__
        ok = "fn" in code.co_freevars and "__dynamo_disable" in code.co_names
        return _DISABLE_DYNAMO_SHAPE if ok else f"code freevars={code.co_freevars} names={code.co_names}"
    if inspect.isfunction(obj):
        return str(inspect.signature(obj))
    if callable(obj) and not isinstance(obj, type):
        try:
            return str(inspect.signature(obj))
        except (TypeError, ValueError):
            return f"<builtin {type(obj).__name__}>"
    return type(obj).__name__


def _torch_disable_dynamo():
    import torch

    return torch._disable_dynamo


def _resolve(target):
    """The owner object and attribute name of ``target`` (imports its module)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            owner = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in parts[i:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise LookupError(target)


def _target_name(owner, attr):
    if not isinstance(owner, type):
        return f"{owner.__name__}.{attr}"
    # A class's __module__ is where it is defined (torch.Tensor's is torch._tensor):
    # find the table entry that names this class.
    for target in PATCHES:
        if target.endswith("." + attr) and _resolve(target)[0] is owner:
            return target
    return f"{owner.__module__}.{owner.__qualname__}.{attr}"


_originals: dict[str, object] = {}  # target -> torch's object before patching
_warned: set[str] = set()


def original(target):
    """Torch's object at ``target`` before any patch (the current one if unpatched)."""
    if target in _originals:
        return _originals[target]
    owner, attr = _resolve(target)
    return getattr(owner, attr)


def _entry(target, why):
    entry = PATCHES.get(target)
    if entry is None:
        raise LookupError(f"torch patch {target!r} is not listed in torch_tpu_eager._torch_patches.PATCHES")
    if not why:
        raise ValueError(f"torch patch {target!r}: say why")
    return entry


def _check_shape(entry, obj):
    got = shape_of(obj)
    if got != entry.expect and entry.target not in _warned:
        _warned.add(entry.target)
        warnings.warn(
            f"torch_tpu_eager patch {entry.target} was written for torch {entry.checked}, where the "
            f"original is {entry.expect}; this torch has {got}",
            TorchPatchWarning,
            stacklevel=3,
        )


def mismatches():
    """``[(target, expected, found)]`` for every patch whose original changed shape."""
    out = []
    for target, entry in PATCHES.items():
        try:
            got = shape_of(original(target))
        except (LookupError, AttributeError) as e:
            got = f"missing ({e})"
        if got != entry.expect:
            out.append((target, entry.expect, got))
    return out


def patch(owner, attr, replacement, why):
    """Sets ``owner.attr = replacement`` for a patch listed in :data:`PATCHES`.

    Idempotent: a second call for the same target leaves the first replacement.
    Returns torch's original. Raises LookupError for a target not in the table.
    """
    target = _target_name(owner, attr)
    entry = _entry(target, why)
    current = getattr(owner, attr)
    if target in getattr(current, "_tpu_eager_patches", ()):
        return _originals[target]
    _check_shape(entry, current)
    _originals[target] = current
    # One replacement may serve several targets (torch.to_dlpack is torch.utils.dlpack.to_dlpack).
    replacement._tpu_eager_patches = getattr(replacement, "_tpu_eager_patches", frozenset()) | {target}
    setattr(owner, attr, replacement)
    return current


def add_storage_class(cls, why):
    """Adds ``cls`` to ``torch._storage_classes`` (what torch.is_storage accepts)."""
    import torch

    _entry("torch._storage_classes", why)
    torch._storage_classes.add(cls)


def set_dynamo_disable_cache(fn, disabled, why):
    """Sets the ``fn.__dynamo_disable`` cache that ``torch._disable_dynamo``'s wrapper of
    ``fn`` reads before importing Dynamo (``fn`` is a torch function)."""
    _entry("torch._disable_dynamo", why)
    setattr(fn, "__dynamo_disable", disabled)


def after_import(module_name, fn, why):
    """Runs ``fn(module)`` once ``module_name`` is imported (now, if it already is).

    Until then a ``sys.meta_path`` finder waits for the module (and removes
    itself when it is found), so registering does not import it.
    """
    _entry(f"{module_name}.device_interface.init_device_reg", why)
    if module_name in sys.modules:
        fn(sys.modules[module_name])
        return

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != module_name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_hook(module):
                exec_module(module)
                fn(module)

            loader.exec_module = exec_and_hook
            return spec

    sys.meta_path.insert(0, _Hook())
