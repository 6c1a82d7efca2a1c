"""Storages and DLPack for "tpu" tensors, as torch 2.13 provides them for CUDA.

- ``torch.tpu.FloatStorage`` and the other legacy typed-storage classes (the
  twelve ``torch.cuda`` defines), which ``Tensor.storage_type()``,
  ``isinstance(storage, torch.tpu.FloatStorage)`` and ``TypedStorage.type()``
  look up on the device module.
- DLPack: ``Tensor.__dlpack_device__`` of a "tpu" tensor is
  ``(DLDeviceType.kDLExtDev, index)`` (torch 2.13 compares the device type
  with the literal "privateuse1" and so rejects a renamed backend; later
  PyTorch releases return kDLExtDev for it). Exporting (``__dlpack__``,
  ``torch.utils.dlpack.to_dlpack``) first runs the queued ops that use the
  tensor's storage, so the capsule's bytes are current, and pins the
  buffer's address. ``torch.from_dlpack`` of such a capsule gives a "tpu"
  tensor sharing the exported tensor's storage (the device resolves the
  imported StorageImpl to the storage it was exported from).
"""

import functools

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

from . import _C, _torch_patches

# The legacy storage classes torch.cuda defines, by dtype (torch/cuda/__init__.py).
_LEGACY_STORAGE_DTYPES = {
    "ByteStorage": torch.uint8,
    "DoubleStorage": torch.double,
    "FloatStorage": torch.float,
    "HalfStorage": torch.half,
    "LongStorage": torch.long,
    "IntStorage": torch.int,
    "ShortStorage": torch.short,
    "CharStorage": torch.int8,
    "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16,
    "ComplexDoubleStorage": torch.cdouble,
    "ComplexFloatStorage": torch.cfloat,
}


class _TpuLegacyStorage(_LegacyStorage):
    """Base of ``torch.tpu.<Type>Storage``: a TypedStorage of one dtype on "tpu"."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for tpu storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for tpu storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for tpu storage")


def _make_legacy_storage_class(name, dtype, module_name):
    def _dtype_getter(cls):
        return dtype

    def dtype_getter(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(
        name,
        (_TpuLegacyStorage,),
        {
            "dtype": classproperty(dtype_getter),
            "_dtype": classproperty(_dtype_getter),
            "__module__": module_name,
            "__qualname__": name,
        },
    )
    return cls


def install_storage_classes(device_module, module_name="torch.tpu"):
    """Defines ``<module_name>.<Type>Storage`` on ``device_module`` (the module
    registered as ``torch.tpu``) and registers them with ``torch.is_storage``."""
    for name, dtype in _LEGACY_STORAGE_DTYPES.items():
        if hasattr(device_module, name):
            continue
        cls = _make_legacy_storage_class(name, dtype, module_name)
        setattr(device_module, name, cls)
        _torch_patches.add_storage_class(cls, why="torch.is_storage accepts torch.tpu.<Type>Storage")


def install_storage_methods():
    """``UntypedStorage._byteswap`` (behind ``storage.byteswap(dtype)``) of a "tpu"
    storage: PyTorch's C++ method swaps the bytes of the host memory in place,
    which on this device may not hold the storage's value yet (queued ops).
    It runs on a host copy (same checks and errors) that is copied back."""
    cls = torch.UntypedStorage
    orig = _torch_patches.original("torch.UntypedStorage._byteswap")

    @functools.wraps(orig)
    def _byteswap(self, *args, **kwargs):
        if self.device.type != "tpu":
            return orig(self, *args, **kwargs)
        host = self.cpu()
        orig(host, *args, **kwargs)
        self.copy_(host)

    _torch_patches.patch(cls, "_byteswap", _byteswap, why="swap a host copy of queued values")


# ---- DLPack ----


def _is_tpu(t):
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def _prepare_export(t):
    # Only what torch itself would export: torch raises its own BufferError /
    # RuntimeError for the rest (requires_grad, conj bit, sparse layouts).
    if t.layout == torch.strided and not t.requires_grad and not t.is_conj():
        _C._prepare_address_export(t)


def install_dlpack():
    """Wraps the DLPack entry points for "tpu" tensors (see the module docstring)."""
    from torch.utils import dlpack as dl

    tensor_cls = torch.Tensor
    orig_dlpack = _torch_patches.original("torch.Tensor.__dlpack__")
    orig_dlpack_device = _torch_patches.original("torch.Tensor.__dlpack_device__")
    orig_to_dlpack = _torch_patches.original("torch.utils.dlpack.to_dlpack")

    @functools.wraps(orig_dlpack)
    def __dlpack__(self, *args, **kwargs):
        if _is_tpu(self):
            _prepare_export(self)
        return orig_dlpack(self, *args, **kwargs)

    @functools.wraps(orig_dlpack_device)
    def __dlpack_device__(self):
        if _is_tpu(self) and not torch.overrides.has_torch_function_unary(self):
            idx = self.device.index if self.device.index is not None else 0
            return (dl.DLDeviceType.kDLExtDev, idx)
        return orig_dlpack_device(self)

    @functools.wraps(orig_to_dlpack)
    def to_dlpack(tensor):
        if _is_tpu(tensor):
            _prepare_export(tensor)
        return orig_to_dlpack(tensor)

    why = "DLPack export of a 'tpu' tensor runs its queued ops first"
    _torch_patches.patch(tensor_cls, "__dlpack__", __dlpack__, why=why)
    _torch_patches.patch(tensor_cls, "__dlpack_device__", __dlpack_device__, why="kDLExtDev for a renamed backend")
    _torch_patches.patch(dl, "to_dlpack", to_dlpack, why=why)
    if _torch_patches.original("torch.to_dlpack") is orig_to_dlpack:
        _torch_patches.patch(torch, "to_dlpack", to_dlpack, why=why)
