"""Counters of the compiled-program caches, and recompile logging.

Every executor asks its cache for a program before running it; a miss means
an XLA compile.  ``TORCHTPU_LOG_RECOMPILES=1`` logs each compile after a
graph's first, with what changed in its inputs.
"""

from __future__ import annotations

import collections
import logging
import os
import threading

log = logging.getLogger("torchtpu.recompiles")
_lock = threading.Lock()
_counts = {"requests": 0, "hits": 0, "misses": 0, "compile_seconds": 0.0, "donated_inputs": 0}
graph_fallbacks = collections.Counter()  # why a compiled graph runs op by op instead -> count


def record_hit() -> None:
    with _lock:
        _counts["requests"] += 1
        _counts["hits"] += 1


def record_miss(seconds: float) -> None:
    with _lock:
        _counts["requests"] += 1
        _counts["misses"] += 1
        _counts["compile_seconds"] += seconds


def record_donations(count: int) -> None:
    with _lock:
        _counts["donated_inputs"] += count


def stats() -> dict:
    with _lock:
        return dict(_counts)


def reset() -> None:
    with _lock:
        _counts.update(requests=0, hits=0, misses=0, compile_seconds=0.0, donated_inputs=0)


def log_recompiles() -> bool:
    return os.environ.get("TORCHTPU_LOG_RECOMPILES", "0") not in ("", "0", "false", "False")


def describe_change(old: tuple, new: tuple) -> str:
    """Why a graph recompiled: which of its inputs (shape, dtype) or settings changed, and how.

    A signature is ``(inputs, settings)``, each a tuple."""
    (old_inputs, old_settings), (new_inputs, new_settings) = old, new
    if len(old_inputs) != len(new_inputs):
        return f"the number of inputs changed from {len(old_inputs)} to {len(new_inputs)}"
    changes = [f"input {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(old_inputs, new_inputs)) if a != b]
    changes += [f"setting {a} -> {b}" for a, b in zip(old_settings, new_settings) if a != b]
    return "; ".join(changes) or "unknown"
