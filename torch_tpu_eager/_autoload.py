"""The ``torch.backends`` entry point (setup.py): ``import torch`` alone makes "tpu" available.

PyTorch calls :func:`load` at the end of ``import torch`` (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). The entry point lives in this submodule, not
in the package, because ``import torch_tpu_eager`` itself imports torch first: torch
then loads this entry point while the package is still initializing, and a
package-level attribute would not exist yet.
"""

import importlib


def load():
    """Imports torch_tpu_eager, which installs the "tpu" device.

    If the package is already being imported (it imported torch, which called this),
    returns at once: the package finishes its own installation.
    """
    importlib.import_module("torch_tpu_eager")
