"""Partition decides fusion once, asking the target (csrc/jit/partition.cpp,
FusionRules::op_fusion), and the region verifier (csrc/jit/verify.h) checks its output.

Values are compared with CPU PyTorch; which ops ran fused is read from the
per-op counters of ``metrics_report`` (``fused.<op>`` / ``op_by_op.<op>``,
kept at ``TORCH_TPU_DEBUG=1``, hence a child process).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from difftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="partition and its verifier are the tpu device's")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_debug(code):
    """Runs `code` in a child with TORCH_TPU_DEBUG=1; returns the JSON it prints last."""
    env = dict(os.environ, TORCH_TPU_DEBUG="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PRELUDE = """
import json, torch, torch_tpu_eager as tte
from torch_tpu_eager import _C
_C._jit_set_verify(True)
def counts():
    return {k: v for k, v in dict(_C._op_counts()).items() if k.startswith(("fused.", "op_by_op."))}
"""


def test_random_op_does_not_keep_chain_from_fusing():
    # normal_ (from a device randn) feeding a*2+b: the chain is one fused loop, normal_ runs alone.
    # (IEEE-exact ops: bit-equal to CPU; transcendental ones differ by an ulp, test_fused_elementwise.py.)
    code = (
        _PRELUDE
        + """
b = torch.randn(64, 64, device="tpu")
b.cpu()
_C._reset_debug_report()
ok = True
for _ in range(3):
    a = torch.randn(64, 64, device="tpu")
    c = (a * 2 + b).relu() - 1
    ac, cc = a.cpu(), c.cpu()
    ok = ok and torch.equal(cc, (ac * 2 + b.cpu()).relu() - 1)
print(json.dumps({"ok": ok, "counts": counts()}))
"""
    )
    out = _run_debug(code)
    assert out["ok"]
    c = out["counts"]
    for op in ("mul.Tensor", "add.Tensor", "relu", "sub.Tensor"):
        assert c.get("fused." + op) == 3, c
        assert "op_by_op." + op not in c, c
    assert c.get("op_by_op.normal_") == 3, c


def test_unfusable_reduction_is_cut_out_and_producers_fuse():
    # A sum over the first dim is not a loop op on the tpu (a sum over the last dim is,
    # tests/executors/tpu/test_fused_rms_norm.py): the chain before it fuses, sum runs by itself.
    code = (
        _PRELUDE
        + """
x = torch.randn(32, 48)
y = torch.randn(32, 48)
xd, yd = x.to("tpu"), y.to("tpu")
_C._reset_debug_report()
s = ((xd * yd + 1).relu() * 3).sum(dim=0)
r = s.cpu()
print(json.dumps({"ok": torch.equal(r, ((x * y + 1).relu() * 3).sum(dim=0)), "counts": counts()}))
"""
    )
    out = _run_debug(code)
    assert out["ok"]
    c = out["counts"]
    for op in ("mul.Tensor", "add.Tensor", "relu"):
        assert c.get("fused." + op, 0) >= 1, c
    assert c.get("op_by_op.sum.dim_IntList") == 1, c


def test_softmax_consumers_start_a_new_region(dev):
    # The row loop ends at softmax; its consumers form the next region. Values equal CPU.
    import torch_tpu_eager as tte

    x = torch.randn(16, 40)
    w = torch.randn(16, 40)
    xd, wd = x.to(dev), w.to(dev)
    tte._C._jit_set_verify(True)
    before = tte.metrics()["regions_run"]
    y = (torch.softmax(xd * 2, dim=-1) * wd + 1).cpu()
    regions = tte.metrics()["regions_run"] - before
    assert torch.equal(y, torch.softmax(x * 2, dim=-1) * w + 1)
    assert regions == 2


@pytest.mark.parametrize(
    "mode, message",
    [(1, "out of program order"), (2, "not materialized"), (3, "matmul region"), (4, "reads a value of loop 0")],
)
def test_verifier_catches_a_broken_region(dev, mode, message):
    import torch_tpu_eager as tte

    tte._C._jit_set_verify(True)
    a = torch.randn(8, 8)
    ad = a.to(dev)
    ad.cpu()
    tte._C._jit_break_next_partition(mode)
    b = (ad * 2 + 1).exp()
    with pytest.raises(RuntimeError, match="region verifier: .*" + message):
        b.cpu()
    # The flush's error stays with what it wrote; the device and other tensors stay valid.
    c = (ad * 3).cpu()
    assert torch.equal(c, a * 3)
    assert torch.equal(ad.cpu(), a)


def test_verifier_is_on_in_tests():
    import torch_tpu_eager as tte

    assert tte._C._jit_verify_enabled()


@pytest.mark.parametrize("precision", ["medium", "high"])
def test_lowering_table_baddbmm_at_reduced_precision(dev, precision, restore_target_and_precision):
    # The lowering table gives baddbmm's operands (self, batch1, batch2): the MXU
    # numerics (DESIGN §6) round batch1 and batch2 to bf16 and add beta * self.
    # (Before the table, a name test took self and batch1 as the product's operands.)
    torch.manual_seed(0)
    s, b1, b2 = torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)

    def hi_lo(x):
        hi = x.to(torch.bfloat16).float()
        return hi, (x - hi).to(torch.bfloat16).float()

    (ah, al), (bh, bl) = hi_lo(b1), hi_lo(b2)
    p = torch.bmm(ah, bh)
    if precision == "high":
        p = p.add_(torch.bmm(ah, bl)).add_(torch.bmm(al, bh))
    expected = p.mul(2).add(s.mul(0.5))
    torch.set_float32_matmul_precision(precision)
    got = torch.baddbmm(s.to(dev), b1.to(dev), b2.to(dev), beta=0.5, alpha=2).cpu()
    assert torch.equal(got, expected)


def test_multi_tensor_region_is_one_region_of_one_loop_per_shape(dev):
    # Independent updates of tensors of three shapes: one region (a multi-tensor loop),
    # its loops decided by partition (Region::loop), every op fused; values equal CPU.
    import torch_tpu_eager as tte

    tte._C._jit_set_verify(True)
    shapes = [(7,), (5, 3), (32, 64)]
    xs = [torch.randn(*s) for s in shapes]
    ds = [x.to(dev) for x in xs]
    torch.tpu.synchronize()
    before = tte.metrics()["regions_run"]
    for d in ds:
        d.mul_(0.9).add_(1.0)
    torch.tpu.synchronize()
    assert tte.metrics()["regions_run"] - before == 1
    for x, d in zip(xs, ds):
        assert torch.equal(d.cpu(), x.mul(0.9).add(1.0))


def test_value_read_in_another_shape_is_cut_or_ordered(dev):
    # b (shape [64]) made in the flush and read broadcast by x + b (shape [32, 64]):
    # partition puts them in two loops, the maker first, its value stored; a value
    # written in place after a loop of another shape read it starts a new region.
    import torch_tpu_eager as tte

    tte._C._jit_set_verify(True)
    x, v = torch.randn(32, 64), torch.randn(64)
    xd, vd = x.to(dev), v.to(dev)
    torch.tpu.synchronize()
    before = tte.metrics()["regions_run"]
    b = vd * 2 + 1
    y = (xd * 3 + b).relu()
    yc = y.cpu()
    assert tte.metrics()["regions_run"] - before == 1
    assert torch.equal(yc, (x * 3 + (v * 2 + 1)).relu())
    b2 = vd * 2
    y2 = xd + b2
    b2.add_(1)  # written after a loop of another shape read it: not in that region
    y2c, b2c = y2.cpu(), b2.cpu()
    assert torch.equal(y2c, x + v * 2) and torch.equal(b2c, v * 2 + 1)


def test_in_place_write_after_a_read_moved_into_an_earlier_region(dev):
    # x comes from an op-by-op region (arange); x * 2 starts a fused region; x.sum()
    # and the copies go back into arange's earlier region; x.add_ then writes x in the
    # fused region. Partition must still see that the fused region's loop read x, so
    # the write joins that loop (or is cut), never a second loop of the same region
    # (the verifier rejects that); values equal CPU.
    import torch_tpu_eager as tte

    tte._C._jit_set_verify(True)

    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        y = x * 2
        s = x.sum()
        c = x.t().contiguous()
        x.add_(100)
        return [t.cpu() for t in (x, y, s, c)]

    for got, expected in zip(prog(dev), prog("cpu")):
        assert torch.equal(got, expected)
