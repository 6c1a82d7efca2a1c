"""Differential sweep of PyTorch's OpInfo database: CPU versus the "tpu" device.

For one OpInfo (an entry of ``torch.testing._internal.common_methods_invocations.op_db``)
and one dtype, every sample input the OpInfo generates on CPU is run twice: on CPU as
generated, and on "tpu" after moving every tensor (also inside lists, tuples and dicts)
with ``.to("tpu")``. The outcomes must agree:

- if CPU returns, "tpu" returns the same structure; tensors match in dtype (exactly),
  shape and values (``torch.testing.assert_close`` with ``equal_nan=True``), and live on
  "tpu"; the sample's input tensors also match afterwards (catches wrong mutation);
- if CPU raises, "tpu" raises an exception of the same type (at the call or, lazily, when
  the result is read back).

Which OpInfos are worth sweeping is decided by :func:`coverage`: one sample is run on CPU
under a ``TorchDispatchMode`` that records the ATen overloads the OpInfo reaches; the
OpInfo is *covered* when at least one of them is in :func:`torch_tpu_eager.op_table`.

Typical use::

    from torch_tpu_eager.testing import load_op_db, sweep_op
    op = next(o for o in load_op_db() if o.name == "add")
    print(sweep_op(op, torch.float32))
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Iterable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tpu_eager

# OpInfos whose outputs are random draws: CPU and "tpu" use different generators, so the
# values cannot be compared sample by sample.
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "normal.in_place",
        "normal.number_mean",
        "uniform",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "nn.functional.alpha_dropout",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.rrelu",
    }
)

# OpInfos that return uninitialized memory: only metadata is defined, not values.
UNINITIALIZED_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_permuted",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
    }
)

# Tolerance for float16/bfloat16 when the OpInfo declares none: half precision keeps
# ~3 significant digits, and CPU and the device may round intermediates differently.
HALF_TOLERANCE = (1e-2, 1e-2)  # (rtol, atol)
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def load_op_db() -> list:
    """The OpInfo list ``op_db``.

    Imports ``torch_tpu_eager`` first: the "tpu" device must be registered before
    ``torch.testing._internal.common_device_type`` builds its device-type tables.
    """
    assert torch_tpu_eager is not None
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def op_key(op) -> str:
    """A unique, readable name of an OpInfo: ``name`` or ``name.variant_test_name``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.lru_cache(maxsize=None)
def registered_overloads() -> frozenset:
    """Names (``add.Tensor``, ``abs`` for a default overload) of the ops "tpu" records."""
    return frozenset(name for name, _kind in torch_tpu_eager.op_table())


def _overload_name(func) -> str:
    """An OpOverload's name in the format of op_table(); other namespaces keep a prefix."""
    name = func.name()  # "aten::add.Tensor", "aten::abs" for the default overload
    ns, _, rest = name.partition("::")
    return rest if ns == "aten" else name


class _RecordOverloads(TorchDispatchMode):
    """Records every overload that reaches the Python dispatch key.

    An overload without a "tpu" kernel that has a composite kernel (explicit:
    ``sum`` -> ``sum.dim_IntList``, ``sort`` -> ``sort.stable``; or implicit, reached from
    inside another kernel: ``thnn_conv2d`` -> ``_slow_conv2d_forward``) runs that kernel
    with the mode re-entered, so the ops it calls are recorded too. ``seeded`` collects
    overloads tagged nondeterministic_seeded.
    """

    def __init__(self, registered: frozenset):
        super().__init__()
        self.registered = registered
        self.seen: set = set()
        self.seeded: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _overload_name(func)
        self.seen.add(name)
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seeded.add(name)
        kwargs = kwargs or {}
        if name not in self.registered:
            explicit = torch._C.DispatchKey.CompositeExplicitAutograd
            if func.has_kernel_for_dispatch_key(explicit):
                with self:
                    return func._op_dk(explicit, *args, **kwargs)
            if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
                with self:
                    return func.decompose(*args, **kwargs)
        return func(*args, **kwargs)


class _SeededProbe(TorchDispatchMode):
    """Notes overloads tagged nondeterministic_seeded (RNG draws) during a CPU call.

    Watching the ops rather than the generator state also catches OpInfos that reseed
    and restore the generator around the call (``wrapper_set_seed``).
    """

    def __init__(self):
        super().__init__()
        self.seeded: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and not _draw_disabled(func, args, kwargs):
            self.seeded.add(_overload_name(func))
        return func(*args, **kwargs)


def _draw_disabled(func, args, kwargs) -> bool:
    """True for a seeded op called so that it draws nothing: ``dropout_p=0``/``p=0``
    or ``train=False`` (attention and dropout kernels carry the tag regardless)."""
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
        if arg.name in ("dropout_p", "p") and isinstance(value, (int, float)) and value == 0:
            return True
        if arg.name == "train" and value is False:
            return True
    return False


def skip_reason(op) -> Optional[str]:
    """Why an OpInfo cannot be compared value by value, or None if it can."""
    key = op_key(op)
    if key in RANDOM_OPS:
        return "outputs are random draws; CPU and tpu generators differ"
    if key in UNINITIALIZED_OPS:
        return "outputs are uninitialized memory"
    return None


_SAMPLE_SEED = 0


def sample_inputs(op, dtype: torch.dtype) -> Iterable:
    """The OpInfo's CPU samples for ``dtype`` (no autograd), deterministically.

    Same samples as ``op.sample_inputs("cpu", dtype)``, which reseeds before each one,
    but without its test-tracking wrapper: that wrapper walks the interpreter stack with
    ``inspect.stack()`` on every call (~0.2 s under pytest's deep stacks) and
    ``torch.manual_seed`` also seeds every lazily-initialised accelerator module. Only the
    CPU generator is reseeded here, before each sample.
    """
    gen = torch.default_generator
    gen.manual_seed(_SAMPLE_SEED)
    it = iter(op.sample_inputs_func(op, "cpu", dtype, False))
    while True:
        gen.manual_seed(_SAMPLE_SEED)
        try:
            sample = next(it)
        except StopIteration:
            return
        yield sample


def _reference_dtype(op) -> Optional[torch.dtype]:
    """float32 when the OpInfo supports it on CPU, else its first supported dtype."""
    dtypes = op.supported_dtypes("cpu")
    if torch.float32 in dtypes:
        return torch.float32
    ordered = sorted(dtypes, key=str)
    return ordered[0] if ordered else None


def _trace(op, dtype: Optional[torch.dtype], max_samples: int) -> _RecordOverloads:
    """Runs the first ``max_samples`` CPU samples of ``op`` under a recording mode."""
    mode = _RecordOverloads(registered_overloads())
    dtype = dtype or _reference_dtype(op)
    if dtype is None:
        return mode
    for i, sample in enumerate(sample_inputs(op, dtype)):
        if i >= max_samples:
            break
        with mode:
            try:
                op(sample.input, *sample.args, **sample.kwargs)
            except Exception:  # noqa: BLE001 - an error sample still reached some ops
                pass
    return mode


def aten_overloads_of(op, dtype: Optional[torch.dtype] = None, max_samples: int = 1) -> frozenset:
    """ATen overloads the OpInfo reaches on CPU, from its first ``max_samples`` samples.

    Runs under a TorchDispatchMode, so composite (implicit-autograd) ops show up as the
    ops they decompose into, which is also what "tpu" sees; unregistered ops with a
    composite kernel are followed into it (see _RecordOverloads). Samples whose CPU call raises
    still contribute the overloads reached before the error. Names use op_table()'s
    format (``add.Tensor``; ``abs`` for a default overload; ``prims::...`` outside aten).
    """
    return frozenset(_trace(op, dtype, max_samples).seen)


@dataclasses.dataclass
class Coverage:
    """Which ATen overloads an OpInfo reaches and which of them "tpu" registers."""

    op_name: str
    reached: frozenset
    registered: frozenset
    seeded: frozenset = frozenset()
    error: Optional[str] = None

    @property
    def covered(self) -> bool:
        """True when at least one reached overload has a "tpu" kernel."""
        return bool(self.registered)

    @property
    def unregistered(self) -> frozenset:
        """Reached overloads without a "tpu" kernel (composite ops or gaps)."""
        return self.reached - self.registered


def coverage(op, max_samples: int = 3) -> Coverage:
    """Maps an OpInfo to the ATen overloads it reaches and the registered ones.

    ``seeded`` lists reached overloads tagged ``nondeterministic_seeded`` (RNG draws).
    """
    try:
        mode = _trace(op, None, max_samples)
        reached, seeded, error = frozenset(mode.seen), frozenset(mode.seeded), None
    except Exception as e:  # noqa: BLE001 - sample generation itself can fail
        reached, seeded, error = frozenset(), frozenset(), f"{type(e).__name__}: {e}"
    return Coverage(op_key(op), reached, reached & registered_overloads(), seeded, error)


class _SkipSample(Exception):
    """A sample that cannot be compared: not movable to the device (sparse, quantized),
    or its CPU run drew random numbers and the outputs differ."""


def _is_cpu_device(d) -> bool:
    return isinstance(d, (str, torch.device)) and torch.device(d).type == "cpu"


def _tensor_to(t: torch.Tensor, device: str) -> torch.Tensor:
    if t.layout != torch.strided or t.is_quantized:
        raise _SkipSample(f"tensor with layout {t.layout}")
    span = t.untyped_storage().nbytes() // t.element_size()
    d = t.detach().to(device)
    if d.stride() == t.stride() and t.storage_offset() == 0 and span == t.numel():
        return d
    # .to() makes non-dense inputs (stepped slices, expanded dims) contiguous and drops
    # the storage offset; as_strided-style ops see both. Copy the whole storage and view
    # it with CPU's exact strides and offset so the device sees the same layout.
    base = t.detach().as_strided((span,), (1,), 0).to(device)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def to_device(obj: Any, device: str = "tpu", _key: Optional[str] = None) -> Any:
    """Copies a sample's tensors to ``device``, recursing into lists, tuples and dicts.

    Strides and storage offsets are preserved, also for non-dense views (the whole
    storage is copied). Device arguments naming CPU are redirected to ``device``: a
    ``device=`` keyword (factory ops' samples carry one), torch.device("cpu") objects and
    the string "cpu" (``x.to("cpu", ...)``). Every other value is returned as is.
    """
    if isinstance(obj, torch.Tensor):
        return _tensor_to(obj, device)
    if isinstance(obj, torch.device):
        return torch.device(device) if obj.type == "cpu" else obj
    if (_key == "device" and _is_cpu_device(obj)) or (isinstance(obj, str) and obj == "cpu"):
        return device
    if isinstance(obj, list):
        return [to_device(x, device) for x in obj]
    if isinstance(obj, tuple):
        moved = [to_device(x, device) for x in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    if isinstance(obj, dict):
        return {k: to_device(v, device, _key=k) for k, v in obj.items()}
    return obj


def _mentions_device(obj: Any, _key: Optional[str] = None) -> bool:
    """True when :func:`to_device` would send something in ``obj`` to the device."""
    if isinstance(obj, (torch.Tensor, torch.device)):
        return True
    if (_key == "device" and _is_cpu_device(obj)) or (isinstance(obj, str) and obj == "cpu"):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_mentions_device(x) for x in obj)
    if isinstance(obj, dict):
        return any(_mentions_device(v, k) for k, v in obj.items())
    return False


def _tensor_leaves(obj: Any) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensor_leaves(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensor_leaves(x)]
    return []


def _tolerance(op, dtype: torch.dtype) -> tuple:
    """(rtol, atol) for ``dtype``.

    The OpInfo's CPU/any-device tolerance or precision override if it declares one (the
    largest, since overrides are per test), else torch.testing's defaults for float32
    (None, None); for float16/bfloat16 never tighter than :data:`HALF_TOLERANCE`.
    """
    rtol = atol = None
    for info in getattr(op, "decorators", ()) or ():
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for dec in getattr(info, "decorators", ()) or ():
            table = getattr(dec, "d", None)
            if not isinstance(table, dict) or dtype not in table:
                continue
            entry = table[dtype]
            # toleranceOverride gives tol(atol, rtol); precisionOverride a bare atol.
            r, a = (entry.rtol, entry.atol) if hasattr(entry, "rtol") else (0.0, float(entry))
            rtol, atol = max(rtol or 0.0, r), max(atol or 0.0, a)
    if dtype in _HALF_DTYPES:
        rtol = max(rtol or 0.0, HALF_TOLERANCE[0])
        atol = max(atol or 0.0, HALF_TOLERANCE[1])
    if rtol is not None and atol is None:
        atol = 0.0
    if atol is not None and rtol is None:
        rtol = 0.0
    return rtol, atol


def _compare(expected: Any, actual: Any, device: str, tol: tuple, path: str = "out") -> None:
    """Asserts that a device outcome equals the CPU outcome (raises AssertionError).

    ``device`` is where results that CPU put on "cpu" must be: the device, or "cpu" for a
    sample that gave the device nothing (a factory call without ``device=``).
    """
    rtol, atol = tol
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: CPU returned a tensor, device returned {type(actual).__name__}")
        want_type = torch.device(device).type if expected.device.type == "cpu" else expected.device.type
        if actual.device.type != want_type:
            raise AssertionError(f"{path}: result on {actual.device}, expected {want_type}")
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{path}: dtype {actual.dtype} != CPU {expected.dtype}")
        if actual.shape != expected.shape:
            raise AssertionError(f"{path}: shape {tuple(actual.shape)} != CPU {tuple(expected.shape)}")
        torch.testing.assert_close(
            actual.detach().to("cpu"),
            expected.detach(),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            check_device=False,
            msg=lambda m: f"{path}: {m}",
        )
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(
                f"{path}: structure differs: CPU {type(expected).__name__} of "
                f"{len(expected)}, device {type(actual).__name__}"
            )
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare(e, a, device, tol, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise AssertionError(f"{path}: dict keys differ")
        for k in expected:
            _compare(expected[k], actual[k], device, tol, f"{path}[{k!r}]")
        return
    if isinstance(expected, torch.device):
        want = torch.device(device) if expected.type == "cpu" else expected
        if not isinstance(actual, torch.device) or actual.type != want.type:
            raise AssertionError(f"{path}: device {actual!r} != expected {want!r}")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
        ok = math.isclose(
            actual, expected, rel_tol=rtol if rtol is not None else 1.3e-6, abs_tol=atol if atol is not None else 1e-5
        )
        if not ok:
            raise AssertionError(f"{path}: {actual!r} != CPU {expected!r}")
        return
    if type(actual) is not type(expected) or actual != expected:
        raise AssertionError(f"{path}: {actual!r} != CPU {expected!r}")


def _numel(obj: Any) -> int:
    return sum(t.numel() for t in _tensor_leaves(obj))


def _describe(sample) -> str:
    """Short description of a sample: tensor shapes/dtypes/strides and other arguments."""

    def d(x):
        if isinstance(x, torch.Tensor):
            s = f"T{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
            return s if x.is_contiguous() else s + f"@{x.stride()}"
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(d(v) for v in x) + "]"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in x.items()) + "}"
        return repr(x)

    return f"input={d(sample.input)} args={d(list(sample.args))} kwargs={d(sample.kwargs)}"


@dataclasses.dataclass
class OpResult:
    """Outcome of sweeping one OpInfo for one dtype on the device.

    ``failed``: both sides ran and the results differ, or CPU raised and the device did
    not (or raised another type). ``errors``: the device raised where CPU did not.
    ``skipped``: samples not compared (too large, not movable to the device, or random),
    counted per reason in ``skipped_why``.
    ``failures`` keeps the first few (sample index, kind, message, sample description).
    """

    op_name: str
    dtype: str
    noncontiguous: bool = False
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    skip_reason: Optional[str] = None
    failures: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    skipped_why: dict = dataclasses.field(default_factory=dict)

    def skip(self, why: str) -> None:
        """Counts one sample skipped for reason ``why``."""
        self.skipped += 1
        self.skipped_why[why] = self.skipped_why.get(why, 0) + 1

    @property
    def total(self) -> int:
        """Samples run (passed + failed + errors)."""
        return self.passed + self.failed + self.errors

    @property
    def ok(self) -> bool:
        """True when no sample failed or errored."""
        return self.failed == 0 and self.errors == 0

    @property
    def first_failure(self) -> Optional[str]:
        """Message of the first failing sample, or None."""
        if not self.failures:
            return None
        idx, kind, msg, desc = self.failures[0]
        return f"sample {idx} ({kind}): {msg}\n  sample: {desc}"

    def summary(self) -> str:
        """One line: name, dtype, counts and the first failure's first line."""
        layout = "-noncontig" if self.noncontiguous else ""
        s = (
            f"{self.op_name} {self.dtype}{layout}: {self.passed} passed, {self.failed} failed, "
            f"{self.errors} errors, {self.skipped} skipped ({self.seconds:.2f}s)"
        )
        if self.skip_reason:
            s += f" [skipped: {self.skip_reason}]"
        first = self.first_failure
        if first is not None:
            s += " | " + first.splitlines()[0][:300]
        return s


def _short(e: BaseException, limit: int = 600) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) <= limit else msg[:limit] + " ..."


def _materialize(result: Any) -> Any:
    """Reads every device tensor of a result back to host (forces lazy errors out)."""
    for t in _tensor_leaves(result):
        if t.layout == torch.strided:
            t.detach().to("cpu")
    return result


def run_sample(op, sample, device: str, tol: tuple) -> tuple:
    """Runs one sample on CPU and on ``device``; returns (kind, message).

    kind is "pass", "fail" or "error" (see :class:`OpResult`); message is None on pass.
    Raises _SkipSample when the sample cannot be moved to the device, or when its CPU
    run drew random numbers and the outputs differ (the generators differ; a sample whose
    draws do not reach the outputs still passes).
    """
    # Move first: the CPU call may mutate the sample in place.
    try:
        dev_input = to_device(sample.input, device)
        dev_args = to_device(tuple(sample.args), device)
        dev_kwargs = to_device(dict(sample.kwargs), device)
    except _SkipSample:
        raise
    except Exception as e:  # noqa: BLE001 - the copy to the device is device code too
        return "error", f"moving the sample to {device}: {_short(e)}"

    target = device if _mentions_device((sample.input, sample.args, sample.kwargs)) else "cpu"

    probe = _SeededProbe()
    try:
        with probe:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        cpu_exc = None
    except Exception as e:  # noqa: BLE001 - a CPU error is the reference outcome
        expected, cpu_exc = None, e
    try:
        actual = _materialize(op(dev_input, *dev_args, **dev_kwargs))
        dev_exc = None
    except Exception as e:  # noqa: BLE001
        actual, dev_exc = None, e

    if cpu_exc is not None:
        if dev_exc is None:
            return "fail", f"CPU raised {_short(cpu_exc, 300)}; device did not raise"
        if not isinstance(dev_exc, type(cpu_exc)):
            return "fail", (
                f"CPU raised {type(cpu_exc).__name__}, device raised {_short(dev_exc)} (CPU: {_short(cpu_exc, 200)})"
            )
        return "pass", None
    if dev_exc is not None:
        return "error", _short(dev_exc)
    try:
        _compare(expected, actual, target, tol)
        _compare(
            _tensor_leaves((sample.input, sample.args, sample.kwargs)),
            _tensor_leaves((dev_input, dev_args, dev_kwargs)),
            target,
            tol,
            "inputs after call",
        )
    except AssertionError as e:
        if probe.seeded:
            # CPU and the device draw from different generators: a mismatch says nothing.
            raise _SkipSample(
                "draws random numbers (" + ", ".join(sorted(probe.seeded)) + ") and outputs differ"
            ) from None
        return "fail", str(e)[:1500]
    except Exception as e:  # noqa: BLE001 - e.g. the read-back itself raised
        return "error", "reading results: " + _short(e)
    return "pass", None


def _leafify(obj: Any, leaves: list) -> Any:
    """A copy of ``obj`` whose floating-point tensors are fresh leaves that require grad
    (collected in ``leaves``, in order); other values are returned as is."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            leaf = obj.detach().clone().requires_grad_(True)
            leaves.append(leaf)
            return leaf
        return obj
    if isinstance(obj, list):
        return [_leafify(x, leaves) for x in obj]
    if isinstance(obj, tuple):
        moved = [_leafify(x, leaves) for x in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    if isinstance(obj, dict):
        return {k: _leafify(v, leaves) for k, v in obj.items()}
    return obj


def _grads(op, sample_args: tuple, device: str) -> Optional[list]:
    """Gradients of sum(out * w) over every differentiable output (w: a fixed ramp, so a
    wrong gradient layout shows), with respect to every floating-point input; None where
    an input gets no gradient. Runs on the device the arguments are on."""
    leaves: list = []
    inp, args, kwargs = _leafify(sample_args, leaves)
    outs = [t for t in _tensor_leaves(op(inp, *args, **kwargs)) if t.requires_grad]
    if not outs or not leaves:
        return None
    weights = [
        torch.linspace(-1, 1, t.numel(), dtype=torch.float32).reshape(t.shape).to(t.dtype).to(t.device) for t in outs
    ]
    grads = torch.autograd.grad(outs, leaves, grad_outputs=weights, allow_unused=True)
    return [None if g is None else g for g in grads]


def run_sample_grad(op, sample, device: str, tol: tuple) -> tuple:
    """Compares the gradients of one sample (see :func:`_grads`) on CPU and on ``device``.

    Returns (kind, message) like :func:`run_sample`. Raises _SkipSample when CPU's
    backward raises (not differentiable for this sample) or nothing is differentiable.
    """
    cpu_args = (sample.input, tuple(sample.args), dict(sample.kwargs))
    try:
        expected = _grads(op, cpu_args, "cpu")
    except Exception as e:  # noqa: BLE001 - CPU cannot differentiate this sample
        raise _SkipSample("CPU backward raised " + type(e).__name__) from None
    if expected is None:
        raise _SkipSample("no differentiable output")
    try:
        grads = _grads(op, to_device(cpu_args, device), device)
        if grads is None:
            return "error", f"backward: no differentiable output on {device}"
        actual = [None if g is None else g.to("cpu") for g in grads]
    except Exception as e:  # noqa: BLE001
        return "error", "backward: " + _short(e)
    exp = [g for g in expected if g is not None]
    act = [g for g in actual if g is not None]
    if len(exp) != len(act):
        return "fail", f"backward: {len(act)} inputs got gradients on {device}, {len(exp)} on CPU"
    try:
        _compare(exp, act, "cpu", tol, "grad")
    except AssertionError as e:
        return "fail", "backward: " + str(e)[:1500]
    return "pass", None


def sweep_op(
    op,
    dtype: torch.dtype,
    device: str = "tpu",
    *,
    noncontiguous: bool = False,
    max_numel: int = 1_000_000,
    max_samples: Optional[int] = None,
    stop_at_first_failure: bool = False,
    keep_failures: int = 5,
    grads: bool = False,
) -> OpResult:
    """Runs every sample of ``op`` for ``dtype`` on CPU and on ``device`` and compares.

    ``noncontiguous=True`` transforms each sample with ``sample.noncontiguous()`` first.
    With ``grads`` (for differentiable OpInfos and floating dtypes), every sample whose
    forward passed also compares input gradients with CPU's (:func:`run_sample_grad`).
    Samples with more than ``max_numel`` tensor elements in total are skipped (a time
    guard on this simulated device); ``max_samples`` caps the samples run (the first
    ones); ``stop_at_first_failure`` ends the sweep at the first failing sample. Sample
    generation is seeded, so a sweep is deterministic.
    """
    res = OpResult(op_key(op), str(dtype).replace("torch.", ""), noncontiguous)
    start = time.perf_counter()
    reason = skip_reason(op)
    if reason is None and dtype not in op.supported_dtypes("cpu"):
        reason = f"{res.dtype} not supported by the OpInfo on CPU"
    if reason is not None:
        res.skip_reason = reason
        return res
    tol = _tolerance(op, dtype)
    try:
        samples = sample_inputs(op, dtype)
        for idx, sample in enumerate(samples):
            if max_samples is not None and res.total >= max_samples:
                break
            if noncontiguous:
                sample = sample.noncontiguous()
            if _numel((sample.input, sample.args, sample.kwargs)) > max_numel:
                res.skip(f"more than {max_numel} elements")
                continue
            try:
                kind, msg = run_sample(op, sample, device, tol)
            except _SkipSample as e:
                res.skip(str(e))
                continue
            if kind == "pass" and grads and op.supports_autograd and dtype.is_floating_point:
                try:
                    kind, msg = run_sample_grad(op, sample, device, tol)
                except _SkipSample:
                    kind = "pass"
            if kind == "pass":
                res.passed += 1
                continue
            if kind == "fail":
                res.failed += 1
            else:
                res.errors += 1
            if len(res.failures) < keep_failures:
                res.failures.append((idx, kind, msg, _describe(sample)))
            if stop_at_first_failure:
                break
    except Exception as e:  # noqa: BLE001 - sample generation failed midway
        if res.total == 0:
            res.skip_reason = f"sample_inputs raised {_short(e, 200)}"
        else:
            res.skip(f"the remaining samples: sample_inputs raised {_short(e, 200)}")
    res.seconds = time.perf_counter() - start
    return res


def sweep(
    ops: Optional[Iterable] = None,
    dtypes: Iterable[torch.dtype] = (torch.float32,),
    device: str = "tpu",
    *,
    covered_only: bool = True,
    noncontiguous: bool = False,
    **kwargs,
) -> list:
    """Sweeps OpInfos (default: all of op_db) for each dtype; returns OpResults.

    With ``covered_only`` OpInfos that reach no registered overload are left out.
    Extra keyword arguments go to :func:`sweep_op`.
    """
    results = []
    for op in load_op_db() if ops is None else ops:
        if covered_only and not coverage(op).covered:
            continue
        for dtype in dtypes:
            results.append(sweep_op(op, dtype, device, noncontiguous=noncontiguous, **kwargs))
    return results


def _case_name(res: OpResult) -> str:
    return res.dtype + ("-noncontig" if res.noncontiguous else "")


def main(argv: Optional[list] = None) -> int:
    """Command line: sweep covered OpInfos and print pass rates and failing cases.

    ``python -m torch_tpu_eager.testing.opinfo_sweep [--dtypes float32,int64]
    [--noncontig] [--only NAME ...] [--exclude NAME ...] [--all] [--json FILE]``. Exits 1 when a
    sample failed. The output lists failing cases in the ``(name, case)`` form of
    tests/api/test_ops.py's KNOWN_FAILURES, each with its first failure.
    """
    import argparse
    import json
    import warnings

    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtype names")
    parser.add_argument("--noncontig", action="store_true", help="non-contiguous samples")
    parser.add_argument("--only", nargs="*", default=None, help="OpInfo names to sweep")
    parser.add_argument("--exclude", nargs="*", default=(), help="OpInfo names to leave out")
    parser.add_argument("--all", action="store_true", help="also sweep OpInfos that reach no registered overload")
    parser.add_argument("--json", default=None, help="write every OpResult to this file")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # tiny samples: a second intra-op thread only spins

    dtypes = [getattr(torch, d.strip()) for d in args.dtypes.split(",") if d.strip()]
    ops = [
        op for op in load_op_db() if (args.only is None or op_key(op) in args.only) and op_key(op) not in args.exclude
    ]
    results = sweep(ops, dtypes, covered_only=not args.all, noncontiguous=args.noncontig)
    for dtype in dtypes:
        rs = [r for r in results if r.dtype == str(dtype).replace("torch.", "") and not r.skip_reason]
        p, f, e = (sum(getattr(r, k) for r in rs) for k in ("passed", "failed", "errors"))
        n = p + f + e
        print(
            f"{dtype}: {len(rs)} OpInfos, {n} samples: {p} passed, {f} failed, {e} errors"
            f" ({100.0 * p / max(n, 1):.2f}% pass), {sum(r.skipped for r in rs)} skipped"
        )
    bad = [r for r in results if not r.ok]
    for r in bad:
        print(f"({r.op_name!r}, {_case_name(r)!r}): {r.failed} failed, {r.errors} errors of {r.total}")
        print("    " + r.first_failure.replace("\n", "\n    ")[:1200])
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1, default=str)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
