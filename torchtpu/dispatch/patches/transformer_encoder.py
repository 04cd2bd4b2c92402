"""``nn.TransformerEncoder`` on tpu runs its padded-batch fast path dense, not as a nested tensor.

In eval mode under ``no_grad``, with a key padding mask, PyTorch packs the
unpadded tokens into a nested tensor for the layers and pads the result with
zeros again (``enable_nested_tensor``, on by default). torchtpu has no nested
tensors, so on tpu the encoder takes its dense path for that call: every
layer still runs its fused fast path (``ops/fused_nn.py``) with the padding
mask, and every unpadded position gets CPU's values. The padded positions,
which the nested path leaves as zeros and PyTorch documents as undefined,
hold what the dense path computes there.
"""

from __future__ import annotations

import functools

import torch

_original_forward = torch.nn.TransformerEncoder.forward


@functools.wraps(_original_forward)
def _forward(self, src, *args, **kwargs):
    if not (getattr(self, "use_nested_tensor", False) and isinstance(src, torch.Tensor) and src.device.type == "tpu"):
        return _original_forward(self, src, *args, **kwargs)
    self.use_nested_tensor = False
    try:
        return _original_forward(self, src, *args, **kwargs)
    finally:
        self.use_nested_tensor = True


def install() -> None:
    torch.nn.TransformerEncoder.forward = _forward
