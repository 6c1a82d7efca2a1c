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


def test_set_cost_changes_simulated_time(lib):
    ns, _ = lib
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
