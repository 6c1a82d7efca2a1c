"""torch.tpu.Precision / torch.tpu.precision: scoped float32 matmul precision."""

import pytest
import torch

from difftest import requires_tpu
from threaded import run_threads

pytestmark = requires_tpu


def _bf16_matmul(a, b):
    return a.bfloat16().float() @ b.bfloat16().float()


def test_scope_sets_nests_and_restores():
    before = torch.get_float32_matmul_precision()
    assert torch.tpu.get_precision().value == before  # no scope: PyTorch's setting
    with torch.tpu.precision(torch.tpu.Precision.MEDIUM) as p:
        assert p is torch.tpu.Precision.MEDIUM
        assert torch.tpu.get_precision() is torch.tpu.Precision.MEDIUM
        with torch.tpu.precision("highest"):
            assert torch.tpu.get_precision() is torch.tpu.Precision.HIGHEST
        assert torch.tpu.get_precision() is torch.tpu.Precision.MEDIUM
        # The scope is this thread's: PyTorch's process-wide setting is untouched.
        assert torch.get_float32_matmul_precision() == before
    assert torch.tpu.get_precision().value == before


def test_restores_on_exception():
    before = torch.get_float32_matmul_precision()
    with pytest.raises(KeyError):
        with torch.tpu.precision("high"):
            with torch.tpu.precision("medium"):
                raise KeyError("x")
    assert torch.tpu.get_precision().value == before
    assert torch.get_float32_matmul_precision() == before


def test_same_scope_object_reentered():
    scope = torch.tpu.precision("medium")
    with scope:
        with scope:
            assert torch.tpu.get_precision() is torch.tpu.Precision.MEDIUM
        assert torch.tpu.get_precision() is torch.tpu.Precision.MEDIUM
    assert torch.tpu.get_precision().value == torch.get_float32_matmul_precision()


def test_ops_recorded_inside_run_at_the_scope_precision():
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ta, tb = a.to("tpu"), b.to("tpu")
    with torch.tpu.precision("medium"):
        y_medium = ta @ tb
    y_highest = ta @ tb  # recorded outside: "highest" (the default)
    torch.testing.assert_close(y_medium.cpu(), _bf16_matmul(a, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y_highest.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_decorator_and_bad_values():
    @torch.tpu.precision("high")
    def f():
        return torch.tpu.get_precision().value

    assert f() == "high"
    with pytest.raises(ValueError, match="unknown precision"):
        torch.tpu.precision("fp8")
    with pytest.raises(ValueError):
        torch.tpu.precision(3)


def test_outside_a_scope_the_precision_is_pytorchs_at_the_call():
    # CPU reads torch.get_float32_matmul_precision() when the matmul is called;
    # a deferred matmul keeps the one of its call, not the one of its flush.
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ta, tb = a.to("tpu"), b.to("tpu")
    torch.tpu.synchronize()
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        y_medium = ta @ tb
        assert torch.tpu.get_precision() is torch.tpu.Precision.MEDIUM
        torch.set_float32_matmul_precision("highest")
        y_highest = ta @ tb
    finally:
        torch.set_float32_matmul_precision(before)
    torch.testing.assert_close(y_medium.cpu(), _bf16_matmul(a, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y_highest.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def _run_threads(*fns):
    run_threads(lambda fn: fn(), [(fn,) for fn in fns], timeout=60)


def test_scope_is_per_thread():
    import threading

    torch.manual_seed(1)
    a, b = torch.randn(48, 48), torch.randn(48, 48)
    ta, tb = a.to("tpu"), b.to("tpu")
    torch.tpu.synchronize()
    inside, entered, recorded = {}, threading.Event(), threading.Event()

    def scoped():
        with torch.tpu.precision("medium"):
            entered.set()
            assert recorded.wait(30)
            inside["get"] = torch.tpu.get_precision()
            inside["y"] = ta @ tb  # recorded inside this thread's scope

    def unscoped():
        assert entered.wait(30)
        # The other thread is inside its scope right now: not ours.
        inside["other_get"] = torch.tpu.get_precision()
        inside["z"] = ta @ tb
        recorded.set()

    _run_threads(scoped, unscoped)
    assert inside["get"] is torch.tpu.Precision.MEDIUM
    assert inside["other_get"].value == torch.get_float32_matmul_precision()
    torch.testing.assert_close(inside["y"].cpu(), _bf16_matmul(a, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(inside["z"].cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_threads_with_different_scopes_interleaved():
    import threading

    torch.manual_seed(2)
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    ta, tb = a.to("tpu"), b.to("tpu")
    torch.tpu.synchronize()
    results = {"medium": [], "highest": []}
    barrier = threading.Barrier(2)

    def worker(p):
        with torch.tpu.precision(p):
            for _ in range(5):
                barrier.wait(30)  # both threads record between the same barriers
                results[p].append(ta @ tb)
                assert torch.tpu.get_precision().value == p

    _run_threads(lambda: worker("medium"), lambda: worker("highest"))
    for y in results["medium"]:
        torch.testing.assert_close(y.cpu(), _bf16_matmul(a, b), rtol=1e-5, atol=1e-4)
    for y in results["highest"]:
        torch.testing.assert_close(y.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_new_thread_starts_without_the_scope_of_its_creator():
    seen = []
    with torch.tpu.precision("medium"):
        _run_threads(lambda: seen.append(torch.tpu.get_precision()))
    assert seen[0].value == torch.get_float32_matmul_precision()


def test_switching_precision_flushes_with_its_reason():
    import torch_tpu_eager

    x = torch.randn(16, 16, device="tpu")
    torch.tpu.synchronize()
    torch_tpu_eager.reset_metrics()
    y = x @ x
    with torch.tpu.precision("medium"):
        z = x @ x
    m = torch_tpu_eager.metrics()
    assert m["flush_reasons"].get("precision_switch") == 1
    y.cpu(), z.cpu()
