"""``torch.tpu.precision``: the float32 matmul precision, and the dtypes autocast supports."""

from __future__ import annotations

import contextlib
import enum

import torch

from ..runtime import precision as runtime_precision

class Precision(enum.Enum):
    DEFAULT = "default"  # bfloat16 passes on TPU: fastest
    HIGH = "high"  # three bfloat16 passes
    HIGHEST = "highest"  # full float32


def get_precision() -> Precision:
    return Precision(runtime_precision.current())


@contextlib.contextmanager
def precision(value):
    """Compile the float32 matmuls and convolutions inside the block at ``value``.

    HIGHEST (full float32, matching CPU) is the default; DEFAULT and HIGH are
    faster bfloat16-based modes on TPU.  Programs are cached per precision.
    Outside any such block the precision follows ``torch.set_float32_matmul_precision``
    ("high": HIGH, "medium": DEFAULT), unless the ``matmul_precision`` setting chose one.
    """
    value = Precision(value) if not isinstance(value, Precision) else value
    previous = runtime_precision.chosen()
    runtime_precision.set_current(value.value)
    try:
        yield
    finally:
        runtime_precision.set_current(previous)


def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16]
