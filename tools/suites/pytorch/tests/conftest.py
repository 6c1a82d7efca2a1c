# Harness conftest for PyTorch 2.4.0 test files run against torch 2.13 on "cpu" or "tpu".
# Kept in tools/suites/pytorch/tests/; run.py copies it beside the fetched test files.
import json
import os
import re
import time

DEVICE = os.environ.get("SUITE_DEVICE", "cpu")
if DEVICE == "tpu":
    # Before common_device_type computes device_type_test_bases.
    import torch_tpu_eager  # noqa: F401

import numpy as np  # noqa: E402
import torch.testing._internal.common_cuda as _cc  # noqa: E402
import torch.testing._internal.common_mkldnn as _cm  # noqa: E402
import torch.testing._internal.common_nn as _cn  # noqa: E402
import torch.testing._internal.common_utils as _cu  # noqa: E402

# Names the 2.4.0 files import that torch 2.13 moved or removed.
if not hasattr(_cu, "skipIfMps"):
    _cu.skipIfMps = _cu.skipIfMPS
if not hasattr(_cn, "new_module_tests"):
    _cn.new_module_tests = _cn.get_new_module_tests()
if not hasattr(_cc, "tf32_is_not_fp32"):
    _cc.tf32_is_not_fp32 = lambda: False
if not hasattr(_cm, "bf32_on_and_off"):
    _cm.bf32_on_and_off = _cm.reduced_f32_on_and_off
try:
    import torch.testing._internal.common_methods_invocations as _cmi

    if not hasattr(_cmi, "binary_ufuncs_and_refs"):
        _cmi.binary_ufuncs_and_refs = tuple(_cmi.binary_ufuncs)
    # test_ops.py imports these from here; torch 2.13 has them in common_device_type,
    # skipOps taking the skip specs alone (2.4.0: skipOps(class name, test name, specs)).
    import torch.testing._internal.common_device_type as _cdt

    for _name in ("skip", "xfail"):
        if not hasattr(_cmi, _name):
            setattr(_cmi, _name, getattr(_cdt, _name))
    if not hasattr(_cmi, "skipOps"):
        _cmi.skipOps = lambda _cls, _test, specs: _cdt.skipOps(specs)
except Exception:  # pragma: no cover
    pass
if not hasattr(np, "msort"):
    np.msort = lambda a: np.sort(a, axis=0)

if os.environ.get("SUITE_BYPASS") == "1":
    import torch.testing._internal.common_device_type as _cdt

    _cdt.PrivateUse1TestBase.bypass_device_restrictions = True

if os.environ.get("SUITE_CPU_DTYPES") == "1":
    # Outside the count: a test whose @dtypesIfCPU lists more dtypes than its @dtypes is
    # generated for "tpu" in CPU's dtypes too (CPU computes them; "tpu" should as well).
    import torch.testing._internal.common_device_type as _cdt

    _get_dtypes = _cdt.PrivateUse1TestBase._get_dtypes.__func__

    @classmethod
    def _cpu_dtypes(cls, test):
        found = _get_dtypes(cls, test)
        return test.dtypes.get("cpu", found) if found is not None else None

    _cdt.PrivateUse1TestBase._get_dtypes = _cpu_dtypes

LOG = os.environ.get("SUITE_LOG")
SELECT = os.environ.get("SUITE_SELECT")
DESELECT = os.environ.get("SUITE_DESELECT")


def _finished():
    """Node ids the log already holds an outcome for (from a run that crashed)."""
    done = set()
    if LOG and os.path.exists(LOG):
        with open(LOG) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "outcome":
                    done.add(rec["nodeid"])
    return done


def _write(rec):
    if not LOG:
        return
    rec["t"] = time.time()
    with open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pytest_collection_modifyitems(session, config, items):
    done = _finished()
    keep, drop = [], []
    sel = re.compile(SELECT) if SELECT else None
    desel = re.compile(DESELECT) if DESELECT else None
    for item in items:
        name = item.name
        if item.nodeid in done:
            drop.append(item)
        elif sel is not None and not sel.search(name):
            drop.append(item)
        elif desel is not None and desel.search(name):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _synchronize_chips():
    """Runs every chip's pending ops; raises the oldest error no read reported yet."""
    import torch

    for i in range(torch.tpu.device_count()):
        torch.tpu.synchronize(i)


if DEVICE == "tpu" and os.environ.get("SUITE_NO_SYNC") != "1":
    import pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item):
        """Synchronizes after each test, so an error deferred to the flush (a dtype or index
        error of a value that died unread) fails the test that made it, not the next test
        that reads a tensor (CUDA's asynchronous error reporting, lazy/async_errors.h).
        A test that already failed or skipped keeps its own outcome."""
        try:
            result = yield
        except BaseException:
            try:
                _synchronize_chips()
            except Exception:
                pass
            raise
        _synchronize_chips()
        return result


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})


_state = {}


def pytest_runtest_logreport(report):
    nid = report.nodeid
    if report.when == "setup":
        if report.skipped:
            _state[nid] = ("skipped", _msg(report))
        elif report.failed:
            _state[nid] = ("error", _msg(report))
    elif report.when == "call":
        if hasattr(report, "wasxfail"):
            _state[nid] = ("xfailed" if report.skipped else "xpassed", _msg(report))
        elif report.skipped:
            _state[nid] = ("skipped", _msg(report))
        elif report.failed:
            _state[nid] = ("failed", _msg(report))
        else:
            _state[nid] = ("passed", "")
    elif report.when == "teardown":
        outcome, msg = _state.pop(nid, ("error", "no setup/call report"))
        if report.failed and outcome == "passed":
            outcome, msg = "error", _msg(report)
        _write({"event": "outcome", "nodeid": nid, "outcome": outcome, "msg": msg})


def _msg(report):
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):  # skip: (path, lineno, reason)
        return str(lr[2])[:300]
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300] if crash.message else ""
    text = str(lr).strip().splitlines()
    return text[-1][:300] if text else ""
