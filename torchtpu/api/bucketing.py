"""Shape buckets: pad a dimension that varies (sequence length) to one of a few sizes.

Every compiled program has static shapes, so a dimension that takes a new
size at every step compiles a new program at every step.  Padding it up to a
bucket (the next power of two, or one of the sizes you give) bounds the
number of programs by the number of buckets.  Padding changes what the
model sees, so pair it with the mask the model already takes (an attention
mask, ``ignore_index`` labels): ``pad_to_bucket`` returns the original length
for that.
"""

from __future__ import annotations

import bisect

import torch
import torch.nn.functional as F

from ..runtime import metrics


def bucket_size(n: int, buckets=None) -> int:
    """The smallest bucket that holds ``n``: a power of two, or the next of ``buckets``."""
    if n < 0:
        raise ValueError(f"bucket_size: a size must be non-negative, got {n}")
    if buckets is None:
        return 1 if n <= 1 else 1 << (n - 1).bit_length()
    sizes = sorted(buckets)
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes):
        raise ValueError(f"bucket_size: {n} is larger than the largest bucket ({sizes[-1]})")
    return sizes[i]


def pad_to_bucket(tensor: torch.Tensor, dim: int, buckets=None, value=0, side="right") -> tuple[torch.Tensor, int]:
    """``tensor`` padded with ``value`` along ``dim`` to its bucket, and the original size.

    ``side="right"`` pads at the end (training batches, with ignored labels);
    ``side="left"`` pads at the start, as a prompt for ``generate()`` is padded,
    so that the new tokens follow the real ones."""
    if side not in ("left", "right"):
        raise ValueError(f"pad_to_bucket: side must be 'left' or 'right', got {side!r}")
    dim = dim % tensor.dim()
    size = tensor.shape[dim]
    extra = bucket_size(size, buckets) - size
    metrics.tell("padding", (size, size + extra))  # torchtpu tune analyze sums the waste
    if extra == 0:
        return tensor, size
    before, after = (extra, 0) if side == "left" else (0, extra)
    padding = [0, 0] * (tensor.dim() - dim - 1) + [before, after]  # F.pad lists dims from the last
    return F.pad(tensor, padding, value=value), size
