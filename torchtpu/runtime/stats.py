"""Counters a user can read to see what the backend did: compiles, host syncs, fallbacks, graph breaks."""

import collections

compiles = collections.Counter()  # op -> programs compiled
host_syncs = collections.Counter()  # reason -> count
cpu_fallbacks = collections.Counter()  # op -> calls run on the host
graph_breaks = collections.Counter()  # fused mode: cause -> pending graphs run
fused = collections.Counter()  # fused mode: graphs compiled / run, cache hits, ops fused, buffers donated


def reset() -> None:
    for counter in (compiles, host_syncs, cpu_fallbacks, graph_breaks, fused):
        counter.clear()
