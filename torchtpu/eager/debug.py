"""Debug eager: every op's program runs to completion before the next op starts.

An error then surfaces at the op that caused it, not at some later host sync.
With ``debug_checks(True)`` each op's floating-point results are also checked
for NaN and infinity; the error names the op and the user's line that called
it (the first stack frame outside torch, torchtpu and jax).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import torch

from ..core import tensor
from ..runtime import context

_checks = False
_warned_inert = False


class NonFiniteError(RuntimeError):
    """An op produced NaN or infinity while ``torch.tpu.debug_checks`` was on."""


def checks_enabled() -> bool:
    return _checks


class debug_checks:
    """``torch.tpu.debug_checks(True)`` turns NaN/inf checks on; as a context manager, for a block.

    Checks run in debug mode (``DEFER_NEVER_AND_LAUNCH_BLOCKING``), where each
    op is waited for anyway.
    """

    def __init__(self, enabled: bool = True):
        global _checks
        self.previous = _checks
        _checks = bool(enabled)
        warn_if_checks_inert(context.current().launcher.name != DebugLauncher.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _checks
        _checks = self.previous
        return False


def warn_if_checks_inert(inert: bool) -> None:
    global _warned_inert
    if _checks and inert and not _warned_inert:
        _warned_inert = True
        warnings.warn("torchtpu: debug_checks only run in EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING "
                      "(torch.tpu.set_eager_mode or TPU_LAUNCH_BLOCKING=1)")


class DebugLauncher:
    name = "debug"
    defers = False

    def launch(self, program, dynamic):
        """Run the program, wait for it, and check its results when checks are on."""
        outs, written = program(*dynamic)
        results = [a for a in outs if a is not None] + [a for a in written.values() if a is not None]
        jax.block_until_ready(results)
        if _checks:
            for position, array in enumerate(results):
                _check_finite(program.name, position, array)
        return outs, written

    def flush(self, cause=None) -> None:
        pass


_all_finite = jax.jit(lambda a: jnp.all(jnp.isfinite(a)))


def _check_finite(name, position, array) -> None:
    if not (jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.complexfloating)):
        return
    with tensor.x64():
        if bool(_all_finite(array)):
            return
        kind = "NaN" if bool(jnp.isnan(array).any()) else "infinity"
    raise NonFiniteError(
        f"torchtpu debug check: {name} produced {kind} "
        f"in result {position} (shape {tuple(array.shape)}, {array.dtype})\n  at {user_frame()}")


_INTERNAL_ROOTS = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (torch, jax, sys.modules["torchtpu"]))


def user_frame() -> str:
    """'file:line in function: source' of the innermost frame outside torch, torchtpu and jax.

    Backward ops run on autograd's engine thread, which has no user frames;
    the user's line is then where the main thread waits (``loss.backward()``).
    """
    found = _first_user_frame(sys._getframe(1))
    if found is None and threading.current_thread() is not threading.main_thread():
        found = _first_user_frame(sys._current_frames().get(threading.main_thread().ident))
    return "<no user frame>" if found is None else _describe_frame(found)


def _first_user_frame(frame):
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_INTERNAL_ROOTS) and not filename.startswith("<frozen"):
            return frame
        frame = frame.f_back
    return None


def _describe_frame(frame) -> str:
    import linecache

    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    return f"{where}: {line}" if line else where
