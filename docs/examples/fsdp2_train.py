"""Fully sharded data parallel training (FSDP2, `fully_shard`) on tpu chips, one process per chip.

    torchrun --nproc_per_node=2 docs/examples/fsdp2_train.py

Each rank holds 1/world of every parameter and of the optimizer state;
`fully_shard` all-gathers a layer's parameters just before it runs and frees
them after, and reduce-scatters the gradients.  Parameters are kept in
float32 and computed in bfloat16 (MixedPrecisionPolicy).  At the end the
job saves a sharded checkpoint with torch.distributed.checkpoint.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import torchtpu  # noqa: F401  (registers the "tpu" device and c10d backend)

STEPS = 30


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


def main():
    dist.init_process_group("tpu")  # first: JAX's multi-process runtime starts here, before any tpu tensor
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", int(os.environ["LOCAL_RANK"]))  # as a CUDA script names its GPU

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(32) for _ in range(3)], nn.Linear(32, 1)).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model[:3]:
        fully_shard(block, mp_policy=policy)  # one all-gather per block
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 32, generator=data)
    targets = torch.tanh(inputs @ torch.randn(32, 1, generator=data))
    x, y = inputs[rank::world].to(device), targets[rank::world].to(device)  # this rank's shard of the data

    for step in range(STEPS):
        loss = F.mse_loss(model(x).float(), y)
        loss.backward()  # gradients reduce-scattered in float32
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == STEPS - 1:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:3d}  loss {mean_loss.item():.4f}", flush=True)

    shard = next(model.parameters()).to_local()
    print(f"rank {rank} holds {shard.numel()} of {next(model.parameters()).numel()} values on {shard.device}",
          flush=True)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    checkpoint = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint)
    if rank == 0:
        print(f"saved a sharded checkpoint to {checkpoint}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
