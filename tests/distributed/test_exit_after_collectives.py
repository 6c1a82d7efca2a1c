"""Interpreter exit right after tpu_ccl collectives (torch_tpu_eager/distributed/backend.py,
``_drain_transport``).

gloo's worker threads release a finished work's host tensors after ``wait()`` returned; the
release takes the GIL, and a thread taking the GIL while the interpreter finalizes aborts the
process ("terminate called without an active exception"). The atexit drain waits for those
releases. The program (exit_program.py) has examples/train_ddp.py's shape: DDP steps, a last
broadcast, destroy_process_group, exit. The abort was a race (about 1 run in 10 under CPU load),
so the program runs several times; each run must exit with status 0.
"""

import os
import subprocess
import sys

import pytest

from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

HERE = os.path.dirname(os.path.abspath(__file__))


def _torchrun(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            os.path.join(HERE, "exit_program.py"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
    )


def test_gloo_workers_release_every_handed_tensor_before_exit():
    r = _torchrun("--check-drain")
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.stdout.count("EXIT OK") == 2


@pytest.mark.parametrize("attempt", range(5))
def test_exit_after_ddp_and_destroy_process_group_does_not_abort(attempt):
    r = _torchrun()
    assert "terminate called" not in r.stderr, r.stderr[-5000:]
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert r.stdout.count("EXIT OK") == 2
