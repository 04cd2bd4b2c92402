"""Counters a user can read to see what the backend did: compiles, host syncs, fallbacks."""

import collections

compiles = collections.Counter()  # op -> programs compiled
host_syncs = collections.Counter()  # reason -> count
cpu_fallbacks = collections.Counter()  # op -> calls run on the host


def reset() -> None:
    for counter in (compiles, host_syncs, cpu_fallbacks):
        counter.clear()
