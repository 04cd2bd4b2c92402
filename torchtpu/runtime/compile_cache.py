"""Compiled programs across processes and for people: the disk cache, recompile logs, dumps.

``TORCHTPU_CACHE_DIR`` (or ``enable_disk_cache(path)``) keeps compiled
programs on disk with XLA's persistent compilation cache, so a new process
skips compiling what an earlier one compiled.  That cache is JAX's, so it
also serves the user's own JAX programs; it is only switched on when asked.
``TORCHTPU_LOG_RECOMPILES=1`` logs each compile of a graph after its first,
with what changed in its inputs.  ``TORCHTPU_DUMP_DIR`` writes the StableHLO
of each compiled graph there.  Hits, misses and compile seconds are counted
in ``metrics.compile_cache``.
"""

from __future__ import annotations

import itertools
import logging
import pathlib

import jax

from .. import config
from . import metrics

log = logging.getLogger("torchtpu.recompiles")


def record_hit() -> None:
    metrics.count(metrics.compile_cache, "requests")
    metrics.count(metrics.compile_cache, "hits")


def record_miss(seconds: float) -> None:
    metrics.count(metrics.compile_cache, "requests")
    metrics.count(metrics.compile_cache, "misses")
    metrics.count(metrics.compile_cache, "compile_seconds", seconds)


def record_donations(count: int) -> None:
    metrics.count(metrics.compile_cache, "donated_inputs", count)


def log_recompile(name: str, previous, signature, retraced: bool = False) -> None:
    """Log a graph's recompile with its reason, when ``TORCHTPU_LOG_RECOMPILES`` asks for it.

    ``retraced``: Dynamo traced the same code again (its own recompile, which it logs)."""
    if previous is not None and config.current.log_recompiles:
        log.warning("torchtpu: recompiling the %s graph: %s", name, describe_change(previous, signature),
                    extra={"retraced": retraced})


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


_disk_cache_dir: str | None = None


def disk_cache_dir() -> str | None:
    """The directory ``enable_disk_cache`` opened, or None."""
    return _disk_cache_dir


def enable_disk_cache(directory) -> None:
    """Keep every compiled program in ``directory`` (XLA's persistent compilation cache), and let
    ``torch.compile(backend="tpu")`` use AOTAutograd's disk cache (compile/dynamo.py)."""
    global _disk_cache_dir
    from jax._src import compilation_cache

    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # eager ops compile fast, and add up
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    compilation_cache.reset_cache()  # JAX decides once whether to use the cache; let it decide again
    _disk_cache_dir = str(directory)


def _count_disk_hits(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        metrics.count(metrics.compile_cache, "disk_hits")


_dump_serial = itertools.count()
_observers: list = []  # callables told of every compiled graph (torchtpu.tune listens here)


def observe(callback):
    """Call ``callback(name, lowered, compiled, seconds)`` for every graph compiled from now on
    (``torch.compile`` graphs); returns a function that stops it."""
    _observers.append(callback)
    return lambda: _observers.remove(callback) if callback in _observers else None


def compiled(name: str, lowered, program, seconds: float) -> None:
    """A graph was compiled: count it and tell the observers."""
    record_miss(seconds)
    for callback in list(_observers):
        callback(name, lowered, program, seconds)


def dump(name: str, lowered) -> None:
    """Write a lowered program's StableHLO to ``TORCHTPU_DUMP_DIR``, if it is set."""
    directory = config.current.dump_dir
    if not directory:
        return
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{next(_dump_serial):05d}-{name}.stablehlo.mlir").write_text(lowered.as_text())


def install() -> None:
    """At import: count disk-cache hits, and open the disk cache if the settings name one."""
    jax.monitoring.register_event_listener(_count_disk_hits)
    if config.current.cache_dir:
        enable_disk_cache(config.current.cache_dir)
