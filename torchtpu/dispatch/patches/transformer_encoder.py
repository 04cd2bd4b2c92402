"""``nn.TransformerEncoder``'s padded-batch fast path on tpu, without nested tensors.

In eval mode under ``no_grad``, with a key padding mask that is left-aligned,
PyTorch packs the unpadded tokens into a nested tensor for the layers and pads
the result with zeros again before the final norm (``enable_nested_tensor``,
on by default). torchtpu has no nested tensors, so on tpu the encoder runs the
same layers dense with the padding mask (each still through its fused fast
path, ``ops/fused_nn.py``), then zeroes the padded positions where PyTorch
would have packed: the result is CPU's at every position, padded ones
included, which matters where a decoder reads the encoder's output unmasked.
"""

from __future__ import annotations

import contextlib
import functools

import torch

_original_forward = torch.nn.TransformerEncoder.forward


def _left_aligned(padding_mask) -> bool:
    """Every row's tokens come before its padding (True marks padding)."""
    return not bool((padding_mask[:, :-1] & ~padding_mask[:, 1:]).any())


def _layer_tensors(layer) -> tuple:
    attention = layer.self_attn
    return (attention.in_proj_weight, attention.in_proj_bias, attention.out_proj.weight, attention.out_proj.bias,
            layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias, layer.linear1.weight,
            layer.linear1.bias, layer.linear2.weight, layer.linear2.bias)


def _packs_as_nested(encoder, src, mask, padding_mask) -> bool:
    """Whether PyTorch's forward would take its nested-tensor path for this call (its own tests, in order)."""
    first = encoder.layers[0]
    tensors = (src, *_layer_tensors(first))
    mask_check = getattr(encoder, "mask_check", True)
    return bool(
        torch.backends.mha.get_fastpath_enabled() and encoder.use_nested_tensor and not first.training
        and src.dim() == 3 and padding_mask is not None and not (mask_check and torch.compiler.is_compiling())
        and not src.is_nested and mask is None and not torch.is_autocast_enabled()
        and not torch.overrides.has_torch_function(tensors)
        and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))
        and (not mask_check or _left_aligned(padding_mask.to(torch.bool)))
    )


@contextlib.contextmanager
def _attributes(module, **values):
    previous = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


@functools.wraps(_original_forward)
def _forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
    if not (getattr(self, "use_nested_tensor", False) and isinstance(src, torch.Tensor) and src.device.type == "tpu"):
        return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    if not _packs_as_nested(self, src, mask, src_key_padding_mask):
        with _attributes(self, use_nested_tensor=False):
            return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    with _attributes(self, use_nested_tensor=False, norm=None):
        output = _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    padded = src_key_padding_mask.to(torch.bool) if self.layers[0].self_attn.batch_first else \
        src_key_padding_mask.to(torch.bool).T
    output = output.masked_fill(padded[..., None], 0.0)
    return output if self.norm is None else self.norm(output)


def install() -> None:
    torch.nn.TransformerEncoder.forward = _forward
