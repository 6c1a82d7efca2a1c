"""Host memory reuse behind device storages and flush temporaries (device/block_cache.h).

Freed device blocks of 64 KiB or more, and the flush's host temporaries
(executors/host_runtime.h, scratch_storage), go back to the block cache instead of the
C library, which trimmed the top of its heap and grew it again every training step: the
CNN step of benchmarks/run_all.py took ~450 page faults a step where CPU eager took ~1.
Values are compared with CPU; reuse is shown by data pointers, the cache's counters and
the page-fault counter of a process running the benchmark's CNN step, never by time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_tpu_eager
from difftest import DEVICE, REPO_ROOT, cpu_randn

pytestmark = pytest.mark.skipif(DEVICE != "tpu", reason="the block cache is the tpu device's")

_C = torch_tpu_eager._C


def _chips():
    return range(torch.tpu.device_count())


def test_freed_device_block_of_256_kib_is_reused():
    torch.tpu.synchronize()
    x = torch.empty(64 * 1024, device="tpu")  # 256 KiB: below the old 1 MiB cache threshold
    ptr = x.data_ptr()
    del x
    assert _C._cached_bytes(0) >= 256 * 1024  # counted to its chip while cached
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated() + 256 * 1024
    y = torch.empty(64 * 1024, device="tpu")
    assert y.data_ptr() == ptr
    y.fill_(2.0)
    assert torch.equal(y.cpu(), torch.full((64 * 1024,), 2.0))
    del y
    torch.tpu.empty_cache()
    assert _C._cached_bytes(0) == 0


@pytest.mark.parametrize("numel", [1024, 2048, 8192, 16368])  # 4, 8, 32 KiB, 64 KiB - 64 B
def test_small_blocks_are_cached_and_reused(numel):
    # Every recorded op's fresh result takes a block; the C library's 64-byte-aligned
    # allocation and free cost ~800-1,900 instructions, a tenth of the record path.
    # Blocks between 4 and 64 KiB (a small model's activations) are cached too.
    torch.tpu.empty_cache()
    x = torch.empty(numel, device="tpu")
    address = x.data_ptr()
    del x
    assert _C._cached_bytes(-1) >= 4 * numel
    y = torch.empty(numel, device="tpu")
    assert y.data_ptr() == address  # the freed block, from the cache
    del y
    torch.tpu.empty_cache()
    assert _C._cached_bytes(-1) == 0


def test_flush_temporaries_are_cached_and_counted_to_no_chip():
    a, b = cpu_randn(256, 256, seed=1), cpu_randn(256, 256, seed=2)

    def prog(x, y):
        # mm's result (256 KiB) is a temporary of the flush that relu and the sum read
        return (x @ y).relu().sum(0)

    want = prog(a, b)
    ta, tb = a.to("tpu"), b.to("tpu")
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    got = prog(ta, tb).cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    chips = sum(_C._cached_bytes(d) for d in _chips())
    assert _C._cached_bytes(-1) - chips >= 256 * 1024  # the temporary's block, counted to no chip
    free, total = torch.tpu.mem_get_info()
    assert free == total - torch.tpu.memory_reserved()  # host temporaries are no device memory
    torch.testing.assert_close(prog(ta, tb).cpu(), want, rtol=0, atol=0)  # a reused block, same values
    torch.tpu.empty_cache()
    assert _C._cached_bytes(-1) == 0


_FAULTS_CHILD = r"""
import json, resource, sys
import torch
sys.path.insert(0, sys.argv[1])
import run_all  # the benchmark's CNN step (benchmarks/run_all.py, section 7)

torch.set_num_threads(1)
name, make_model, make_opt, clip, make_batches = run_all._training_cases(False)[2]
batches = make_batches()
trainers = {d: run_all.StepTrainer(d, make_model, make_opt, clip, batches) for d in ("tpu", "cpu")}
losses = {d: [t.step().item() for _ in range(3)] for d, t in trainers.items()}  # warm


def faults(t, n=10):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t.steps(n)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n


print(json.dumps({"losses": losses, "tpu": faults(trainers["tpu"]), "cpu": faults(trainers["cpu"])}))
"""


def test_warm_cnn_step_touches_no_fresh_pages_and_matches_cpu():
    # A fresh process, as the benchmark runs: the C library's heap state decides whether
    # freed blocks make it trim (the pytest process's own allocations hid it).
    root = Path(REPO_ROOT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_CHILD, str(root / "benchmarks")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(res["losses"]["tpu"]), torch.tensor(res["losses"]["cpu"]))
    # Before the cache held blocks under 1 MiB and the flush's temporaries: ~450 a step (CPU eager: ~10).
    assert res["tpu"] <= res["cpu"] + 100, res


def _chain(x):
    # 16 ops on one shape: each intermediate dies inside the flush that computes it.
    # The fused loop's vector sin is within float32's default tolerance of CPU's, not bit-equal.
    for k in range(8):
        x = (x * 1.5 + float(k)).sin()
    return x


def test_flush_intermediates_blocks_are_reused_and_memory_stats_stay_exact():
    # A flush's dying intermediates give their blocks back to the cache together with
    # their DeferredStorage's memory (block_free_paired); the next fresh result of that
    # size takes both. Accounting is CUDA's caching allocator's: a cached block counts
    # as reserved, not allocated; empty_cache releases it.
    a = cpu_randn(4, 4, seed=3)
    want = _chain(a)
    t = a.to("tpu")
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    for _ in range(3):
        got = _chain(t)
        torch.tpu.synchronize()
        # Allocated: the input and the live result alone (64 bytes each); 15 intermediates died.
        assert torch.tpu.memory_allocated() == base + got.nbytes
        torch.testing.assert_close(got.cpu(), want)
        del got
        assert torch.tpu.memory_allocated() == base
    assert _C._cached_bytes(0) >= 15 * 64  # the intermediates' blocks, cached to chip 0
    assert torch.tpu.memory_reserved() == (
        torch.tpu.memory_allocated() + _C._cached_bytes(0) + _C._live_padding_bytes(0)
    )
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    # Fresh results of that size take the cached blocks back (addresses reused).
    cached = _C._cached_bytes(0)
    fresh = [torch.empty(4, 4, device="tpu") for _ in range(4)]
    assert _C._cached_bytes(0) == cached - 4 * 64
    assert torch.tpu.memory_allocated() == base + 4 * 64
    for f in fresh:
        f.fill_(2.0)
    assert all(torch.equal(f.cpu(), torch.full((4, 4), 2.0)) for f in fresh)
    del fresh
    torch.tpu.empty_cache()
    assert _C._cached_bytes(-1) == 0
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated() + _C._live_padding_bytes(0)
    torch.testing.assert_close(_chain(t).cpu(), want)  # after the release: fresh blocks


def test_storage_lifetime_is_unchanged_by_block_reuse():
    # A tensor the queue held dies at the flush as before; its storage's memory is reused
    # only after that, and a live tensor's storage never is.
    import weakref

    t = cpu_randn(4, 4, seed=4).to("tpu")
    y = t * 2.0
    ref = weakref.ref(y)
    z = y + 1.0  # the queue's node holds y's storage
    del y
    assert ref() is None  # the Python tensor dies at once, as on CPU
    keep = [z * float(k) for k in range(4)]
    torch.tpu.synchronize()
    addresses = {k.data_ptr() for k in keep} | {z.data_ptr(), t.data_ptr()}
    fresh = [torch.empty(4, 4, device="tpu") for _ in range(8)]
    assert not addresses & {f.data_ptr() for f in fresh}  # live storages are never handed out
    want = cpu_randn(4, 4, seed=4) * 2.0 + 1.0
    torch.testing.assert_close(z.cpu(), want, rtol=0, atol=0)
    for k, v in enumerate(keep):
        torch.testing.assert_close(v.cpu(), want * float(k), rtol=0, atol=0)
