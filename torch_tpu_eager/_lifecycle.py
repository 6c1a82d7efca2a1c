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
        if name.startswith("pt_autograd_") and name[len("pt_autograd_") :].isdigit():
            found.add(int(name[len("pt_autograd_") :]))
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


# ---------------------------------------------------------------------------
# torch.multiprocessing: tpu tensors travel through shared host memory
# ---------------------------------------------------------------------------


def _rebuild_tpu_tensor(cls, host, size, stride, offset, requires_grad, index):
    """Unpickles a tpu tensor sent by `_reduce_tensor`: its storage's values (a CPU tensor in
    shared memory) back on tpu:<index>, viewed with the sender's sizes, strides and offset."""
    t = host.to(torch.device("tpu", index)).as_strided(size, stride, offset)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _keep_for_spawning_process(host):
    """Keeps the host copy of a tpu tensor alive while a process that receives it starts.

    Pickled as an argument of a spawn/forkserver ``Process`` (``Process(args=(t,))``,
    ``torch.multiprocessing.spawn(fn, args=(t,))``), the copy's shared memory travels as a
    file descriptor that the child inherits only when it is launched, after pickling; the
    copy, which nothing else references, must outlive this call or the descriptor is closed
    first (the child failed with "unable to resize file ... Invalid argument"). It lives as
    long as the Popen object (the Process's ``_popen``). A queue duplicates the descriptor
    while it pickles, so nothing is kept there."""
    from multiprocessing import context

    popen = context.get_spawning_popen()
    if popen is not None:
        kept = popen.__dict__.setdefault("_tpu_host_copies", [])
        kept.append(host)


def _make_tensor_reducer(torch_reduce):
    def _reduce_tensor(tensor):
        """ForkingPickler's reducer for tensors: tpu tensors are sent by value through a CPU
        tensor in shared memory (the receiver gets a copy, values as of the send); others go to
        torch's own reducer. Raises in the sending process where CPU's reducer raises."""
        if tensor.device.type != "tpu" or (tensor.requires_grad and not tensor.is_leaf):
            return torch_reduce(tensor)  # torch raises for a non-leaf requiring grad
        if tensor.layout != torch.strided:
            raise RuntimeError(f"Cannot send a tpu tensor of layout {tensor.layout} between processes")
        storage = tensor.untyped_storage()
        held = storage.nbytes() // tensor.element_size()
        flat = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(storage, 0, (held,), (1,))
        host = flat.detach().to("cpu", copy=True)
        _keep_for_spawning_process(host)
        return (
            _rebuild_tpu_tensor,
            (
                type(tensor),
                host,
                tensor.size(),
                tensor.stride(),
                tensor.storage_offset(),
                tensor.requires_grad,
                tensor.device.index or 0,
            ),
        )

    return _reduce_tensor


def _install_multiprocessing_reductions():
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    reducer = _make_tensor_reducer(reductions.reduce_tensor)
    for cls in (torch.Tensor, torch.nn.parameter.Parameter):
        ForkingPickler.register(cls, reducer)


def _backward_on_caller():
    """Backward on the calling thread (TORCH_TPU_BACKWARD_ON_CALLER, default on).

    PyTorch's engine runs the backward functions of a non-CPU device on that device's
    worker thread (``pt_autograd_<i>``): each ``backward()`` hands its graph to that
    thread and waits, two thread hand-offs that cost more than recording a small
    model's backward (measured: 80-250 us of CPU time per ``backward()`` of a few ops,
    and milliseconds of wall time on a loaded machine). Our device kernels only record
    into the device's thread-safe queue, so nothing needs the worker thread: with
    autograd multithreading off in the importing thread (PyTorch's
    ``torch.autograd.set_multithreading_enabled(False)``, a thread-local setting),
    backward called from that thread runs there, as CPU's does. Other threads keep
    PyTorch's default. The flag is observable
    (``torch.autograd.is_multithreading_enabled()``); 0 restores CUDA's behaviour.
    """
    if _C._env_bool("TORCH_TPU_BACKWARD_ON_CALLER"):  # (not .env: `python -m torch_tpu_eager.env` imports us first)
        torch.autograd.set_multithreading_enabled(False)


def install():
    atexit.register(_drain_autograd_device_threads)
    _backward_on_caller()
    _install_multiprocessing_reductions()
