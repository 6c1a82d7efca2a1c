"""fork after the device was used: CUDA's bad-fork rule (the child gets CUDA's RuntimeError,
never a deadlock), fork before first use, DataLoader fork workers, init() then fork.

Every test runs its program in a subprocess with a timeout, so a regression fails
(exit status, or TimeoutExpired) instead of aborting or hanging the test run.
"""

from difftest import requires_tpu, run_python


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
        assert msg.startswith("Cannot re-initialize TPU in forked subprocess"), line
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
        print("Cannot re-initialize TPU in forked subprocess" in str(e))
    """
    r = run_python(code, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "True"


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
            code = 0 if str(e).startswith("Cannot re-initialize TPU in forked subprocess") else 5
        if torch.tpu.is_initialized() or not torch.tpu._is_in_bad_fork():
            code = 6
        os._exit(code)
    _, st = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(st), torch.tpu.is_initialized(), (torch.ones(2, device="tpu") + 1).cpu().tolist())
    """
    r = run_python(code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0 True [2.0, 2.0]", (r.stdout, r.stderr[-3000:])
