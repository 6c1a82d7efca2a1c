"""Queued ops compute in the default dtype of their call, as CPU's kernels do.

CPU reads ``torch.get_default_dtype()`` when its kernel runs: an integer true division
or a floating-point function of integers computes in it. Found by PyTorch's
test_binary_ufuncs.py (test_div_rounding_numpy): a division queued inside
``set_default_dtype(torch.float64)`` and read after it computed in float32.
torch_tpu_eager/_default_dtype.py.
"""

import pytest
import torch
from torch.testing._internal.common_utils import set_default_dtype

from difftest import compare, materialize, requires_tpu

_A = [1234567891, 987654321, -3, 7, 2**31 - 1]
_B = [3, 7, 1234567, -999999937, 13]

OPS = {
    "div": lambda a, b: torch.divide(a, b),
    "true_divide_scalar": lambda a, b: a / 3,
    "sqrt": lambda a, b: torch.sqrt(a.abs()),
    "sin": lambda a, b: torch.sin(a),
    "atan2": lambda a, b: torch.atan2(a, b),
    "sigmoid": lambda a, b: torch.sigmoid(b % 20 - 10),
    "mean_of_float": lambda a, b: (a / b).mean(),
}


def _run(dev, op, inner, outer):
    """``op`` called under default dtype ``inner``, its result read under ``outer``."""
    a = torch.tensor(_A, dtype=torch.int32, device=dev)
    b = torch.tensor(_B, dtype=torch.int32, device=dev)
    with set_default_dtype(outer):
        with set_default_dtype(inner):
            r = OPS[op](a, b)
        return materialize(r)


@pytest.mark.parametrize("inner,outer", [(torch.float64, torch.float32), (torch.float32, torch.float64)])
@pytest.mark.parametrize("op", sorted(OPS))
def test_result_computed_in_the_default_dtype_of_the_call(dev, op, inner, outer):
    compare(_run("cpu", op, inner, outer), _run(dev, op, inner, outer), dev, rtol=0, atol=0)


@requires_tpu
def test_set_default_tensor_type_runs_the_queue_first():
    a = torch.tensor(_A, dtype=torch.int32)
    b = torch.tensor(_B, dtype=torch.int32)
    saved = torch.get_default_dtype()
    try:
        torch.set_default_tensor_type(torch.DoubleTensor)
        expected, actual = a / b, a.to("tpu") / b.to("tpu")
        torch.set_default_tensor_type(torch.FloatTensor)
        assert actual.dtype == torch.float64
        assert torch.equal(actual.cpu(), expected)
    finally:
        torch.set_default_dtype(saved)
