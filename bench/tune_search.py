"""``torchtpu tune search`` measured: does the search find a configuration at least 1.3x faster than the default?

Three searches, each through ``torchtpu.tools.tune.search.search`` with its
repeats (the default and the best run three times each, taking turns; a
speed-up counts only when every run of the best beat every run of the default):

- the Llama 10m training step of ``bench/llama_step.py`` (its model, batch and
  AdamW), with ``torch.compile(backend="tpu")`` as a script-level knob
  (``--vary compile=0,1``) and the default space (eager modes, fused graph size);
- ``tests/tune/programs/microbatch.py``, gradient accumulation over
  microbatches of one example (``--vary microbatch=1,8,64``);
- ``tests/tune/programs/slow_unless_fused.py``, a planted 0.2 s per step that
  only fused eager mode removes (the default space).

    .venv/bin/python bench/tune_search.py            # all three; writes its section of docs/benchmarks.md
    .venv/bin/python bench/tune_search.py --quick    # the two planted programs only, writes nothing
    .venv/bin/python bench/tune_search.py --trial --compile=1   # one trial of the Llama step, as the search runs it
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "tune" / "programs"


# ---- one trial: the Llama training step ------------------------------------------------------------


def llama_trial(compile_step: bool, n_steps: int) -> None:
    import torch
    import torch.nn.functional as F
    from llama_config import make_batch, make_model, make_optimizer

    import torchtpu  # noqa: F401
    from torchtpu.tools.tune.search import steps

    model = make_model("10m").to("tpu")
    ids, labels = (t.to("tpu") for t in make_batch(model.config.vocab_size))
    optimizer = make_optimizer(model, capturable=compile_step)

    def loss_of_batch():  # the step of bench/llama_step.py, its eager mode left to the settings
        return F.cross_entropy(model(ids).logits.flatten(0, 1).float(), labels.flatten())

    def train_step():
        loss_of_batch().backward()
        optimizer.step()
        optimizer.zero_grad()

    step = torch.compile(train_step, backend="tpu") if compile_step else train_step
    for _ in steps(n_steps):
        step()


# ---- the searches ---------------------------------------------------------------------------------


def searches(quick: bool) -> list:
    """(name, script, script arguments, search keyword arguments) for each search."""
    from torchtpu.tools.tune import search

    planted = [
        ("microbatch.py (planted: microbatches of one)", str(PROGRAMS / "microbatch.py"), [],
         dict(space=[], vary={"microbatch": ["1", "8", "64"]})),
        ("slow_unless_fused.py (planted: 0.2 s a step unless fused)", str(PROGRAMS / "slow_unless_fused.py"), [],
         dict(space=search.default_space())),
    ]
    llama = ("Llama 10m training step (bench/llama_step.py's model)", __file__, ["--trial"],
             dict(space=search.default_space(), vary={"compile": ["0", "1"]}, max_trials=6))
    return planted if quick else [llama, *planted]


def run_search(name: str, script: str, script_args: list, options: dict, out: pathlib.Path) -> dict:
    from torchtpu.tools.tune import search

    started = time.perf_counter()
    result = search.search(script, script_args, out=str(out), timeout_s=600, repeats=2, **options)
    return {"name": name, "result": result, "wall_s": time.perf_counter() - started}


def _ms(values: list) -> str:
    return ", ".join(f"{v * 1e3:.1f}" for v in values) if values else "-"


def table(rows: list) -> str:
    lines = ["| program | trials (failed) | default step ms (runs) | best configuration | best step ms (runs) | "
             "speed-up | search s |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        r = row["result"]
        failed = sum(t.status != "ok" for t in r.trials)
        speedup = f"**{r.speedup:.2f}x**" if r.confirmed else "none claimed"
        best = f"`{r.best.candidate.label()}`" if r.best is not r.default else "(the default)"
        default_median = f"{statistics.median(r.default_runs) * 1e3:.1f}" if r.default_runs else "-"
        best_median = f"{statistics.median(r.best_runs) * 1e3:.1f}" if r.best_runs else "-"
        lines.append(f"| {row['name']} | {len(r.trials)} ({failed}) | {default_median} ({_ms(r.default_runs)}) | "
                     f"{best} | {best_median} ({_ms(r.best_runs)}) | {speedup} | {row['wall_s']:.0f} |")
    return "\n".join(lines)


def tried(result) -> str:
    """Each searched trial's configuration and measure, in the order they ran."""
    searched = [t for t in result.trials if not t.role.startswith("confirm")]
    return "; ".join(f"`{t.candidate.label()}` " + (f"{t.step_s * 1e3:.1f}" if t.status == "ok" else t.status)
                     for t in searched)


def section(rows: list, command: str, started: float) -> str:
    import jax
    import torch

    from results import how_measured

    measured_by = sorted({row["result"].default.measured_by for row in rows})
    text = [
        "## torchtpu tune search: speed-up found over the default",
        "",
        "Each row is one `torchtpu.tools.tune.search.search` run (see [tune-search.md](tune-search.md)): "
        "every trial a new process, the step time the median of the steps each trial reports "
        "(`torchtpu-step-seconds` lines, first step left out). The default and the best ran three times each, "
        "taking turns; the speed-up is the ratio of their medians, claimed only when every run of the best "
        "beat every run of the default. The goal is at least 1.3x.",
        "",
        table(rows),
        "",
        "The trials of each search (step ms; the repeats left out):",
        "",
        *(f"- {row['name']}: {tried(row['result'])}" for row in rows),
        "",
        how_measured(command, started, "XLA CPU (no TPU)", f"torch {torch.__version__}, jax {jax.__version__}",
                     notes=[f"measured by: {', '.join(measured_by)}",
                            "2 cores shared with other work: each measure is a median, and the runs of default "
                            "and best alternate"]),
    ]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial", action="store_true", help="run one trial of the Llama step (what the search runs)")
    parser.add_argument("--compile", type=int, default=0, help="with --trial: torch.compile the step")
    parser.add_argument("--steps", type=int, default=6, help="with --trial: steps to run")
    parser.add_argument("--quick", action="store_true", help="the planted programs only; write nothing")
    args = parser.parse_args()
    if args.trial:
        llama_trial(bool(args.compile), args.steps)
        return
    started = time.time()
    out = pathlib.Path(tempfile.mkdtemp(prefix="tune-search-bench-"))
    rows = []
    for index, (name, script, script_args, options) in enumerate(searches(args.quick)):
        print(f"== {name}", file=sys.stderr)
        rows.append(run_search(name, script, script_args, options, out / f"search-{index}"))
        print(table(rows), flush=True)
    print(f"reports under {out}")
    if not args.quick:
        from results import write_section

        write_section("tune_search.py", section(rows, "bench/tune_search.py", started))


if __name__ == "__main__":
    main()
