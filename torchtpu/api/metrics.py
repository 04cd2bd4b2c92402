"""``torch.tpu.metrics()``: what the backend did, in one place.

The ``*_stats()`` functions are older views of the same counters, kept for
programs that use them.
"""

from __future__ import annotations

from ..runtime import metrics as _metrics


def metrics() -> dict:
    """Every counter: ``compiles`` (by op or graph), ``compile_cache`` (requests, hits,
    misses, compile seconds, donated inputs, disk hits), ``host_syncs`` (by reason),
    ``cpu_fallbacks`` (by op), ``graph_breaks`` (fused mode, by cause), ``fused``
    (graphs compiled and run, cache hits, ops fused, buffers donated),
    ``graph_fallbacks`` (compiled graphs run op by op, by reason), ``cache_evictions``
    (by cache), and ``totals``."""
    return _metrics.snapshot()


def reset_metrics() -> None:
    """Zero every counter."""
    _metrics.reset()


def fallback_stats() -> dict:
    """How many times each op ran on the host through TORCHTPU_CPU_FALLBACK=1."""
    return metrics()["cpu_fallbacks"]


def compile_stats() -> dict:
    """How many programs were compiled for each op."""
    return metrics()["compiles"]


def host_sync_stats() -> dict:
    return metrics()["host_syncs"]


def compile_cache_stats() -> dict:
    """The compiled-graph caches: requests, hits, misses and seconds spent compiling."""
    return metrics()["compile_cache"]


def graph_break_stats() -> dict:
    """Fused mode: how many times the pending graph ran, by cause ("item", "print", "size limit", ...)."""
    return metrics()["graph_breaks"]


def fused_stats() -> dict:
    """Fused mode: graphs compiled and run, cache hits, ops fused, input buffers donated."""
    return metrics()["fused"]
