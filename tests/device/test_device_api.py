"""torch.tpu module, eager modes, metrics and fusion counts (device only)."""

import os
import subprocess
import sys

import pytest
import torch

from difftest import DEVICE, requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def test_device_module_basics():
    assert torch.tpu.is_available() and torch.tpu.device_count() >= 1 and torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    with torch.tpu.device(0):
        x = torch.ones(3, device="tpu")
    assert x.device == torch.device("tpu", 0)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):  # as CUDA
        torch.tpu.set_device(torch.tpu.device_count())


def test_memory_allocated_tracks_storages():
    before = torch.tpu.memory_allocated()
    x = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_allocated() - before == 4096
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del x
    assert torch.tpu.memory_allocated() == before


def test_rng_state_round_trip():
    torch.tpu.manual_seed(3)
    state = torch.tpu.get_rng_state()
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.rand(5, device="tpu").cpu()
    assert torch.equal(a, b)


def test_chain_ending_in_reduction_is_at_most_two_regions():
    tte = _tte()
    x = torch.randn(64, 128).to("tpu")
    torch.tpu.synchronize()
    tte.reset_metrics()
    y = ((((x * 2 + 1).sin() - 0.5).exp() / 3).relu() * x).sum()
    value = y.item()
    m = tte.metrics()
    xc = x.cpu()
    expected = ((((xc * 2 + 1).sin() - 0.5).exp() / 3).relu() * xc).sum()
    torch.testing.assert_close(torch.tensor(value), expected)
    assert m["ops_recorded"] == 9 and m["regions_run"] <= 2, m  # 8 elementwise ops + sum


def test_dead_values_are_not_materialized():
    tte = _tte()
    x = torch.randn(256, 256).to("tpu")
    torch.tpu.synchronize()
    tte.reset_metrics()
    y = ((x + 1) * 2 - 3).abs()  # three intermediates die at once
    y.cpu()
    m = tte.metrics()
    assert m["bytes_materialized"] == 256 * 256 * 4, m


def test_cache_hit_on_repeat_with_new_scalar():
    tte = _tte()
    x = torch.randn(32, 32).to("tpu")
    (x * 0.5 + 1).cpu()
    tte.reset_metrics()
    for lr in (0.1, 0.01, 0.001):
        (x * lr + 1).cpu()
    m = tte.metrics()
    assert m["compiles"] == 0 and m["cache_hits"] == 3, m


def test_flush_reasons_are_recorded():
    tte = _tte()
    tte.reset_metrics()
    x = torch.ones(4, device="tpu") + 1
    x.sum().item()
    (x * 2).cpu()
    torch.tpu.synchronize()
    reasons = tte.metrics()["flush_reasons"]
    assert reasons.get("item") == 1 and reasons.get("host_read") == 1, reasons


def test_queue_length_limit_auto_flushes():
    tte = _tte()
    old = tte.queue_limits()
    tte.set_queue_limits(max_ops=100)
    try:
        tte.reset_metrics()
        x = torch.zeros(4, device="tpu")
        for _ in range(1000):
            x = x + 1
        assert torch.tpu.memory_allocated() < 1 << 20
        assert tte.metrics()["flush_reasons"].get("queue_length_limit", 0) >= 9
        assert x.cpu().tolist() == [1000.0] * 4
    finally:
        tte.set_queue_limits(*old)
    with pytest.raises(ValueError):
        tte.set_queue_limits(max_ops=0)


def test_defer_never_mode_flushes_every_op():
    tte = _tte()
    with tte.set_eager_mode(tte.EagerMode.DEFER_NEVER):
        tte.reset_metrics()
        y = torch.ones(3, device="tpu") * 2 + 1
        assert tte.metrics()["flushes"] == 3  # fill_ (ones), mul, add
        assert y.cpu().tolist() == [3.0] * 3
    assert tte.get_eager_mode() == tte.EagerMode.DEFER_AND_FUSE
    with pytest.raises(ValueError):
        tte.set_eager_mode("NOT_A_MODE")


def test_launch_blocking_raises_at_the_op():
    tte = _tte()
    x = torch.arange(4.0).to("tpu")
    with tte.set_eager_mode("DEFER_NEVER_AND_LAUNCH_BLOCKING"):
        with pytest.raises(IndexError):
            torch.index_select(x, 0, torch.tensor([7]).to("tpu"))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_env_var_defer_and_fuse_off():
    code = (
        "import torch, torch_tpu_eager as t; "
        "assert t.get_eager_mode() == t.EagerMode.DEFER_NEVER; "
        "y = torch.ones(2, device='tpu') + 1; assert t.metrics()['flushes'] >= 1; print('ok')"
    )
    env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_missing_kernel_names_the_op_and_fallback_runs_it():
    code = (
        "import torch, torch_tpu_eager, warnings\n"
        "x = torch.randn(4, 4).to('tpu')\n"
        "try:\n"
        "    torch.ops.aten.{op}(x){args}\n"
        "    print('ran')\n"
        "except NotImplementedError as e:\n"
        "    assert '{op}' in str(e); print('not implemented')\n"
    )
    # an op with a CPU kernel that the op table leaves out (compressed sparse layouts are not modelled)
    snippet = code.format(op="_to_sparse_csr", args=".to_dense().sum().item()")
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert "not implemented" in out.stdout, out.stdout + out.stderr


def test_repr_flushes_once_and_matches_cpu_formatting():
    tte = _tte()
    x = torch.arange(6.0).reshape(2, 3)
    d = x.to("tpu") * 1
    tte.reset_metrics()
    text = repr(d)
    assert tte.metrics()["flushes"] == 1 and tte.metrics()["ops_recorded"] == 0
    assert text == repr(x).replace(")", ", device='tpu:0')")


def test_error_at_flush_names_the_op_and_line_and_keeps_other_tensors():
    good = torch.arange(3.0).to("tpu") + 1
    bad = torch.index_select(torch.arange(3.0).to("tpu"), 0, torch.tensor([5]).to("tpu") * 1)
    assert good.cpu().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(IndexError) as info:
        bad.cpu()
    assert "index_select" in str(info.value) and "test_device_api.py" in str(info.value)
    assert (good * 2).cpu().tolist() == [2.0, 4.0, 6.0]


def test_cpu_fallback_runs_missing_op_with_one_warning():
    # _dirichlet_grad has a CPU kernel but no row in the op table
    code = (
        "import torch, torch_tpu_eager\n"
        "x, a, t = torch.rand(5) * 0.8 + 0.1, torch.rand(5) + 0.5, torch.rand(5) + 2.0\n"
        "ref = torch.ops.aten._dirichlet_grad(x, a, t)\n"
        "for _ in range(2):\n"
        "    got = torch.ops.aten._dirichlet_grad(x.to('tpu'), a.to('tpu'), t.to('tpu'))\n"
        "    assert torch.allclose(got.cpu(), ref)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TORCH_TPU_CPU_FALLBACK="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert out.stderr.count("_dirichlet_grad' has no tpu kernel") == 1, out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "NotImplementedError" in out.stderr and "_dirichlet_grad" in out.stderr


def test_torch_compile_runs_tpu_graphs_on_the_device():
    def f(x, y):
        return (x @ y).relu().sum(dim=0) * 0.5

    x, y = torch.randn(8, 5), torch.randn(5, 3)
    expected = f(x, y)
    for backend in ("inductor", "tpu"):
        got = torch.compile(f, backend=backend)(x.to("tpu"), y.to("tpu"))
        torch.testing.assert_close(got.cpu(), expected)
    from torch._dynamo.device_interface import get_interface_for_device

    assert get_interface_for_device("tpu").__module__ == "torch_tpu_eager.dynamo"


def test_autocast_follows_cuda_policies():
    # The device takes CUDA's autocast lists: matmul in the lower precision,
    # log_softmax in float32 (CPU's own lists keep log_softmax in bf16).
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_mm = a @ b
    ref_ls = torch.log_softmax(ref_mm.float(), dim=1)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        mm = a.to("tpu") @ b.to("tpu")
        ls = torch.log_softmax(mm, dim=1)
    assert mm.dtype == torch.bfloat16 and ls.dtype == torch.float32
    torch.testing.assert_close(mm.cpu(), ref_mm)
    torch.testing.assert_close(ls.cpu(), ref_ls)


@pytest.mark.skipif(DEVICE != "tpu", reason="device memory caching is the tpu allocator's")
def test_freed_large_blocks_are_reused_and_released():
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    # Small tensors left alive by earlier tests count their 64 B rounding in
    # memory_reserved; what this test frees must bring it back to this value.
    base_reserved = torch.tpu.memory_reserved()
    a = torch.full((1024, 1024), 3.0, device="tpu")
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base + 4 * 2**20
    del a
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.memory_reserved() >= base + 4 * 2**20  # kept for reuse
    # A reused block holds the old bytes; zeros and values still match CPU.
    z = torch.zeros(1024, 1024, device="tpu")
    assert torch.equal(z.cpu(), torch.zeros(1024, 1024))
    assert torch.tpu.memory_allocated() == base + 4 * 2**20
    del z
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.memory_reserved() == base_reserved


@pytest.mark.skipif(DEVICE != "tpu", reason="device memory caching is the tpu allocator's")
def test_memory_reserved_counts_the_rounding_of_blocks_in_use():
    # Blocks of 4 MiB or more are whole 2 MiB huge pages: a tensor of 4 MiB + 4 B holds
    # 6 MiB. Reserved counts the block while it is in use and once it is cached, alike.
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    base_allocated, base_reserved = torch.tpu.memory_allocated(), torch.tpu.memory_reserved()
    t = torch.ones(2**20 + 1, device="tpu")
    assert t[-1].item() == 1.0
    assert torch.tpu.memory_allocated() == base_allocated + 4 * 2**20 + 4
    in_use = torch.tpu.memory_reserved()
    assert in_use == base_reserved + 6 * 2**20
    del t
    assert torch.tpu.memory_allocated() == base_allocated
    assert torch.tpu.memory_reserved() == in_use
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() == base_reserved
