"""``torch.tpu``'s eager modes and debug checks (``eager/modes.py``, ``eager/debug.py``)."""

from __future__ import annotations

from ..eager import debug, fused, modes

EagerMode = modes.EagerMode
get_eager_mode = modes.get_eager_mode
set_eager_mode = modes.set_eager_mode
eager_mode = modes.eager_mode
debug_checks = debug.debug_checks
NonFiniteError = debug.NonFiniteError
set_max_fused_ops = fused.set_max_ops
get_max_fused_ops = fused.get_max_ops
