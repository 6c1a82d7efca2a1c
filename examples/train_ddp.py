"""Train the digits MLP with DistributedDataParallel on simulated chips, one process per chip.

    torchrun --nproc-per-node 2 examples/train_ddp.py            # 6 epochs
    torchrun --nproc-per-node 2 examples/train_ddp.py --quick    # 1 epoch
    (or python -m torch.distributed.run --nproc-per-node 2 examples/train_ddp.py)

Each process takes chip ``tpu:<LOCAL_RANK % device_count>`` and its share of every global
batch of 64 (the UCI digits of examples/train_digits.py, shuffled by one CPU generator with
the same seed everywhere); DDP averages the gradients over the c10d backend "tpu_ccl"
(docs/distributed.md). Rank 0 also trains the same model on CPU in a single process with the
global batch and checks that the per-epoch losses agree (relative 1e-4): data parallelism
changes where the work runs, not what is computed.

Prints per epoch the loss of both runs and the simulated step time of a chip (an Event pair
on its default stream around the epoch, per step), split into compute (the simulated time of
its kernels, ``torch_tpu_eager.metrics()``), communication (the simulated interconnect time of
its collectives, ``torch_tpu_eager.distributed.collective_metrics()``), the overlap (the
communication that ran while the chip computed: compute + communication - step) and the
exposed communication (step - compute: what compute did not hide). Collectives run on the chip's
interconnect stream, so a gradient bucket's all_reduce overlaps the backward of the layers
before it; the buckets are small here (``BUCKET_CAP_MB``: 2 buckets for the 69 KB of
gradients), as a large model's gradients fill many 25 MB buckets. Exit code 0 when the losses
agree.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import torch_tpu_eager  # noqa: F401  (registers "tpu" and the c10d backend "tpu_ccl")
from torch_tpu_eager.distributed import collective_metrics, reset_collective_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # find _common however we are loaded
from _common import quick_default, rel_diff  # noqa: E402
from train_digits import LR, SEED, load_data, make_model  # noqa: E402

GLOBAL_BATCH = 64
LOSS_RTOL = 1e-4
BUCKET_CAP_MB = 0.03  # DDP gradient bucket size: 2 buckets for the MLP's 17,226 float32 gradients


def batches(n_train, epochs):
    """Index tensors of the full global batches of each epoch (the last partial batch is dropped,
    so every rank's share has the same size and DDP's mean equals the global-batch mean)."""
    shuffle = torch.Generator().manual_seed(SEED + 1)
    for _ in range(epochs):
        order = torch.randperm(n_train, generator=shuffle)
        yield [order[s : s + GLOBAL_BATCH] for s in range(0, n_train - GLOBAL_BATCH + 1, GLOBAL_BATCH)]


def train_cpu(data, epochs):
    """Single-process CPU reference with the global batch: mean loss per epoch."""
    x, y = data[0], data[1]
    torch.manual_seed(SEED)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for epoch in batches(len(x), epochs):
        total = 0.0
        for idx in epoch:
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total / len(epoch))
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--quick", action="store_true", default=quick_default())
    args = parser.parse_args(argv)
    epochs = args.epochs or (1 if args.quick else 6)
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --nproc-per-node 2 examples/train_ddp.py")

    dist.init_process_group()  # the backend of the "tpu" device: tpu_ccl
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"the global batch {GLOBAL_BATCH} must divide among {world} processes")
    device = torch.device("tpu", int(os.environ.get("LOCAL_RANK", rank)) % torch.tpu.device_count())
    torch.tpu.set_device(device)
    share = GLOBAL_BATCH // world
    data = load_data()
    x, y = data[0], data[1]

    torch.manual_seed(SEED)
    model = make_model().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.Adam(ddp.parameters(), lr=LR)

    losses, step_times = [], []
    for epoch in batches(len(x), epochs):
        torch_tpu_eager.synchronize()
        torch_tpu_eager.reset_metrics()
        reset_collective_metrics()
        start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        start.record()
        loss_sum = torch.zeros((), device=device)
        for idx in epoch:
            mine = idx[rank * share : (rank + 1) * share]
            xb, yb = x[mine].to(device), y[mine].to(device)
            loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)  # the mean of the shares = the global-batch loss
        end.record()  # after the synchronous all_reduce: every collective of the epoch is joined
        losses.append(loss_sum.item() / len(epoch))
        chip = torch_tpu_eager.metrics()  # sim_time_s includes the collectives' ICI time
        step = start.elapsed_time(end) / 1e3 / len(epoch)
        comm = collective_metrics()["collective_time_s"] / len(epoch)
        compute = (chip["sim_time_s"] - chip["collective_time_s"]) / len(epoch)
        step_times.append((step, compute, comm))

    reference = train_cpu(data, epochs) if rank == 0 else None
    ok = True
    if rank == 0:
        print(
            f"DDP on {world} simulated chips ({torch.tpu.get_device_name(device)}), global batch "
            f"{GLOBAL_BATCH} ({share} per chip), {len(x)} training images"
        )
        print(
            f"{'epoch':>5} {'loss (ddp)':>12} {'loss (cpu)':>12} {'rel diff':>9} "
            f"{'step us':>9} {'compute':>9} {'comm':>9} {'overlap':>9} {'exposed':>9}  (simulated, per step)"
        )
        for i, (loss, ref, (step, compute, comm)) in enumerate(zip(losses, reference, step_times)):
            diff = rel_diff(loss, ref)
            ok &= diff <= LOSS_RTOL
            exposed = min(max(step - compute, 0.0), comm)
            print(
                f"{i + 1:>5} {loss:>12.6f} {ref:>12.6f} {diff:>9.1e} {1e6 * step:>9.2f} "
                f"{1e6 * compute:>9.2f} {1e6 * comm:>9.2f} {1e6 * (comm - exposed):>9.2f} {1e6 * exposed:>9.2f}"
            )
        step, compute, comm = step_times[-1]
        hidden = comm - min(max(step - compute, 0.0), comm)
        print(
            f"per step: {1e6 * step:.2f} us = {1e6 * compute:.2f} us compute + {1e6 * (comm - hidden):.2f} us "
            f"exposed communication; {1e6 * hidden:.2f} of the {1e6 * comm:.2f} us of communication "
            f"({100 * hidden / comm if comm else 0.0:.0f}%) overlap compute"
        )
        per_op = collective_metrics()["per_op"]
        print(
            "collectives in the last epoch: "
            + ", ".join(f"{op} x{v['count']} ({v['bytes'] / 1e6:.2f} MB)" for op, v in sorted(per_op.items()))
        )
        print("PASS" if ok else f"FAIL: losses differ by more than {LOSS_RTOL} relative")
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, src=0)
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
