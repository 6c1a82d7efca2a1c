"""Dynamo device interface for "tpu" (so torch.compile sees our device, not
the built-in interface torch 2.13 ships for Google's torch_tpu)."""

import torch
from torch._dynamo.device_interface import DeviceInterface


class TpuInterface(DeviceInterface):
    """Describes the simulated "tpu" device to Dynamo: one device, no streams."""

    class Worker:
        @staticmethod
        def set_device(device):
            torch.tpu.set_device(device)

        @staticmethod
        def current_device():
            return torch.tpu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return {"name": "tpu (simulated)"}

    @staticmethod
    def current_device():
        return torch.tpu.current_device()

    @staticmethod
    def set_device(device):
        torch.tpu.set_device(device)

    @staticmethod
    def device_count():
        return torch.tpu.device_count()

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize(device=None):
        torch.tpu.synchronize(device)

    @staticmethod
    def is_bf16_supported(including_emulation=False):
        return True

    @staticmethod
    def get_compute_capability(device=None):
        return ""


def tpu_backend(gm, example_inputs):
    """Dynamo backend for "tpu" graphs: runs the captured FX graph op by op on
    the device, where the DeferAndFuse queue records and fuses it."""
    return gm.forward
