"""Check the planner's communication model against collectives measured with the tpu c10d backend.

The "host" pseudo-chip is this machine with one process per chip.  Calibration: for each collective,
2 processes at three sizes give the latency per call (alpha) and the bandwidth (beta) of the alpha-beta
model in ``torchtpu/tools/tune/plan_comm.py``.  Prediction: the same model and constants at the other sizes
and at 4 processes.
Measurement: ``bench/collectives.py``'s worker (its "tpu" peer: ``dist.all_reduce`` etc. on tpu tensors).

    .venv/bin/python bench/tune_comm.py            # 2 and 4 processes; writes docs/benchmarks.md
    .venv/bin/python bench/tune_comm.py --quick    # 2 processes, 3 sizes; writes nothing
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import collectives
import results

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torchtpu.tools.tune import chips, plan_comm  # noqa: E402  (the repository root, added above)

SIZES = [4 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20]
FIT_SIZES = (4 << 10, 256 << 10, 64 << 20)  # 2 processes; 4 MB and 16 MB and every 4-process row are held out
QUICK_SIZES = [4 << 10, 1 << 20, 16 << 20]
TOLERANCE = 0.30


def fit(rows: list[dict], cores: int) -> chips.Chip:
    """alpha (per call) and beta (bandwidth) minimising the squared relative error over ``rows``: a linear
    least-squares problem in (alpha, 1/beta), since each row says alpha + moved / beta = measured."""
    a = [(1 / r["tpu"], plan_comm.bytes_moved(r["collective"], r["n"], r["bytes"]) / r["tpu"]) for r in rows]
    s11, s12, s22 = (sum(x * x for x, _ in a), sum(x * y for x, y in a), sum(y * y for _, y in a))
    b1, b2 = sum(x for x, _ in a), sum(y for _, y in a)
    det = s11 * s22 - s12 * s12
    alpha, inverse_bandwidth = (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det
    if alpha < 0 or inverse_bandwidth <= 0:  # noise made the exact solution unphysical: the floor instead
        alpha = min(r["tpu"] for r in rows)
        inverse_bandwidth = max(max((r["tpu"] - alpha) / plan_comm.bytes_moved(r["collective"], r["n"], r["bytes"])
                                    for r in rows), 1e-12)
    return chips.calibrated_host(alpha, 1 / inverse_bandwidth, cores)


def is_fit_point(row: dict, fit_sizes, collective: str | None = None) -> bool:
    """Whether ``row`` was used to fit (``collective``'s fit, or the row's own collective's)."""
    return row["n"] == 2 and row["bytes"] in fit_sizes and row["collective"] == (collective or row["collective"])


def predict(rows: list[dict], fit_sizes, cores: int) -> tuple[list[dict], dict]:
    """Each row with two predictions: "host", the host pseudo-chip (all_reduce's alpha and beta for every
    collective), and "own", the alpha and beta fitted to the row's own collective."""
    fits = {c: fit([r for r in rows if is_fit_point(r, fit_sizes, c)], cores) for c in collectives.COLLECTIVES}
    for r in rows:
        r["fit_host"] = is_fit_point(r, fit_sizes, "all_reduce")
        r["fit_own"] = is_fit_point(r, fit_sizes)
        r["host"] = plan_comm.flat_time(r["collective"], r["bytes"], r["n"], fits["all_reduce"])
        r["own"] = plan_comm.flat_time(r["collective"], r["bytes"], r["n"], fits[r["collective"]])
    return rows, fits


def measure(procs: list[int], sizes, repeats: int, runs: int) -> list[dict]:
    """bench/collectives.py's rows, each the fastest of ``runs`` runs' medians.  The process counts take
    turns run by run, so that load from other jobs on this shared machine falls on both alike; that load
    only ever adds time, hence the fastest."""
    best = {}
    for _ in range(runs):
        for nprocs in procs:
            for row in collectives.run(nprocs, sizes, repeats, timeout=1800):
                key = (row["collective"], row["bytes"], row["n"])
                if key not in best or row["tpu"] < best[key]["tpu"]:
                    best[key] = row
    return sorted(best.values(), key=lambda r: (r["n"], collectives.COLLECTIVES.index(r["collective"]), r["bytes"]))


def _error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def _cell(row: dict, key: str) -> str:
    fitted = " (fit)" if row[f"fit_{key}"] else ""
    return f"{row[key] * 1e3:.2f}{fitted} | {_error(row[key], row['tpu']):+.0%}"


def table(rows: list[dict]) -> str:
    lines = ["| processes | collective | size | measured (ms) | host model (ms) | error | own collective's fit (ms) "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['collective']} | {collectives._size(r['bytes'])} | {r['tpu'] * 1e3:.2f} | "
                     f"{_cell(r, 'host')} | {_cell(r, 'own')} |")
    return "\n".join(lines)


def fits_table(fits: dict) -> str:
    lines = ["| collective | alpha: latency per call (ms) | beta: bandwidth per process (GB/s) |", "|---|---|---|"]
    for name, host in fits.items():
        lines.append(f"| {name} | {host.call_latency * 1e3:.2f} | {host.ici_bandwidth / 1e9:.2f} |")
    return "\n".join(lines)


def accuracy(rows: list[dict], key: str) -> str:
    held_out = [r for r in rows if not r[f"fit_{key}"]]
    inside = [r for r in held_out if abs(_error(r[key], r["tpu"])) <= TOLERANCE]
    large = [r for r in held_out if r["bytes"] >= 4 << 20]
    large_inside = [r for r in large if abs(_error(r[key], r["tpu"])) <= TOLERANCE]
    return (f"{len(inside)} of {len(held_out)} predicted rows within ±{TOLERANCE:.0%} "
            f"({len(large_inside)} of {len(large)} at 4 MB and above)")


def process_scaling(rows: list[dict]) -> str:
    """From 2 to 4 processes at the bandwidth-bound sizes: the ring factor the TPU predictions rest on."""
    by_key = {(r["collective"], r["bytes"], r["n"]): r for r in rows}
    lines = ["| collective | size | measured 4 / 2 processes | model 4 / 2 processes | error |", "|---|---|---|---|---|"]
    for (collective, nbytes, n), four in by_key.items():
        two = by_key.get((collective, nbytes, 2))
        if n != 4 or two is None or nbytes < 4 << 20:
            continue
        measured, model = four["tpu"] / two["tpu"], four["host"] / two["host"]
        lines.append(f"| {collective} | {collectives._size(nbytes)} | {measured:.2f} | {model:.2f} | "
                     f"{_error(model, measured):+.0%} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    return (f"Host model (all_reduce's alpha and beta for every collective): {accuracy(rows, 'host')}. "
            f"Each collective's own alpha and beta: {accuracy(rows, 'own')}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--runs", type=int, default=3, help="measure this many times, keep each row's fastest")
    parser.add_argument("--procs", default="2,4")
    parser.add_argument("--quick", action="store_true", help="2 processes, 3 sizes, 3 repeats; writes nothing")
    args = parser.parse_args()
    sizes, fit_sizes = (QUICK_SIZES, (QUICK_SIZES[0], QUICK_SIZES[-1])) if args.quick else (SIZES, FIT_SIZES)
    if args.quick:
        args.repeats, args.procs, args.runs = 3, "2", 1
    started, cores = time.time(), len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    rows = measure([int(n) for n in args.procs.split(",")], sizes, args.repeats, args.runs)
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    rows, fits = predict(rows, fit_sizes, cores)
    text = "\n\n".join([fits_table(fits), table(rows), summary(rows), process_scaling(rows), load])
    print(text)
    if args.quick:
        return
    import jax
    import torch

    results.write_section("tune_comm.py", "\n\n".join([
        "## The planner's communication model against measured collectives (`torchtpu tune plan`)",
        "The alpha-beta ring model of `torchtpu/tools/tune/plan_comm.py` on the \"host\" pseudo-chip (one process "
        "per chip, the tpu c10d backend, JAX's gloo transport): one alpha (latency per call) and one beta "
        "(bandwidth per process), fitted by least squares on the relative error to the 2-process all_reduce "
        "calls at 4 KB, 256 KB and 64 MB (marked \"fit\"). Every other value is a prediction: the other "
        f"collectives, 4 MB and 16 MB, and 4 processes at every size (on this machine's {cores} cores, where "
        "the model stretches the latency by processes / cores). The last columns fit each "
        "collective to its own 2-process calls instead. "
        f"Each row is the fastest of {args.runs} runs' medians. docs/tune-plan.md discusses the result.",
        fits_table(fits), table(rows), summary(rows),
        "From 2 to 4 processes at 4 MB and above: the model's ratio is the ring's bytes moved, (n-1)/n "
        "(2(n-1)/n for all_reduce):", process_scaling(rows),
        results.how_measured("python bench/tune_comm.py", started, "XLA CPU, one process per device",
                             f"torch {torch.__version__}, jax {jax.__version__}",
                             [f"{args.repeats} repeats per size (median, rank 0), measured by "
                              f"bench/collectives.py's worker; the fastest of {args.runs} such runs, 2 and 4 processes "
                              f"taking turns", f"Machine load (1-minute): {load}", "The machine was shared with other jobs: "
                              "latency-bound rows (below ~1 MB) swing by several milliseconds run to run"]),
    ]))


if __name__ == "__main__":
    main()
