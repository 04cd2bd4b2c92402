"""The float32 matmul precision that products and convolutions are compiled with.

HIGHEST (full float32) is the default, so results match CPU.  On TPU, DEFAULT
(one bfloat16 pass) and HIGH (three passes) trade accuracy for speed; on the
XLA CPU backend all three compute in float32.  The value is held by the
execution context and is part of every program's cache key, so changing it
recompiles rather than reusing a program built for another precision.

Unless chosen (``torch.tpu.precision``, the ``matmul_precision`` setting),
it follows ``torch.set_float32_matmul_precision``, as CUDA's TF32 does:
"high" is HIGH, "medium" DEFAULT.
"""

import torch
from jax import lax

from .. import config
from . import context

_BY_NAME = {
    "default": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST,
}


# torch.get_float32_matmul_precision() -> ours.
_FROM_TORCH = {"highest": "highest", "high": "high", "medium": "default"}


def current() -> str:
    """``torch.tpu.precision``'s inside its block, else the ``matmul_precision`` setting's, else torch's."""
    chosen = context.current().precision or config.current.matmul_precision
    return chosen or _FROM_TORCH.get(torch.get_float32_matmul_precision(), "highest")


def chosen() -> str | None:
    """The precision ``torch.tpu.precision`` chose, or None outside its blocks."""
    return context.current().precision


def set_current(name: str | None) -> None:
    if name is not None and name not in _BY_NAME:
        raise ValueError(f"precision must be one of {sorted(_BY_NAME)}, got {name!r}")
    context.current().precision = name


def matmul() -> lax.Precision:
    """The precision to pass to dot/einsum/conv while tracing a program."""
    return _BY_NAME[current()]
