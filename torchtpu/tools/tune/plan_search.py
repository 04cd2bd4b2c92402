"""Search the plans for a workload, rank them by predicted MFU, and sweep the chip count (the scaling curve)."""

from __future__ import annotations

import collections
import dataclasses
import math

from . import plan_cost
from .plan_cost import Estimate, Layout, Workload


@dataclasses.dataclass(frozen=True)
class Limits:
    """How wide the search goes; each axis's degree is a divisor of the chip count up to its cap."""

    max_tp: int = 16
    max_cp: int = 8
    max_pp: int = 8
    max_micro_batch: int = 16
    max_dp_per_slice: int = 8  # data replication beyond a few copies per slice only adds all-reduce traffic
    ac_modes: tuple = plan_cost.AC_MODES


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _capped(n: int, cap: int) -> list[int]:
    return [d for d in divisors(n) if d <= cap]


def layouts(work: Workload, limits: Limits = Limits()):
    """Every layout worth estimating: axes that divide the chip count, experts, batch and micro-batch."""
    model, n = work.model, work.chips
    max_dp = limits.max_dp_per_slice * math.ceil(n / work.slice_size)
    for tp in _capped(n, limits.max_tp):
        for cp in _capped(n // tp, limits.max_cp):
            for pp in _capped(n // (tp * cp), min(limits.max_pp, model.layers)):
                data = n // (tp * cp * pp)
                if work.global_batch % data:
                    continue
                local = work.global_batch // data
                for dp in _capped(data, max_dp):
                    fsdp = data // dp
                    shard_ways = fsdp * cp * tp
                    eps = divisors(math.gcd(model.experts, shard_ways)) if model.is_moe else [1]
                    micros = [mb for mb in divisors(local) if mb <= limits.max_micro_batch
                              and (pp == 1 or local // mb >= pp)]  # a pipeline needs a micro-batch per stage
                    for ep in eps:
                        for mb in micros:
                            for ac in limits.ac_modes:
                                yield Layout(dp, fsdp, cp, tp, pp, ep, mb, ac)


@dataclasses.dataclass
class SearchResult:
    work: Workload
    ranked: list  # Estimates that fit, best MFU first
    rejected: collections.Counter  # reason (its first words) -> how many plans
    examples: dict  # reason kind -> one full rejected Estimate
    evaluated: int
    limits: Limits = Limits()

    @property
    def best(self) -> Estimate | None:
        return self.ranked[0] if self.ranked else None


def _reason_kind(reason: str) -> str:
    return reason.split(":")[0]


def rank(estimates) -> list[Estimate]:
    """Plans that fit, by predicted MFU, then the smaller memory footprint."""
    return sorted((e for e in estimates if e.fits), key=lambda e: (-e.mfu, e.memory_total))


def search(work: Workload, limits: Limits = Limits()) -> SearchResult:
    fitting, rejected, examples, evaluated = [], collections.Counter(), {}, 0
    fitted = set()  # (axes, micro-batch) that fit with less checkpointing: more would only add compute
    for layout in layouts(work, limits):
        key = dataclasses.replace(layout, ac="")
        if key in fitted:
            continue
        estimate = plan_cost.estimate(work, layout)
        evaluated += 1
        if estimate.fits:
            fitting.append(estimate)
            fitted.add(key)
        else:
            kind = _reason_kind(estimate.rejected)
            rejected[kind] += 1
            examples.setdefault(kind, estimate)
    return SearchResult(work, rank(fitting), rejected, examples, evaluated, limits)


def scaling_counts(chips: int) -> list[int]:
    counts = [1 << i for i in range(chips.bit_length()) if 1 << i <= chips]
    return counts if counts[-1] == chips else counts + [chips]


def scaling_curve(work: Workload, limits: Limits = Limits()) -> list[dict]:
    """The best plan at 1, 2, 4, ... chips with the batch per chip held (weak scaling, as pods are used)."""
    rows = []
    for count in scaling_counts(work.chips):
        batch = max(1, round(work.global_batch * count / work.chips))
        best = search(dataclasses.replace(work, chips=count, global_batch=batch), limits).best
        rows.append({"chips": count, "global_batch": batch, "plan": best.layout.describe() if best else None,
                     "tokens_per_s": best.tokens_per_s if best else 0.0, "mfu": best.mfu if best else 0.0})
    reference = next((r for r in rows if r["tokens_per_s"]), None)
    for row in rows:
        per_chip_ref = reference["tokens_per_s"] / reference["chips"] if reference else 0.0
        row["efficiency"] = row["tokens_per_s"] / row["chips"] / per_chip_ref if per_chip_ref else 0.0
    return rows
