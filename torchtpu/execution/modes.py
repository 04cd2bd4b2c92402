"""The eager modes: how each op's program is launched.

- ``DEFER_NEVER`` (strict, the default): one op at a time, asynchronous.
- ``DEFER_NEVER_AND_LAUNCH_BLOCKING`` (debug): one op at a time, each waited
  for, with optional NaN/inf checks that name the op and the user's line.
- ``DEFER_AND_FUSE`` (fused): ops are recorded into a pending graph that runs
  as one compiled program at the next host sync.

All three share the strict executor's per-op programs; a mode only swaps
``strict._launch``.  The names are those of Google's TorchTPU.
"""

from __future__ import annotations

import enum
import os

from . import debug, fused, strict


class EagerMode(enum.Enum):
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_NEVER = "strict"
    DEFER_AND_FUSE = "fused"


_current = EagerMode.DEFER_NEVER


def get_eager_mode() -> EagerMode:
    return _current


def set_eager_mode(mode) -> None:
    """Switch mode; leaving fused mode first runs whatever it has pending."""
    global _current
    mode = mode if isinstance(mode, EagerMode) else _parse(mode)
    if _current is EagerMode.DEFER_AND_FUSE and mode is not EagerMode.DEFER_AND_FUSE:
        fused.flush("mode change")
    _current = mode
    strict._launch = {
        EagerMode.DEFER_NEVER: None,
        EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING: debug.launch,
        EagerMode.DEFER_AND_FUSE: fused.record,
    }[mode]
    debug.warn_if_checks_inert(mode is EagerMode.DEFER_AND_FUSE)


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
        self.previous = _current
        set_eager_mode(self.mode)
        return self

    def __exit__(self, *exc):
        set_eager_mode(self.previous)
        return False


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no", "off")


def mode_from_env() -> EagerMode:
    """TPU_LAUNCH_BLOCKING=1 selects debug mode, TPU_DEFER_AND_FUSE=1 fused; debug wins."""
    if _env_flag("TPU_LAUNCH_BLOCKING"):
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if _env_flag("TPU_DEFER_AND_FUSE"):
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


def apply_env() -> None:
    """Read the environment variables (at import) and the fused graph size limit."""
    limit = os.environ.get("TPU_MAX_FUSED_OPS")
    if limit:
        fused.set_max_ops(int(limit))
    set_eager_mode(mode_from_env())
