"""Sharing tpu tensors between processes: torch.multiprocessing queues carry them (values,
strides, offset, Parameter type); the consumer never waits forever.
"""

import os
import subprocess
import sys
import textwrap


from difftest import PYTHON_ENV as ENV
from difftest import requires_tpu


def _run_script(code: str, name: str) -> list[str]:
    """Run ``code`` as a script file (spawned children re-import ``__main__`` from a file) and
    return its stdout lines; asserts it exited 0."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tpu_mp_{name}_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    try:
        r = subprocess.run([sys.executable, path], env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()


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
    lines = _run_script(code, "queue")
    assert lines[0] == "('tpu', [[1.0], [3.0], [5.0], [7.0]], (2, 7), 1, 'Parameter', True, [3.0, 3.0])"
    assert lines[1] == "0"


@requires_tpu
def test_spawned_process_receives_tpu_tensor_arguments():
    """tpu tensors passed as arguments of a spawned Process (the pickled host copy's shared
    memory reaches the child as a file descriptor inherited at launch): values, strides and
    Parameter type arrive, as CPU tensors' do."""
    code = """
    import torch, torch_tpu_eager, torch.multiprocessing as mp

    def child(out, t, p):
        out.put((t.device.type, t.cpu().tolist(), t.stride(), type(p).__name__, p.detach().cpu().tolist()))

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        x = (torch.arange(6.).to("tpu") * 2).view(2, 3).t()
        proc = ctx.Process(target=child, args=(out, x, torch.nn.Parameter(torch.ones(2, device="tpu"))))
        proc.start()
        print(out.get(timeout=240))
        proc.join(60)
        print(proc.exitcode)
    """
    lines = _run_script(code, "args")
    assert lines[0] == "('tpu', [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]], (1, 3), 'Parameter', [1.0, 1.0])"
    assert lines[1] == "0"
