"""Copies the device makes that CPU eager does not: none at record time for a Python
scalar operand (record.cpp keeps a wrapped number as is), none at the flush for ops
whose out= overload PyTorch generates as "functional op, then copy into out"
(region_runner.cpp, direct_outputs; out_variant.h), and masked_fill writes its
device buffer with CPU's own clone-then-fill (direct_kernels.h). Values, dtypes and
strides equal CPU's; copies are counted with the profiler against CPU eager's."""

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


PROGRAMS = {
    # masked_fill's result is a temporary that softmax reads
    "masked_fill_then_softmax": lambda x: x.masked_fill(MASK.to(x.device), float("-inf")).softmax(-1),
    # _to_copy (dtype conversion) into a temporary
    "to_float64_then_mul": lambda x: x.to(torch.float64) * 3.0,
    # native_dropout (its out= is generated) with p=0 in training, into a temporary
    "dropout_then_add": lambda x: torch.nn.functional.dropout(x, 0.0, training=True) + 1.0,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_flush_copies_no_more_than_cpu_eager(name):
    fn = PROGRAMS[name]
    want = fn(X)
    x = X.to("tpu")
    torch.tpu.synchronize()
    cpu_copies = _count(aten_ops_during(lambda: fn(X)), "aten::copy_")
    out = fn(x)
    flush_copies = _count(aten_ops_during(torch.tpu.synchronize), "aten::copy_")
    assert flush_copies <= cpu_copies
    assert out.dtype == want.dtype and out.stride() == want.stride()
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("value", [float("-inf"), "tensor"])
@pytest.mark.parametrize("self_shape", [(4, 8, 8), (8,)], ids=["same_shape", "self_broadcast"])
def test_materialized_masked_fill_copies_as_cpu(value, self_shape):
    base = X[0, 0] if self_shape == (8,) else X
    v = torch.tensor(-2.5) if value == "tensor" else value
    want = base.masked_fill(MASK, v)
    cpu_copies = _count(aten_ops_during(lambda: base.masked_fill(MASK, v)), "aten::copy_")
    b, m = base.to("tpu"), MASK.to("tpu")
    v = v.to("tpu") if value == "tensor" else v
    torch.tpu.synchronize()
    out = b.masked_fill(m, v)
    assert _count(aten_ops_during(torch.tpu.synchronize), "aten::copy_") == cpu_copies
    assert out.shape == want.shape and out.stride() == want.stride()
    assert torch.equal(out.cpu(), want)


def test_masked_fill_error_as_cpu_and_queue_stays_valid():
    # A value tensor with dimensions: CPU raises; the device raises the same type.
    with pytest.raises(RuntimeError) as cpu_err:
        X.masked_fill(MASK, torch.ones(2))
    x = X.to("tpu")
    keep = x * 2.0
    with pytest.raises(type(cpu_err.value)):
        x.masked_fill(MASK.to("tpu"), torch.ones(2, device="tpu")).cpu()
    assert torch.equal(keep.cpu(), X * 2.0)
