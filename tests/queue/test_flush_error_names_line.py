"""An error a CPU kernel raises at a flush names the op and the Python line that recorded it."""

import sys
import pytest
import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


# Fixed in region_runner.cpp run_ops: CPU kernels' plain std::runtime_error (Scalar
# overflow in fill_/full/masked_fill) now also names the op and its Python line.
def test_overflow_error_at_flush_names_the_recording_line():
    # A fill value held in a device tensor is known only at the flush (a Python
    # Scalar is checked at the call: tests/record/test_scalar_overflow.py).
    value = torch.tensor(300, device="tpu")
    mask = torch.ones(3, dtype=torch.bool, device="tpu")
    line = sys._getframe().f_lineno + 1
    t = torch.zeros(3, dtype=torch.int8, device="tpu").masked_fill(mask, value)  # the line the error must name
    with pytest.raises(RuntimeError, match="without overflow") as info:
        t.cpu()
    assert f"{__file__}:{line}" in str(info.value)
