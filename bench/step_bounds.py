"""What bounds two goals of the eager and start-up issue on the Llama 10m training step (XLA:CPU here).

**Fused vs strict (goal: strict step >= 1.5x fused step).**  A fused step
records its ops on the host, then runs them as one program; a strict step runs
each op's program as it comes.  Each tpu step is split into its *dispatch*
(the Python step up to the loss: recording, or running op by op) and its
*wait* (``loss.item()`` plus a device sync).  With the whole step in one
graph (``max_fused_ops`` above the step's op count), the wait is the one
program's device time: strict step / that time is the most fused mode could
gain if recording cost nothing.

**Cold start (goals: compiled cold <= 0.25x inductor's, <= 0.5x PyTorch/XLA's).**
Each compiled configuration starts in a new process and runs two steps;
PyTorch's own compile-time counters split the time into Dynamo's bytecode
tracing (shared with inductor; a frame that graph-breaks, here at
``loss.backward()``, is analysed again from the start: the attempts column),
AOTAutograd (shared), and the backend's own work (for tpu: FX-to-JAX
translation, then JAX tracing, lowering and XLA compiling, from torchtpu's
counters).  Inductor's caches start empty too.

    .venv/bin/python bench/step_bounds.py      # ~3 min; writes its section of docs/benchmarks.md
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from llama_config import make_batch, make_model
from llama_step import torch_runner

import torchtpu
from results import how_measured, write_section
from torchtpu.runtime import metrics

SIZE, STEPS = "10m", 8
STEADY = {"tpu strict": {}, "tpu fused": {}, "tpu fused, one graph": {"max_fused_ops": 100_000},
          "tpu compiled+fused": {}, "tpu compiled": {}}


def split_steps(runners, steps):
    """Median (dispatch, wait) seconds of each configuration, taking turns step by step."""
    parts = {name: [] for name in runners}
    for _ in range(steps):
        for name, (step, settings) in runners.items():
            with torchtpu.config.override(**settings):
                t0 = time.perf_counter()
                loss = step.dispatch()
                t1 = time.perf_counter()
                loss.item()
                torch.tpu.synchronize()
                parts[name].append((t1 - t0, time.perf_counter() - t1))
    return {name: tuple(statistics.median(p[i] for p in values) for i in (0, 1)) for name, values in parts.items()}


def steady():
    model = make_model(SIZE)
    batch = make_batch(model.config.vocab_size)
    runners = {}
    for name, settings in STEADY.items():
        mode = name.split()[1].rstrip(",")
        step = torch_runner(model, "tpu", mode, batch, True)
        with torchtpu.config.override(**settings):
            step(), step()  # compiles
        runners[name] = (step, settings)
    return split_steps(runners, STEPS)


def cold_child(config):
    """Run in a new process: two steps of ``config`` with the time split by compile stage."""
    from torch._dynamo.utils import compilation_time_metrics

    from torchtpu.compile import dynamo

    translating = []
    init = dynamo.CompiledGraph.__init__

    def timed_init(self, *args, **kwargs):
        start = time.perf_counter()
        init(self, *args, **kwargs)
        translating.append(time.perf_counter() - start)

    dynamo.CompiledGraph.__init__ = timed_init
    model = make_model(SIZE)
    device, mode = config.split()
    step = torch_runner(model, device, mode, make_batch(model.config.vocab_size), True)
    start = time.perf_counter()
    step(), step()
    total = time.perf_counter() - start
    spent = {name: sum(times) for name, times in compilation_time_metrics.items()}
    return {"cold": total, "dynamo tracing": spent.get("bytecode_tracing", 0.0),
            "attempts": sum(1 for name in spent if name.startswith("compile_attempt_")),
            "aot autograd": spent.get("create_aot_dispatcher_function", 0.0),
            "tpu: fx graph to jax": sum(translating),
            "tpu: jax trace, lower, xla compile": metrics.compile_cache_stats()["compile_seconds"],
            "dynamo total": spent.get("_compile.compile_inner", 0.0)}


def cold(config, env=None):
    """``cold_child`` in a new process, with an empty inductor cache (on by default, it would skip
    inductor's AOTAutograd and compile)."""
    with tempfile.TemporaryDirectory() as inductor_cache:
        done = subprocess.run([sys.executable, __file__, "--cold-child", config], capture_output=True, text=True,
                              check=True, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_cache, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def fused_section(parts):
    lines = ["### Fused vs strict: where a training step's time goes", "",
             "| configuration | dispatch ms | wait ms | step ms | strict / this |", "|---|---|---|---|---|"]
    strict = sum(parts["tpu strict"])
    for name, (dispatch, wait) in parts.items():
        lines.append(f"| {name} | {dispatch * 1e3:.1f} | {wait * 1e3:.1f} | {(dispatch + wait) * 1e3:.1f} | "
                     f"{strict / (dispatch + wait):.2f} |")
    program = parts["tpu fused, one graph"][1]
    lines += ["", f"The one-graph fused step's program alone runs {program * 1e3:.1f} ms: with recording free, "
              f"fused mode could reach strict / fused = {strict / program:.2f} (goal 1.5). Its recording "
              f"costs {parts['tpu fused, one graph'][0] * 1e3:.1f} ms, against strict's "
              f"{parts['tpu strict'][0] * 1e3:.1f} ms of dispatching and running op by op."]
    return "\n".join(lines)


COLD_COLUMNS = ["dynamo tracing", "aot autograd", "tpu: fx graph to jax", "tpu: jax trace, lower, xla compile"]


def cold_section(colds):
    lines = ["### Cold start, a new process each: where the seconds go", "",
             "| configuration | cold s (2 steps) | Dynamo attempts | " + " | ".join(COLD_COLUMNS) + " | rest |",
             "|---|---|---|" + "---|" * (len(COLD_COLUMNS) + 1)]
    for name, row in colds.items():
        # AOTAutograd's time includes the tpu backend's (it calls the backend's compilers).
        rest = row["cold"] - row["dynamo total"] - (row["tpu: jax trace, lower, xla compile"]
                                                    if "tpu" in name else 0.0)
        cells = [f"{row[c]:.2f}" if c.startswith("dynamo") or c.startswith("aot") or "tpu" in name else "-"
                 for c in COLD_COLUMNS]
        lines.append(f"| {name} | {row['cold']:.2f} | {row['attempts']} | " + " | ".join(cells) + f" | {rest:.2f} |")
    compiled, inductor = colds["tpu compiled"], colds["cpu inductor"]
    ours = compiled["tpu: fx graph to jax"] + compiled["tpu: jax trace, lower, xla compile"]
    warm = colds["tpu compiled, disk cache filled"]["cold"]
    lines += ["", f"tpu compiled cold / inductor cold = {compiled['cold'] / inductor['cold']:.2f} (goal 0.25). "
              f"torchtpu's own part of the tpu cold start is {ours:.2f} s of {compiled['cold']:.2f} s (the FX graphs "
              f"translated to JAX, then traced, lowered and compiled by XLA); the rest is PyTorch's front end, "
              f"Dynamo's tracing and AOTAutograd, which inductor pays too (its AOTAutograd column also holds "
              f"inductor's own compile). With torchtpu's part at zero the cold start would be "
              f"{(compiled['cold'] - ours) / inductor['cold']:.2f}x inductor's. The disk caches (a second process "
              f"finding the first one's XLA programs and AOTAutograd graphs) skip XLA's compiles and AOTAutograd's "
              f"tracing, not Dynamo's: {warm:.2f} s, {warm / compiled['cold']:.2f}x the first process."]
    return "\n".join(lines)


def main():
    if sys.argv[1:2] == ["--cold-child"]:
        print(json.dumps(cold_child(sys.argv[2])))
        return
    started, load = time.time(), os.getloadavg()
    parts = steady()
    colds = {"tpu compiled": cold("tpu compiled"), "cpu inductor": cold("cpu inductor")}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor_cache:
        disk_caches = {"TORCHTPU_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": inductor_cache}
        cold("tpu compiled", disk_caches)
        colds["tpu compiled, disk cache filled"] = cold("tpu compiled", disk_caches)
    report = fused_section(parts) + "\n\n" + cold_section(colds)
    print(report)
    intro = __doc__.split("\n\n    .venv")[0].split("\n\n", 1)[1]
    versions = f"torch {torch.__version__}, torchtpu {torchtpu.__version__}"
    write_section("step_bounds.py", f"## What bounds fused mode and the cold start (Llama {SIZE} training step)\n\n"
                  f"{intro}\n\n{report}\n\n" + how_measured(
                      "python bench/step_bounds.py", started, torch.tpu.get_device_name(), versions,
                      ["load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in load)]))


if __name__ == "__main__":
    main()
