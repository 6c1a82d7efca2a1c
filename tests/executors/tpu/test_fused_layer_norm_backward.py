"""native_layer_norm_backward as a fused row loop (fused_layer_norm_backward.cpp,
layer_norm_backward_row.inc), with the residual gradient's add after it in the same loop
(partition.cpp, residual_gradient_add). Every gradient is compared with CPU's kernel bit
for bit (torch.equal) at 1 and 2 threads: CPU sums the weight / bias gradients in
per-thread buffers over its split of the rows, which the loop reproduces."""

import json
import os
import subprocess
import sys

import pytest
import torch

from difftest import DEVICE, REPO_ROOT, aten_ops_during, cpu_randn, restoring

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="fusion exists only on the tpu device")

if DEVICE == "tpu":
    import torch_tpu_eager


@pytest.fixture
def threads():
    yield from restoring(torch.get_num_threads, torch.set_num_threads)


# (leading shape, cols): nanoGPT's [8, 64] x 64; a partial last vector (40, 100, 13);
# fewer rows than threads' chunks would even out (7, 15 rows); wide rows (1024).
SHAPES = [((8, 64), 64), ((3, 5), 40), ((1, 300), 100), ((7,), 13), ((15,), 5), ((2, 33), 1024)]


def _inputs(lead, cols):
    x = cpu_randn(*lead, cols, seed=71) * 2 + 0.5
    w, b = cpu_randn(cols, seed=72), cpu_randn(cols, seed=73)
    dy, res = cpu_randn(*lead, cols, seed=74), cpu_randn(*lead, cols, seed=75)
    _, mean, rstd = torch.native_layer_norm(x, (cols,), w, b, 1e-5)
    return dy, x, mean, rstd, w, b, res


def _backward_and_add(form, dy, x, mean, rstd, w, b, res, cols):
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])
    if form == "dx.add_(res)":
        s = dx.add_(res)
    elif form == "res.add_(dx)":
        s = res.add_(dx)
    else:
        s = res + dx
    return dx, dw, db, s


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("form", ["dx.add_(res)", "res.add_(dx)", "res + dx"])
@pytest.mark.parametrize("lead,cols", SHAPES, ids=[f"{s[0]}x{s[1]}" for s in SHAPES])
def test_backward_and_residual_add_run_as_one_row_loop(lead, cols, form, nthreads, threads):
    # On main the backward ran through CPU's kernel and the add through CPU's add
    # kernel, op by op; here one row loop makes dx, the weight / bias gradients and
    # the sum. Every result is CPU's bit for bit.
    threads(nthreads)
    args = _inputs(lead, cols)
    want = _backward_and_add(form, *[a.clone() for a in args], cols)
    dev = [a.to("tpu") for a in args]
    torch.tpu.synchronize()
    with torch_tpu_eager.profile() as prof:
        got = _backward_and_add(form, *dev, cols)
        ops = aten_ops_during(torch.tpu.synchronize)
    assert len(prof.kernels) == 1, [k["ops"] for k in prof.kernels]
    assert "aten::native_layer_norm_backward" not in ops and "aten::add_" not in ops and "aten::add" not in ops, ops
    for name, g, e in zip(("dx", "dweight", "dbias", "sum"), got, want):
        assert torch.equal(g.cpu(), e), name
    if form == "res.add_(dx)":
        assert torch.equal(dev[-1].cpu(), want[3])


_COUNTS = """
import json, sys, torch, torch_tpu_eager
from torch_tpu_eager import _C
sys.path.insert(0, "tests")
from difftest import cpu_randn
_C._jit_set_verify(True)
torch.set_num_threads(1)
x = cpu_randn(8, 64, 64, seed=91)
w, b = cpu_randn(64, seed=92), cpu_randn(64, seed=93)
dy, res = cpu_randn(8, 64, 64, seed=94), cpu_randn(8, 64, 64, seed=95)
_, mean, rstd = torch.native_layer_norm(x, (64,), w, b, 1e-5)
def step(dy, x, mean, rstd, w, b, res):
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, [64], mean, rstd, w, b, [True, True, True])
    return dx.add_(res), dw, db, dw.norm(), db.norm()
want = step(dy, x, mean, rstd, w, b, res.clone())
dev = [t.to("tpu") for t in (dy, x, mean, rstd, w, b, res)]
torch.tpu.synchronize()
_C._reset_debug_report()
got = [t.cpu() for t in step(*dev)]
counts = {k: v for k, v in dict(_C._op_counts()).items() if k.startswith(("fused.", "op_by_op."))}
print(json.dumps({"equal": [torch.equal(g, e) for g, e in zip(got, want)], "counts": counts}))
"""


def test_op_counts_backward_and_add_fused_norms_op_by_op():
    # The backward and the add run in the row loop (on main: op by op through CPU's
    # kernels); the clip's norms of the weight / bias gradients, which the loop does
    # not take, run op by op after it in the same region.
    env = dict(os.environ, TORCH_TPU_DEBUG="1", PYTHONPATH=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _COUNTS], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(out["equal"]), out
    counts = out["counts"]
    assert counts.get("fused.native_layer_norm_backward") == 1 and counts.get("fused.add_.Tensor") == 1, counts
    assert "op_by_op.native_layer_norm_backward" not in counts and "op_by_op.add_.Tensor" not in counts, counts
    assert counts.get("op_by_op.linalg_vector_norm") == 2, counts


class _PreNormBlock(torch.nn.Module):
    def __init__(self, d, affine=True, bias=True):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d, elementwise_affine=affine, bias=bias)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize(
    "affine,bias,dtype",
    [
        (True, True, torch.float32),
        (True, False, torch.float32),
        (False, False, torch.float32),
        (True, True, torch.bfloat16),
    ],
    ids=["weight+bias", "weight", "neither", "bf16"],
)
def test_pre_norm_block_gradients_equal_cpu(affine, bias, dtype, nthreads, threads):
    # Autograd's sum of the block input's two gradients (the residual's and the
    # norm's) after the norm's backward. With weight and bias in float32 the backward
    # runs fused; without them, or in bfloat16, op by op through CPU's kernel: the
    # gradients are CPU's either way.
    threads(nthreads)
    torch.manual_seed(0)
    cpu = _PreNormBlock(48, affine, bias).to(dtype)
    dev = _PreNormBlock(48, affine, bias).to(dtype)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    x = (cpu_randn(4, 11, 48, seed=81) * 2).to(dtype)
    xc, xd = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    for m, inp in ((cpu, xc), (dev, xd)):
        m(m(inp)).square().sum().backward()
    torch.tpu.synchronize()
    assert torch.equal(xd.grad.cpu(), xc.grad)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert torch.equal(q.grad.cpu(), p.grad), name


def test_a_non_add_consumer_of_dx_runs_op_by_op_with_cpu_values():
    # A product of dx (not an add) does not join the row loop; values stay CPU's.
    args = _inputs((4, 6), 24)
    dy, x, mean, rstd, w, b, res = args
    want = torch.ops.aten.native_layer_norm_backward(dy, x, [24], mean, rstd, w, b, [True, True, True])[0] * res
    d = [a.to("tpu") for a in args]
    got = (
        torch.ops.aten.native_layer_norm_backward(d[0], d[1], [24], d[2], d[3], d[4], d[5], [True, True, True])[0]
        * d[6]
    )
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("reader", ["norm", "sum", "amax"])
@pytest.mark.parametrize("form", ["dx.add_(res)", "res.add_(dx)"])
def test_an_op_by_op_reader_of_the_add_target_stays_out_of_the_row_loop_region(form, reader):
    # The gradient clip's norm (an op run op by op) of the storage the residual add writes
    # in place: it must not join the backward's region as a later loop (a storage written in
    # place belongs to one loop; the region verifier rejected the char-LM step's region).
    # Values and the flush stay CPU's.
    read = {
        "norm": lambda t: torch.linalg.vector_norm(t),
        "sum": lambda t: t.sum(0),
        "amax": lambda t: t.amax(1),
    }[reader]

    def program(args):
        dy, x, mean, rstd, w, b, res = args
        *_, s = _backward_and_add(form, dy, x, mean, rstd, w, b, res, 24)
        return s, read(s)

    args = _inputs((4, 6), 24)
    want = program([a.clone() for a in args])
    got = program([a.to("tpu") for a in args])
    for g, c in zip(got, want):
        assert torch.equal(g.cpu(), c)
