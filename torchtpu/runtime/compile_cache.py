"""The compiled-program caches: counters, recompile logging, the disk cache, dumps.

Every executor asks its cache for a program before running it; a miss means
an XLA compile.  ``TORCHTPU_LOG_RECOMPILES=1`` logs each compile after a
graph's first, with what changed in its inputs.

``TORCHTPU_CACHE_DIR`` (or ``enable_disk_cache(path)``) keeps compiled
programs on disk with XLA's persistent compilation cache, so a new process
skips compiling what an earlier one compiled.  That cache is JAX's, so it
also serves the user's own JAX programs; it is only switched on when asked.
``TORCHTPU_DUMP_DIR`` writes the StableHLO of each compiled graph there.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import pathlib
import threading

import jax

log = logging.getLogger("torchtpu.recompiles")
_lock = threading.Lock()
_counts = {"requests": 0, "hits": 0, "misses": 0, "compile_seconds": 0.0, "donated_inputs": 0, "disk_hits": 0}
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
        _counts.update(requests=0, hits=0, misses=0, compile_seconds=0.0, donated_inputs=0, disk_hits=0)


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


# ---- on disk ------------------------------------------------------------------------------------------


def enable_disk_cache(directory) -> None:
    """Keep every compiled program in ``directory`` (XLA's persistent compilation cache)."""
    from jax._src import compilation_cache

    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # eager ops compile fast, and add up
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    compilation_cache.reset_cache()  # JAX decides once whether to use the cache; let it decide again


def _count_disk_hits(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        with _lock:
            _counts["disk_hits"] += 1


_dump_serial = itertools.count()


def dump(name: str, lowered) -> None:
    """Write a lowered program's StableHLO to ``TORCHTPU_DUMP_DIR``, if it is set."""
    directory = os.environ.get("TORCHTPU_DUMP_DIR")
    if not directory:
        return
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{next(_dump_serial):05d}-{name}.stablehlo.mlir").write_text(lowered.as_text())


def configure_from_env() -> None:
    jax.monitoring.register_event_listener(_count_disk_hits)
    if os.environ.get("TORCHTPU_CACHE_DIR"):
        enable_disk_cache(os.environ["TORCHTPU_CACHE_DIR"])
