"""The exit-time drain of autograd's device thread waits for that thread's work.

At exit, torch_tpu_eager's atexit handler runs one no-op task through each
``pt_autograd_<i>`` thread so that a finished backward's GraphTask (which holds the
Python context torch.autograd stashes) is released while the interpreter is whole;
released during finalization, the thread's GIL request ends it with pthread_exit and
the process aborts ("terminate called without an active exception"). The importing
thread runs its own backward (TORCH_TPU_BACKWARD_ON_CALLER, autograd multithreading
off there), which made the no-op run on the caller at once: the drain did not wait.
Checked by order, not by time: a backward on another thread is still inside its slow
node on the device thread when the drain starts, and has left it when the drain returns.
"""

import threading

import torch

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device)
from torch_tpu_eager import _C


def test_drain_waits_for_the_device_thread_from_the_importing_thread():
    entered, release, left = threading.Event(), threading.Event(), threading.Event()

    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            entered.set()
            release.wait(30)
            left.set()
            return g * 2

    def step():
        w = torch.ones(4, device="tpu", requires_grad=True)
        Gate.apply(w).sum().backward()

    t = threading.Thread(target=step)
    t.start()
    assert entered.wait(30)
    assert not torch.autograd.is_multithreading_enabled()  # the importing thread runs its own backward
    threading.Timer(0.2, release.set).start()
    _C._drain_autograd_device_thread(torch.tpu.current_device())
    assert left.is_set()  # the drain returned after the device thread left the node
    assert not torch.autograd.is_multithreading_enabled()  # restored
    t.join()
