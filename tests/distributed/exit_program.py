"""The shape of examples/train_ddp.py, cut short, for test_exit_after_collectives.py: DDP steps
on "tpu" over tpu_ccl, a last broadcast, destroy_process_group, then the interpreter exits right
away. Run under torchrun (RANK, WORLD_SIZE, ... in the environment). Prints "EXIT OK <rank>"
just before returning; with ``--check-drain`` it first runs the backend's exit drain and fails
if gloo's worker threads still hold a tensor the backend handed them."""

import os
import sys

import torch
import torch.distributed as dist

import torch_tpu_eager  # noqa: F401  (registers "tpu" and tpu_ccl)
from torch_tpu_eager.distributed import backend


def main():
    dist.init_process_group()
    rank = dist.get_rank()
    device = torch.device("tpu", int(os.environ.get("LOCAL_RANK", rank)) % torch.tpu.device_count())
    torch.tpu.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)).to(device)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flag = torch.tensor([1], device=device)
    dist.broadcast(flag, src=0)
    dist.destroy_process_group()
    if "--check-drain" in sys.argv:
        backend._drain_transport()
        if backend._handed:
            print(f"gloo still holds {len(backend._handed)} tensors after the drain", file=sys.stderr)
            return 1
    print(f"EXIT OK {rank}", flush=True)
    return 0 if flag.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
