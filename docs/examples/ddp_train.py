"""Data-parallel training with DistributedDataParallel on tpu chips, one process per chip.

    torchrun --nproc_per_node=2 docs/examples/ddp_train.py

Each process trains on its own shard of a synthetic regression data set;
DDP averages the gradients, so the replicas stay identical.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchtpu  # noqa: F401  (registers the "tpu" device and c10d backend)

STEPS = 30


def main():
    dist.init_process_group("tpu")  # first: JAX's multi-process runtime starts here, before any tpu tensor
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # DDP also broadcasts rank 0's weights at construction
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to("tpu")
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(256, 16, generator=data)
    targets = inputs @ torch.randn(16, 1, generator=data)
    x, y = inputs[rank::world].to("tpu"), targets[rank::world].to("tpu")  # this rank's shard

    for step in range(STEPS):
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients, bucket by bucket
        optimizer.step()
        if step % 10 == 0 or step == STEPS - 1:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:3d}  loss {mean_loss.item():.4f}", flush=True)

    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(replicas, weights)
    if rank == 0:
        identical = all(torch.equal(replicas[0].cpu(), r.cpu()) for r in replicas)
        print(f"replicas identical: {identical}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
