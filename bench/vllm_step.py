"""Where a vLLM step's time goes: tpu against vLLM's CPU platform, step by step.

bench/vllm_offline.py's 100m Llama (``--size tiny`` for its tiny one) and
workload: 16 prompts of 32 tokens, 32 new tokens each, greedy, bfloat16.
Each engine runs alone in a process of its own, with the engine core in
that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the scheduler's
timestamps are this process's:

- **step ms**: the time between the ends of successive steps
  (``Scheduler.update_from_output``), median over the measured batches:
  **prefill** steps (256 tokens each: the 16 prompts in two) and **decode**
  steps (16 requests, one token each). Async scheduling overlaps a step's
  host work with the previous step's device work, so this is what a step
  costs in the steady state.
- **tpu, device ms**: a further batch in which every compiled graph's
  outputs are waited for as it returns (no overlap), by program: the
  model's forward at the decode token bucket, the LM head, the sampler and
  the rest (taking the sampled ids into the next inputs). Their sum is the
  device time of a decode step alone; **host ms** is the runner's own work
  per decode step (``execute_model`` plus ``sample_tokens``, median), which
  async scheduling hides behind the device's.

bench/decode_matmuls.py times the matrix products of the same decode step
alone: XLA CPU's against PyTorch's and vLLM CPU's oneDNN.

    .venv/bin/python bench/vllm_step.py              # writes its section of docs/benchmarks.md
    .venv/bin/python bench/vllm_step.py --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import vllm_offline

MARK = "@@vllm_step "
ENGINES = {"vllm cpu": "cpu", "vllm tpu": "tpu"}
DECODE_TOKENS = 16  # the decode token bucket of 16 requests


# ----------------------------------------------------------------------------- inside a worker


class StepClock:
    """The end time and token count of every engine step (``Scheduler.update_from_output``)."""

    def __init__(self):
        from vllm.v1.core.sched import scheduler

        self.ends: list[tuple[float, int]] = []
        update = scheduler.Scheduler.update_from_output

        def timed_update(sched, scheduler_output, model_output):
            self.ends.append((time.perf_counter(), scheduler_output.total_num_scheduled_tokens))
            return update(sched, scheduler_output, model_output)

        scheduler.Scheduler.update_from_output = timed_update

    def steps(self, since: int) -> dict:
        """Median step time in ms by kind, for the steps after index ``since``."""
        kinds = {"prefill": [], "decode": []}
        ends = self.ends[since:]
        for (before, _), (end, tokens) in zip(ends, ends[1:]):
            kind = "decode" if tokens == DECODE_TOKENS else "prefill" if tokens == vllm_offline.MAX_BATCHED_TOKENS else None
            if kind:
                kinds[kind].append(1000 * (end - before))
        return {kind: statistics.median(ms) if ms else None for kind, ms in kinds.items()}


class DeviceClock:
    """Wall time of each compiled graph call with its outputs waited for, by graph and first input shape."""

    def __init__(self):
        from torchtpu.compile import dynamo

        self.on, self.times = False, {}
        call = dynamo.CompiledGraph.__call__

        def timed_call(graph, *args):
            if not self.on:
                return call(graph, *args)
            start = time.perf_counter()
            outputs = call(graph, *args)
            _wait(outputs)
            shape = next((tuple(a.shape) for a in args if hasattr(a, "shape") and a.dim() > 0), ())
            self.times.setdefault((id(graph), len(args), shape), []).append(time.perf_counter() - start)
            return outputs

        dynamo.CompiledGraph.__call__ = timed_call


def _wait(outputs):
    from torchtpu.core import tensor

    for value in outputs:
        if hasattr(value, "device") and value.device.type == "tpu":
            tensor.read(value).block_until_ready()


class HostClock:
    """The runner's own time per step: ``execute_model`` and ``sample_tokens``."""

    def __init__(self):
        from torchtpu.integrations.vllm import model_runner

        self.times = {"execute_model": [], "sample_tokens": []}
        for name in self.times:
            self._wrap(model_runner.TpuModelRunner, name)

    def _wrap(self, cls, name):
        method = getattr(cls, name)

        def timed(runner, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(runner, *args, **kwargs)
            finally:
                self.times[name].append(time.perf_counter() - start)

        setattr(cls, name, timed)


def worker(args) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    tpu = args.engine == "tpu"
    step_clock = StepClock()
    device_clock = DeviceClock() if tpu else None
    host_clock = HostClock() if tpu else None
    import vllm

    llm = vllm.LLM(args.model, dtype=args.dtype, max_model_len=vllm_offline.MAX_MODEL_LEN,
                   max_num_seqs=vllm_offline.MAX_NUM_SEQS, max_num_batched_tokens=vllm_offline.MAX_BATCHED_TOKENS,
                   kv_cache_memory_bytes=vllm_offline.KV_CACHE_BYTES, enable_prefix_caching=False, seed=0)
    config = json.load(open(os.path.join(args.model, "config.json")))
    prompts = [{"prompt_token_ids": p} for p in vllm_offline.make_prompts(config["vocab_size"], 16, 32)]
    params = vllm.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    since, seconds = len(step_clock.ends), []
    host_since = {k: len(v) for k, v in host_clock.times.items()} if tpu else {}
    for _ in range(args.repeats):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    reply = {"tok_s": 16 * 32 / statistics.median(seconds), **step_clock.steps(since)}
    if tpu:
        reply["host"] = {k: 1000 * statistics.median(v[host_since[k]:]) for k, v in host_clock.times.items()}
        device_clock.on = True
        llm.generate(prompts, params, use_tqdm=False)
        reply["device"] = device_parts(device_clock.times, config)
    print(MARK + json.dumps(reply), flush=True)
    os._exit(0)  # vLLM's engine threads need not wind down


def device_parts(times: dict, config: dict) -> dict:
    """Median ms of each program that runs at every decode step (the prefill's run a few times
    a batch), named by its inputs: the forward takes every weight, the LM head the hidden
    states, the sampler the logits; the rest puts the sampled ids into the next step's inputs."""
    parts = {}
    for (_, num_args, shape), values in times.items():
        if len(values) < 10:
            continue
        kind = ("forward" if num_args > 20 else "LM head" if shape[-1:] == (config["hidden_size"],)
                else "sampler" if shape[-1:] == (config["vocab_size"],) else "sampled ids into the inputs")
        parts[kind] = parts.get(kind, 0.0) + 1000 * statistics.median(values)
    return parts


# ----------------------------------------------------------------------------- the parent


def run_engine(name: str, args, model: str, scratch: str) -> dict | str:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_VLLM", "VLLM_TARGET_DEVICE", "TORCHTPU_CACHE_DIR")}
    if name == "vllm cpu":
        env["TORCHTPU_VLLM"] = "0"
    env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="engine-cache-", dir=scratch)
    log_path = os.path.join(scratch, ENGINES[name] + ".log")
    command = [sys.executable, __file__, "--engine", ENGINES[name], "--model", model, "--dtype", args.dtype,
               "--repeats", str(args.repeats)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                env=env)
        try:
            out, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            out = ""
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    for line in out.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = open(log_path, errors="replace").read().splitlines()[-10:]
    print(f"  {name} failed (code {proc.returncode}); log tail:\n" + "\n".join("    | " + t[:200] for t in tail),
          file=sys.stderr)
    return f"failed (code {proc.returncode})"


def tables(rows: dict) -> str:
    cpu = rows.get("vllm cpu")
    lines = ["| engine | output tok/s | prefill step ms (256 tokens) | decode step ms (16 requests) | "
             "decode step / vllm cpu |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        if not isinstance(row, dict):
            lines.append(f"| {name} | {row} | | | |")
            continue
        ratio = (f"{row['decode'] / cpu['decode']:.2f}" if isinstance(cpu, dict) and row["decode"] and cpu["decode"]
                 else "n/a")
        lines.append(f"| {name} | {row['tok_s']:.1f} | {_ms(row['prefill'])} | {_ms(row['decode'])} | {ratio} |")
    tpu = rows.get("vllm tpu")
    if isinstance(tpu, dict):
        device = tpu["device"]
        lines += ["", "| vllm tpu, one decode step | ms |", "|---|---|"]
        lines += [f"| device: {part} | {ms:.1f} |" for part, ms in sorted(device.items(), key=lambda kv: -kv[1])]
        lines.append(f"| device, all programs | {sum(device.values()):.1f} |")
        host = tpu["host"]
        lines.append(f"| host: the runner's execute_model + sample_tokens | "
                     f"{host['execute_model'] + host['sample_tokens']:.1f} |")
    return "\n".join(lines)


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "100m"], default="100m")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3, help="measured batches per engine")
    parser.add_argument("--timeout", type=float, default=900, help="seconds an engine's process may run")
    parser.add_argument("--no-write", action="store_true", help="print the tables, leave docs/benchmarks.md alone")
    parser.add_argument("--engine", choices=sorted(ENGINES.values()), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        return worker(args)
    started, load = time.time(), os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="vllm-step-")
    try:
        model = vllm_offline.write_model(os.path.join(scratch, "model"), args.size)
        rows = {}
        for name in ENGINES:
            print(f"  {name} ...", file=sys.stderr, flush=True)
            rows[name] = run_engine(name, args, model, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = tables(rows)
    print(report)
    if args.no_write:
        return
    import torch

    import torchtpu  # noqa: F401  for the device's name
    from results import how_measured, write_section

    write_section("vllm_step.py", "\n".join([
        f"## Where a vLLM step's time goes ({args.size} model): tpu against vLLM's CPU platform", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "",
        report, "",
        how_measured(f"python bench/vllm_step.py --size {args.size} --dtype {args.dtype} --repeats {args.repeats}",
                     started, torch.tpu.get_device_name(), f"torch {torch.__version__}",
                     notes=[f"Load average at start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (the cores are shared)"]),
    ]))


if __name__ == "__main__":
    main()
