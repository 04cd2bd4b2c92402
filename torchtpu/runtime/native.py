"""torchtpu's C++ extension (``torchtpu/csrc/native.cpp``), where it was built.

It gives PrivateUse1 a device guard with a settable index and count, and a
one-call tensor factory.  pip builds it at install (``setup.py``); where it
could not be built, or ``TORCHTPU_NATIVE=0``, ``module`` is None and the
process has one device name, ``tpu:0`` (docs/distributed.md).
"""

from __future__ import annotations

import importlib

from .. import config


def _load():
    if not config.current.native:
        return None
    try:  # a compiled module that imports nothing of ours: it sits below every layer
        return importlib.import_module("torchtpu._native")
    except ImportError:
        return None


module = _load()
