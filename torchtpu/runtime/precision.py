"""The float32 matmul precision that products and convolutions are compiled with.

HIGHEST (full float32) is the default, so results match CPU.  On TPU, DEFAULT
(one bfloat16 pass) and HIGH (three passes) trade accuracy for speed; on the
XLA CPU backend all three compute in float32.  The value is held by the
execution context and is part of every program's cache key, so changing it
recompiles rather than reusing a program built for another precision.
"""

from jax import lax

from . import context

_BY_NAME = {
    "default": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST,
}


def current() -> str:
    return context.current().precision


def set_current(name: str) -> None:
    if name not in _BY_NAME:
        raise ValueError(f"precision must be one of {sorted(_BY_NAME)}, got {name!r}")
    context.current().precision = name


def matmul() -> lax.Precision:
    """The precision to pass to dot/einsum/conv while tracing a program."""
    return _BY_NAME[current()]
