"""``F.scaled_dot_product_attention`` on tpu: one fused op forward and one backward.

PyTorch picks fused SDPA backends for a PrivateUse1 device in C++ only, so a
Python backend takes the op above autograd (an AutogradPrivateUse1 kernel)
and runs the two ops of ``ops/attention.py`` under its own autograd Function.
"""

from __future__ import annotations

import math

import torch

from ..ops import attention

aten = torch.ops.aten


class _FusedAttention(torch.autograd.Function):
    """Attention as two ops (ops/attention.py): one program forward, one backward."""

    @staticmethod
    def forward(ctx, query, key, value, bias, is_causal, scale):
        out, logsumexp = attention.sdpa_forward_op(query, key, value, bias, is_causal, scale)
        ctx.save_for_backward(query, key, value, bias, out, logsumexp)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, bias, out, logsumexp = ctx.saved_tensors
        grads = attention.sdpa_backward_op(grad_out, query, key, value, bias, out, logsumexp, ctx.is_causal, ctx.scale)
        grad_bias = grads[3] if bias is not None and ctx.needs_input_grad[3] else None
        return grads[0], grads[1], grads[2], grad_bias, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False):
    """``F.scaled_dot_product_attention`` on tpu, above autograd: one fused op each way.

    Dropout, grouped-query heads and unusual ranks take PyTorch's math path,
    which runs on the lowered ops."""
    if dropout_p != 0.0 or enable_gqa or query.dim() != 4 or key.shape[:-2] != query.shape[:-2]:
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # True means "attend"
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _FusedAttention.apply(query, key, value, attn_mask, is_causal, scale)


AUTOGRAD_KERNELS = {
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
}
