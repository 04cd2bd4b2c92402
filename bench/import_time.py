"""Import time: ``import torchtpu`` against its peer ``import torch, jax`` (what it cannot avoid), each in a new process.

torchtpu's own cost is the difference.  Each configuration runs in a fresh
interpreter, alternating, ``--runs`` times; the table gives medians.  With
``--ref`` a second checkout (``git worktree add /tmp/ref <commit>``) is
measured in the same run, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from results import how_measured, write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "import torch, jax (peer)": ("import torch, jax", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "import torchtpu": ("import torchtpu", {}),
}


def _seconds(code: str, env: dict, path: str) -> float:
    full_env = {**os.environ, **env, "PYTHONPATH": path}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=full_env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ref", help="another checkout of torchtpu to measure alongside (before/after)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    started = time.time()
    configs = dict(CONFIGS)
    paths = {name: ROOT for name in configs}
    if args.ref:
        configs["import torchtpu (ref)"] = CONFIGS["import torchtpu"]
        paths["import torchtpu (ref)"] = os.path.abspath(args.ref)
    times = {name: [] for name in configs}
    for _ in range(args.runs):  # take turns, so load drift falls on all alike
        for name, (code, env) in configs.items():
            times[name].append(_seconds(code, env, paths[name]))
    peer = statistics.median(times["import torch, jax (peer)"])
    rows = ["| configuration | median s | min s | over the peer s |", "|---|---|---|---|"]
    for name, samples in times.items():
        median = statistics.median(samples)
        rows.append(f"| {name} | {median:.2f} | {min(samples):.2f} | {median - peer:+.2f} |")
    text = "\n".join(["## Import time", "", *rows, "",
                      how_measured(f"python bench/import_time.py --runs {args.runs}" + (" --ref ..." if args.ref else ""),
                                   started, "none (import only)", f"python {sys.version.split()[0]}",
                                   ["Each figure is a new interpreter; torchtpu's cost is the difference to the peer."])])
    print(text)
    if not args.no_write:
        write_section("import_time.py", text)


if __name__ == "__main__":
    main()
