"""DDP and FSDP2 training steps of the bench Llama: the `tpu` backend against gloo on CPU, world size 1, 2, 4.

Each configuration is one torchrun launch (`--standalone`), every rank
training the 10m Llama of bench/llama_config.py on its own batch of
BATCH x SEQUENCE tokens (weak scaling) with AdamW:

- **tpu eager**: tpu tensors, `init_process_group("tpu")`, op by op;
- **tpu compiled**: the same with the model under `torch.compile(backend="tpu")`
  (for FSDP2 the collectives then sit inside the compiled programs);
- **gloo CPU**: CPU tensors, `init_process_group("gloo")`, PyTorch's own kernels.

Reported: rank 0's median step time (ms) over `--steps` steps after
`--warmup`, and tokens per second across the world.  Configurations run one
after another, so this is a ratio table for one machine at one time, not a
scaling claim for TPU pods.

    .venv/bin/python bench/distributed_training.py              # writes docs/benchmarks.md
    .venv/bin/python bench/distributed_training.py --quick      # world size 2, fewer steps, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import results

CONFIGS = [("ddp", "tpu", False), ("ddp", "cpu", False), ("fsdp2", "tpu", False), ("fsdp2", "tpu", True),
           ("fsdp2", "cpu", False)]


def worker(engine: str, device: str, compiled: bool, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from llama_config import BATCH, SEQUENCE, make_batch, make_model, make_optimizer

    import torchtpu  # noqa: F401

    dist.init_process_group("tpu" if device == "tpu" else "gloo")
    rank = dist.get_rank()
    target = torch.device("tpu", int(os.environ["LOCAL_RANK"])) if device == "tpu" else torch.device("cpu")
    model = make_model("10m").to(target)
    if engine == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(target.type, (dist.get_world_size(),))  # FSDP2's default is the accelerator
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    forward = torch.compile(model, backend="tpu") if compiled else model
    optimizer = make_optimizer(model)
    ids, labels = make_batch(model.config.vocab_size if engine == "fsdp2" else model.module.config.vocab_size)
    torch.manual_seed(rank)
    ids, labels = ids.roll(rank, 0).to(target), labels.roll(rank, 0).to(target)

    def step():
        loss = forward(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()  # a host sync, as a training loop's logging does

    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        median = statistics.median(times)
        tokens = BATCH * SEQUENCE * dist.get_world_size() / median
        print("ROW " + json.dumps({"engine": engine, "device": device, "compiled": compiled,
                                   "n": dist.get_world_size(), "ms": median * 1e3, "tokens_per_s": tokens}),
              flush=True)
    dist.destroy_process_group()


def run(config, nprocs: int, steps: int, warmup: int, timeout: float) -> dict:
    engine, device, compiled = config
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nprocs}",
               __file__, "--worker", engine, device, str(int(compiled)), str(steps), str(warmup)]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // nprocs)))
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    raise RuntimeError(f"{config} on {nprocs} processes failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")


def table(rows) -> str:
    lines = ["| world size | engine | device | step (ms) | tokens/s | vs gloo CPU |", "|---|---|---|---|---|---|"]
    cpu = {(r["n"], r["engine"]): r["ms"] for r in rows if r["device"] == "cpu"}
    for r in rows:
        name = "tpu compiled" if r["compiled"] else ("tpu eager" if r["device"] == "tpu" else "gloo CPU")
        cpu_ms = cpu.get((r["n"], r["engine"]))
        speedup = f"{cpu_ms / r['ms']:.2f}x" if cpu_ms else "n/a"
        lines.append(f"| {r['n']} | {r['engine']} | {name} | {r['ms']:.0f} | {r['tokens_per_s']:.0f} | {speedup} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.worker:
        engine, device, compiled, steps, warmup = args.worker
        return worker(engine, device, compiled == "1", int(steps), int(warmup))
    started = time.time()
    if args.quick:
        args.sizes, args.steps, args.warmup = "2", 2, 1
    rows = results.sweep(map(int, args.sizes.split(",")), CONFIGS,
                         lambda config, nprocs: run(config, nprocs, args.steps, args.warmup, timeout=3600), table)
    if args.quick:
        return
    import jax
    import torch

    results.write_section("distributed_training.py", "\n\n".join([
        "## DDP and FSDP2 training steps: the `tpu` backend against gloo on CPU", "",
        "The 10m bench Llama, each rank its own batch (weak scaling); median step time of rank 0, "
        "`loss.item()` included. Goal: the compiled FSDP2 step faster than the eager one.",
        table(rows),
        results.how_measured("python bench/distributed_training.py", started, "XLA CPU, one process per device",
                             f"torch {torch.__version__}, jax {jax.__version__}",
                             [f"{args.steps} steps after {args.warmup} warm-up steps",
                              "All processes share this machine's cores: world size 4 on 2 cores measures "
                              "contention, not scaling"]),
    ]))


if __name__ == "__main__":
    main()
