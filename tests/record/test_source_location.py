"""Errors raised at a flush name the Python line that recorded the failing op. On
CPython 3.11 the line is read without the GIL and cached per thread, so these tests
record from several lines, loops and threads and check each error names its own line."""

import sys
import threading

import pytest
import torch

from difftest import DEVICE
from threaded import run_threads

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="deferred errors exist only on the tpu device")


def _failing(value):
    # The fill value sits in a device tensor, so its int8 overflow is found only at the flush.
    mask = torch.ones(3, dtype=torch.bool, device="tpu")
    return torch.zeros(3, dtype=torch.int8, device="tpu"), mask, value


def _error_text(t):
    with pytest.raises(RuntimeError, match="without overflow") as info:
        t.cpu()
    return str(info.value)


def test_two_lines_of_one_loop_are_told_apart():
    value = torch.tensor(300, device="tpu")
    for i in range(4):  # later rounds hit the per-thread cache
        z, mask, v = _failing(value)
        if i % 2:
            line = sys._getframe().f_lineno + 1
            t = z.masked_fill(mask, v)
        else:
            line = sys._getframe().f_lineno + 1
            t = z.masked_fill(mask, v)
        assert f"{__file__}:{line}" in _error_text(t)


def test_a_line_in_a_called_function_is_named():
    value = torch.tensor(300, device="tpu")

    def inner():
        z, mask, v = _failing(value)
        return z.masked_fill(mask, v), sys._getframe().f_lineno

    for _ in range(3):
        t, line = inner()
        assert f"{__file__}:{line}" in _error_text(t)


def test_threads_name_their_own_lines():
    # Each thread records and reads under a lock, so a flush holds only that thread's
    # failing op (with both threads' ops in one flush, a region's error names the
    # first failing op of the region, whichever thread recorded it).
    value = torch.tensor(300, device="tpu")
    texts, lines = {}, {}
    turn = threading.Lock()

    def work(k):
        for _ in range(20):
            with turn:
                z, mask, v = _failing(value)
                if k == 0:
                    lines[k] = sys._getframe().f_lineno + 1
                    t = z.masked_fill(mask, v)
                else:
                    lines[k] = sys._getframe().f_lineno + 1
                    t = z.masked_fill(mask, v)
                try:
                    t.cpu()
                except RuntimeError as e:
                    texts.setdefault(k, set()).add(str(e).split(" recorded at ")[1].split(" ")[0])

    run_threads(work, [(0,), (1,)])
    for k in range(2):
        assert texts[k] == {f"{__file__}:{lines[k]}"}


def test_many_lines_each_named_while_the_per_thread_caches_churn():
    # 600 functions, each its own code object and line, record in turn: more keys than the
    # per-thread caches hold, so entries are evicted and looked up again every round.
    n, every = 600, 50
    src = "\n".join(f"def f{i}(z, mask, v):\n    return z.masked_fill(mask, v)\n" for i in range(n))
    filename = __file__.replace(".py", "_generated.py")
    scope = {}
    exec(compile(src, filename, "exec"), scope)
    value = torch.tensor(300, device="tpu")
    fine = torch.tensor(7, device="tpu")
    for _ in range(3):
        for i in range(n):
            z, mask, v = _failing(value if i % every == 0 else fine)
            t = scope[f"f{i}"](z, mask, v)
            if i % every == 0:
                assert f"{filename}:{3 * i + 2}" in _error_text(t)
    torch.tpu.synchronize()


def test_one_library_function_called_from_two_lines_names_each_caller(tmp_path):
    # The same library frame (code object and offset) under two user lines in turn: the
    # per-thread caches key the innermost frame and the user's, so each error names its
    # own caller, not the library file, also when the ops of one line repeat.
    from torch_tpu_eager import _C, _registration

    library = tmp_path / "lib"
    library.mkdir()
    filename = str(library / "fill.py")
    scope = {}
    exec(compile("def fill(z, mask, v):\n    return z.masked_fill(mask, v)\n", filename, "exec"), scope)
    prefixes, stdlib = _registration._library_paths()
    _C._set_library_paths([*prefixes, str(library) + "/"], stdlib)
    try:
        value = torch.tensor(300, device="tpu")
        for i in range(6):
            z, mask, v = _failing(value)
            if i % 3 == 0:
                line = sys._getframe().f_lineno + 1
                t = scope["fill"](z, mask, v)
            else:
                line = sys._getframe().f_lineno + 1
                t = scope["fill"](z, mask, v)
            text = _error_text(t)
            assert f"{__file__}:{line}" in text and filename not in text
    finally:
        _C._set_library_paths(prefixes, stdlib)


def test_ops_of_one_backward_pass_name_the_backward_call():
    # Every op of a backward pass is recorded under the same Python frames (library frames
    # under the `loss.backward()` line); a failing op recorded right after them names its
    # own line, and the gradients are CPU's.
    w = torch.ones(3, device="tpu", requires_grad=True)
    for _ in range(3):
        loss = (w * 2).sin().sum()
        loss.backward()
        z, mask, v = _failing(torch.tensor(300, device="tpu"))
        after = sys._getframe().f_lineno + 1
        t = z.masked_fill(mask, v)
        assert f"{__file__}:{after}" in _error_text(t)
    torch.testing.assert_close(w.grad.cpu(), 3 * 2 * torch.cos(torch.ones(3) * 2))
