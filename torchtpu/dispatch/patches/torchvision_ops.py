"""``import torchvision`` next to a CPU torch when the installed torchvision is PyPI's CUDA build.

PyPI's Linux torchvision wheel is built for CUDA: beside a CPU torch its C++
ops library does not load, which torchvision tolerates, but its fake-kernel
registrations then name ``torchvision::nms`` and ``torchvision::qnms``, which
were never defined, and the import fails. Transformers and SGLang import
torchvision, so serving engines would not start. When (and only when) the ops
library did not load, this defines those two schemas without kernels before
the registrations run: the import succeeds, and calling the ops raises
torchvision's own "Couldn't load custom C++ ops" error.
"""

from __future__ import annotations

import importlib.abc
import sys

import torch

_REGISTRATIONS = "torchvision._meta_registrations"
_OPS_WITHOUT_META_GUARD = ("nms", "qnms")
_library = None  # kept alive: the schemas live as long as their Library


class _DefineMissingSchemas(importlib.abc.MetaPathFinder):
    """Runs just before ``torchvision._meta_registrations`` is imported; finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name == _REGISTRATIONS:
            extension = sys.modules.get("torchvision.extension")
            if extension is not None and not extension._has_ops():
                _define_schemas()
        return None


def _define_schemas() -> None:
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("torchvision", "FRAGMENT")
    for op in _OPS_WITHOUT_META_GUARD:
        _library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def install() -> None:
    if not any(isinstance(finder, _DefineMissingSchemas) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DefineMissingSchemas())
