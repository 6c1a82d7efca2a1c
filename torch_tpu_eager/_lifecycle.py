"""Process lifetime: interpreter exit after autograd, and fork.

Exit: PyTorch's autograd worker thread of a device (``pt_autograd_<i>``) drops
its reference to a finished backward's GraphTask only after ``backward()`` has
returned to the caller. That GraphTask holds Python objects (the contextvars
context ``torch.autograd`` stashes for device threads), so the thread then takes
the GIL; once the interpreter is finalizing, CPython ends such a thread with
``pthread_exit``, and its unwinding through a noexcept destructor aborts the
process ("terminate called without an active exception", exit status 134). An
atexit handler, which runs while the interpreter is still whole, waits until
each such thread has finished its tasks (``_C._drain_autograd_device_thread``).

Fork: see ``csrc/device/fork.h`` (``torch.tpu._is_in_bad_fork()``).
"""
import atexit
import os

import torch

from . import _C


def _autograd_device_threads():
    """Indices i of this process's threads named ``pt_autograd_<i>``; None if /proc cannot say."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = set()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("pt_autograd_") and name[len("pt_autograd_"):].isdigit():
            found.add(int(name[len("pt_autograd_"):]))
    return found


def _drain_autograd_device_threads():
    """atexit: let every tpu autograd worker finish (and release) its tasks while Python is alive."""
    if _C._is_in_bad_fork():
        return
    try:
        count = torch.tpu.device_count()
        running = _autograd_device_threads()
        indices = range(count) if running is None else sorted(i for i in running if i < count)
        for i in indices:
            _C._drain_autograd_device_thread(i)
    except Exception:  # never turn a clean exit into a failing one
        pass


def install():
    atexit.register(_drain_autograd_device_threads)
