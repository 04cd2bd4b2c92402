"""PyTorch's parallel stack on tpu: FSDP2, DTensor, tensor parallel, a 2-D mesh, DCP; each against one CPU process.

Run by test_parallel.py with 2 processes (``--world 2``) and with 4 (the 2-D
FSDP x TP mesh).  Every rank trains a CPU copy of the same model on the whole
batch, which is what the parallel run must reproduce.
"""

from __future__ import annotations

import copy
import io
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchtpu  # noqa: F401
from worker_common import RANK, WORLD, run

DEVICE = torch.device("tpu", int(os.environ["LOCAL_RANK"]))


class MLP(torch.nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _batches(steps, rows=4 * 4, dim=8):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(rows, dim, generator=g) for _ in range(steps)]


def _train_cpu(model, batches, lr=0.05):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x in batches:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _full(p):
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()


def check_fsdp2(checks, steps=3):
    torch.manual_seed(0)
    ref = MLP()
    model = copy.deepcopy(ref).to(DEVICE)
    for module in (model.up, model.down, model):
        fully_shard(module)
    checks.true("fsdp2 parameters are DTensors on this chip",
                all(isinstance(p, DTensor) and p.to_local().device == DEVICE for p in model.parameters()))
    batches = _batches(steps)
    ref_losses = _train_cpu(ref, batches)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for step, x in enumerate(batches):
        mine = x.chunk(WORLD)[RANK].to(DEVICE)  # each rank its share of the batch
        loss = model(mine).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        checks.equal(f"fsdp2 step {step} loss", total, ref_losses[step], atol=1e-5)
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        checks.equal(f"fsdp2 {name} after {steps} AdamW steps", _full(p), rp.detach(), atol=2e-5)


def check_fsdp2_bf16_params(checks):
    """MixedPrecisionPolicy(param_dtype=bf16): compute in bf16, keep float32 master weights and grads."""
    torch.manual_seed(0)
    ref = MLP()
    model = copy.deepcopy(ref).to(DEVICE)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for module in (model.up, model.down, model):
        fully_shard(module, mp_policy=policy)
    x = _batches(1)[0]
    out = model(x.chunk(WORLD)[RANK].to(DEVICE))
    checks.true("fsdp2 bf16 compute", out.dtype == torch.bfloat16, str(out.dtype))
    out.float().square().mean().backward()
    grads_fp32 = all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in model.parameters())
    checks.true("fsdp2 bf16: float32 master parameters and gradients", grads_fp32)
    ref_bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    ref_out = ref_bf16(x.to(torch.bfloat16)).chunk(WORLD)[RANK]
    checks.equal("fsdp2 bf16 forward like CPU bf16", out.float().cpu(), ref_out.float(), atol=3e-2)


def check_dtensor(checks):
    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    a, b = torch.randn(4 * WORLD, 6), torch.randn(6, 5)
    da = distribute_tensor(a.to(DEVICE), mesh, [Shard(0)])
    checks.true("distribute_tensor shards on this chip", da.to_local().device == DEVICE
                and da.to_local().shape == (4, 6))
    checks.equal("distribute_tensor local shard", da.to_local(), a.chunk(WORLD)[RANK])
    checks.equal("Shard(0) -> Replicate", da.redistribute(mesh, [Replicate()]).to_local(), a)
    ds1 = da.redistribute(mesh, [Shard(1)])
    checks.equal("Shard(0) -> Shard(1)", ds1.to_local(), a.tensor_split(WORLD, dim=1)[RANK])
    partial = DTensor.from_local(torch.full((3,), float(RANK + 1), device=DEVICE), mesh, [Partial()])
    checks.equal("Partial -> Replicate sums", partial.redistribute(mesh, [Replicate()]).to_local(),
                 torch.full((3,), float(sum(range(1, WORLD + 1)))))
    checks.equal("Partial -> Shard(0) reduce-scatters", partial.redistribute(mesh, [Shard(0)]).full_tensor(),
                 torch.full((3,), float(sum(range(1, WORLD + 1)))))
    buffer = io.BytesIO()
    torch.save(da, buffer)  # a DTensor pickles its local shard and its placement
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    checks.true("torch.save/load of a DTensor keeps placements and device",
                isinstance(loaded, DTensor) and loaded.placements == (Shard(0),)
                and loaded.to_local().device == DEVICE)
    checks.equal("torch.save/load of a DTensor keeps the shard", loaded.to_local(), a.chunk(WORLD)[RANK])
    db = distribute_tensor(b.to(DEVICE), mesh, [Replicate()])
    checks.equal("sharded @ replicated matmul", (da @ db).full_tensor(), a @ b, atol=1e-5)


def check_tensor_parallel(checks, steps=2):
    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    ref = MLP(hidden=4 * WORLD)
    model = parallelize_module(copy.deepcopy(ref).to(DEVICE), mesh,
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    batches = _batches(steps)
    ref_losses = _train_cpu(ref, batches)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for step, x in enumerate(batches):
        loss = model(x.to(DEVICE)).square().mean()  # every rank the whole batch, weights split
        loss.backward()
        opt.step()
        opt.zero_grad()
        checks.equal(f"tensor parallel step {step} loss", loss.detach(), ref_losses[step], atol=1e-5)
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        checks.equal(f"tensor parallel {name}", _full(p), rp.detach(), atol=2e-5)


def check_fsdp_times_tp(checks, steps=2):
    """4 processes: a (2, 2) mesh, tensor parallel inside each row, FSDP2 across rows."""
    mesh = init_device_mesh("tpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = MLP(hidden=8)
    model = parallelize_module(copy.deepcopy(ref).to(DEVICE), mesh["tp"],
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    batches = _batches(steps)
    ref_losses = _train_cpu(ref, batches)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    dp_rank = mesh["dp"].get_local_rank()
    for step, x in enumerate(batches):
        loss = model(x.chunk(2)[dp_rank].to(DEVICE)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
        checks.equal(f"fsdp x tp step {step} loss", total, ref_losses[step], atol=1e-5)
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        checks.equal(f"fsdp x tp {name}", _full(p), rp.detach(), atol=2e-5)


def check_checkpoint(checks, directory):
    """DCP: save a sharded model and optimizer, train on, load, and get the saved state back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    torch.manual_seed(0)
    model = MLP().to(DEVICE)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    batches = _batches(3)

    def step(x):
        model(x.chunk(WORLD)[RANK].to(DEVICE)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step(batches[0])
    model_sd, opt_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=directory)
    saved = {k: _full(v).clone() for k, v in model_sd.items()}
    step(batches[1])
    step(batches[2])
    after_three = {k: _full(v).clone() for k, v in get_state_dict(model, opt)[0].items()}
    model_sd, opt_sd = get_state_dict(model, opt)
    dcp.load({"model": model_sd, "optim": opt_sd}, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=opt_sd)
    for k, v in get_state_dict(model, opt)[0].items():
        checks.equal(f"dcp load restores {k}", _full(v), saved[k])
    step(batches[1])
    step(batches[2])
    for k, v in get_state_dict(model, opt)[0].items():  # resuming replays the same steps
        checks.equal(f"dcp resume replays {k}", _full(v), after_three[k], atol=1e-6)
    checks.true("dcp shards live on this chip", all(v.to_local().device == DEVICE for v in model_sd.values()))


def _sharded_training():
    torch.manual_seed(0)
    model = MLP().to(DEVICE)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _fsdp_step(model, opt, x):
    loss = model(x.chunk(WORLD)[RANK].to(DEVICE)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    return total


def save_then_die(directory):
    """A job that checkpoints after its first step and is then killed (SIGKILL, no clean-up)."""
    import signal

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = _sharded_training()
    _fsdp_step(model, opt, _batches(3)[0])
    model_sd, opt_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=directory)
    dist.barrier()
    print(f"[rank {RANK}] saved", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def resume(checks, directory):
    """New processes load the checkpoint and continue: the losses are those of an uninterrupted run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    torch.manual_seed(0)
    ref = MLP()
    ref_losses = _train_cpu(ref, _batches(3))
    model, opt = _sharded_training()
    model(torch.zeros(1, 8, device=DEVICE)).sum().backward()  # AdamW's state must exist to be loaded into
    opt.step()
    opt.zero_grad()
    model_sd, opt_sd = get_state_dict(model, opt)
    dcp.load({"model": model_sd, "optim": opt_sd}, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=opt_sd)
    for step, x in enumerate(_batches(3)[1:], start=1):
        checks.equal(f"resumed step {step} loss", _fsdp_step(model, opt, x), ref_losses[step], atol=1e-5)
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        checks.equal(f"resumed {name} after 3 steps", _full(p), rp.detach(), atol=2e-5)


def main(checks):
    dist.init_process_group("tpu")
    torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
    if sys.argv[2:] == ["save-then-die"]:
        save_then_die(sys.argv[1])
    elif sys.argv[2:] == ["resume"]:
        resume(checks, sys.argv[1])
    elif WORLD == 4:
        check_fsdp_times_tp(checks)
    else:
        check_fsdp2(checks)
        check_fsdp2_bf16_params(checks)
        check_dtensor(checks)
        check_tensor_parallel(checks)
        check_checkpoint(checks, sys.argv[1])
    dist.barrier()


if __name__ == "__main__":
    run(main)
