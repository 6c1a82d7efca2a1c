"""Testing utilities for the "tpu" device.

:mod:`torch_tpu_eager.testing.opinfo_sweep` runs PyTorch's OpInfo sample inputs on CPU
and on "tpu" and compares the outcomes (values, dtypes, shapes, raised exception types);
``python -m torch_tpu_eager.testing.opinfo_sweep --help`` runs it from the command line.
The names below are loaded on first use, so importing this package stays cheap and
``python -m`` does not import the module twice.
"""

import importlib

__all__ = [
    "Coverage",
    "OpResult",
    "RANDOM_OPS",
    "UNINITIALIZED_OPS",
    "aten_overloads_of",
    "coverage",
    "load_op_db",
    "op_key",
    "registered_overloads",
    "sample_inputs",
    "skip_reason",
    "sweep",
    "sweep_op",
    "to_device",
]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module(".opinfo_sweep", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
