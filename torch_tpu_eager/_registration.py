"""Registration of the "tpu" device with PyTorch (order matters; see
PRIVATEUSE1_NOTES: rename, device module, generated methods, kernels)."""

import sys

import torch

from . import _C, _torch_patches

_installed = False


def install():
    """Renames PrivateUse1 to "tpu" and installs kernels, ``torch.tpu`` and printing.

    Idempotent. Raises RuntimeError if PrivateUse1 was already renamed to
    another name by a different backend.
    """
    global _installed
    if _installed:
        return
    torch.utils.rename_privateuse1_backend("tpu")
    from . import device as device_module

    torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from . import _storage

    _storage.install_storage_classes(device_module)
    _storage.install_storage_methods()
    _storage.install_dlpack()
    _C._register_kernels()
    _C._set_library_paths(*_library_paths())
    _C._install_location_hook()
    _install_repr()
    _install_dynamo_interface()
    _install_inductor_redirect()
    _installed = True


def _library_paths():
    """Directories of library code for the source line an op is reported at: torch's and
    this package's (the innermost frame outside them, and outside the standard library, is
    the user's line)."""
    import os
    import sysconfig

    dirs = [os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, sys.modules[__package__])]
    return dirs, os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _install_repr():
    # Printing a tensor runs ~23 ops (PRIVATEUSE1_NOTES pitfall 7). Format the
    # contents from one host copy instead: a single flush, no device ops.
    from torch import _tensor_str

    original = _torch_patches.original("torch._tensor_str._tensor_str")

    def _tensor_str_on_host(self, indent):
        if self.device.type == "tpu":
            self = _host_view_for_print(self.detach())
        return original(self, indent)

    _torch_patches.patch(_tensor_str, "_tensor_str", _tensor_str_on_host, why="one host copy per print")


def _host_view_for_print(t):
    """A CPU tensor with `t`'s values for printing, copying at most what `t`'s storage holds.

    An expanded or unfolded view (`zeros(1).expand(2**16, 2**16)`) has far more
    elements than its storage: copy the storage to the host once and view it with
    `t`'s sizes, strides and offset (printing then summarizes as on CPU). A small
    view of a big storage copies only the view.
    """
    itemsize = t.element_size()
    storage = t.untyped_storage()
    held = storage.nbytes() // itemsize
    if t.is_conj() or t.is_neg() or t.numel() <= held or t.layout != torch.strided:
        return t.to("cpu")
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (held,), (1,))
    return flat.cpu().as_strided(t.size(), t.stride(), t.storage_offset())


def _install_dynamo_interface():
    # torch 2.13's Dynamo registers its own "tpu" interface (for Google's
    # torch_tpu) the first time it initialises its device registry, silently
    # replacing one registered before (pitfall 1). Force that initialisation
    # first, then register ours.
    # Hooked on the package: its submodules import each other while it loads.
    def register(_dynamo):
        from torch._dynamo import device_interface as di
        from torch._dynamo.backends import registry

        from .dynamo import TpuInterface

        di.get_interface_for_device("cpu")
        di.register_interface_for_device("tpu", TpuInterface)
        _install_compile_backends(registry)

    _torch_patches.after_import("torch._dynamo", register, why="register after torch's own 'tpu' interface")


def _install_compile_backends(registry):
    # Inductor maps "tpu" to its Pallas code generator, which needs JAX and
    # would read device memory directly (our values are deferred). Graphs with
    # "tpu" inputs run instead through the device itself, whose JIT already
    # fuses them; `backend="tpu"` asks for that explicitly.
    from .dynamo import tpu_backend

    registry.register_backend(tpu_backend, name="tpu")


def _install_inductor_redirect():
    # torch.compile's default backend is this wrapper (not a registry lookup).
    wrapper = torch._TorchCompileInductorWrapper
    inductor_call = _torch_patches.original("torch._TorchCompileInductorWrapper.__call__")

    def __call__(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs_):
            from .dynamo import tpu_backend

            return tpu_backend(model_, inputs_)
        return inductor_call(self, model_, inputs_, **kwargs)

    _torch_patches.patch(wrapper, "__call__", __call__, why="graphs with 'tpu' inputs skip Inductor")
