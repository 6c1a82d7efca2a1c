"""Testing utilities for the "tpu" device.

:mod:`torch_tpu_eager.testing.opinfo_sweep` runs PyTorch's OpInfo sample inputs on CPU
and on "tpu" and compares the outcomes (values, dtypes, shapes, raised exception types).
It imports ``torch.testing._internal`` lazily, so importing this package stays cheap.
"""
from .opinfo_sweep import (  # noqa: F401
    Coverage,
    OpResult,
    RANDOM_OPS,
    UNINITIALIZED_OPS,
    aten_overloads_of,
    coverage,
    load_op_db,
    op_key,
    registered_overloads,
    skip_reason,
    sweep,
    sweep_op,
    to_device,
)

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
    "skip_reason",
    "sweep",
    "sweep_op",
    "to_device",
]
