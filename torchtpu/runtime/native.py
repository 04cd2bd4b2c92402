"""torchtpu's C++ extension (``torchtpu/csrc/native.cpp``), where it was built.

It gives PrivateUse1 a device guard with a settable index and count, a
one-call tensor factory, and C++ view kernels.  pip builds it at install (``setup.py``); where it
could not be built, or ``TORCHTPU_NATIVE=0``, ``module`` is None and the
process has one device name, ``tpu:0`` (docs/distributed.md).
"""

from __future__ import annotations

import importlib
import warnings

from .. import config

API_VERSION = 5  # csrc/native.cpp's; a build of older sources is ignored


def _load():
    if not config.current.native:
        return None
    try:  # a compiled module that imports nothing of ours: it sits below every layer
        module = importlib.import_module("torchtpu._native")
    except ImportError:
        return None
    if getattr(module, "API_VERSION", None) != API_VERSION:
        warnings.warn("torchtpu: the C++ extension was built from older sources and is ignored; "
                      "reinstall torchtpu (pip install -e .) to rebuild it")
        return None
    return module


module = _load()
