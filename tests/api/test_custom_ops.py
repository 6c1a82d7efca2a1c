"""torch.library custom ops on "tpu": recorded at the call (fake impl), run at
flush by the author's "tpu" kernel on host tensors (torch_tpu_eager.custom_ops).
Every result is compared with the same op run on CPU."""

import itertools

import pytest
import torch

import torch_tpu_eager

_ids = itertools.count()


def _ns():
    return f"tpu_test_{next(_ids)}"


@pytest.fixture
def lib():
    """A fresh namespace per test; its registrations go with it."""
    ns = _ns()
    holder = torch.library.Library(ns, "FRAGMENT")
    yield ns, holder
    holder._destroy()


def _scaled_add(ns, lib):
    """mylib::scaled_add(x, y, alpha) = x + alpha * y, with a tpu and a cpu kernel and autograd."""

    @torch.library.custom_op(f"{ns}::scaled_add", mutates_args=(), device_types="cpu")
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return x + alpha * y

    calls = []

    @scaled_add.register_kernel("tpu")
    def _(x, y, alpha):
        calls.append((x.device.type, y.device.type))
        return x + alpha * y

    @scaled_add.register_fake
    def _(x, y, alpha):
        torch._check(x.shape == y.shape, lambda: f"scaled_add: shapes {tuple(x.shape)} and {tuple(y.shape)} differ")
        if x.dtype != y.dtype:
            raise TypeError(f"scaled_add: dtypes {x.dtype} and {y.dtype} differ")
        return torch.empty_like(x)

    def backward(ctx, grad):
        return grad, grad * ctx.alpha, None

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[2]

    scaled_add.register_autograd(backward, setup_context=setup_context)
    return scaled_add, calls


def test_recorded_and_run_at_flush_on_host_tensors(lib):
    ns, _ = lib
    op, calls = _scaled_add(ns, lib)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch_tpu_eager.synchronize()
    torch_tpu_eager.reset_metrics()
    r = op(x.to("tpu"), y.to("tpu"), 0.5)
    assert r.device.type == "tpu" and r.shape == (4, 5) and r.dtype == torch.float32
    assert calls == []  # recorded, not run
    assert torch_tpu_eager.metrics()["ops_recorded"] >= 1
    out = (r * 2).cpu()
    assert calls == [("cpu", "cpu")]  # the kernel ran once, at flush, on host tensors
    torch.testing.assert_close(out, op(x, y, 0.5) * 2, rtol=0, atol=0)
    assert f"custom_op.{ns}::scaled_add: 1" in torch_tpu_eager.metrics_report()


def test_profiler_names_the_op(lib):
    ns, _ = lib
    op, _ = _scaled_add(ns, lib)
    x = torch.randn(8, 128, device="tpu")
    with torch_tpu_eager.profile() as prof:
        op(x, x, 2.0).sum().item()
    names = [k["name"] for k in prof.kernels]
    assert f"{ns}::scaled_add" in names
    k = prof.kernels[names.index(f"{ns}::scaled_add")]
    assert k["ops"] == [f"{ns}::scaled_add"] and k["sim_time_s"] > 0 and k["bytes_read"] > 0


def test_autograd_through_custom_op(lib):
    ns, _ = lib
    op, _ = _scaled_add(ns, lib)
    xc = torch.randn(3, 4, requires_grad=True)
    yc = torch.randn(3, 4, requires_grad=True)
    xt = xc.detach().to("tpu").requires_grad_()
    yt = yc.detach().to("tpu").requires_grad_()
    (op(xc, yc, 3.0) ** 2).sum().backward()
    (op(xt, yt, 3.0) ** 2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    torch.testing.assert_close(yt.grad.cpu(), yc.grad)


def test_bad_input_raises_at_the_call_from_the_fake_impl(lib):
    ns, _ = lib
    op, calls = _scaled_add(ns, lib)
    x = torch.randn(3, 4, device="tpu")
    with pytest.raises(RuntimeError, match="shapes"):
        op(x, torch.randn(4, 3, device="tpu"), 1.0)
    with pytest.raises(TypeError, match="dtypes"):
        op(x, torch.randn(3, 4, device="tpu", dtype=torch.float64), 1.0)
    assert calls == []
    # The queue and other tensors stay valid.
    torch.testing.assert_close(op(x, x, 1.0).cpu(), 2 * x.cpu())


def test_mutating_op_visible_to_later_reads_and_views(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::add_rows_", mutates_args=("out",))
    def add_rows_(out: torch.Tensor, src: torch.Tensor) -> None:
        out.add_(src.sum(0, keepdim=True))

    @add_rows_.register_fake
    def _(out, src):
        return None

    base_c = torch.arange(24.0).reshape(6, 4)
    base_t = base_c.to("tpu")
    src_c = torch.randn(3, 4)
    src_t = src_c.to("tpu")
    view_c, view_t = base_c[1:4], base_t[1:4]  # a view of the mutated storage
    other_view_t = base_t.t()
    add_rows_(view_c, src_c)
    add_rows_(view_t, src_t)
    assert view_t._version == view_c._version
    torch.testing.assert_close(base_t.cpu(), base_c)
    torch.testing.assert_close(other_view_t.cpu(), base_c.t())
    torch.testing.assert_close((view_t * 1).cpu(), view_c)


def test_several_results_and_tensor_lists(lib):
    ns, holder = lib
    holder.define("split_stats(Tensor x, int n) -> (Tensor, Tensor, Tensor[])")

    def kernel(x, n):
        return x.mean(-1), x.amax(-1), list(x.chunk(n, -1))

    def fake(x, n):
        parts = [x.new_empty(*x.shape[:-1], c.shape[-1]) for c in torch.empty(x.shape[-1], device="meta").chunk(n)]
        return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1]), parts

    holder.impl("split_stats", kernel, "CPU")
    holder.impl("split_stats", kernel, "PrivateUse1")
    torch.library.register_fake(f"{ns}::split_stats", fake, lib=holder)
    op = getattr(getattr(torch.ops, ns), "split_stats")
    x = torch.randn(5, 9)
    want = op(x, 3)
    got = op(x.to("tpu"), 3)
    assert [t.device.type for t in got[2]] == ["tpu"] * 3
    torch.testing.assert_close(got[0].cpu(), want[0])
    torch.testing.assert_close(got[1].cpu(), want[1])
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g.cpu(), w)


def test_view_result_aliases_the_argument(lib):
    ns, holder = lib
    holder.define("first_half(Tensor(a) x) -> Tensor(a)")
    holder.impl("first_half", lambda x: x[: x.shape[0] // 2], "PrivateUse1")
    holder.impl("first_half", lambda x: x[: x.shape[0] // 2], "CPU")
    torch.library.register_fake(f"{ns}::first_half", lambda x: x[: x.shape[0] // 2], lib=holder)
    op = getattr(getattr(torch.ops, ns), "first_half")
    xc = torch.arange(8.0)
    xt = xc.to("tpu")
    vc, vt = op(xc), op(xt)
    assert vt.untyped_storage().data_ptr() == xt.untyped_storage().data_ptr()
    vt.mul_(10)
    vc.mul_(10)
    torch.testing.assert_close(xt.cpu(), xc)


def test_torch_compile_fullgraph(lib):
    ns, _ = lib
    op, _ = _scaled_add(ns, lib)

    def f(x, y):
        return op(x.sin(), y, 0.25).relu() * 2

    x, y = torch.randn(16, 8), torch.randn(16, 8)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x.to("tpu"), y.to("tpu")).cpu(), f(x, y))


def test_no_tpu_kernel_raises_not_implemented_naming_it(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::cpu_only", mutates_args=(), device_types="cpu")
    def cpu_only(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(NotImplementedError, match=f"{ns}::cpu_only"):
        cpu_only(torch.ones(2, device="tpu"))


def test_cpu_fallback_runs_cpu_kernel(lib):
    ns, _ = lib
    code = (
        "import torch, torch_tpu_eager\n"
        f"@torch.library.custom_op('{ns}::cpu_only', mutates_args=(), device_types='cpu')\n"
        "def f(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x * 3\n"
        "r = f(torch.ones(2, device='tpu'))\n"
        "assert r.device.type == 'tpu', r.device\n"
        "assert r.cpu().tolist() == [3.0, 3.0]\n"
    )
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCH_TPU_CPU_FALLBACK="1")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_kernel_using_tpu_tensors_raises_instead_of_reentering(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::bad", mutates_args=())
    def bad(x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("not called on cpu here")

    @bad.register_kernel("tpu")
    def _(x):
        return (x.to("tpu") + 1).cpu()  # a tpu op inside the flush

    bad.register_fake(lambda x: torch.empty_like(x))
    x = torch.ones(3, device="tpu")
    r = bad(x)
    ok = x + 1
    with pytest.raises(RuntimeError, match=f"{ns}::bad"):
        r.cpu()
    torch.testing.assert_close(ok.cpu(), torch.full((3,), 2.0))


def test_kernel_error_surfaces_with_its_type_and_op(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::fails", mutates_args=())
    def fails(x: torch.Tensor) -> torch.Tensor:
        return x

    @fails.register_kernel("tpu")
    def _(x):
        raise ValueError("kernel says no")

    fails.register_fake(lambda x: torch.empty_like(x))
    x = torch.ones(3, device="tpu")
    r = fails(x)
    y = x * 2
    with pytest.raises(ValueError, match="kernel says no"):
        r.cpu()
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))


def test_wrong_result_shape_from_kernel_raises_at_flush(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::liar", mutates_args=())
    def liar(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @liar.register_kernel("tpu")
    def _(x):
        return x[:1].clone()

    liar.register_fake(lambda x: torch.empty_like(x))
    with pytest.raises(RuntimeError, match="fake impl gave"):
        liar(torch.ones(3, device="tpu")).cpu()


def test_data_dependent_fake_runs_at_the_call(lib):
    ns, _ = lib

    @torch.library.custom_op(f"{ns}::positives", mutates_args=())
    def positives(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].clone()

    @positives.register_kernel("tpu")
    def _(x):
        return x[x > 0].clone()

    @positives.register_fake
    def _(x):
        n = torch.library.get_ctx().new_dynamic_size()
        return x.new_empty(n)

    xc = torch.tensor([1.0, -2.0, 3.0, -4.0])
    torch.testing.assert_close(positives(xc.to("tpu") * 2).cpu(), positives(xc * 2))


@pytest.mark.parametrize("target", ["tpu-v5e", "spyre"])
def test_set_cost_changes_simulated_time(lib, target):
    ns, _ = lib
    before = torch_tpu_eager.get_target()
    torch_tpu_eager.set_target(target)
    try:
        _check_set_cost(ns, lib)
    finally:
        torch_tpu_eager.set_target(before)


def _check_set_cost(ns, lib):
    op, _ = _scaled_add(ns, lib)
    x = torch.randn(64, 128, device="tpu")

    def kernel_time():
        with torch_tpu_eager.profile() as prof:
            op(x, x, 1.0).sum().item()
        return next(k for k in prof.kernels if k["name"] == f"{ns}::scaled_add")

    base = kernel_time()
    torch_tpu_eager.custom_ops.set_cost(op, flops=1e12, mxu=True)
    try:
        costly = kernel_time()
    finally:
        torch_tpu_eager.custom_ops.set_cost(op)
    assert costly["flops"] == 1e12 and costly["sim_time_s"] > 100 * base["sim_time_s"]


# ---- "tpu" kernels registered in C++ (TORCH_LIBRARY_IMPL(ns, PrivateUse1, m)) ----------
# A tiny extension, built once with torch.utils.cpp_extension.load into a cached
# directory (a rebuild only when the source changes; listed as slow in tests/tiers.py).
# Its kernels compute on data_ptr() as a device kernel of this device would.
_CPP_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

namespace {
at::Tensor scaled_add(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(), "cppk::scaled_add: bad arguments");
  at::Tensor out = at::empty_like(x);
  const float* a = x.data_ptr<float>();
  const float* b = y.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = a[i] + static_cast<float>(alpha) * b[i];
  return out;
}
void add_into_(const at::Tensor& out, const at::Tensor& src) {
  TORCH_CHECK(out.is_contiguous() && src.is_contiguous() && out.numel() == src.numel(), "cppk::add_into_: bad");
  float* o = out.data_ptr<float>();
  const float* s = src.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] += s[i];
}
at::Tensor twice(const at::Tensor& x) { return scaled_add(x, x, 1.0); }
at::Tensor strict(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.device().is_privateuseone(), "cppk::strict wants tpu tensors, got ", x.device());
  return x.clone();
}
}  // namespace

TORCH_LIBRARY(cppk, m) {
  m.def("scaled_add(Tensor x, Tensor y, float alpha) -> Tensor");
  m.def("add_into_(Tensor(a!) out, Tensor src) -> ()");
  m.def("twice(Tensor x) -> Tensor");
  m.def("strict(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(cppk, PrivateUse1, m) {
  m.impl("scaled_add", &scaled_add);
  m.impl("add_into_", &add_into_);
  m.impl("twice", &twice);
  m.impl("strict", &strict);
}
"""


def _cpp_ext_dir():
    import os
    import tempfile

    d = os.environ.get("TORCH_TPU_TEST_EXT_DIR") or os.path.join(tempfile.gettempdir(), "torch_tpu_eager_test_ext")
    os.makedirs(d, exist_ok=True)
    return d


def _cpp_ext_source():
    import os

    path = os.path.join(_cpp_ext_dir(), "cppk.cpp")
    old = open(path).read() if os.path.exists(path) else None
    if old != _CPP_SOURCE:
        with open(path, "w") as f:
            f.write(_CPP_SOURCE)
    return path


@pytest.fixture(scope="module")
def cppk():
    """Builds (or reuses) and loads the extension; fake impls for two of its ops."""
    from torch.utils import cpp_extension

    cpp_extension.load(
        "tpu_eager_test_cppk",
        [_cpp_ext_source()],
        build_directory=_cpp_ext_dir(),
        is_python_module=False,
        extra_cflags=["-O1"],
        verbose=False,
    )
    holder = torch.library.Library("cppk", "FRAGMENT")
    torch.library.register_fake("cppk::scaled_add", lambda x, y, alpha: torch.empty_like(x), lib=holder)
    torch.library.register_fake("cppk::add_into_", lambda out, src: None, lib=holder)
    torch.library.register_fake("cppk::strict", lambda x: torch.empty_like(x), lib=holder)
    yield torch.ops.cppk
    holder._destroy()


def test_cpp_kernel_is_recorded_and_runs_at_flush(cppk):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    xt, yt = x.to("tpu") * 2, y.to("tpu") + 1  # pending: the kernel must see computed buffers
    with torch_tpu_eager.profile() as prof:  # (entering it flushes)
        torch_tpu_eager.reset_metrics()
        xt, yt = xt * 1, yt * 1
        r = cppk.scaled_add(xt, yt, 0.5)
        assert r.device.type == "tpu" and r.shape == (4, 5) and r.dtype == torch.float32
        assert torch_tpu_eager.metrics()["flushes"] == 0  # recorded, not run
        out = (r * 3).cpu()
    torch.testing.assert_close(out, (x * 2 + 0.5 * (y + 1)) * 3)
    assert "cppk::scaled_add" in [k["name"] for k in prof.kernels]
    assert "custom_op.cppk::scaled_add: 1" in torch_tpu_eager.metrics_report()


def test_cpp_mutating_kernel_seen_by_later_reads(cppk):
    base_c = torch.arange(12.0).reshape(3, 4)
    base_t = base_c.to("tpu") * 1
    src_c = torch.randn(3, 4)
    cppk.add_into_(base_t, src_c.to("tpu") - 1)
    base_c += src_c - 1
    torch.testing.assert_close(base_t.t().cpu(), base_c.t())
    torch.testing.assert_close((base_t + 1).cpu(), base_c + 1)


def test_cpp_kernel_without_fake_runs_at_the_call(cppk):
    x = torch.randn(6)
    torch.testing.assert_close(cppk.twice(x.to("tpu") + 1).cpu(), 2 * (x + 1))


def test_cpp_kernel_error_surfaces_with_its_type_and_op(cppk):
    x = torch.ones(3, device="tpu")
    r = cppk.strict(x)  # it insists on PrivateUse1 arguments; at flush it gets host tensors
    ok = x + 1
    with pytest.raises(ValueError, match=r"(?s)cppk::strict wants tpu tensors.*C\+\+ tpu kernel of cppk::strict"):
        r.cpu()
    torch.testing.assert_close(ok.cpu(), torch.full((3,), 2.0))


def test_cpp_kernel_under_torch_compile(cppk):
    def f(x, y):
        return cppk.scaled_add(x.sin(), y, 0.25).relu() * 2

    x, y = torch.randn(16, 8), torch.randn(16, 8)
    got = torch.compile(f, fullgraph=True)(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.relu(x.sin() + 0.25 * y) * 2)


def test_cpp_kernels_adopted_once(cppk):
    assert torch_tpu_eager.custom_ops.adopt_cpp_kernels("cppk") == 0  # load_library adopted them already
    assert torch_tpu_eager.custom_ops.adopt_cpp_kernels() == 0


def test_cpp_kernel_adopted_at_torch_ops_lookup(cppk):
    """A library loaded without torch.ops.load_library (ctypes): the first
    torch.ops.<ns>.<name> lookup adopts the kernel."""
    import glob
    import os
    import subprocess
    import sys

    (so,) = glob.glob(os.path.join(_cpp_ext_dir(), "tpu_eager_test_cppk*.so"))
    code = (
        "import ctypes, torch, torch_tpu_eager\n"
        f"ctypes.CDLL({so!r}, mode=ctypes.RTLD_GLOBAL)\n"
        "torch.library.register_fake('cppk::scaled_add', lambda x, y, a: torch.empty_like(x))\n"
        "x = torch.arange(4.0, device='tpu') * 2\n"
        "r = torch.ops.cppk.scaled_add(x, x, 1.0)\n"
        "assert torch_tpu_eager.metrics()['flushes'] == 0, 'ran at the call'\n"
        "assert r.cpu().tolist() == [0.0, 4.0, 8.0, 12.0], r.cpu()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def test_torch_ops_lookup_of_torchscript_only_operators():
    # torch.ops.<ns>.<name> adopts C++ "tpu" kernels first; TorchScript's own operators
    # (prim::layout, ...) have a schema but no dispatcher entry, and their lookup must
    # give the packet as without the package (torch.nested's jagged layout looks up
    # torch.ops.prim.layout when it is first used).
    fresh = torch._ops._OpNamespace("prim")  # not the cached torch.ops.prim
    for name in ("layout", "device", "dtype"):
        assert torch._C._jit_get_schemas_for_operator(f"prim::{name}")
        assert getattr(fresh, name).default._schema.name == f"prim::{name}"
