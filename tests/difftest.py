"""Differential-testing helpers: run one program on CPU and on the device under test.

Tests build a function ``fn(device) -> result`` that creates all its tensors on
``device`` and returns device tensors (not ``.cpu()`` copies), Python scalars, or
nested tuples/lists/dicts of them. ``run_both`` runs it on "cpu" and on the device and
compares every returned value: dtype, shape, values, and for views also stride() and
storage_offset().
"""

import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

# The repository root, for tests that run its examples, benchmarks and tools (tests live
# in stage subdirectories of tests/, so paths are taken from here, not from a test file).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Arguments of documented runs other tests make in process (tests/examples/test_docs_commands.py
# does not make them again): test_benchmarks_smoke.py's run of benchmarks/run_all.py (it adds
# --json) and test_examples.py's runs of examples/train_char_lm.py and train_digits.py.
RUN_ALL_SMOKE_ARGS = ("--quick", "--threads", "1", "--no-compile")
QUICK_EXAMPLE_ARGS = ("--quick",)

# The environment of a child Python process that imports this repository's package.
PYTHON_ENV = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def load_tool(name):
    """Imports tools/<name>.py of this repository as a fresh module (tools/ is
    not a package); returns the module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "tools", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_python(code, timeout=300):
    """Runs `code` (dedented) in a fresh interpreter with PYTHON_ENV; returns the
    CompletedProcess. Raises subprocess.TimeoutExpired on a hang."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=PYTHON_ENV, capture_output=True, text=True, timeout=timeout
    )


def run_avx2_child(code, cwd):
    """Runs ``code`` in a child process with ATEN_CPU_CAPABILITY=avx2 (CPU's kernels and the
    fused loops' AVX2 unit both run their AVX2 code), this repository first on its path, in
    ``cwd``. The child prints a JSON object with its ``capability`` last; returns that object
    after asserting that the child exited with 0 and ran at AVX2."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["capability"] == "AVX2"
    return res


DEVICE = os.environ.get("TPU_TEST_DEVICE", "tpu").strip().lower() or "tpu"
if DEVICE not in ("tpu", "cpu"):
    raise RuntimeError(f"TPU_TEST_DEVICE must be 'tpu' or 'cpu', got {DEVICE!r}")

requires_tpu = pytest.mark.skipif(
    DEVICE != "tpu", reason="needs the tpu device (TPU_TEST_DEVICE=cpu runs the CPU reference only)"
)


class _Snapshot:
    """Host copy of a returned tensor plus the metadata observed on its own device."""

    def __init__(self, t):
        self.device_type = t.device.type
        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        self.stride = t.stride()
        self.storage_offset = t.storage_offset()
        self.is_view = t._base is not None
        self.is_contiguous = t.is_contiguous()
        self.requires_grad = t.requires_grad
        # .cpu() on a CPU tensor returns the tensor itself; clone so later mutation of the
        # program's tensors cannot change the snapshot.
        self.value = t.detach().to("cpu", copy=True)


def materialize(result):
    """Turn a program result into host snapshots (this is where a lazy device flushes)."""
    if isinstance(result, torch.Tensor):
        return _Snapshot(result)
    if isinstance(result, (list, tuple)):
        return type(result)(materialize(r) for r in result)
    if isinstance(result, dict):
        return {k: materialize(v) for k, v in result.items()}
    return result


def compare(expected, actual, dev, *, rtol=None, atol=None, check_stride=False, path="result"):
    """Assert that a device snapshot tree equals the CPU snapshot tree."""
    if isinstance(expected, _Snapshot):
        assert isinstance(actual, _Snapshot), f"{path}: expected a tensor, got {type(actual)}"
        assert actual.device_type == torch.device(dev).type, (
            f"{path}: result is on {actual.device_type}, expected {dev}"
        )
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.is_view or check_stride:
            assert actual.stride == expected.stride, f"{path}: stride {actual.stride} != {expected.stride}"
            assert actual.storage_offset == expected.storage_offset, (
                f"{path}: storage_offset {actual.storage_offset} != {expected.storage_offset}"
            )
            assert actual.is_contiguous == expected.is_contiguous, f"{path}: is_contiguous differs"
        assert actual.is_view == expected.is_view, f"{path}: is a view on one device only (cpu: {expected.is_view})"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        if rtol is None and atol is None:
            torch.testing.assert_close(actual.value, expected.value, equal_nan=True, msg=lambda m: f"{path}: {m}")
        else:
            torch.testing.assert_close(
                actual.value, expected.value, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}"
            )
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{path}: structure differs ({expected!r} vs {actual!r})"
        )
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare(e, a, dev, rtol=rtol, atol=atol, check_stride=check_stride, path=f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), f"{path}: keys differ"
        for k in expected:
            compare(expected[k], actual[k], dev, rtol=rtol, atol=atol, check_stride=check_stride, path=f"{path}[{k!r}]")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected):
            assert math.isnan(actual), f"{path}: {actual} != nan"
        elif rtol is None and atol is None:
            assert actual == expected, f"{path}: {actual} != {expected}"
        else:
            assert math.isclose(actual, expected, rel_tol=rtol or 0.0, abs_tol=atol or 0.0), (
                f"{path}: {actual} != {expected}"
            )
        return
    assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def run_both(fn, dev, *, rtol=None, atol=None, check_stride=False):
    """Run ``fn("cpu")`` and ``fn(dev)`` and compare every returned value.

    Values are compared exactly for integer/bool tensors and with torch.testing's
    default dtype-based tolerances for floating tensors unless rtol/atol are given.
    Views (``_base is not None`` on CPU) are also compared on stride() and
    storage_offset(); ``check_stride=True`` extends that to every tensor.
    Returns the host snapshots of the device run's result.
    """
    expected = materialize(fn("cpu"))
    actual = materialize(fn(dev))
    compare(expected, actual, dev, rtol=rtol, atol=atol, check_stride=check_stride)
    return actual


def run_both_outcome(fn, dev, **kw):
    """Like run_both, but an exception is also an outcome.

    If CPU raises, the device must raise an exception of the same type (it may raise
    lazily, when the result is read); otherwise results are compared as in run_both.
    Returns the CPU exception or None.
    """
    try:
        expected = materialize(fn("cpu"))
        cpu_exc = None
    except Exception as e:  # noqa: BLE001 - any CPU error is the reference outcome
        cpu_exc = e
    try:
        actual = materialize(fn(dev))
        dev_exc = None
    except Exception as e:  # noqa: BLE001
        dev_exc = e
    if cpu_exc is not None:
        assert dev_exc is not None, f"CPU raised {type(cpu_exc).__name__}: {cpu_exc}; {dev} did not raise"
        assert isinstance(dev_exc, type(cpu_exc)), (
            f"CPU raised {type(cpu_exc).__name__}, {dev} raised {type(dev_exc).__name__}: {dev_exc}"
        )
        return cpu_exc
    if dev_exc is not None:
        raise AssertionError(f"{dev} raised {type(dev_exc).__name__} where CPU did not: {dev_exc}") from dev_exc
    compare(expected, actual, dev, **kw)
    return None


def cpu_randn(*shape, seed=0, dtype=torch.float32):
    """Deterministic CPU normal data, independent of the global RNG."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def cpu_randint(low, high, shape, seed=0, dtype=torch.int64):
    """Deterministic CPU integer data, independent of the global RNG."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def restoring(get, set_):
    """Body of a fixture that lets a test change a process-wide setting: yields ``set_``
    and afterwards restores the value ``get()`` returned before the test."""
    before = get()
    yield set_
    set_(before)


@contextlib.contextmanager
def cpu_features_off(*names):
    """Within the block the executors' vector kernels see the CPU without the named
    features ("avx2", "fma", "f16c", "avx512f"; executors/cpu_features.h), so they run
    their narrower builds; the previous switches are restored after it."""
    from torch_tpu_eager import _C

    before = _C._set_cpu_features_off(list(names))
    try:
        yield
    finally:
        _C._set_cpu_features_off(before)


def report_count(prefix):
    """The sum of ``metrics_report()``'s counts on the lines starting with ``prefix``
    (e.g. "spyre_chain_pass.": every kernel's launches through that pass)."""
    from torch_tpu_eager import metrics_report

    n = 0
    for line in metrics_report().splitlines():
        if line.strip().startswith(prefix):
            n += int(line.rsplit(":", 1)[1])
    return n


def aten_ops_during(fn):
    """Names of the ATen op calls torch.profiler records while ``fn()`` runs, in order
    (with repeats): on "tpu", ``fn=torch.tpu.synchronize`` lists what a flush runs on the host."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


def flush_on_tpu(fn, *cpu_args):
    """Copies ``cpu_args`` to "tpu", flushes, records ``fn(*args)`` (a sequence of
    tensors) and flushes it with the region verifier on: returns (the results read
    back to CPU, the ATen ops that flush ran on the host)."""
    import torch_tpu_eager

    torch_tpu_eager._C._jit_set_verify(True)
    args = [a.to("tpu") for a in cpu_args]
    torch.tpu.synchronize()
    out = fn(*args)
    ops = aten_ops_during(torch.tpu.synchronize)
    return [o.cpu() for o in out], ops


def assert_bit_equal(got, want):
    """Each tensor of ``got`` has the dtype, shape and exact values (torch.equal) of
    the one at its position in ``want``."""
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        assert torch.equal(g, w), (g, w)


def _call_outcome(build, act, device):
    import warnings

    tensors = build(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, exc = act(*tensors), None  # not read: an error must come from the call itself
        except Exception as e:  # noqa: BLE001 - any error is the outcome under test
            result, exc = None, e
    messages = sorted({(w.category.__name__, str(w.message)) for w in caught})
    return tensors, result, exc, messages


def run_both_at_call(build, act, dev, *, check_warnings=False):
    """Differential check of one call, at the call.

    ``build(device)`` returns a tuple of tensors; ``act(*tensors)`` makes the call
    under test (its result is not read). When CPU raises, ``act`` on ``dev`` must
    raise the same exception type with the same message itself, before anything is
    read; otherwise both results are compared as in run_both. Either way every
    tensor ``build`` made must afterwards be readable on ``dev`` and hold CPU's
    values (a rejected call writes nothing). ``check_warnings``: the call's warnings
    (category and message) must be CPU's too. Returns the CPU exception or None.
    """
    cpu_t, cpu_r, cpu_exc, cpu_w = _call_outcome(build, act, "cpu")
    dev_t, dev_r, dev_exc, dev_w = _call_outcome(build, act, dev)
    if cpu_exc is not None:
        assert dev_exc is not None, f"CPU raised {type(cpu_exc).__name__}: {cpu_exc}; {dev} did not raise at the call"
        assert type(dev_exc) is type(cpu_exc) and str(dev_exc) == str(cpu_exc), (
            f"CPU raised {type(cpu_exc).__name__}: {cpu_exc}\n{dev} raised {type(dev_exc).__name__}: {dev_exc}"
        )
    else:
        if dev_exc is not None:
            raise AssertionError(f"{dev} raised {type(dev_exc).__name__} where CPU did not: {dev_exc}") from dev_exc
        compare(materialize(cpu_r), materialize(dev_r), dev)
    compare(materialize(cpu_t), materialize(dev_t), dev, path="arguments after the call")
    if check_warnings:
        assert dev_w == cpu_w, f"warnings differ: cpu {cpu_w}, {dev} {dev_w}"
    return cpu_exc


class ProgramLog:
    """The lines of a generated program (random-program judges): each logged line is also
    given to hypothesis's ``note`` so that a failing example prints the program."""

    def __init__(self):
        self.code = []

    def log(self, line):
        from hypothesis import note

        self.code.append(line)
        note(line)

    def where(self):
        return "\n".join(self.code)


def outcome_quietly(fn, *args):
    """``(fn(*args), None)``, or ``(None, exception)`` when it raised; warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn(*args), None
        except Exception as ex:  # noqa: BLE001
            return None, ex


def run_generated(body, *, examples, seed):
    """The command-line form of a random-program judge: runs ``body(data)`` (a hypothesis
    ``st.data()`` program) for ``examples`` programs drawn from ``seed``, shrinking the first
    failure. Prints "OK: n programs" or "FAIL after n programs" and the failure; returns
    ``(exit code 0 or 1, programs run)``."""
    import traceback

    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    count = [0]

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        count[0] += 1
        body(data)

    try:
        run()
    except BaseException as ex:  # noqa: BLE001
        print(f"FAIL after {count[0]} programs")
        traceback.print_exception(ex, limit=0)
        return 1, count[0]
    print(f"OK: {count[0]} programs")
    return 0, count[0]


def print_step_counts(stats):
    """Prints how many generated steps completed and how many raised as on CPU; ``stats``
    counts steps by ``("ok" or "err", op name)``."""
    ok = sum(n for (o, _), n in stats.items() if o == "ok")
    print(f"steps run: {ok} completed, {sum(stats.values()) - ok} raised as on CPU")
