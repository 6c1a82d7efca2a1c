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
"""
import torch
import torch._meta_registrations as _meta_registrations

from . import _C


def install():
    """Wraps ``device_hint`` once. Looked up as a module global by the meta
    kernels (and imported at call time by torch._refs), so the wrapper applies
    to every call after this one."""
    original = _meta_registrations.device_hint
    if getattr(original, "_tpu_eager_wrapped", False):
        return

    def device_hint(tensor):
        if (_C._in_device_meta_inference() and isinstance(tensor, torch.Tensor)
                and not isinstance(tensor, torch._subclasses.FakeTensor) and tensor.device.type == "meta"):
            return "cpu"
        return original(tensor)

    device_hint._tpu_eager_wrapped = True
    device_hint.__doc__ = original.__doc__
    _meta_registrations.device_hint = device_hint
