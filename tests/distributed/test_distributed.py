"""torch.distributed on "tpu": the c10d backend "tpu_ccl" (docs/distributed.md).

Multi-process checks run tests/distributed/dist_worker.py (2 processes on localhost, spawned,
each case under a timeout); every value is compared with gloo on CPU tensors or a
single-process CPU run inside the ranks. In-process checks come first.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = REPO_ROOT


def _run_case(case, world=2, timeout=280, chips=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    if chips is not None:
        env["TORCH_TPU_NUM_DEVICES"] = str(chips)
    # the worker kills its ranks at this deadline, before the timeout below kills only the worker
    env["TPU_DIST_DEADLINE"] = str(timeout - 30)
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "dist_worker.py"), case, str(world)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"{case} failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    return r.stdout


def test_backend_is_registered_for_tpu():
    import torch_tpu_eager.distributed as tdist

    assert tdist.BACKEND_NAME == "tpu_ccl"
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_ccl"
    assert dist.Backend("tpu_ccl") == "tpu_ccl"
    assert dist.Backend.backend_capability["tpu_ccl"] == ["tpu"]
    assert torch.accelerator.current_accelerator().type == "tpu"  # init_process_group() picks tpu_ccl


def test_collective_before_init_process_group_raises_as_on_cpu():
    assert not dist.is_initialized()
    errors = []
    for t in (torch.ones(2), torch.ones(2, device="tpu")):
        with pytest.raises(ValueError) as e:
            dist.all_reduce(t)
        errors.append(str(e.value))
        with pytest.raises(ValueError):
            dist.broadcast(t, src=0)
        with pytest.raises(ValueError):
            dist.barrier()
    assert errors[0] == errors[1] and "Default process group has not been initialized" in errors[0]


def test_charge_collective_counts_every_collective():
    from torch_tpu_eager.distributed import backend

    backend.reset_collective_metrics()
    backend._charge_collective("all_reduce", 4096, 2, torch.device("tpu", 0))
    backend._charge_collective("all_gather", 100, 2, torch.device("tpu", 0))
    m = backend.collective_metrics()
    assert m["collectives"] == 2 and m["collective_bytes"] == 4196
    assert m["per_op"]["all_reduce"] == {"count": 1, "bytes": 4096, "time_s": m["per_op"]["all_reduce"]["time_s"]}
    backend.reset_collective_metrics()
    assert backend.collective_metrics()["collectives"] == 0


def test_every_collective_and_dtype_equals_gloo_bit_for_bit():
    # all_reduce (every ReduceOp gloo has; PREMUL_SUM as NCCL defines it), broadcast, reduce, all_gather(_into_tensor),
    # reduce_scatter(_tensor), all_to_all(_single), gather, scatter, send/recv,
    # isend/irecv, batch_isend_irecv, coalesced, async handles, barrier, object
    # collectives; 9 dtypes; pending and non-contiguous inputs
    assert "collectives OK" in _run_case("collectives")


def test_every_collective_on_three_processes_equals_gloo():
    # 3 ranks: gloo's reduction order over more than two inputs, uneven all_to_all splits
    assert "collectives OK" in _run_case("collectives", world=3)


def test_collectives_overlap_compute_on_the_simulated_timeline():
    # an async all_reduce on the chip's interconnect stream overlaps the compute recorded
    # after it until wait(): serial = comm + compute, overlapped = max(comm, compute) (the
    # ICI model's time and the kernels' measured one), values unchanged; DDP's buckets
    # overlap backward; torch.profiler puts the collective on the interconnect stream's track,
    # and a DDP step's Chrome trace shows a bucket's all_reduce overlapping compute kernels on
    # the simulated clock, the optimizer's kernels after the last one, each of the model's length
    assert "overlap OK" in _run_case("overlap")


def test_default_init_cpu_tensors_bad_input_and_several_chips_per_process():
    # init_process_group() with no backend, tpu:0 and tpu:1 in two processes, object
    # collectives through "tpu" tensors, NCCL's error for a CPU tensor; then mismatched
    # shapes/dtypes across ranks (torch's collective-mismatch error where plain gloo
    # aborts the process), gloo's errors for unsupported ops/dtypes, NCCL's for
    # PREMUL_SUM on integers / a factor tensor of another dtype, the group usable after
    # mismatched all-to-all exchanges (plain gloo aborts or leaves garbage); then several chips in
    # one process: each rank drives 2 of 4 chips, collectives on both equal gloo's
    out = _run_case("api", chips=4)
    assert "api OK" in out and "Detected mismatch between collectives" in out


def test_torch_multiprocessing_spawn_launches_one_process_per_chip():
    # the same program as test_default_init_cpu_tensors_and_bad_input's first half, its two
    # processes started by torch.multiprocessing (spawn), as torchrun starts the example's
    out = _run_case("torch_spawn:default")
    assert "default OK" in out and "exit codes [0, 0]" in out


def test_failing_rank_reaches_the_others_as_an_error():
    # a live rank that skips a collective: gloo's timeout error at the group's timeout (3 s);
    # a rank that raises and exits: an error on the others at once, within the timeout
    out = _run_case("failing_rank")
    assert "rank 0: timed out after" in out and "rank 0: got RuntimeError" in out, out


def test_ddp_fsdp2_dtensor_tp_and_checkpoint_equal_single_process_cpu():
    # DDP (several buckets, no_sync), FSDP2 fully_shard (f32; bf16 params with f32
    # reduce), DTensor on init_device_mesh("tpu"), parallelize_module Colwise/Rowwise,
    # torch.distributed.checkpoint save/load of the sharded state dict
    assert "parallel OK" in _run_case("parallel")


def test_train_ddp_example_under_torchrun():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            os.path.join(ROOT, "examples", "train_ddp.py"),
            "--quick",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert "PASS" in r.stdout and "all_reduce x" in r.stdout
