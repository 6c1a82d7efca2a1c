"""Copies the device makes that CPU eager does not: none at record time for a Python
scalar operand (record.cpp keeps a wrapped number as is). Values and dtypes equal
CPU's; copies are counted with the profiler."""
import pytest
import torch

from difftest import DEVICE, aten_ops_during, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="record and flush copies are the tpu device's")

X = cpu_randn(4, 8, 8, seed=11)
MASK = torch.tril(torch.ones(8, 8)) == 0  # a causal mask, broadcast over the batch


def _count(names, op):
    return sum(1 for n in names if n == op)


@pytest.mark.parametrize("scalar", [0.5, 3, True])
def test_python_scalar_operand_is_not_copied_at_record(scalar):
    x = X.to("tpu")
    torch.tpu.synchronize()
    names = aten_ops_during(lambda: x * scalar)
    assert _count(names, "aten::clone") == 0 and _count(names, "aten::copy_") == 0, names
    got, want = x * scalar, X * scalar
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_cpu_tensor_operand_is_still_a_snapshot():
    # A user's CPU 0-dim tensor may change before the flush: the recorded op keeps its value.
    s = torch.tensor(2.0)
    x = X.to("tpu")
    y = x * s
    s.fill_(5.0)
    assert torch.equal(y.cpu(), X * 2.0)
