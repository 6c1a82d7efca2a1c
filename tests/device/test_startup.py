"""Start-up: an eager program on "tpu" imports no more of torch than CPU needs.

PyTorch's Python meta kernels (which the record kernel runs for shape inference and
CPU never does) are wrapped in ``torch._disable_dynamo``, whose first call imports
``torch._dynamo`` (~0.8 s). torch_tpu_eager.meta_hints.defer_dynamo_import keeps that
import for programs that use Dynamo. The ratio to CPU is in benchmarks/cold_start.py.
"""

import subprocess
import sys

import pytest
import torch

import torch_tpu_eager  # noqa: F401  (registers the "tpu" device for the in-process tests)
from torch_tpu_eager import meta_hints


def _run(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_first_ops_import_neither_dynamo_nor_inductor():
    out = _run(
        "import sys, torch, torch_tpu_eager\n"
        "x = torch.randn(4, 8, device='tpu')\n"
        "y = (torch.ones(3, device='tpu') + 1).cpu()\n"
        "z = (x.sin() * 2).softmax(-1).sum(0).cpu()\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))\n"
    )
    assert out == "[]"


def test_structured_ops_import_no_sympy():
    # Ops whose CPU kernel is structured (OpTrait kCppMetaIsCpu) infer their result with
    # ATen's C++ meta function; the Python reference meta kernels would import sympy
    # (0.37 s) and torch.fx's symbolic shapes on their first call.
    out = _run(
        "import sys, torch, torch_tpu_eager\n"
        "x = torch.ones(4, 8, device='tpu')\n"
        "y = (torch.ones(3, device='tpu') + 1).cpu()\n"
        "z = (x.sin() * 2).softmax(-1).sum(0)\n"
        "w = torch.zeros(8, 5, device='tpu').fill_(0.5)\n"
        "o = torch.empty(0, device='tpu')\n"
        "torch.mul(x @ w, w.sum(), out=o); x.add_(1); x.mul_(z)\n"
        "print(o.cpu().sum().item(), x.cpu().sum().item())\n"
        "print(sorted(m for m in ('sympy', 'torch.fx.experimental.symbolic_shapes') if m in sys.modules))\n"
    )
    assert out.splitlines()[-1] == "[]", out


def _layouts(shape):
    t = torch.randn(*shape)
    yield t
    yield t.transpose(0, 1)
    if len(shape) == 4:
        yield t.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("add", lambda a: a + a.sum(0, keepdim=True)),
        ("mul_int", lambda a: a * 2),
        ("div_int_tensor", lambda a: (a * 10).to(torch.int32) / 3),
        ("sin", torch.sin),
        ("where", lambda a: torch.where(a > 0, a, 0.0)),
        ("softmax", lambda a: a.softmax(-1)),
        ("log_softmax", lambda a: a.log_softmax(1)),
        ("sum", lambda a: a.sum(1)),
        ("amax", lambda a: a.amax(-1, keepdim=True)),
        ("pow_bool", lambda a: (a > 0) ** True),
        ("cat", lambda a: torch.cat([a, a], 1)),
        ("replication_pad2d", lambda a: torch.nn.functional.pad(a, (1, 2, 1, 0), mode="replicate")),
        ("upsample_nearest", lambda a: torch.nn.functional.interpolate(a, scale_factor=2)),
        ("max_pool2d", lambda a: torch.nn.functional.max_pool2d(a, 2)),
        ("avg_pool2d", lambda a: torch.nn.functional.avg_pool2d(a, 2)),
    ],
)
def test_cpp_meta_geometry_equals_cpu(name, fn):
    # The C++ meta function's result geometry is CPU's: sizes, strides and dtypes for
    # contiguous, transposed and channels_last inputs.
    for t in _layouts((2, 3, 4, 6)):
        want = fn(t)
        got = fn(t.to("tpu"))
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), name
        torch.testing.assert_close(got.cpu(), want)


def test_meta_kernels_still_disable_dynamo_once_it_is_imported():
    # After Dynamo is imported, the wrapped meta kernels get the real
    # torch._dynamo.disable(fn): torch.compile over "tpu" tensors still works and
    # agrees with eager CPU.
    out = _run(
        "import torch, torch_tpu_eager\n"
        "x = torch.randn(4, 8, device='tpu')\n"
        "(x + 1).cpu()\n"
        "f = torch.compile(lambda a: (a * 2).sin() + a)\n"
        "c = x.cpu()\n"
        "print(torch.allclose(f(x).cpu(), (c * 2).sin() + c))\n"
    )
    assert out == "True"


def test_torch_disable_dynamo_wrapper_has_the_shape_we_adjust():
    # defer_dynamo_import relies on torch 2.13's _disable_dynamo: a closure over
    # ``fn`` that caches ``fn.__dynamo_disable``. A torch that changes it fails here.
    wrapper = torch._disable_dynamo(lambda: None)
    assert "fn" in wrapper.__code__.co_freevars
    assert "__dynamo_disable" in wrapper.__code__.co_names
    assert meta_hints.defer_dynamo_import() == 0  # everything reachable was adjusted at import


@pytest.mark.parametrize("dynamo_imported", [False, True])
def test_lazily_disabled_calls_through(dynamo_imported, monkeypatch):
    calls = []

    def fn(a, b=1):
        calls.append((a, b))
        return a + b

    if not dynamo_imported:
        monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    else:
        import torch._dynamo  # noqa: F401
    wrapped = meta_hints._lazily_disabled(fn)
    assert wrapped(2, b=3) == 5 and calls == [(2, 3)]
    assert hasattr(fn, "__dynamo_disable") == dynamo_imported
