"""Process lifetime: interpreter exit after autograd (fork: test_fork.py; sharing between
processes: test_ipc.py).

Every test runs its program in a subprocess with a timeout, so a regression fails
(exit status, or TimeoutExpired) instead of aborting or hanging the test run.
"""

import textwrap

import pytest

from difftest import requires_tpu, run_python


# The driver imports torch once and forks each run: every child runs the script's
# body and then exits through normal interpreter finalization (Py_FinalizeEx), which
# is where the abort happened. Two children run at a time.
EXIT_DRIVER = """
import gc, os, sys, torch, torch_tpu_eager, torch._dynamo
runs = {runs}
gc.freeze()  # children's finalization then does not copy the parent's heap page by page
codes, live, started, child = [], set(), 0, False
while started < runs or live:
    while started < runs and len(live) < 2:
        pid = os.fork()
        if pid == 0:
            child = True
            break
        live.add(pid)
        started += 1
    if child:
        break
    pid, status = os.wait()
    live.discard(pid)
    codes.append(os.waitstatus_to_exitcode(status))
if not child:
    bad = [c for c in codes if c != 0]
    print("runs", len(codes), "failed", len(bad), bad[:10])
    sys.exit(0 if len(codes) == runs and not bad else 1)
{body}
"""

BACKWARD = """
x = torch.randn(3, requires_grad=True).to("tpu")
(x * 2).sum().backward()
"""


@requires_tpu
def test_backward_script_exits_with_status_0_200_times():
    """Issue 17: exit 134 ('terminate called without an active exception') after a backward."""
    r = run_python(EXIT_DRIVER.format(runs=200, body=BACKWARD), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "runs 200 failed 0" in r.stdout
    assert "terminate called" not in r.stderr


EXIT_SCRIPTS = {
    "backward": BACKWARD + "print(x.grad)",
    "forward_only": """
        x = torch.randn(4, 4).to("tpu")
        print((x @ x).relu().sum().item())
    """,
    "pending_ops_at_exit": """
        x = torch.randn(64, requires_grad=True).to("tpu")
        y = (x.sin() * 3).sum()
        y.backward()
        z = x.cos() + 1  # recorded, never read
        w = z * z
    """,
    "backward_on_several_threads": """
        import threading
        def step(i):
            w = torch.randn(8, 8, requires_grad=True, device="tpu")
            for _ in range(3):
                (w * (i + 1)).tanh().sum().backward()
        ts = [threading.Thread(target=step, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    """,
    "storages_outlive_their_thread": """
        # A thread keeps freed storage blocks for its next tensors; threads that made
        # (and freed, > 1024) tensors exit, and the main thread frees the ones they returned.
        import threading
        out = {}
        def work(i):
            x = torch.full((3, 3), float(i), device="tpu")
            for _ in range(1200):
                x = x * 0.5 + 1.0
            out[i] = [x, x + 1]
            out[i][0].cpu()
        ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for i in range(3):
            assert torch.allclose(out[i][1].cpu(), torch.full((3, 3), 3.0)), out[i][1].cpu()
        out.clear()
        y = torch.ones(4, device="tpu")
        for _ in range(300):
            y = y * 2.0 - 1.0
        assert y.cpu().eq(1.0).all()
    """,
    "custom_function_backward": """
        class Twice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.keep = object()  # a Python object the device thread releases
                return x * 2
            @staticmethod
            def backward(ctx, g):
                return g * 2
        x = torch.randn(5, requires_grad=True, device="tpu")
        Twice.apply(x).sum().backward()
    """,
}


@requires_tpu
@pytest.mark.parametrize("case", sorted(EXIT_SCRIPTS))
def test_scripts_exit_with_status_0(case):
    body = textwrap.dedent(EXIT_SCRIPTS[case])
    r = run_python(EXIT_DRIVER.format(runs=10, body=body), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    r = run_python("import torch, torch_tpu_eager\n" + body)  # once in a fresh interpreter too
    assert r.returncode == 0, r.stderr[-3000:]
