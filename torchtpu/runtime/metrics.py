"""Counters a user can read to see what the backend did: ``torch.tpu.metrics()``.

Every counter lives here and nowhere else; the older ``torch.tpu.*_stats()``
functions are views of these.  Counters only grow until ``reset()``.
"""

from __future__ import annotations

import collections
import threading

_lock = threading.Lock()

compiles = collections.Counter()  # what was compiled (an op, "fused graph", "compiled graph forward") -> programs
host_syncs = collections.Counter()  # reason -> count
cpu_fallbacks = collections.Counter()  # op -> calls run on the host
host_runs = collections.Counter()  # op -> calls of a shape with no program yet, run on the host (eager/host_tier.py)
graph_breaks = collections.Counter()  # fused mode: cause -> pending graphs run
fused = collections.Counter()  # fused mode: graphs compiled / run, cache hits, ops fused, buffers donated
graph_fallbacks = collections.Counter()  # why a compiled graph runs op by op instead -> count
cache_evictions = collections.Counter()  # bounded cache name -> programs evicted
compile_cache = collections.Counter()  # compiled graphs: requests, hits, misses, compile_seconds, donated_inputs, disk_hits

_COUNTERS = {
    "compiles": compiles,
    "host_syncs": host_syncs,
    "cpu_fallbacks": cpu_fallbacks,
    "host_runs": host_runs,
    "graph_breaks": graph_breaks,
    "fused": fused,
    "graph_fallbacks": graph_fallbacks,
    "cache_evictions": cache_evictions,
    "compile_cache": compile_cache,
}
_COMPILE_CACHE_KEYS = ("requests", "hits", "misses", "compile_seconds", "donated_inputs", "disk_hits")


# While `torchtpu tune analyze` runs: called as listener(event, detail) for each event that
# costs time (a host sync, a CPU fallback, an eager op, a fused-graph break, a new compiled graph).
listener = None


def count(counter: collections.Counter, key, amount=1) -> None:
    """Add to a counter from any thread (the compile path runs on autograd's threads too)."""
    with _lock:
        counter[key] += amount


def record(counter: collections.Counter, key, event: str) -> None:
    """Count ``key`` and tell the listener, if one runs, that ``event`` happened."""
    count(counter, key)
    tell(event, key)


def tell(event: str, detail) -> None:
    if listener is not None:
        listener(event, detail)


def compile_cache_stats() -> dict:
    with _lock:
        return {key: compile_cache.get(key, 0.0 if key == "compile_seconds" else 0) for key in _COMPILE_CACHE_KEYS}


def snapshot() -> dict:
    """A copy of every counter, plus the totals a dashboard wants first."""
    with _lock:
        # Copies that still answer 0 for a key never counted, as the live counters do.
        result = {name: collections.Counter(counter) for name, counter in _COUNTERS.items()}
    result["compile_cache"] = compile_cache_stats()
    result["totals"] = {
        "programs_compiled": sum(compiles.values()),
        "cache_hits": result["compile_cache"]["hits"] + fused.get("graph cache hits", 0),
        "host_syncs": sum(host_syncs.values()),
        "cpu_fallbacks": sum(cpu_fallbacks.values()),
        "host_runs": sum(host_runs.values()),
        "graph_breaks": sum(graph_breaks.values()),
        "donated_buffers": result["compile_cache"]["donated_inputs"] + fused.get("buffers donated", 0),
        "cache_evictions": sum(cache_evictions.values()),
    }
    return result


def reset(*names) -> None:
    """Zero the named counters ("compiles", "fused", ...), or all of them."""
    with _lock:
        for name in names or _COUNTERS:
            _COUNTERS[name].clear()
