"""torch.nn's fused fast-path ops, as compositions of ATen ops.

In eval mode under ``no_grad``, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` call one fused op each on a PrivateUse1 device, as
on CUDA: ``_transformer_encoder_layer_fwd`` and ``_native_multi_head_attention``
(whose softmax is ``_masked_softmax``). PyTorch ships no decomposition of
them, so these are written here from their CPU kernels' definitions, and
``decompositions.py`` serves them like PyTorch's own: op by op in eager mode,
traced into the graph under torch.compile.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def masked_softmax(scores, mask, dim=None, mask_type=None):
    """Softmax where ``mask`` is False; True (or, as CPU reads a float mask, nonzero) is left out.

    A key padding mask (``mask_type`` 1, shape batch x keys) applies to every head and query.
    A row with every key left out gives NaN, as on CPU."""
    dim = scores.dim() - 1 if dim is None else dim
    mask = mask.to(torch.bool)
    if mask_type == 1 and mask.dim() == 2 and scores.dim() == 4:
        mask = mask[:, None, None, :]
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim)


def _heads(x, num_heads):
    """(batch, length, embed) -> (batch, heads, length, embed / heads)."""
    batch, length, embed = x.shape
    return x.view(batch, length, num_heads, embed // num_heads).transpose(1, 2)


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """Batch-first multi-head attention with packed in-projection weights; CPU's order of operations
    (queries scaled before the product). No weights (None) when not asked for, as on CPU."""
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)
    q = _heads(F.linear(query, w_q, b_q), num_head) / math.sqrt(embed_dim // num_head)
    k = _heads(F.linear(key, w_k, b_k), num_head)
    v = _heads(F.linear(value, w_v, b_v), num_head)
    scores = q @ k.transpose(-2, -1)
    weights = torch.softmax(scores, -1) if mask is None else masked_softmax(scores, mask, -1, mask_type)
    attended = (weights @ v).transpose(1, 2).flatten(2)
    out = F.linear(attended, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, weights.mean(1) if average_attn_weights else weights


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """One encoder layer: self-attention and a two-layer feed-forward block, each with a residual
    and a layer norm before (``norm_first``) or after it."""
    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = src + native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                          proj_bias, mask, False, True, mask_type)[0]
    x = x if norm_first else norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)
    x = x + h
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


DECOMPOSITIONS = {
    aten._masked_softmax.default: masked_softmax,
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
