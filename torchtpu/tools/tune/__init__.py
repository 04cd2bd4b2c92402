"""``torchtpu tune``: find what slows a program down, predict it on a TPU pod, and fix it.

Four parts, each a module and a ``torchtpu tune`` command:

- ``analyze`` (module ``diagnose``): run a program for a few steps under instrumentation and rank what
  costs time (recompiles, graph breaks, host syncs, CPU fallbacks, misaligned
  matrix dimensions, float32 matmuls, padding, memory);
- ``cost``: predict a compiled step's time on a TPU generation from XLA's cost
  analysis, calibrated on the machine at hand;
- ``plan``: search mesh shapes and parallelism for a model on N chips;
- ``search``: try settings in subprocesses, measure each, keep the best.

Nothing here is imported by ``import torchtpu``; the tuner loads on first use.
"""

from __future__ import annotations

import importlib

_MODULES = ("chips", "cost", "diagnose", "plan", "search")


def __getattr__(name):
    if name == "analyze":  # a function (in diagnose): torchtpu.tune.analyze(step_fn, *inputs, steps=N)
        return importlib.import_module(".diagnose", __name__).analyze
    if name in ("steps", "report_step"):  # the step protocol a script uses for `tune search`
        return getattr(importlib.import_module(".search", __name__), name)
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'torchtpu.tune' has no attribute {name!r}")
