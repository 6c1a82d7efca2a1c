"""CPU's own float32 transcendental kernels give the same numbers in every process that imports us.

MKL VML's lazy set-up races when its first call comes from two OpenMP threads; in a fraction of
processes (sqrt: 5 of 40 without this package, 15 of 40 with it) the second thread's
half of `exp`/`sqrt`/... of an 8,192-element tensor then differs from the first thread's code path
for the rest of the process (torch_tpu_eager/_cpu_math.py). Every "tpu" result is compared with
CPU, so the package starts VML on one thread at import. The check runs fresh processes, each
making its first VML call on two threads and comparing it with the same call on one thread; with
the start-up call removed, 16 processes all passing has probability about 0.63**16 < 0.1%.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

_PROGRAM = """
import torch
import torch_tpu_eager
torch.set_num_threads(2)
x = torch.rand(8192, generator=torch.Generator().manual_seed(0)) * 0.9 + 0.05
two = torch.exp(x)  # chunks of 2,048 on two threads: the first VML call of the process after import
torch.set_num_threads(1)
one = torch.exp(x)
print(int((two != one).sum()))
"""

_PROCESSES = 16


def _differing_elements(_):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="CPU PyTorch without MKL has no VML to race")
def test_first_vector_math_call_on_two_threads_matches_one_thread():
    with ThreadPoolExecutor(max_workers=2) as pool:
        differing = list(pool.map(_differing_elements, range(_PROCESSES)))
    assert differing == [0] * _PROCESSES
