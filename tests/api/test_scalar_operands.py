"""Python scalar operands: rounding and dtype promotion as on CPU."""

import torch
import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


# Fixed in record.cpp: the snapshot of a CPU scalar argument (clone) dropped its
# wrapped-number flag, so the op-by-op CPU kernel promoted x * 0.1 to float64 and
# rounded differently; the meta cache keyed a wrapped number like a 0-dim tensor, so
# t * 0.01 and t * tensor(0.01, float64) shared one result dtype.
def test_python_scalar_operand_rounds_and_promotes_as_cpu():
    x = torch.arange(1000, dtype=torch.int32)
    assert torch.equal((x.to("tpu") * 0.1).cpu(), x * 0.1)
    c = torch.tensor(0.9999992847442627)
    s = c.to("tpu")
    s.mul_(0.01)
    assert torch.equal(s.cpu(), c * 0.01)
    t = c.to("tpu")
    for other in (torch.tensor(0.01, dtype=torch.float64), 0.01, torch.tensor(0.01, dtype=torch.float64)):
        got, want = t * other, c * other
        assert got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)


def test_bool_tensor_to_a_bool_power_stays_bool():
    for exponent in (True, False):
        t = torch.tensor([True, False])
        got, want = t.to("tpu") ** exponent, t**exponent
        assert got.dtype == want.dtype == torch.bool
        assert torch.equal(got.cpu(), want)
