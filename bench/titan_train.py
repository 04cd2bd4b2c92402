"""TorchTitan's llama3 debug model trained with its own entry point: tpu (eager, compiled) against CPU with gloo.

Each configuration is one ``torchrun --nproc_per_node=N -m torchtitan.train``
launch (the CPU one through tests/titan/cpu_reference.py, TorchTitan having no
CPU mode), FSDP2 over N processes, ``--training.local_batch_size 4
--training.seq_len 256``, float32 parameters, the tests' tokenizer and text
dataset (tests/titan/assets.py):

- **tpu eager**: op by op on tpu;
- **tpu compiled**: ``--compile.enable`` (each block and the loss through
  ``torch.compile``, whose default backend runs tpu graphs on torchtpu's);
- **cpu eager (gloo)**: PyTorch's own CPU kernels.

Reported: TorchTitan's own ``tps`` (tokens per second per rank) of rank 0,
median over the steps after the first two; the first step's time (compiles
included); and, for tpu, how many programs recompiled after step 2
(``TORCHTPU_LOG_RECOMPILES``: a graph whose input shapes changed). Ratios
to cpu eager. Configurations run one after another on this machine's 2
cores, so N = 4 shares them among 4 processes: a ratio table, not a scaling claim.

    .venv/bin/python bench/titan_train.py               # world sizes 1, 2, 4; writes docs/benchmarks.md
    .venv/bin/python bench/titan_train.py --sizes 2 --no-write
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import results

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
CONFIGS = ["cpu eager (gloo)", "tpu eager", "tpu compiled"]
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*[0-9.]+.*?tps:\s*([0-9,]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def launch(config: str, nprocs: int, steps: int, tokenizer: str, data: str, dump: str, port: int) -> dict:
    entry = [str(TESTS / "titan" / "cpu_reference.py")] if config.startswith("cpu") else ["-m", "torchtitan.train"]
    env = dict(os.environ, TORCHTPU_LOG_RECOMPILES="1")
    if config.startswith("cpu"):
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nprocs}", f"--master_port={port}",
            *entry, "--model.name", "llama3", "--model.flavor", "debugmodel", "--model.hf_assets_path", tokenizer,
            "--training.dataset", "c4_test", "--training.dataset_path", data, "--training.local_batch_size", "4",
            "--training.seq_len", "256", "--training.steps", str(steps), "--training.mixed_precision_param",
            "float32", "--metrics.log_freq", "1", "--job.dump_folder", dump,
            *(["--compile.enable"] if config == "tpu compiled" else [])]
    started = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, start_new_session=True)
    log = ANSI.sub("", out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"{config} on {nprocs}: exit {out.returncode}\n{log[-3000:]}")
    rank0 = [line for line in log.splitlines() if "[rank" not in line or "[rank0]" in line]
    tps, first_step_at, after_step_2, recompiles = {}, None, False, 0
    for line in rank0:
        match = STEP.search(line)
        if match:
            step = int(match.group(1))
            tps.setdefault(step, float(match.group(2).replace(",", "")))
            after_step_2 = after_step_2 or step >= 2
        elif "recompiling the" in line and after_step_2:
            recompiles += 1
    steady = [t for step, t in tps.items() if step > 2]
    return {"config": config, "nprocs": nprocs, "tps": statistics.median(steady), "wall_s": time.perf_counter() - started,
            "recompiles": recompiles if config.startswith("tpu") else None}


def table(rows) -> str:
    lines = ["| processes | run | tokens/s per rank (steady) | / cpu eager | launch to end, s | recompiles after step 2 |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        base = next((r["tps"] for r in rows if r["nprocs"] == row["nprocs"] and r["config"].startswith("cpu")), None)
        ratio = f"{row['tps'] / base:.2f}" if base else "n/a"
        recompiles = "n/a" if row["recompiles"] is None else str(row["recompiles"])
        lines.append(f"| {row['nprocs']} | {row['config']} | {row['tps']:.0f} | {ratio} | {row['wall_s']:.0f} | "
                     f"{recompiles} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(TESTS))
    from titan.assets import write_assets

    started, load = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer, data = write_assets(pathlib.Path(scratch) / "assets")

        def measure(config, nprocs):
            """One launch, retried once on another port: gloo on 4 processes sharing 2 cores
            sometimes aborts a CPU rank (SIGABRT) before the first step."""
            i = CONFIGS.index(config)
            for attempt in range(2):
                dump = os.path.join(scratch, f"run{i}_{nprocs}_{attempt}")
                try:
                    port = 29500 + 10 * nprocs + i + 100 * attempt
                    return launch(config, nprocs, args.steps, tokenizer, data, dump, port)
                except RuntimeError as error:
                    if attempt:
                        raise
                    print(f"{config} on {nprocs} failed, retrying once: {str(error).splitlines()[0]}", file=sys.stderr)

        rows = results.sweep(map(int, args.sizes.split(",")), CONFIGS, measure, table)
    if args.no_write:
        return
    import importlib.metadata

    import jax
    import torch

    results.write_section("titan_train.py", "\n\n".join([
        "## TorchTitan llama3 debug model: tpu (eager, compiled) against CPU with gloo",
        __doc__.split("\n\n    .venv")[0].split("\n", 1)[1].strip(), table(rows),
        results.how_measured(f"python bench/titan_train.py --sizes {args.sizes} --steps {args.steps}", started,
                             "XLA CPU", f"torchtitan {importlib.metadata.version('torchtitan')}, jax {jax.__version__}, "
                             f"torch {torch.__version__}",
                             notes=[f"Load average at start: {', '.join(f'{x:.2f}' for x in load)}"])]))


if __name__ == "__main__":
    main()
