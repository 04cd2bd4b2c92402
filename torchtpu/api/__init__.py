"""The ``torch.tpu`` module, built from the table in ``public_api.py``.

Each submodule holds one family of ``torch.tpu`` functions (device, memory,
random, streams, precision, execution, metrics, bucketing, pallas).  The
module object PyTorch installs as ``torch.tpu`` is made by ``build_module``
and holds exactly the names the table lists.
"""

from __future__ import annotations

import importlib
import types

from .public_api import PUBLIC_API, PUBLIC_SUBMODULES, PYTORCH_PROTOCOL

def build_module() -> types.ModuleType:
    """A fresh ``torch.tpu`` module with the public names and PyTorch's protocol names."""
    module = types.ModuleType("torch.tpu", "torchtpu's device module: torch.cuda's API for the tpu device.")
    for table in (PUBLIC_API, PYTORCH_PROTOCOL):
        for submodule, names in table.items():
            source = importlib.import_module(f"{__name__}.{submodule}")
            for name in names:
                setattr(module, name, getattr(source, name))
    for submodule in PUBLIC_SUBMODULES:
        setattr(module, submodule, importlib.import_module(f"{__name__}.{submodule}"))
    return module
