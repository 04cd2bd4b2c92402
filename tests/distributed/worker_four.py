"""4 ranks: the main collectives on the world, then a 2-D DeviceMesh whose row and
column groups overlap (every rank is in one of each), used in turn."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import torchtpu  # noqa: F401
from worker_collectives import DEV, RANKS, expected_avg, fold, value
from worker_common import RANK, WORLD, run


def check_world(c):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        xs = [value(r, dtype) for r in RANKS]
        t = xs[RANK].to(DEV)
        dist.all_reduce(t)
        c.equal(f"all_reduce SUM {dtype}", t, fold(torch.add, xs))
        out = torch.zeros(WORLD * 4, 3, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(out, xs[RANK].to(DEV))
        c.equal(f"all_gather_into_tensor {dtype}", out, torch.cat(xs))
        big = [value(r, dtype, (WORLD * 2, 3)) for r in RANKS]
        out = torch.zeros(2, 3, dtype=dtype, device=DEV)
        dist.reduce_scatter_tensor(out, big[RANK].to(DEV))
        c.equal(f"reduce_scatter_tensor SUM {dtype}", out, fold(torch.add, big)[2 * RANK:2 * RANK + 2])
        out = torch.zeros(WORLD * 2, 3, dtype=dtype, device=DEV)
        dist.all_to_all_single(out, big[RANK].to(DEV))
        c.equal(f"all_to_all_single {dtype}", out, torch.cat([b[2 * RANK:2 * RANK + 2] for b in big]))
    xs = [value(r, torch.float32) for r in RANKS]
    t = xs[RANK].to(DEV)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    c.equal("all_reduce AVG float32", t, expected_avg(xs, torch.float32), atol=1e-6)
    t = xs[RANK].to(DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    c.equal("all_reduce MAX float32", t, torch.stack(xs).amax(0))

    def split(src, dst):  # rank src sends this many rows to rank dst (zeros included)
        return (src * 2 + dst) % 4

    ins = [value(r, torch.float32, (sum(split(r, j) for j in RANKS), 3)) for r in RANKS]
    out_splits = [split(i, RANK) for i in RANKS]
    out = torch.zeros(sum(out_splits), 3, device=DEV)
    dist.all_to_all_single(out, ins[RANK].to(DEV), out_splits, [split(RANK, j) for j in RANKS])
    want = torch.cat([ins[i][sum(split(i, j) for j in range(RANK)):][:split(i, RANK)] for i in RANKS])
    c.equal("all_to_all_single unequal splits", out, want)


def check_device_mesh(c):
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    groups = {name: mesh.get_group(name) for name in ("dp", "tp")}
    # ranks laid out [[0, 1], [2, 3]]: tp groups are rows, dp groups are columns
    members = {"tp": [2 * (RANK // 2), 2 * (RANK // 2) + 1], "dp": [RANK % 2, RANK % 2 + 2]}
    for name, group in groups.items():
        c.equal(f"DeviceMesh {name} group ranks", torch.tensor(dist.get_process_group_ranks(group)),
                torch.tensor(members[name]))
    xs = [value(r, torch.float32) for r in RANKS]
    for step in range(2):  # the overlapping groups in turn, then the world
        for name in ("tp", "dp"):
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, group=groups[name])
            c.equal(f"all_reduce over the {name} group step {step}", t, fold(torch.add, [xs[r] for r in members[name]]))
            out = torch.zeros(2 * 4, 3, device=DEV)
            dist.all_gather_into_tensor(out, xs[RANK].to(DEV), group=groups[name])
            c.equal(f"all_gather_into_tensor over the {name} group step {step}", out,
                    torch.cat([xs[r] for r in members[name]]))
        t = xs[RANK].to(DEV)
        dist.all_reduce(t)
        c.equal(f"all_reduce over the world between mesh groups step {step}", t, fold(torch.add, xs))
    c.true("the mesh's groups are tpu process groups",
           all(type(g).__name__ == "TpuProcessGroup" for g in groups.values()))


def main(c):
    dist.init_process_group()  # no backend named: tpu is the accelerator, "tpu" its default backend
    c.true("with no backend named, the world group is a tpu process group",
           type(dist.group.WORLD).__name__ == "TpuProcessGroup", type(dist.group.WORLD).__name__)
    check_world(c)
    check_device_mesh(c)
    dist.barrier()  # rank 0 hosts the store: no rank may still need it when rank 0 leaves
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main)
