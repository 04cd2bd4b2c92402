"""Eager per-op overhead: torchtpu against a cached ``jax.jit`` call and CPU PyTorch.

Every figure is measured side by side in one run.  For each small op and size
we time, in turn:

  tpu     the op on torchtpu's ``tpu`` device (strict eager executor)
  jax     the same math as one cached ``jax.jit`` call on jax arrays: the
          ceiling torchtpu can reach, since it runs such a call per op
  cpu     PyTorch's own CPU eager kernel
  (and ``torch.compile`` with inductor on CPU for one case, when it works)

Each timing loops the op many times and blocks once at the end (jax
dispatch is asynchronous, so per-op time is the dispatch cost or the compute,
whichever is larger).  Backends take turns within each repeat so that load on
the machine hits them alike, and the median repeat is reported.

    .venv/bin/python bench/eager_overhead.py            # prints the table, writes docs/benchmarks.md
    .venv/bin/python bench/eager_overhead.py --quick    # fewer repeats, no file
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

import torchtpu  # noqa: F401  registers the tpu device
from results import write_section

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOAL = 2.0  # tpu per-op time at most this multiple of the bare jax call


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    torch_fn: Callable  # (x, y, mask) -> tensor, on torch tensors of any device
    jax_fn: Callable  # (x, y, mask) -> array: the same math, to be jitted
    chained: bool = False  # result feeds the next call as x (in-place ops)


def _add_inplace(x, y, mask):
    return x.add_(y)


CASES = [
    Case("add", lambda x, y, m: x + y, lambda x, y, m: x + y),
    Case("mul", lambda x, y, m: x * y, lambda x, y, m: x * y),
    Case("relu", lambda x, y, m: torch.relu(x), lambda x, y, m: jnp.maximum(x, 0)),
    Case("where", lambda x, y, m: torch.where(m, x, y), lambda x, y, m: jnp.where(m, x, y)),
    Case("sum", lambda x, y, m: x.sum(), lambda x, y, m: jnp.sum(x)),
    Case("matmul", lambda x, y, m: x @ y, lambda x, y, m: x @ y),
    Case("add_ (in place)", _add_inplace, lambda x, y, m: x + y, chained=True),
    Case("view + mul", lambda x, y, m: x[:, ::2] * 2.0, lambda x, y, m: x[:, ::2] * 2.0),
]
SIZES = [64, 1024]


# ---- timing --------------------------------------------------------------------


def _loop(fn, x, y, mask, n, chained):
    if chained:
        for _ in range(n):
            x = fn(x, y, mask)
        return x
    out = None
    for _ in range(n):
        out = fn(x, y, mask)
    return out


class Runner:
    """One backend's way to run a case: its inputs, its callable and how to block."""

    def __init__(self, name, fn, inputs, block, chained):
        self.name, self.fn, self.inputs, self.block, self.chained = name, fn, inputs, block, chained

    def time_per_op(self, n: int) -> float:
        x, y, mask = self.inputs
        start = time.perf_counter()
        out = _loop(self.fn, x, y, mask, n, self.chained)
        self.block(out)
        return (time.perf_counter() - start) / n


def _block_tpu(out):
    torch.tpu.synchronize()


def _block_jax(out):
    out.block_until_ready()


def _block_none(out):
    pass  # CPU eager kernels finish before they return


def _inputs(size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, size), dtype=np.float32)
    y = rng.standard_normal((size, size), dtype=np.float32)
    return x, y, x > 0


def runners_for(case: Case, size: int, with_compile: bool) -> list[Runner]:
    x, y, mask = _inputs(size)
    cpu = tuple(torch.from_numpy(a.copy()) for a in (x, y, mask))
    tpu = tuple(t.to("tpu") for t in cpu)
    jitted = jax.jit(case.jax_fn)
    arrays = tuple(jnp.asarray(a) for a in (x, y, mask))
    runners = [
        Runner("tpu", case.torch_fn, tpu, _block_tpu, case.chained),
        Runner("jax", jitted, arrays, _block_jax, case.chained),
        Runner("cpu", case.torch_fn, cpu, _block_none, case.chained),
    ]
    if with_compile:
        runners.append(Runner("cpu inductor", torch.compile(case.torch_fn, backend="inductor"),
                              tuple(t.clone() for t in cpu), _block_none, case.chained))
    return runners


def measure(runners: list[Runner], repeats: int, target_s: float) -> dict[str, float]:
    """Median seconds per op for each runner, after warm-up and calibration."""
    counts = {}
    for r in runners:
        r.time_per_op(3)  # warm-up: compiles and caches
        once = r.time_per_op(3)
        counts[r.name] = max(5, min(2000, int(target_s / max(once, 1e-7))))
    samples = {r.name: [] for r in runners}
    for _ in range(repeats):
        for r in runners:  # take turns, so that load hits every backend alike
            samples[r.name].append(r.time_per_op(counts[r.name]))
    return {name: statistics.median(values) for name, values in samples.items()}


# ---- where one op's time goes ---------------------------------------------------


def breakdown(repeats: int, n: int = 5000) -> list[tuple[str, float]]:
    """``x + y`` at 64x64 on tpu, piece by piece (µs per op, the best of ``repeats`` loops): the
    executor's steps run in their order, each timed, on the op's real arguments; the rest of
    the whole op's time is PyTorch's dispatcher into our Python kernel and the kernel's entry."""
    from torchtpu.eager import executor, plan
    from torchtpu.eager.key import Call

    x, y = (torch.from_numpy(a).to("tpu") for a in _inputs(64)[:2])
    op_plan, args, kwargs = plan.plan_for(torch.ops.aten.add.Tensor), (x, y), {}
    x + y  # compiles the program
    clock = time.perf_counter

    def pieces_once():
        totals = [0.0] * 5
        for _ in range(n):
            t0 = clock()
            call = Call(op_plan, args, kwargs)
            t1 = clock()
            program = executor.PROGRAMS.get(call.key)
            t2 = clock()
            outs, _ = program(*[buf.value for buf, _ in call.storages])
            t3 = clock()
            result = executor._wrap(op_plan, program, outs, args, kwargs)
            t4 = clock()
            del result, outs
            t5 = clock()
            for i, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
                totals[i] += b - a
        torch.tpu.synchronize()
        return [t / n * 1e6 for t in totals]

    def whole_once():
        start = clock()
        for _ in range(n):
            x + y
        torch.tpu.synchronize()
        return (clock() - start) / n * 1e6

    pieces_once()
    whole = min(whole_once() for _ in range(repeats))
    best = min((pieces_once() for _ in range(repeats)), key=sum)
    names = ["key: describe the arguments (`key.Call`)", "find the program (`PROGRAMS.get`)",
             "run it: the jitted call in jax's 64-bit scope", "wrap the result in a new tensor (`_wrap`)",
             "free the result"]
    rows = [("the whole op, `x + y`", whole), *zip(names, best)]
    return rows + [("the rest: dispatcher and kernel entry", whole - sum(best))]


def breakdown_table(pieces) -> str:
    lines = ["| piece of `x + y` (64x64) | µs |", "|---|---|"]
    lines += [f"| {name} | {us:.1f} |" for name, us in pieces]
    return "\n".join(lines)


# ---- report --------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    case: str
    size: int
    us: dict  # backend -> microseconds per op

    @property
    def tpu_over_jax(self) -> float:
        return self.us["tpu"] / self.us["jax"]

    @property
    def tpu_over_cpu(self) -> float:
        return self.us["tpu"] / self.us["cpu"]


def table(rows: list[Row]) -> str:
    header = "| op | size | tpu µs | jax.jit µs | cpu µs | tpu/jax | tpu/cpu | goal ≤ 2.0x |"
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        ok = "yes" if r.tpu_over_jax <= GOAL else "no"
        lines.append(f"| {r.case} | {r.size}x{r.size} | {r.us['tpu']:.1f} | {r.us['jax']:.1f} | "
                     f"{r.us['cpu']:.1f} | {r.tpu_over_jax:.2f} | {r.tpu_over_cpu:.2f} | {ok} |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    lines = []
    for size in SIZES:
        ratios = [r.tpu_over_jax for r in rows if r.size == size]
        if ratios:
            geomean = math.exp(statistics.fmean(math.log(v) for v in ratios))
            met = sum(v <= GOAL for v in ratios)
            lines.append(f"- {size}x{size}: geometric mean tpu/jax = {geomean:.2f}x; "
                         f"{met} of {len(ratios)} ops within the {GOAL:.1f}x goal")
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores; "
            f"torch.tpu device: {torch.tpu.get_device_name()}; load average at start: {load}\n"
            f"- Versions: Python {platform.python_version()}, torch {torch.__version__}, "
            f"jax {importlib.metadata.version('jax')}, jaxlib {importlib.metadata.version('jaxlib')}, "
            f"torchtpu {torchtpu.__version__}; CPU PyTorch threads: {torch.get_num_threads()}")


def write_results(rows, compile_row, pieces, command, elapsed_s):
    compile_text = ""
    if compile_row is not None:
        name, size, us, cpu_us, note = compile_row
        compile_text = (f"\n### torch.compile (inductor) on CPU\n\n"
                        f"`{name}` at {size}x{size}: {us:.1f} µs/op compiled vs {cpu_us:.1f} µs/op eager CPU. {note}\n")
    write_section("eager_overhead.py", f"""## Eager per-op overhead

Wall time per op in µs (median of repeats; each repeat loops the op many
times and blocks once at the end).  **tpu** is torchtpu's strict eager
executor, **jax.jit** is the same math as one cached `jax.jit` call on jax
arrays (the peer: torchtpu issues one such call per op, so this is its
ceiling), **cpu** is PyTorch's own CPU eager kernel.  All float32.

Goal: tpu per-op time at most {GOAL:.1f}x the bare jax call.

{table(rows)}

Summary:
{summary(rows)}
{compile_text}
### Where one op's time goes

{breakdown_table(pieces)}

The bare `jax.jit` call is the ceiling's whole cost; ours adds the key, the
wrap and the dispatcher's trip into Python.  What bounds it: each piece is
already a handful of Python operations per argument (a storage lookup, the
view's size, stride, offset and dtype; a C++ tensor factory, a Buffer and a
weak reference per result), and the jitted call itself is jax's C++ fast
path.  Views (`x[:, ::2]`, `.t()`, `.view`) cost what they cost on CPU:
their kernels are PyTorch's own, registered in C++ (`csrc/native.cpp`).
Getting under 2x needs the key and the wrap in C++ as well.

### How this was measured

- Command: `{command}`
- Date: {datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}
- Machine: {machine()}
- Total benchmark time: {elapsed_s:.0f} s

The three backends take turns inside every repeat, so background load on
the machine affects them alike; the ratios are more trustworthy than the
absolute times.  At 64x64 the ops are tiny and the figures measure dispatch
overhead; at 1024x1024 compute starts to dominate.  On a machine shared
with other work, multi-threaded CPU PyTorch can collapse (its OpenMP
threads wait on each other for whole scheduler time slices), which is why
a run may pin it to one thread with `--cpu-threads 1`; XLA keeps its own
thread pool either way.
""")


# ---- main ----------------------------------------------------------------------


def _compile_case(repeats, target_s):
    """torch.compile(inductor) on CPU for one case; None if it fails on this machine."""
    case, size = CASES[0], 64
    try:
        start = time.perf_counter()
        runners = runners_for(case, size, with_compile=True)
        result = measure([runners[2], runners[3]], repeats, target_s)
        note = f"(Compiling and measuring took {time.perf_counter() - start:.0f} s in all.)"
        return case.name, size, result["cpu inductor"] * 1e6, result["cpu"] * 1e6, note
    except Exception as error:  # inductor needs a working C++ toolchain
        print(f"torch.compile(inductor) skipped: {type(error).__name__}: {error}", file=sys.stderr)
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats; do not write docs/benchmarks.md")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile(inductor) case")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="threads for CPU PyTorch (default: torch's own; 1 is steadier on a loaded machine)")
    args = parser.parse_args(argv)
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    repeats = args.repeats or (3 if args.quick else 7)
    target_s = 0.05 if args.quick else 0.15
    command = "python bench/eager_overhead.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()

    start = time.perf_counter()
    rows = []
    for size in SIZES:
        for case in CASES:
            result = measure(runners_for(case, size, with_compile=False), repeats, target_s)
            row = Row(case.name, size, {k: v * 1e6 for k, v in result.items()})
            rows.append(row)
            print(f"{case.name:>16} {size:>5}: tpu {row.us['tpu']:9.1f} µs  jax {row.us['jax']:9.1f} µs  "
                  f"cpu {row.us['cpu']:9.1f} µs  tpu/jax {row.tpu_over_jax:6.2f}  tpu/cpu {row.tpu_over_cpu:6.2f}",
                  flush=True)
    compile_row = None if args.no_compile else _compile_case(repeats, target_s)
    pieces = breakdown(repeats)
    elapsed = time.perf_counter() - start

    print()
    print(table(rows))
    print(summary(rows))
    if compile_row is not None:
        print(f"torch.compile(inductor) {compile_row[0]} {compile_row[1]}: {compile_row[2]:.1f} µs/op "
              f"(eager cpu {compile_row[3]:.1f} µs/op)")
    print(breakdown_table(pieces))
    if not args.quick:
        write_results(rows, compile_row, pieces, command, elapsed)
        print("wrote its section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
