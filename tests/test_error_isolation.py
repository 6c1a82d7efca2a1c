"""An op that fails at a flush loses nothing else: ops of the same region that do not
depend on it still compute CPU's values, ops that read its result raise its error, and
the queue stays usable (csrc/executors/region_runner.cpp, run_ops)."""
import pytest
import torch

from difftest import DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="deferred errors exist only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager


def _program(x, y, value, mask):
    w = (x * 2).exp() * y + 1
    t = (w * 10).to(torch.int8)
    bad = t.masked_fill(mask, value)  # 300 does not fit int8: fails when it runs
    after = w - 1                     # recorded after the failing op, independent of it
    dependent = bad + 1               # reads the failing op's result
    return w, after, bad, dependent


def test_independent_ops_after_a_failing_op_keep_their_values():
    x, y = cpu_randn(4, 8, seed=1), cpu_randn(4, 8, seed=2)
    mask = torch.ones(4, 8, dtype=torch.bool)
    w_cpu, after_cpu, _, _ = _program(x, y, torch.tensor(3), mask)
    torch_tpu_eager.reset_metrics()
    w, after, bad, dependent = _program(x.to("tpu"), y.to("tpu"), torch.tensor(300, device="tpu"), mask.to("tpu"))
    with pytest.raises(RuntimeError, match="without overflow") as first:
        bad.cpu()
    assert torch_tpu_eager.metrics()["regions_run"] >= 1
    assert torch.equal(after.cpu(), after_cpu)
    assert torch.equal(w.cpu(), w_cpu)
    with pytest.raises(RuntimeError, match="without overflow") as second:
        dependent.cpu()
    assert str(second.value) == str(first.value), "a dependent op reports the failing op's error"
    assert torch.equal((after * 3).cpu(), after_cpu * 3), "the queue stays usable"


def test_an_in_place_write_by_a_failing_op_poisons_only_its_target():
    x = cpu_randn(6, seed=3)
    xd = x.to("tpu")
    target = torch.zeros(6, dtype=torch.int8, device="tpu")
    other = xd * 5
    target.masked_fill_(torch.ones(6, dtype=torch.bool, device="tpu"), torch.tensor(300, device="tpu"))
    later = other + xd
    with pytest.raises(RuntimeError, match="without overflow"):
        target.cpu()
    assert torch.equal(later.cpu(), x * 5 + x)
    assert torch.equal(other.cpu(), x * 5)
