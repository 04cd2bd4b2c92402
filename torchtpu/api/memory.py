"""``torch.tpu``'s memory functions, with CUDA's names.

PJRT reports real figures on TPU and GPU; on XLA's CPU backend, which
reports none, they come from torchtpu's accounting of live device buffers
(``runtime/memory.py``), and ``memory_stats()["source"]`` says which.
"""

from __future__ import annotations

import os

from ..runtime import memory
from ..runtime.device import runtime_memory_stats

def total_memory() -> int:
    runtime = runtime_memory_stats()
    if runtime and "bytes_limit" in runtime:
        return int(runtime["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def memory_allocated(device=None) -> int:
    runtime = runtime_memory_stats()
    return int(runtime["bytes_in_use"]) if runtime and "bytes_in_use" in runtime else memory.allocated_bytes


def max_memory_allocated(device=None) -> int:
    runtime = runtime_memory_stats()
    if runtime and "peak_bytes_in_use" in runtime:
        return int(runtime["peak_bytes_in_use"])
    return memory.peak_bytes


def memory_reserved(device=None) -> int:
    runtime = runtime_memory_stats()
    if runtime and "bytes_reserved" in runtime:
        return int(runtime["bytes_reserved"])
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max(memory_reserved(device), max_memory_allocated(device))


def memory_stats(device=None) -> dict:
    """CUDA's key names for the figures there are; "active" bytes are the allocated ones
    (XLA frees a buffer when its last tensor dies), and nothing retries or runs out silently."""
    allocated, peak = memory_allocated(device), max_memory_allocated(device)
    return {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": peak,
        "active_bytes.all.current": allocated,
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": memory_reserved(device),
        "reserved_bytes.all.peak": max_memory_reserved(device),
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "source": "pjrt" if runtime_memory_stats() else "torchtpu live-buffer accounting",
    }


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak()


def mem_get_info(device=None) -> tuple:
    total = total_memory()
    return (max(total - memory_reserved(device), 0), total)


def empty_cache() -> None:
    """Nothing to release: XLA frees a buffer as soon as its last tensor dies."""
