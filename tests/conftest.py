"""Shared pytest configuration: chooses the device under test.

The suite runs against the "tpu" device by default. Setting the environment variable
``TPU_TEST_DEVICE=cpu`` runs every test against plain CPU PyTorch instead, which checks
that the tests themselves encode CPU semantics before the device exists.
"""

import math  # noqa: F401  (kept for tests that copy acceptance snippets verbatim)
import os
import sys

import pytest
import torch  # noqa: F401

# Make the helper module importable regardless of pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from difftest import DEVICE  # noqa: E402

if DEVICE == "tpu":
    import torch_tpu_eager  # noqa: F401,E402  (registers the "tpu" device)


@pytest.fixture(params=[DEVICE])
def dev(request):
    """The device string under test: "tpu", or "cpu" when TPU_TEST_DEVICE=cpu."""
    return request.param


@pytest.fixture
def spyre_target():
    """Makes "spyre" the active target for one test, then restores the previous one.
    Yields the torch_tpu_eager module."""
    import torch_tpu_eager as tte

    before = tte.get_target()
    tte.set_target("spyre")
    try:
        yield tte
    finally:
        tte.set_target(before)


@pytest.fixture
def restore_target_and_precision():
    """Restores the active target and float32 matmul precision after a test."""
    import torch_tpu_eager as tte

    target, precision = tte.get_target(), torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)
    tte.set_target(target)


@pytest.fixture
def cpu_math():
    """Fused loops compute exp, sqrt, tanh, ... with CPU's routines (fused math "cpu"), so
    their values are bit-equal to CPU's; the previous mode is restored after the test."""
    import torch_tpu_eager as tte
    from difftest import restoring

    for set_mode in restoring(tte.fused_math, tte.set_fused_math):
        set_mode("cpu")
        yield


# ---- test tiers (tests/README.md): fast, slow, subprocess ----
#
# `subprocess`: the test, a helper it calls or a fixture it uses runs a Python
# process (found from the code, so new tests are classified too).
# `slow`: listed in tests/tiers.py (measured with `python -m pytest tests
# --durations=0`), chosen so that the rest, `fast`, runs in under a minute.
# `fast`: every other test.

from tiers import SLOW  # noqa: E402

_SPAWN_NAMES = {"subprocess", "Popen", "check_output", "check_call", "executable", "spawn", "fork"}


def _code_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _spawns(fn, seen):
    """True if ``fn`` or a function of its module or of difftest it calls (transitively)
    starts a process."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _code_names(code)
    if names & _SPAWN_NAMES:
        return True
    module_globals = getattr(fn, "__globals__", {})
    for name in names:
        g = module_globals.get(name)
        if callable(g) and getattr(g, "__module__", None) in (fn.__module__, "difftest") and _spawns(g, seen):
            return True
    return False


def _tier_key(nodeid):
    """``tests/test_x.py::test_f[param]`` -> (file, function) without the parameters."""
    path, _, name = nodeid.partition("::")
    return path.rsplit("/", 1)[-1], name.split("[", 1)[0]


def pytest_collection_modifyitems(config, items):
    for item in items:
        file, name = _tier_key(item.nodeid)
        seen = set()
        fns = [getattr(item, "function", None)]
        info = getattr(item, "_fixtureinfo", None)
        if info is not None:
            for defs in info.name2fixturedefs.values():
                fns += [d.func for d in defs if getattr(d.func, "__module__", "").startswith("test")]
        if any(_spawns(fn, seen) for fn in fns if fn is not None):
            item.add_marker(pytest.mark.subprocess)
        elif file in SLOW or f"{file}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)
        else:
            item.add_marker(pytest.mark.fast)


if DEVICE == "tpu":
    # Every flush of the suite checks partition's regions (csrc/jit/verify.h).
    torch_tpu_eager._C._jit_set_verify(True)
