"""PyTorch's flex attention in a compiled graph: the ``flex_attention`` higher-order op and its backward, in JAX.

The score and mask modifications arrive as FX subgraphs of scalar ATen ops;
each runs as the jax function of its graph (``fx.to_jax_function``),
vectorised over the elements of a block of scores with ``jax.vmap``.

The attention is block-sparse, as PyTorch's kernels compute it: the block
mask lists, for each block of queries, the blocks of keys it sees (partly:
the mask modification decides each score; fully: no mask evaluated), and
only those blocks are computed, one listed block per query block at a time
(a loop of as many steps as the longest list) with an online softmax. No
score matrix or mask of the full sequence is ever materialised. The
backward is flash attention's: the query gradients loop over the same key
lists, the key and value gradients over the block mask's transposed lists
(each key block's query blocks), recomputing the scores from the saved
log-sum-exp. The results follow PyTorch's: float32 scores (float64 for
float64 inputs), the log-sum-exp and max scores in base 2, zeros and -inf
for a fully masked row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import torch

from . import fx

LN2 = math.log(2)
_hop = torch.ops.higher_order


class BlockSparsity(NamedTuple):
    """The fields of ``BlockMask.as_tuple()`` the lowering reads (torch 2.13's order)."""
    kv_num_blocks: jax.Array           # [B', H', q blocks]: key blocks seen partly (mask evaluated)
    kv_indices: jax.Array              # [B', H', q blocks, key blocks]
    full_kv_num_blocks: jax.Array | None  # key blocks seen fully (no mask evaluated)
    full_kv_indices: jax.Array | None
    q_num_blocks: jax.Array | None     # the transposed lists: [B', H', key blocks] ...
    q_indices: jax.Array | None
    full_q_num_blocks: jax.Array | None
    full_q_indices: jax.Array | None
    q_block: int
    kv_block: int
    mask_mod: object


def block_sparsity(block_mask: tuple) -> BlockSparsity:
    """``block_mask`` (the higher-order op's flattened tuple) as named fields."""
    if len(block_mask) != 17:
        raise NotImplementedError(f"torchtpu: a flex attention block mask of {len(block_mask)} fields; "
                                  "torch 2.13's has 17 (q/kv lengths, 8 block lists, 4 orders, 2 block sizes, mask)")
    (_q_len, _kv_len, kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx,
     _dq_write_order, _dq_write_order_full, _dq_kv_order, _dq_kv_order_spt, q_block, kv_block, mask_mod) = block_mask
    return BlockSparsity(kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx,
                         int(q_block), int(kv_block), mask_mod)


def _scalar_function(gm: torch.fx.GraphModule):
    """A score or mask subgraph as a jax function of scalars (score?, b, h, q_idx, kv_idx, *buffers)."""
    fn = fx.to_jax_function(gm)

    def scalar(*values):
        out, _ = fn(list(values), 0, 0)
        return out[0] if isinstance(out, (list, tuple)) else out

    return scalar


def _elementwise(gm, score, indices, buffers):
    """``gm`` at every element of ``indices`` (b, h, q_idx, kv_idx, broadcast together with ``score``,
    which is None for a mask), one vmapped call over the flattened elements."""
    args = jnp.broadcast_arrays(*([] if score is None else [score]), *indices)
    flat = [a.reshape(-1) for a in args]
    axes = (0,) * len(flat) + (None,) * len(buffers)
    return jax.vmap(_scalar_function(gm), in_axes=axes)(*flat, *buffers).reshape(args[0].shape)


class _Layout(NamedTuple):
    """Sizes of one attention call: queries [B, H, L, D] in blocks of ``q_block``, keys in ``kv_block``."""
    batch: int
    heads: int
    q_len: int
    kv_len: int
    q_blocks: int
    kv_blocks: int
    groups: int      # query heads per key head
    compute: object  # the dtype of scores and accumulators


def _layout(query, key, sparsity: BlockSparsity) -> _Layout:
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    compute = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    return _Layout(batch, heads, q_len, kv_len, -(-q_len // sparsity.q_block), -(-kv_len // sparsity.kv_block),
                   heads // key.shape[1], compute)


def _blocked(t, length: int, blocks: int, block: int, repeat: int = 1):
    """[B, H, length, ...] -> [B, H * repeat, blocks, block, ...], zero-padded, each head repeated ``repeat`` times."""
    pad = [(0, 0)] * t.ndim
    pad[2] = (0, blocks * block - length)
    t = jnp.pad(t, pad)
    if repeat > 1:
        t = jnp.repeat(t, repeat, axis=1)
    return t.reshape(t.shape[0], t.shape[1], blocks, block, *t.shape[3:])


def _unblocked(t, length: int):
    """The inverse of :func:`_blocked` (without the repeat): [B, H, blocks, block, ...] -> [B, H, length, ...]."""
    return t.reshape(t.shape[0], t.shape[1], -1, *t.shape[4:])[:, :, :length]


def _per_head(table, layout: _Layout):
    """A block list broadcast from the mask's [B', H', ...] to [B, H, ...]."""
    return None if table is None else jnp.broadcast_to(table, (layout.batch, layout.heads, *table.shape[2:]))


def _take_blocks(blocks, ids):
    """``blocks[b, h, ids[b, h, i]]`` for each (b, h, i): [B, H, n, block, ...] by [B, H, m] -> [B, H, m, block, ...]."""
    index = ids.reshape(*ids.shape, *([1] * (blocks.ndim - 3)))
    return jnp.take_along_axis(blocks, index, axis=2, mode="clip")


def _lists(sparsity: BlockSparsity, layout: _Layout, transposed: bool):
    """(counts, indices, mask evaluated?) of the partial and the full block lists that exist."""
    if transposed:
        pairs = [(sparsity.q_num_blocks, sparsity.q_indices, True),
                 (sparsity.full_q_num_blocks, sparsity.full_q_indices, False)]
    else:
        pairs = [(sparsity.kv_num_blocks, sparsity.kv_indices, True),
                 (sparsity.full_kv_num_blocks, sparsity.full_kv_indices, False)]
    return [(_per_head(n, layout), _per_head(i, layout), masked) for n, i, masked in pairs if n is not None]


class _Mods(NamedTuple):
    """The score modification (with its buffers) and the mask of one call."""
    score_mod: object
    mask_mod: object
    score_buffers: tuple
    mask_buffers: tuple
    scale: float

    def scores(self, raw, indices, score_buffers=None):
        """Modified scores: ``score_mod`` at each of ``raw``'s elements (at ``indices``)."""
        buffers = self.score_buffers if score_buffers is None else score_buffers
        return _elementwise(self.score_mod, raw, indices, buffers).astype(raw.dtype)

    def visible(self, indices, q_pos, kv_pos, layout: _Layout, live, masked: bool):
        """Which scores of a block count: listed, inside both sequences and, for a partial block, the mask's."""
        seen = live[..., None, None] & (q_pos < layout.q_len) & (kv_pos < layout.kv_len)
        if masked and self.mask_mod is not None:
            seen &= _elementwise(self.mask_mod, None, indices, self.mask_buffers).astype(bool)
        return seen


def _grid_indices(layout: _Layout, q_pos, kv_pos):
    """(b, h, q_idx, kv_idx) for a block of scores [B, H, n, q, kv], as int32 arrays that broadcast."""
    b = jnp.arange(layout.batch, dtype=jnp.int32).reshape(-1, 1, 1, 1, 1)
    h = jnp.arange(layout.heads, dtype=jnp.int32).reshape(1, -1, 1, 1, 1)
    return b, h, q_pos.astype(jnp.int32), kv_pos.astype(jnp.int32)


def _over_lists(lists, body, carry):
    """``carry = body(ids, live, masked, carry)`` for each step of each block list: step j takes each
    row's j-th listed block (``ids``; ``live`` says whether the row has one). The loop runs for the
    longest list, a value of the step, not of the program."""
    for counts, indices, masked in lists:
        def step(j, carry, counts=counts, indices=indices, masked=masked):
            return body(indices[..., j], j < counts, masked, carry)

        carry = jax.lax.fori_loop(0, jnp.max(counts), step, carry)
    return carry


def _positions(block_ids, block: int, axis: int):
    """Absolute positions of the blocks ``block_ids`` ([B, H, n] or [n]), along ``axis`` (-2: rows, -1: columns)."""
    pos = block_ids[..., None] * block + jnp.arange(block, dtype=jnp.int32)
    return pos[..., :, None] if axis == -2 else pos[..., None, :]


def _forward(query, key, value, mods: _Mods, sparsity: BlockSparsity):
    """(out, logsumexp / ln 2, max score / ln 2) of flex attention over the listed blocks."""
    layout = _layout(query, key, sparsity)
    qb, kb = sparsity.q_block, sparsity.kv_block
    q = _blocked(query, layout.q_len, layout.q_blocks, qb).astype(layout.compute)
    keys = _blocked(key, layout.kv_len, layout.kv_blocks, kb, layout.groups)
    values = _blocked(value, layout.kv_len, layout.kv_blocks, kb, layout.groups)
    q_pos = _positions(jnp.arange(layout.q_blocks, dtype=jnp.int32), qb, -2)  # [n, qb, 1]
    rows = (layout.batch, layout.heads, layout.q_blocks, qb)
    carry = (jnp.full(rows, -jnp.inf, layout.compute), jnp.zeros(rows, layout.compute),
             jnp.zeros(rows + (value.shape[-1],), layout.compute))

    def step(ids, live, masked, carry):
        peak, total, acc = carry
        kv_pos = _positions(ids, kb, -1)
        grid = _grid_indices(layout, q_pos, kv_pos)
        raw = jnp.einsum("bhnqd,bhnkd->bhnqk", q, _take_blocks(keys, ids).astype(layout.compute)) * mods.scale
        scores = mods.scores(raw, grid)
        scores = jnp.where(mods.visible(grid, q_pos, kv_pos, layout, live, masked), scores, -jnp.inf)
        new_peak = jnp.maximum(peak, scores.max(-1))
        shift = jnp.where(new_peak == -jnp.inf, 0.0, new_peak)
        weights = jnp.exp(scores - shift[..., None])
        rescale = jnp.exp(peak - shift)
        acc = acc * rescale[..., None] + jnp.einsum(
            "bhnqk,bhnkd->bhnqd", weights, _take_blocks(values, ids).astype(layout.compute))
        return new_peak, total * rescale + weights.sum(-1), acc

    carry = _over_lists(_lists(sparsity, layout, transposed=False), step, carry)
    peak, total, acc = carry
    empty = total == 0
    out = jnp.where(empty[..., None], 0.0, acc / jnp.where(empty, 1.0, total)[..., None])
    logsumexp = jnp.where(empty, -jnp.inf, peak + jnp.log(jnp.where(empty, 1.0, total)))
    return (_unblocked(out, layout.q_len).astype(query.dtype), _unblocked(logsumexp, layout.q_len) / LN2,
            _unblocked(peak, layout.q_len) / LN2)


def _backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, mods: _Mods, sparsity: BlockSparsity,
              learnable: list[int]):
    """Flash attention's backward over the listed blocks: (dq, dk, dv, gradients of the learnable score buffers)."""
    if sparsity.q_num_blocks is None:
        raise RuntimeError("torchtpu: flex attention's backward needs the block mask's q_indices "
                           "(create the BlockMask with compute_q_blocks=True)")
    layout = _layout(query, key, sparsity)
    qb, kb, c = sparsity.q_block, sparsity.kv_block, layout.compute
    q = _blocked(query, layout.q_len, layout.q_blocks, qb).astype(c)
    keys = _blocked(key, layout.kv_len, layout.kv_blocks, kb, layout.groups).astype(c)
    values = _blocked(value, layout.kv_len, layout.kv_blocks, kb, layout.groups).astype(c)
    d_out = _blocked(grad_out, layout.q_len, layout.q_blocks, qb).astype(c)
    lse = _blocked(logsumexp.astype(c) * LN2, layout.q_len, layout.q_blocks, qb)
    lse = jnp.where(lse == -jnp.inf, 0.0, lse)  # a fully masked row: every weight is 0 anyway
    # dS = P * (dP - delta + d lse2 / ln 2): the output's and the returned log-sum-exp's cotangents.
    delta = (d_out * _blocked(out, layout.q_len, layout.q_blocks, qb).astype(c)).sum(-1)
    if grad_logsumexp is not None:
        delta = delta - _blocked(grad_logsumexp.astype(c), layout.q_len, layout.q_blocks, qb) / LN2
    learned = tuple(mods.score_buffers[i] for i in learnable)

    def block_grads(q_rows, kv_cols, live, masked, qj, k, v, d_o, lse_rows, delta_rows, buffers_too: bool):
        """(the weights P, the raw scores' cotangent, the learned buffers' cotangents) of one block of scores."""
        grid = _grid_indices(layout, q_rows, kv_cols)
        visible = mods.visible(grid, q_rows, kv_cols, layout, live, masked)

        def modified(raw, *learned_buffers):
            buffers = list(mods.score_buffers)
            for i, b in zip(learnable, learned_buffers):
                buffers[i] = b
            return mods.scores(raw, grid, tuple(buffers))

        raw = jnp.einsum("bhnqd,bhnkd->bhnqk", qj, k) * mods.scale
        scores, pullback = jax.vjp(modified, raw, *(learned if buffers_too else ()))
        weights = jnp.where(visible, jnp.exp(scores - lse_rows[..., None]), 0.0)
        d_scores = weights * (jnp.einsum("bhnqd,bhnkd->bhnqk", d_o, v) - delta_rows[..., None])
        d_raw, *d_buffers = pullback(d_scores)
        return weights, d_raw, d_buffers

    # dq (and the buffers' gradients): each query block over its key blocks.
    q_pos = _positions(jnp.arange(layout.q_blocks, dtype=jnp.int32), qb, -2)
    carry = (jnp.zeros_like(q), tuple(jnp.zeros(b.shape, c) for b in learned))

    def dq_step(ids, live, masked, carry):
        dq, d_learned = carry
        k, v = _take_blocks(keys, ids), _take_blocks(values, ids)
        _, d_raw, d_buffers = block_grads(q_pos, _positions(ids, kb, -1), live, masked, q, k, v, d_out, lse, delta,
                                          True)
        dq = dq + jnp.einsum("bhnqk,bhnkd->bhnqd", d_raw, k) * mods.scale
        return dq, tuple(a + g.astype(c) for a, g in zip(d_learned, d_buffers))

    dq, d_learned = _over_lists(_lists(sparsity, layout, transposed=False), dq_step, carry)

    # dk, dv: each key block over the query blocks that see it.
    kv_pos = _positions(jnp.arange(layout.kv_blocks, dtype=jnp.int32), kb, -1)
    kv_carry = (jnp.zeros_like(keys), jnp.zeros_like(values))

    def dkv_step(ids, live, masked, carry):
        dk, dv = carry
        qj, d_o = _take_blocks(q, ids), _take_blocks(d_out, ids)
        weights, d_raw, _ = block_grads(_positions(ids, qb, -2), kv_pos, live, masked, qj, keys, values, d_o,
                                        _take_blocks(lse, ids), _take_blocks(delta, ids), False)
        dv = dv + jnp.einsum("bhnqk,bhnqd->bhnkd", weights, d_o)
        dk = dk + jnp.einsum("bhnqk,bhnqd->bhnkd", d_raw, qj) * mods.scale
        return dk, dv

    kv_carry = _over_lists(_lists(sparsity, layout, transposed=True), dkv_step, kv_carry)
    dk, dv = (_unblocked(t, layout.kv_len) for t in kv_carry)
    if layout.groups > 1:  # the repeated heads' gradients flow back to their shared key head
        dk, dv = (t.reshape(t.shape[0], -1, layout.groups, *t.shape[2:]).sum(2) for t in (dk, dv))
    return (_unblocked(dq, layout.q_len).astype(query.dtype), dk.astype(key.dtype), dv.astype(value.dtype),
            [g.astype(mods.score_buffers[i].dtype) for i, g in zip(learnable, d_learned)])


def _learnable(buffers) -> list[int]:
    """Positions of the captured score buffers that can have a gradient (floating tensors)."""
    return [i for i, b in enumerate(buffers) if hasattr(b, "dtype") and jnp.issubdtype(b.dtype, jnp.floating)]


@fx.higher_order(_hop.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                   mask_mod_other_buffers=()):
    sparsity = block_sparsity(block_mask)
    mods = _Mods(score_mod, sparsity.mask_mod, tuple(score_mod_other_buffers), tuple(mask_mod_other_buffers), scale)
    return _forward(query, key, value, mods, sparsity)


@fx.higher_order(_hop.flex_attention_backward)
def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers=(),
                            mask_mod_other_buffers=()):
    sparsity = block_sparsity(block_mask)
    buffers = tuple(score_mod_other_buffers)
    mods = _Mods(fw_graph, sparsity.mask_mod, buffers, tuple(mask_mod_other_buffers), scale)
    learnable = _learnable(buffers)
    grad_q, grad_k, grad_v, learned = _backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, mods,
                                                sparsity, learnable)
    captured = [None] * len(buffers)  # the gradients of the tensors the score modification captured
    for i, grad in zip(learnable, learned):
        captured[i] = grad
    return grad_q, grad_k, grad_v, tuple(captured)
