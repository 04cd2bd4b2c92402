"""Accounting of live device buffers, for ``torch.tpu.memory_*``.

PJRT reports real figures on TPU and GPU; the XLA CPU backend reports none,
so we count the bytes of the arrays that tpu storages hold.
"""

import math

allocated_bytes = 0
peak_bytes = 0


def _nbytes(array) -> int:
    if array is None:
        return 0
    return math.prod(array.shape) * array.dtype.itemsize  # (jax's Array.size is slower)


def replaced(old, new) -> None:
    """A storage's array changed from ``old`` to ``new``."""
    global allocated_bytes, peak_bytes
    allocated_bytes += _nbytes(new) - _nbytes(old)
    peak_bytes = max(peak_bytes, allocated_bytes)


def reset_peak() -> None:
    global peak_bytes
    peak_bytes = allocated_bytes
