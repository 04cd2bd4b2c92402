"""PyTorch's flex attention in a compiled graph: the ``flex_attention`` higher-order op and its backward, in JAX.

The score and mask modifications arrive as FX subgraphs of scalar ATen ops;
each runs as the jax function of its graph (``fx.to_jax_function``),
vectorised over batch, head, query and key positions with ``jax.vmap``. The
attention is dense, as PyTorch's own math implementation computes it: every
(query, key) score, the mask applied to all of them (the block mask's
sparsity, which lets a kernel skip whole blocks, is not used yet). The
results follow PyTorch's: float32 scores (float64 for float64 inputs), the
log-sum-exp and max scores in base 2, zeros and -inf for a fully masked row.
The backward is JAX's derivative of the same function.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from . import fx

LN2 = math.log(2)
_hop = torch.ops.higher_order


def _scalar_function(gm: torch.fx.GraphModule):
    """A score or mask subgraph as a jax function of scalars (score?, b, h, q_idx, kv_idx, *buffers)."""
    fn = fx.to_jax_function(gm)

    def scalar(*values):
        out, _ = fn(list(values), 0, 0)
        return out[0] if isinstance(out, (list, tuple)) else out

    return scalar


def _over_grid(gm, score, shape, buffers):
    """``gm`` at every (b, h, q, kv) of ``shape``; ``score`` (or None for a mask) is the grid's scores."""
    fn = _scalar_function(gm)
    leading = [] if score is None else [0]
    for dim in (3, 2, 1, 0):  # innermost first: kv, q, head, batch
        axes = leading + [0 if d == dim else None for d in range(4)] + [None] * len(buffers)
        fn = jax.vmap(fn, in_axes=tuple(axes))
    positions = [jnp.arange(n, dtype=jnp.int32) for n in shape]
    return fn(*([] if score is None else [score]), *positions, *buffers)


def _attend(query, key, value, score_mod, mask_mod, scale, score_buffers, mask_buffers):
    """(out, logsumexp / ln 2, max score / ln 2) of flex attention, keys and values shared by
    ``query.shape[1] // key.shape[1]`` query heads each (grouped-query attention)."""
    groups = query.shape[1] // key.shape[1]
    key, value = (jnp.broadcast_to(jnp.repeat(t, groups, axis=1), (query.shape[0], *query.shape[1:2], *t.shape[2:]))
                  for t in (key, value))
    compute = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    scores = jnp.einsum("bhqd,bhkd->bhqk", query.astype(compute), key.astype(compute)) * scale
    scores = _over_grid(score_mod, scores, scores.shape, score_buffers).astype(compute)
    if mask_mod is not None:
        scores = jnp.where(_over_grid(mask_mod, None, scores.shape, mask_buffers), scores, -jnp.inf)
    masked = jnp.all(scores == -jnp.inf, axis=-1)
    logsumexp = jnp.where(masked, -jnp.inf, jax.nn.logsumexp(scores, axis=-1))
    weights = jnp.where(masked[..., None], 0.0, jnp.exp(scores - jnp.where(masked, 0.0, logsumexp)[..., None]))
    out = weights.astype(query.dtype) @ value.astype(query.dtype)
    return out, logsumexp / LN2, scores.max(axis=-1) / LN2


@fx.higher_order(_hop.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                   mask_mod_other_buffers=()):
    return _attend(query, key, value, score_mod, block_mask[-1], scale, score_mod_other_buffers,
                   mask_mod_other_buffers)


@fx.higher_order(_hop.flex_attention_backward)
def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers=(),
                            mask_mod_other_buffers=()):
    buffers = list(score_mod_other_buffers)
    learnable = [i for i, b in enumerate(buffers) if hasattr(b, "dtype") and jnp.issubdtype(b.dtype, jnp.floating)]

    def forward(q, k, v, *learned):
        for i, b in zip(learnable, learned):
            buffers[i] = b
        result, lse, _ = _attend(q, k, v, fw_graph, block_mask[-1], scale, tuple(buffers), mask_mod_other_buffers)
        return result, lse

    (result, lse), pullback = jax.vjp(forward, query, key, value, *(buffers[i] for i in learnable))
    lse_cotangent = jnp.zeros_like(lse) if grad_logsumexp is None else grad_logsumexp.astype(lse.dtype)
    grad_q, grad_k, grad_v, *learned_grads = pullback((grad_out.astype(result.dtype), lse_cotangent))
    captured = [None] * len(buffers)  # the gradients of the tensors the score modification captured
    for i, grad in zip(learnable, learned_grads):
        captured[i] = grad
    return grad_q, grad_k, grad_v, tuple(captured)
