"""The eager modes: which launcher runs each op's program.

- ``DEFER_NEVER`` (strict, the default): one op at a time, asynchronous.
- ``DEFER_NEVER_AND_LAUNCH_BLOCKING`` (debug): one op at a time, each waited
  for, with optional NaN/inf checks that name the op and the user's line.
- ``DEFER_AND_FUSE`` (fused): ops are recorded into a pending graph that runs
  as one compiled program at the next host sync.

All three run the same per-op programs; a mode is the launcher installed in
the execution context.  The names are those of Google's TorchTPU.
"""

from __future__ import annotations

import enum

from .. import config
from ..runtime import context
from .debug import DebugLauncher, warn_if_checks_inert
from .fused import LAUNCHER as FUSED_LAUNCHER
from .strict import StrictLauncher


class EagerMode(enum.Enum):
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_NEVER = "strict"
    DEFER_AND_FUSE = "fused"


_LAUNCHERS = {
    EagerMode.DEFER_NEVER: StrictLauncher(),
    EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING: DebugLauncher(),
    EagerMode.DEFER_AND_FUSE: FUSED_LAUNCHER,
}
_MODES = {launcher.name: mode for mode, launcher in _LAUNCHERS.items()}


def get_eager_mode() -> EagerMode:
    return _MODES[context.current().launcher.name]


def set_eager_mode(mode) -> None:
    """Switch mode; leaving a mode first runs whatever it has pending."""
    mode = mode if isinstance(mode, EagerMode) else _parse(mode)
    ctx = context.current()
    launcher = _LAUNCHERS[mode]
    if ctx.launcher is not None and ctx.launcher is not launcher:
        ctx.launcher.flush("mode change")
    ctx.launcher = launcher
    warn_if_checks_inert(mode is EagerMode.DEFER_AND_FUSE)


def _parse(mode) -> EagerMode:
    if isinstance(mode, str):
        for member in EagerMode:
            if mode in (member.name, member.value):
                return member
    raise ValueError(f"unknown eager mode {mode!r}; expected one of {[m.name for m in EagerMode]}")


class eager_mode:
    """``with torch.tpu.eager_mode(EagerMode.DEFER_AND_FUSE):`` sets the mode for the block.

    The previous mode comes back on exit, also when the block raises.
    """

    def __init__(self, mode):
        self.mode = mode
        self.previous = None

    def __enter__(self):
        self.previous = get_eager_mode()
        set_eager_mode(self.mode)
        return self

    def __exit__(self, *exc):
        set_eager_mode(self.previous)
        return False


def mode_from_config(settings: config.Config | None = None) -> EagerMode:
    """Debug mode if ``launch_blocking``, else fused if ``defer_and_fuse``, else strict."""
    settings = settings or config.current
    if settings.launch_blocking:
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if settings.defer_and_fuse:
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


def install() -> None:
    """At import: the mode the settings ask for."""
    set_eager_mode(mode_from_config())
