"""Launch settings for a plan: TorchTitan 0.2.2 flags, the torchrun command, and our device mesh."""

from __future__ import annotations

import math

from .plan_cost import Layout, Workload, microbatches

# TorchTitan 0.2.2 model names for the built-in models (its --model.name); others need the user's choice.
TITAN_MODELS = {"qwen3": "qwen3", "llama3": "llama3"}


def titan_flags(work: Workload, lay: Layout) -> list[str]:
    """Flags of TorchTitan 0.2.2's JobConfig (torchtitan/config/job_config.py) that set up this plan."""
    local_batch = work.global_batch // (lay.dp * lay.fsdp)
    flags = [
        f"--training.global_batch_size {work.global_batch}",
        # without a pipeline, local_batch_size is one forward's batch and the rest is gradient accumulation
        f"--training.local_batch_size {local_batch if lay.pp > 1 else lay.micro_batch}",
        f"--training.seq_len {work.seq}",
        f"--parallelism.data_parallel_replicate_degree {lay.dp}",
        f"--parallelism.data_parallel_shard_degree {lay.fsdp}",
        f"--parallelism.tensor_parallel_degree {lay.tp}",
        f"--parallelism.context_parallel_degree {lay.cp}",
        f"--parallelism.pipeline_parallel_degree {lay.pp}",
        f"--parallelism.expert_parallel_degree {lay.ep}",
        f"--activation_checkpoint.mode {lay.ac}",
    ]
    if lay.pp > 1:
        flags += [f"--parallelism.pipeline_parallel_microbatch_size {lay.micro_batch}",
                  "--parallelism.pipeline_parallel_schedule 1F1B"]
    if lay.ac == "selective":
        flags.append("--activation_checkpoint.selective_ac_option 2")  # every second layer, as costed
    return flags


def _titan_model(name: str) -> str:
    return next((titan for prefix, titan in TITAN_MODELS.items() if name.startswith(prefix)), "<model name>")


def settings(work: Workload, lay: Layout) -> dict:
    hosts = math.ceil(work.chips / work.chip.chips_per_host)
    per_host = min(work.chips, work.chip.chips_per_host)
    flags = titan_flags(work, lay)
    torchrun = (f"torchrun --nnodes={hosts} --nproc_per_node={per_host} --rdzv_backend=c10d "
                f"--rdzv_endpoint=$COORDINATOR:29500 -m torchtitan.train --model.name {_titan_model(work.model.name)} "
                + " ".join(flags))
    shape = (lay.pp, lay.dp, lay.fsdp, lay.cp, lay.tp)
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    mesh = ("import torch.distributed as dist\nfrom torch.distributed.device_mesh import init_device_mesh\n"
            "dist.init_process_group(\"tpu\")  # torchtpu's c10d backend\n"
            f"mesh = init_device_mesh(\"tpu\", {shape}, mesh_dim_names={names})")
    return {"torchtitan_flags": flags, "torchrun": torchrun, "hosts": hosts, "processes_per_host": per_host,
            "gradient_accumulation_steps": microbatches(work, lay) if lay.pp == 1 else 1,
            "device_mesh": mesh}


def describe(launch: dict) -> str:
    return "\n".join(["launch (TorchTitan 0.2.2 under torchrun, one process per chip):",
                      "  " + launch["torchrun"].replace(" --", " \\\n      --"),
                      f"  gradient accumulation steps: {launch['gradient_accumulation_steps']}",
                      "our distributed config (the same mesh without TorchTitan):",
                      *("  " + line for line in launch["device_mesh"].splitlines())])
