"""torch.accelerator / torch.tpu memory API against CUDA's documented contract.

The allocator is a c10::DeviceAllocator, so torch.accelerator's memory functions
reach it; numbers are bytes of the chip's simulated HBM.
"""

import gc

import pytest
import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def _tte():
    import torch_tpu_eager

    return torch_tpu_eager


def test_accelerator_basics():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == torch.tpu.current_device()


def test_accelerator_synchronize_runs_pending_ops():
    x = torch.ones(8, device="tpu") * 3
    assert _tte()._C._storage_has_pending(x)
    torch.accelerator.synchronize()
    assert not _tte()._C._storage_has_pending(x)
    torch.accelerator.synchronize(0)
    torch.accelerator.synchronize("tpu:0")
    torch.accelerator.synchronize(torch.device("tpu", 0))


def test_get_device_capability_lists_cpu_dtypes():
    cap = torch.accelerator.get_device_capability()
    assert isinstance(cap, dict)
    dts = cap["supported_dtypes"]
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64):
        assert dt in dts


def test_memory_allocated_agrees_between_apis():
    gc.collect()
    before = torch.accelerator.memory_allocated()
    assert before == torch.tpu.memory_allocated() == torch.tpu.memory_stats()["allocated_bytes.all.current"]
    x = torch.empty(1024, device="tpu")
    assert torch.accelerator.memory_allocated() - before == 4096
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    assert torch.tpu.memory_reserved() == torch.accelerator.memory_reserved()
    del x
    assert torch.accelerator.memory_allocated() == before


def test_peak_and_reset():
    gc.collect()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_allocated() == base
    x = torch.empty(1 << 20, device="tpu")  # 4 MiB
    del x
    assert torch.accelerator.max_memory_allocated() >= base + (4 << 20)
    assert torch.tpu.max_memory_allocated() == torch.accelerator.max_memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()


def test_memory_stats_keys_and_accumulated_counters():
    torch.accelerator.reset_accumulated_memory_stats()
    stats = torch.accelerator.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "allocation.all.current",
        "num_ooms",
    ):
        assert key in stats, key
    assert stats["allocated_bytes.all.allocated"] == 0
    x = torch.empty(256, device="tpu")
    del x
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.allocated"] >= 1024
    assert stats["allocated_bytes.all.freed"] >= 1024
    assert stats["allocation.all.allocated"] >= 1


def test_freed_counters_are_exact_across_a_reset_and_a_flush():
    # The freed bytes and frees follow from the allocated ones and what is live
    # (a free updates only the live counters): exact for a storage allocated
    # before a reset and freed after it, and for a flush's dying intermediates.
    gc.collect()
    kept = torch.empty(100, device="tpu")  # 400 bytes, alive across the reset
    torch.accelerator.reset_accumulated_memory_stats()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.freed"] == stats["allocation.all.freed"] == stats["num_device_free"] == 0
    del kept
    x = torch.empty(4, 4, device="tpu")  # 64 bytes
    y = ((x + 1) * 3 - 2).sin()  # three 64-byte intermediates, dead once the flush ran
    torch.tpu.synchronize()
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.allocated"] == stats["num_device_alloc"] == 5
    assert stats["allocated_bytes.all.allocated"] == 5 * 64
    assert stats["allocation.all.freed"] == stats["num_device_free"] == 1 + 3
    assert stats["allocated_bytes.all.freed"] == stats["reserved_bytes.all.freed"] == 400 + 3 * 64
    del x, y
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.freed"] == 6
    assert stats["allocated_bytes.all.freed"] == 400 + 5 * 64


def test_mem_get_info_is_free_and_total_of_the_simulated_hbm():
    tte = _tte()
    torch.tpu.empty_cache()  # a cached block would be reused without changing what is free
    free, total = torch.tpu.mem_get_info()
    assert (free, total) == torch.accelerator.get_memory_info()
    info = tte.target_info()
    assert total == info["hbm_bytes"]
    assert free == total - torch.tpu.memory_reserved()
    x = torch.empty(1 << 20, device="tpu")
    free2, _ = torch.tpu.mem_get_info()
    assert free2 <= free - (4 << 20)
    del x


def test_mem_get_info_follows_the_target():
    tte = _tte()
    before = tte.get_target()
    try:
        tte.set_target("tpu-v5p")
        assert torch.tpu.mem_get_info()[1] == tte.target_info()["hbm_bytes"]
    finally:
        tte.set_target(before)


def test_empty_cache_releases_cached_blocks():
    x = torch.empty(2 << 20, device="tpu")  # 8 MiB: a cached block once freed
    del x
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    torch.accelerator.empty_cache()
    assert torch.tpu.memory_reserved() - torch.tpu.memory_allocated() < (8 << 20)
    torch.tpu.empty_cache()


@pytest.mark.parametrize(
    "fn",
    [
        torch.tpu.memory_allocated,
        torch.tpu.max_memory_allocated,
        torch.tpu.memory_reserved,
        torch.tpu.memory_stats,
        torch.tpu.mem_get_info,
        torch.tpu.reset_peak_memory_stats,
    ],
)
def test_bad_device_arguments_raise_as_cuda(fn):
    n = torch.tpu.device_count()
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        fn(n)
    with pytest.raises(ValueError, match="Expected a tpu device"):
        fn("cpu")
    with pytest.raises(ValueError):
        fn(1.5)
    assert torch.ones(2, device="tpu").sum().item() == 2  # the device stays usable


def test_accelerator_bad_index_raises():
    n = torch.tpu.device_count()
    with pytest.raises(RuntimeError):
        torch.accelerator.memory_stats(n)
    with pytest.raises(RuntimeError):
        torch.accelerator.synchronize(n)
    with pytest.raises(RuntimeError):
        torch.accelerator.get_memory_info(n)
    assert torch.ones(2, device="tpu").sum().item() == 2


def test_out_of_memory_is_counted():
    tte = _tte()
    before = torch.tpu.memory_stats()["num_ooms"]
    total = torch.tpu.mem_get_info()[1]
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError  # as torch.cuda.OutOfMemoryError
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(total // 4 + 1024, device="tpu")  # float32: more bytes than the HBM
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    assert torch.ones(2, device="tpu").sum().item() == 2
    del tte


def test_memory_summary_prints_memory_stats():
    # torch.cuda.memory_summary's contract: a printable table of memory_stats
    # (current / peak / total allocated / total freed per metric).
    x = torch.ones(4096, device="tpu") + 1
    x.cpu()
    stats = torch.tpu.memory_stats()
    text = torch.tpu.memory_summary()
    assert isinstance(text, str) and "tpu:0" in text
    rows = {line.split("|")[0].strip(): line.split("|")[1:] for line in text.splitlines() if "|" in line}
    counts = [int(v) for v in rows["Allocations"]]
    assert counts == [stats[f"allocation.all.{k}"] for k in ("current", "peak", "allocated", "freed")]
    cur_bytes = rows["Allocated memory"][0].split()
    assert cur_bytes[1] == "B" or stats["allocated_bytes.all.current"] >= 768 * 1024
    if cur_bytes[1] == "B":
        assert int(cur_bytes[0]) == stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert torch.tpu.memory_summary(abbreviated=True) == torch.tpu.memory_summary()
    del x


def test_cuda_names_for_capture_and_arch_list():
    tte = _tte()
    assert torch.tpu.is_current_stream_capturing() is False
    assert torch.tpu.get_arch_list() == tte.list_targets()
    assert tte.get_target() in torch.tpu.get_arch_list()


def test_a_deleted_pending_result_is_freed_at_del_as_cuda():
    # CUDA's caching allocator frees a tensor's block at its last reference (`del`),
    # although the kernel writing it may still be queued; so does the device for a
    # pending result nothing outside the queue holds. What still holds it (a view, a
    # Python storage object, autograd's saved tensors) keeps it counted.
    mib = 1 << 20
    a = torch.ones(mib // 4, device="tpu")
    torch.tpu.synchronize()
    gc.collect()
    base = torch.tpu.memory_allocated()
    b = a * 2
    assert torch.tpu.memory_allocated() == base + mib
    del b
    assert torch.tpu.memory_allocated() == base
    c = a + 1
    d = c * 3
    del c
    assert torch.tpu.memory_allocated() == base + mib
    half = (a * 5)[::2]  # the view holds its whole storage
    storage = (a * 7).untyped_storage()  # so does a Python storage object
    assert torch.tpu.memory_allocated() == base + 3 * mib
    w = torch.ones(mib // 4, device="tpu", requires_grad=True)
    z = (w * 3).sin()  # sin saves its input for backward
    assert torch.tpu.memory_allocated() == base + 6 * mib
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    del half, storage
    assert torch.tpu.memory_allocated() == base + 4 * mib
    z.sum().backward()
    assert torch.allclose(w.grad.cpu(), 3 * torch.cos(torch.full((mib // 4,), 3.0)))
    assert d.cpu().eq(6).all()
    del z, d, w
    gc.collect()
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.memory_stats()["allocated_bytes.all.current"] == base
