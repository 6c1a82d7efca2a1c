"""Process lifetime: interpreter exit after autograd, and fork (CUDA's bad-fork rule).

Every test runs its program in a subprocess with a timeout, so a regression fails
(exit status, or TimeoutExpired) instead of aborting or hanging the test run.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from difftest import REPO_ROOT, requires_tpu

ROOT = REPO_ROOT
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_python(code, timeout=300):
    """Runs `code` in a fresh interpreter; returns the CompletedProcess (raises TimeoutExpired on a hang)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True, text=True, timeout=timeout
    )


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


# ---------------------------------------------------------------------------
# fork: a child of a process that used the device gets CUDA's RuntimeError
# ---------------------------------------------------------------------------

FORK_WHILE_RECORDING = """
import os, threading, time, torch, torch_tpu_eager
stop = False
def record():
    a = torch.ones(32, 32, device="tpu")
    while not stop:
        a = (a * 1.0001 + 0.5).sin()
        if torch.rand(()).item() < 0.1:
            a.sum().item()
t = threading.Thread(target=record)
t.start()
time.sleep(0.2)
outcomes = []
for i in range(4):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msg = "no error"
        try:
            assert torch.tpu._is_in_bad_fork()
            torch.ones(3, device="tpu") * 2
        except RuntimeError as e:
            msg = str(e)
        # CPU work and dropping inherited tpu tensors must not hang either
        cpu = (torch.arange(1000.) * 2).sum().item()
        del a_parent
        os.write(w, (msg + "|" + str(cpu)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        outcomes.append(f.read())
    os.waitpid(pid, 0)
stop = True
t.join()
print(torch.tpu._is_in_bad_fork(), (a_parent + 1).cpu().tolist())
for o in outcomes:
    print(o)
"""


@requires_tpu
def test_fork_while_another_thread_records_gives_bad_fork_error():
    code = FORK_WHILE_RECORDING.replace("time.sleep(0.2)", "time.sleep(0.2)\na_parent = torch.zeros(2, device='tpu')")
    r = run_python(code, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "False [1.0, 1.0]"  # the parent is unaffected
    assert len(lines) == 5
    for line in lines[1:]:
        msg, cpu = line.split("|")
        assert msg.startswith("Cannot re-initialize tpu in forked subprocess"), line
        assert cpu == "999000.0"


@requires_tpu
def test_fork_before_first_use_works_in_child():
    code = """
    import os, torch, torch_tpu_eager
    pid = os.fork()
    if pid == 0:
        ok = not torch.tpu._is_in_bad_fork() and (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2., 2., 2.]
        os._exit(0 if ok else 3)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    print((torch.ones(2, device="tpu") + 1).cpu().tolist())
    """
    r = run_python(code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[2.0, 2.0]", r.stderr[-3000:]


@requires_tpu
def test_dataloader_fork_workers_while_training_on_tpu():
    """DataLoader workers (fork) do CPU work while the parent trains on tpu; seeding in the
    workers skips the device (torch.manual_seed asks torch.tpu._is_in_bad_fork())."""
    code = """
    import torch, torch_tpu_eager
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            x = torch.full((4,), float(i)).sqrt()  # CPU work in the worker
            return x, torch.tensor(float(i % 3))

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(2):
        loader = DataLoader(Squares(), batch_size=16, num_workers=2,
                            multiprocessing_context="fork", timeout=60)
        for x, y in loader:
            loss = ((model(x.to("tpu")).squeeze(1) - y.to("tpu")) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    print(len(losses), all(l == l for l in losses))
    """
    r = run_python(code, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "8 True"


@requires_tpu
def test_dataloader_worker_touching_tpu_raises_not_hangs():
    code = """
    import torch, torch_tpu_eager
    from torch.utils.data import DataLoader, Dataset
    class OnTpu(Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            return (torch.ones(2, device="tpu") * i).cpu()
    warm = (torch.ones(2, device="tpu") + 1).cpu()  # the parent uses the device
    try:
        list(DataLoader(OnTpu(), batch_size=2, num_workers=2, multiprocessing_context="fork", timeout=60))
        print("no error")
    except RuntimeError as e:
        print("Cannot re-initialize tpu in forked subprocess" in str(e))
    """
    r = run_python(code, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "True"


@requires_tpu
def test_multiprocessing_queue_sends_tpu_tensors():
    """A tpu tensor put on a torch.multiprocessing queue arrives (values, strides, device,
    Parameter type); the consumer never waits forever (timeouts everywhere)."""
    code = """
    import torch, torch_tpu_eager, torch.multiprocessing as mp

    def consumer(q, out):
        t, p = q.get(timeout=120)
        out.put((t.device.type, t.cpu().tolist(), t.stride(), t.storage_offset(),
                 type(p).__name__, p.requires_grad, p.detach().cpu().tolist()))

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, out = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=consumer, args=(q, out))
        proc.start()
        x = torch.arange(8.).to("tpu")[1:].view(1, 7)[:, ::2].t()  # a strided view with an offset
        p = torch.nn.Parameter(torch.ones(2, device="tpu") * 3)
        q.put((x, p))
        print(out.get(timeout=240))
        proc.join(60)
        print(proc.exitcode)
    """
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tpu_mp_queue_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    try:
        r = subprocess.run([sys.executable, path], env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "('tpu', [[1.0], [3.0], [5.0], [7.0]], (2, 7), 1, 'Parameter', True, [3.0, 3.0])"
    assert lines[1] == "0"


@requires_tpu
def test_init_then_fork_child_init_raises_as_cuda():
    """torch.tpu.init() initializes as torch.cuda.init(): a child forked after it cannot
    re-initialize (CUDA's RuntimeError from init, is_initialized False, _is_in_bad_fork True)."""
    code = """
    import os, torch, torch_tpu_eager
    torch.tpu.init()
    assert torch.tpu.is_initialized()
    pid = os.fork()
    if pid == 0:
        try:
            torch.tpu.init()
            code = 4
        except RuntimeError as e:
            code = 0 if str(e).startswith("Cannot re-initialize tpu in forked subprocess") else 5
        if torch.tpu.is_initialized() or not torch.tpu._is_in_bad_fork():
            code = 6
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(st), torch.tpu.is_initialized(), (torch.ones(2, device="tpu") + 1).cpu().tolist())
    """
    r = run_python(code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0 True [2.0, 2.0]", (r.stdout, r.stderr[-3000:])
