"""Registration of the "tpu" device with PyTorch (order matters; see
PRIVATEUSE1_NOTES: rename, device module, generated methods, kernels)."""
import torch

from . import _C


def install():
    """Renames PrivateUse1 to "tpu" and installs kernels, ``torch.tpu`` and printing.

    Idempotent. Raises RuntimeError if PrivateUse1 was already renamed to
    another name by a different backend.
    """
    if getattr(torch, "_tpu_eager_installed", False):
        return
    torch.utils.rename_privateuse1_backend("tpu")
    from . import device as device_module

    torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    _C._register_kernels()
    _C._install_location_hook()
    _install_repr()
    _install_dynamo_interface()
    torch._tpu_eager_installed = True


def _install_repr():
    # Printing a tensor runs ~23 ops (PRIVATEUSE1_NOTES pitfall 7). Format the
    # contents from one host copy instead: a single flush, no device ops.
    from torch import _tensor_str

    original = _tensor_str._tensor_str

    def _tensor_str_on_host(self, indent):
        if self.device.type == "tpu":
            self = self.detach().to("cpu")
        return original(self, indent)

    _tensor_str._tensor_str = _tensor_str_on_host


def _install_dynamo_interface():
    # torch 2.13's Dynamo registers its own "tpu" interface (for Google's
    # torch_tpu) the first time it initialises its device registry, silently
    # replacing one registered before (pitfall 1). Force that initialisation
    # first, then register ours.
    try:
        from torch._dynamo import device_interface as di
    except Exception:  # Dynamo unavailable: nothing to fix
        return
    from .dynamo import TpuInterface

    di.get_interface_for_device("cpu")
    di.register_interface_for_device("tpu", TpuInterface)
