"""A region whose row reduction (softmax, log_softmax, layer_norm, logsumexp) has
elementwise consumers after it runs in two parts: the producers and the reduction in the
fused row loop, then the consumers reading the reduction's result
(csrc/executors/tpu/tpu_executor.cpp, run_split_at_row_reduction). Values are compared
with CPU PyTorch bit for bit (producers and consumers are IEEE-exact ops), and the
profiler shows that the reduction's ATen kernel did not run inside the region."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from difftest import REPO_ROOT, DEVICE, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)


def _run(fn, *args):
    """fn on "tpu" copies of args, read to the host; returns the result and the ATen ops
    called inside every "tpu::" region range."""
    dev = [a.to("tpu") for a in args]
    torch.tpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn(*dev)
        out = tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()

    def below(ev):
        names = []
        for c in ev.cpu_children:
            names += [c.name] + below(c)
        return names

    ops = [n for e in prof.events() if e.name.startswith("tpu::") for n in below(e)]
    return out, ops


CASES = {
    "softmax": (lambda x, b, y: F.softmax(x * 2 + b, -1) * y, "aten::_softmax"),
    "log_softmax": (lambda x, b, y: F.log_softmax(x - b, -1) - y, "aten::_log_softmax"),
    "layer_norm": (lambda x, b, y: F.layer_norm(x + b, x.shape[-1:]) * 0.5 + y, "aten::native_layer_norm"),
    "logsumexp": (lambda x, b, y: torch.logsumexp(x * 2 + b, -1, keepdim=True) - y[..., :1], "aten::logsumexp"),
}


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (64, 1000), (5, 7, 33)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", CASES)
def test_consumers_after_a_row_reduction_match_cpu(case, shape):
    fn, reduction = CASES[case]
    x, b, y = cpu_randn(*shape, seed=1), cpu_randn(*shape, seed=2), cpu_randn(*shape, seed=3)
    actual, ops = _run(fn, x, b, y)
    assert torch.equal(actual, fn(x, b, y))
    assert reduction not in ops, f"{reduction} ran op by op instead of in the fused row loop"


def test_a_producer_read_by_a_consumer_is_materialized_and_equal():
    # h feeds both the softmax (first part) and the consumer (second part).
    def fn(x, b, y):
        h = x * 3.0 - b
        return F.softmax(h, -1) + h, h

    x, b, y = (cpu_randn(33, 65, seed=k) for k in range(3))
    (s, h), ops = _run(fn, x, b, y)
    s_cpu, h_cpu = fn(x, b, y)
    assert torch.equal(s, s_cpu) and torch.equal(h, h_cpu)
    assert "aten::_softmax" not in ops


def test_a_failing_consumer_raises_and_keeps_the_queue_valid():
    # The consumer's int8 overflow is found only when it runs (the value sits in a device tensor).
    x = cpu_randn(8, 16, seed=4)
    keep = (x * 2).to("tpu")
    value = torch.tensor(300, device="tpu")
    s = F.softmax(x.to("tpu") * 2, -1)
    mask = s > 2.0  # all False, but the fill value must still convert
    bad = torch.zeros(8, 16, dtype=torch.int8, device="tpu").masked_fill(mask, value)
    with pytest.raises(RuntimeError, match="without overflow"):
        bad.cpu()
    assert torch.equal(s.cpu(), F.softmax(x * 2, -1))
    assert torch.equal(keep.cpu(), x * 2)
    assert torch.equal((keep + 1).cpu(), x * 2 + 1)


# QA finding: planning a fused program converted Python scalars with a checked cast and
# raised where CPU casts to float32 (x * 1e300 is inf), failing the whole region.
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x * 2) * 1e300,
        lambda x: (x + 1) - 1e39,
        lambda x: F.softmax(x * 2, -1) * 1e300 + 1,
        lambda x: torch.logsumexp(x * 2, -1) * 1e300 + 1,
    ],
    ids=["fused_chain", "fused_chain_sub", "softmax_tail", "logsumexp_tail"],
)
def test_scalars_beyond_float32_range_give_cpu_infinities(fn):
    x = cpu_randn(4, 8, seed=5)
    out, _ = _run(fn, x)
    assert torch.equal(out, fn(x))


SOFTMAX_AT_DEFAULT = """
import torch, torch_tpu_eager
bad = []
for n in list(range(1, 71)) + [1000, 4099]:
    x = torch.randn(3, n) * 4
    for f in (torch.softmax, torch.log_softmax):
        if not torch.equal(f(x.to("tpu") * 2, -1).cpu(), f(x * 2, -1)):
            bad.append((f.__name__, n))
print("MISMATCHES", bad)
"""


def test_softmax_matches_cpu_at_the_default_capability(tmp_path):
    # QA finding: at ATEN_CPU_CAPABILITY=default CPU's softmax is not the AVX2 row loop.
    import os
    import subprocess
    import sys

    script = tmp_path / "softmax_default.py"
    script.write_text(SOFTMAX_AT_DEFAULT)
    root = REPO_ROOT
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "MISMATCHES []" in proc.stdout, proc.stdout
