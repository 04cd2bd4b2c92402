"""``torchtpu tune plan``: rank sharding plans for a model on N chips, print the launch settings and the
scaling curve.

    torchtpu tune plan --model qwen3-235b-a22b --chips v7x:8192 --batch 8192 --seq 4096

The model is a built-in name, a config.json, or a Hugging Face id in the local cache (``plan_model``); each
plan's memory, compute and communication come from ``plan_cost`` (collectives from ``plan_comm``), the search
and the scaling curve from ``plan_search``, the launch settings from ``plan_launch``.  docs/tune-plan.md
explains the model and how accurate it measured.  The library entry point is ``plan(...)``.
"""

from __future__ import annotations

import json
import sys

GIB = 2**30


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True,
                        help="built-in name (qwen3-235b-a22b, qwen3-30b-a3b, llama3-8b, tiny), a config.json, "
                             "or a Hugging Face id already in the local cache")
    parser.add_argument("--chips", required=True, help="GENERATION:COUNT, e.g. v7x:8192, v5p:256, host:4")
    parser.add_argument("--batch", type=int, default=0, help="global batch in sequences (default: one per chip)")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (default 4096)")
    parser.add_argument("--slice-chips", type=int, default=0,
                        help="chips per ICI slice; more chips are joined over DCN (default: the largest slice)")
    parser.add_argument("--top", type=int, default=5, help="how many plans to print (default 5)")
    parser.add_argument("--ac", choices=["none", "selective", "full"], action="append",
                        help="activation checkpointing modes to consider (repeatable; default all)")
    parser.add_argument("--max-tp", type=int, default=16)
    parser.add_argument("--max-cp", type=int, default=8)
    parser.add_argument("--max-pp", type=int, default=8)
    parser.add_argument("--memory-reserve", type=float, default=0.1, help="share of HBM kept free (default 0.1)")
    parser.add_argument("--matmul-efficiency", type=float, default=0.85,
                        help="the best fraction of peak a large matmul reaches (default 0.85)")
    parser.add_argument("--plot", default="tune-plan-scaling.png", help="where to write the scaling plot (PNG)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling curve and its plot")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


class PlanError(ValueError):
    """A request the planner cannot serve, said plainly."""


def parse_chips(spec: str):
    """"v7x:8192" -> (Chip, 8192); a PlanError naming the problem otherwise."""
    from .chips import chip

    name, _, count = spec.partition(":")
    if not count.strip().isdigit() or int(count) < 1:
        raise PlanError(f"--chips {spec!r}: expected GENERATION:COUNT with a positive count, e.g. v7x:8192")
    try:
        return chip(name), int(count)
    except ValueError as error:
        raise PlanError(f"--chips {spec!r}: {error}") from None


def plan(model, chips: str, batch: int = 0, seq: int = 4096, slice_chips: int = 0, ac_modes=None,
         max_tp: int = 16, max_cp: int = 8, max_pp: int = 8, memory_reserve: float = 0.1,
         matmul_efficiency: float = 0.85):
    """Search every plan for ``model`` (a ModelSpec or anything ``plan_model.load`` takes) on ``chips``
    ("v7x:8192"); returns a ``plan_search.SearchResult`` (``.ranked``, ``.best``, ``.rejected``)."""
    from . import plan_cost, plan_model, plan_search

    if seq < 1 or batch < 0:
        raise PlanError(f"--seq must be positive and --batch not negative (got seq {seq}, batch {batch})")
    spec = model if isinstance(model, plan_model.ModelSpec) else plan_model.load(model)
    chip, count = parse_chips(chips)
    work = plan_cost.Workload(spec, chip, count, batch or count, seq, slice_chips, memory_reserve,
                              matmul_efficiency)
    limits = plan_search.Limits(max_tp, max_cp, max_pp, ac_modes=tuple(ac_modes or plan_cost.AC_MODES))
    return plan_search.search(work, limits)


# -- output -------------------------------------------------------------------------------------------------

def plans_table(ranked, top: int) -> str:
    lines = [f"{'#':>2}  {'mesh':<28} {'micro':>5} {'AC':<9} {'GiB/chip':>8} {'compute s':>9} {'comm s':>8} "
             f"{'bubble s':>8} {'step s':>8} {'tokens/s':>12} {'MFU':>6}"]
    for i, e in enumerate(ranked[:top], 1):
        lines.append(f"{i:>2}  {e.layout.describe():<28} {e.layout.micro_batch:>5} {e.layout.ac:<9} "
                     f"{e.memory_total / GIB:>8.1f} {e.compute_s:>9.3f} {e.exposed_comm_s:>8.3f} "
                     f"{e.bubble_s:>8.3f} {e.step_s:>8.3f} {e.tokens_per_s:>12,.0f} {e.mfu:>6.1%}")
    return "\n".join(lines)


def breakdown(best) -> str:
    memory = ", ".join(f"{name} {value / GIB:.1f}" for name, value in best.memory.items())
    lines = [f"memory per chip (GiB): {memory}; total {best.memory_total / GIB:.1f} of "
             f"{best.memory_limit / GIB:.1f} usable",
             f"{'collective':<40} {'axis':<6} {'MB/call':>9} {'calls':>7} {'ICI ms':>8} {'DCN ms':>8} "
             f"{'total s':>8}  overlap"]
    for c in best.collectives:
        lines.append(f"{c.name:<40} {c.axis:<6} {c.nbytes / 1e6:>9.2f} {c.count:>7.0f} {c.ici_s * 1e3:>8.3f} "
                     f"{c.dcn_s * 1e3:>8.3f} {c.total_s:>8.3f}  {'hidden by compute' if c.hidden else 'exposed'}")
    return "\n".join(lines)


def rejected_summary(result) -> str:
    lines = [f"rejected {sum(result.rejected.values())} of {result.evaluated} plans:"]
    for kind, count in result.rejected.most_common():
        example = result.examples[kind].layout
        lines.append(f"  {count:>6}  {result.examples[kind].rejected}  (e.g. {example.describe()}, micro-batch "
                     f"{example.micro_batch}, AC {example.ac})")
    return "\n".join(lines)


def scaling_table(rows) -> str:
    lines = [f"{'chips':>6} {'batch':>7} {'best plan':<28} {'tokens/s':>14} {'MFU':>6} {'efficiency':>10}"]
    for r in rows:
        if r["plan"] is None:
            lines.append(f"{r['chips']:>6} {r['global_batch']:>7} {'(no plan fits)':<28}")
            continue
        lines.append(f"{r['chips']:>6} {r['global_batch']:>7} {r['plan']:<28} {r['tokens_per_s']:>14,.0f} "
                     f"{r['mfu']:>6.1%} {r['efficiency']:>10.1%}")
    return "\n".join(lines)


def write_plot(rows, path: str, title: str) -> str:
    """The scaling curve as a PNG: throughput against chips (with the linear ideal) and efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fitted = [r for r in rows if r["plan"]]
    chips = [r["chips"] for r in fitted]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if fitted:
        base = fitted[0]["tokens_per_s"] / fitted[0]["chips"]
        left.loglog(chips, [r["tokens_per_s"] for r in fitted], "o-", base=2, label="predicted")
        left.loglog(chips, [base * c for c in chips], "--", base=2, label="linear")
        right.semilogx(chips, [100 * r["efficiency"] for r in fitted], "o-", base=2, label="scaling efficiency")
        right.semilogx(chips, [100 * r["mfu"] for r in fitted], "s-", base=2, label="MFU")
    left.set(xlabel="chips", ylabel="tokens / s", title="throughput")
    right.set(xlabel="chips", ylabel="%", title="efficiency", ylim=(0, 110))
    for axes in (left, right):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def to_json(result, top: int, rows, launch) -> dict:
    import dataclasses

    def plan_json(e):
        return {"layout": dataclasses.asdict(e.layout), "mesh": e.layout.describe(),
                "memory_bytes": e.memory, "memory_total_bytes": e.memory_total, "compute_s": e.compute_s,
                "exposed_comm_s": e.exposed_comm_s, "bubble_s": e.bubble_s, "step_s": e.step_s,
                "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
                "collectives": [dict(dataclasses.asdict(c), total_s=c.total_s) for c in e.collectives]}

    work = result.work
    return {"model": dataclasses.asdict(work.model), "params": work.model.params(),
            "active_params": work.model.active_params(), "chip": dataclasses.asdict(work.chip),
            "chips": work.chips, "global_batch": work.global_batch, "seq": work.seq,
            "slice_chips": work.slice_size, "evaluated": result.evaluated,
            "plans": [plan_json(e) for e in result.ranked[:top]],
            "rejected": {kind: {"count": n, "example": result.examples[kind].rejected}
                         for kind, n in result.rejected.items()},
            "launch": launch, "scaling": rows}


def print_report(result, launch, rows, plot, top: int) -> None:
    from . import plan_launch

    work, best = result.work, result.best
    print(f"{work.model.name}: {work.model.params() / 1e9:.2f} B parameters, {work.model.active_params() / 1e9:.2f} B "
          f"active; {work.chips} x {work.chip.name} ({work.slice_size} per ICI slice), global batch "
          f"{work.global_batch} x {work.seq} tokens")
    print(plans_table(result.ranked, top) if best else "no plan fits")
    if result.rejected:
        print(rejected_summary(result))
    if best:
        print(f"\nbest plan: {best.layout.describe()}, micro-batch {best.layout.micro_batch}, AC {best.layout.ac}")
        print(breakdown(best))
        print("\n" + plan_launch.describe(launch))
    if rows:
        print("\nscaling (batch per chip held):\n" + scaling_table(rows))
        print(f"plot: {plot}")


def run(args) -> int:
    from . import plan_launch, plan_model, plan_search

    try:
        result = plan(args.model, args.chips, args.batch, args.seq, args.slice_chips, args.ac, args.max_tp,
                      args.max_cp, args.max_pp, args.memory_reserve, args.matmul_efficiency)
    except (PlanError, plan_model.ModelConfigError, ValueError) as error:
        print(f"torchtpu tune plan: error: {error}", file=sys.stderr)
        return 2
    work, best = result.work, result.best
    launch = plan_launch.settings(work, best.layout) if best else None
    rows = [] if args.no_scaling else plan_search.scaling_curve(work, result.limits)
    plot = None
    if rows and args.plot:
        plot = write_plot(rows, args.plot, f"{work.model.name} on {work.chip.name}, "
                                           f"{work.global_batch / work.chips:g} seq/chip x {work.seq}")
    if args.json:
        document = dict(to_json(result, args.top, rows, launch), plot=plot)
        print(json.dumps(document, indent=1, default=str))
    else:
        print_report(result, launch, rows, plot, args.top)
    return 0 if best else 1
