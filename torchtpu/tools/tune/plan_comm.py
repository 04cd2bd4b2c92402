"""Communication time of one collective over a group of chips: alpha-beta, ring algorithms on a torus.

A group is a contiguous block of the device layout: ``stride`` chips apart (the product of the mesh axes
inside it) and ``size`` chips long.  Chips are laid out slice by slice, each slice a torus whose dimensions
are filled innermost first, so the block's position says which torus dimensions its ring runs over (more
dimensions, more links, more bandwidth) and whether it leaves the slice (then the outer part runs over DCN).

Time = call latency + ring steps x step latency + bytes moved / bandwidth.  Per-chip data sizes follow NCCL's convention: ``nbytes`` is the larger side (the all-gather's output, the
reduce-scatter's input, the all-reduce's buffer).  Ring algorithms move, per chip:

- all-reduce: 2(n-1)/n * nbytes in 2(n-1) steps;
- all-gather, reduce-scatter: (n-1)/n * nbytes in n-1 steps;
- all-to-all: (n-1)/n * nbytes, but on a ring the average message crosses n/4 links, so bandwidth-bound
  time grows with the ring's length: (n-1)/n * nbytes * max(1, longest dimension / 4) / bandwidth.  Its
  group is assumed placed as a compact sub-torus (16 chips as 4x4, not 16x1), as device-mesh builders do
  for the axis that talks most.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .chips import Chip

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bytes_moved(kind: str, n: int, nbytes: float) -> float:
    """Bytes each chip sends for one collective of ``kind`` over ``n`` chips (the bus-bandwidth factor)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if kind == "send_recv":
        return nbytes
    return (n - 1) / n * nbytes


def ring_steps(kind: str, n: int) -> int:
    if n <= 1:
        return 0
    return {"all_reduce": 2 * (n - 1), "send_recv": 1}.get(kind, n - 1)


@functools.lru_cache(maxsize=None)
def torus_shape(chips: int, dims: int) -> tuple[int, ...]:
    """A slice of ``chips`` as ``dims`` torus dimensions, as even as the prime factors allow (8192 -> 16x16x32)."""
    shape = [1] * max(dims, 1)
    for prime in sorted(_prime_factors(chips), reverse=True):
        shape[shape.index(min(shape))] *= prime
    return tuple(sorted(shape))


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


@dataclasses.dataclass(frozen=True)
class Span:
    """Where a group lies: its extent in each torus dimension inside a slice, and how many slices it spans."""

    ici_extents: tuple[int, ...]  # one entry per torus dimension the group's ring runs along (extent > 1)
    dcn_size: int  # slices the group spans (1: all inside one slice)

    @property
    def ici_size(self) -> int:
        return math.prod(self.ici_extents)


@functools.lru_cache(maxsize=None)
def span(stride: int, size: int, slice_chips: int, shape: tuple[int, ...]) -> Span:
    """The torus dimensions and slices that the block [stride, stride * size) of the layout covers."""
    inside = max(1, min(size, slice_chips // stride)) if stride < slice_chips else 1
    dcn = size // inside
    extents, first, last = [], stride, stride * inside  # the block in "cumulative product" coordinates
    cumulative = 1
    for extent in shape:
        low, high = max(first, cumulative), min(last, cumulative * extent)
        if high > low:
            extents.append(round(high / low))
        cumulative *= extent
    return Span(tuple(e for e in extents if e > 1), dcn)


@functools.lru_cache(maxsize=4096)
def ici_time(kind: str, nbytes: float, extents: tuple[int, ...], chip: Chip) -> float:
    """One collective inside a slice: a ring per torus dimension touched, those dimensions' links in use."""
    n = math.prod(extents)
    if n <= 1:
        return 0.0
    if kind == "all_to_all":
        extents = tuple(e for e in torus_shape(n, chip.torus_dims) if e > 1)
    bandwidth = chip.ici_bandwidth * len(extents) / max(chip.torus_dims, 1)
    moved = bytes_moved(kind, n, nbytes)
    if kind == "all_to_all" and chip.ici_topology != "switch":
        moved *= max(1.0, max(extents) / 4)  # bisection: a torus ring carries messages n/4 hops on average
    steps = sum(ring_steps(kind, e) for e in extents)
    return steps * chip.ici_latency + moved / bandwidth


def dcn_time(kind: str, nbytes: float, slices: int, chip: Chip) -> float:
    if slices <= 1:
        return 0.0
    return ring_steps(kind, slices) * chip.dcn_latency + bytes_moved(kind, slices, nbytes) / chip.dcn_bandwidth


def call_latency(n: int, chip: Chip) -> float:
    """The fixed cost of one call; on the host, processes beyond its cores queue for one to run it."""
    if n <= 1:
        return 0.0
    return chip.call_latency * (max(1.0, n / chip.host_cores) if chip.host_cores else 1.0)


def collective_time(kind: str, nbytes: float, where: Span, chip: Chip) -> tuple[float, float]:
    """(ICI seconds, DCN seconds) of one collective.  A group spanning slices runs hierarchically: the ICI
    part on the whole buffer, then the DCN part on the 1/ici_size share each chip holds after it."""
    ici = ici_time(kind, nbytes, where.ici_extents, chip) + call_latency(where.ici_size * where.dcn_size, chip)
    dcn_share = nbytes / where.ici_size if kind in ("all_reduce", "reduce_scatter", "all_gather") else nbytes
    return ici, dcn_time(kind, dcn_share, where.dcn_size, chip)


def flat_time(kind: str, nbytes: float, n: int, chip: Chip) -> float:
    """One collective over ``n`` chips of one slice laid out along as many torus dimensions as it needs."""
    shape = torus_shape(max(n, 1), chip.torus_dims)
    ici, dcn = collective_time(kind, nbytes, span(1, n, max(n, 1), shape), chip)
    return ici + dcn
