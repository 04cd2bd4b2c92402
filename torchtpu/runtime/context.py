"""The execution context: who runs programs, and the settings they are compiled with.

One ``ExecutionContext`` per device (this process has one).  It owns

- the *launcher*, the object that runs each op's program: strict eager calls
  it at once, debug eager calls it and waits, fused eager records it into a
  pending graph.  The eager layer installs launchers (``eager/modes.py``); the
  layers below only call ``launch`` and ``flush`` through the protocol.
- the float32 matmul *precision* programs are compiled with (part of every
  program key).

Both are per device, not per thread, on purpose: autograd runs the backward
on its own thread, and it must run in the mode and precision of the forward.
"""

from __future__ import annotations

from typing import Protocol

from . import device


class Launcher(Protocol):
    """How programs run.  ``launch`` returns ``(outputs, {storage slot: new array})``."""

    name: str

    def launch(self, plan, program, dynamic): ...

    def flush(self, cause: str | None) -> None:
        """Run whatever is pending, so every buffer holds a real array."""


class ExecutionContext:
    __slots__ = ("launcher", "precision")

    def __init__(self):
        self.launcher: Launcher | None = None  # installed by eager.modes at import
        self.precision: str | None = None  # None: torch.get_float32_matmul_precision() decides (runtime.precision)

    @property
    def device(self) -> "torch.device":
        return device.TORCH_DEVICE  # this process's chip: set_device may rename it before the first tensor

    def flush(self, cause: str | None = None) -> None:
        if self.launcher is not None:
            self.launcher.flush(cause)


_current = ExecutionContext()


def current() -> ExecutionContext:
    return _current
