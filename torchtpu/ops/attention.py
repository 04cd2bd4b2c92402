"""Lowerings: fused scaled-dot-product attention, forward and backward.

``F.scaled_dot_product_attention`` on tpu runs as two ops defined here,
``torchtpu::sdpa_forward`` and ``torchtpu::sdpa_backward`` (its autograd
kernel is in ``dispatch/attention.py``), so eager mode runs one program each
way instead of a chain of matmuls and softmaxes, and compiled graphs carry
one node.

The forward keeps each row's log-sum-exp, so the backward recomputes the
probabilities instead of storing them.  Where the shapes fit (no bias,
lengths that are multiples of the block), the forward runs as a Pallas
flash-attention kernel: on TPU always, elsewhere when
``TORCHTPU_FLASH_ATTENTION=1`` asks for it (in Pallas' interpreter, for
testing).  On XLA's CPU backend, scores larger than a cache-sized block run
as loops over blocks of heads, one loop per result (``_looped_forward``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import config
from .registry import define, lower

BLOCK = 128


def _forward_shapes(q, k, v, bias, causal, scale):
    return q.new_empty(q.shape[:-1] + v.shape[-1:]), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_shapes(grad_out, q, k, v, bias, out, logsumexp, causal, scale):
    grad_bias = torch.empty_like(bias) if bias is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), grad_bias


sdpa_forward_op = define(
    "sdpa_forward(Tensor q, Tensor k, Tensor v, Tensor? bias, bool causal, float scale) -> (Tensor, Tensor)",
    _forward_shapes)
sdpa_backward_op = define(
    "sdpa_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor out, "
    "Tensor logsumexp, bool causal, float scale) -> (Tensor, Tensor, Tensor, Tensor)", _backward_shapes)


def _scores(q, k, bias, causal, scale):
    """Scaled scores in float32, with the bias added and the causal mask applied (-inf)."""
    s = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    if causal:
        tq, tk = s.shape[-2:]
        keep = jnp.tril(jnp.ones((tq, tk), bool))  # aligned to the top left, as in PyTorch's SDPA
        s = jnp.where(keep, s, -jnp.inf)
    return s


def _safe_logsumexp(s):
    """Row log-sum-exp; a fully masked row gives -inf, and its probabilities 0 (PyTorch's _safe_softmax)."""
    peak = jnp.max(s, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    return jnp.log(jnp.sum(jnp.exp(s - peak), axis=-1)) + peak[..., 0]


def _safe_softmax(s):
    """softmax over the last axis; a fully masked row gives 0 (PyTorch's _safe_softmax)."""
    peak = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - jnp.where(jnp.isfinite(peak), peak, 0.0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.where(total > 0, e / jnp.where(total > 0, total, 1.0), 0.0)


def _probabilities(s, lse):
    return jnp.where(jnp.isfinite(lse)[..., None], jnp.exp(s - lse[..., None]), 0.0)


def attention(q, k, v, bias, causal, scale):
    """(output, logsumexp) of softmax(q k^T * scale + bias) v, in plain XLA."""
    s = _scores(q, k, bias, causal, scale)
    lse = _safe_logsumexp(s)
    out = jnp.einsum("...qk,...kd->...qd", _probabilities(s, lse).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.astype(q.dtype), lse


def _flash_fits(q, k, bias) -> bool:
    wanted = jax.default_backend() == "tpu" or config.current.flash_attention
    return wanted and bias is None and q.shape[-2] % BLOCK == 0 and k.shape[-2] % BLOCK == 0


def flash_attention(q, k, v, causal, scale):
    """The forward as a Pallas kernel: one query block per program, streaming key blocks
    with an online softmax, so the score matrix never exists in full."""
    from jax.experimental import pallas as pl

    *batch, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    bh = math.prod(batch)
    q3, k3, v3 = q.reshape(bh, tq, d), k.reshape(bh, tk, d), v.reshape(bh, tk, dv)
    kernel = functools.partial(_flash_kernel, causal=causal, scale=scale, key_blocks=tk // BLOCK)
    out, lse = pl.pallas_call(
        kernel,
        grid=(bh, tq // BLOCK),
        in_specs=[pl.BlockSpec((None, BLOCK, d), lambda b, i: (b, i, 0)),
                  pl.BlockSpec((None, tk, d), lambda b, i: (b, 0, 0)),
                  pl.BlockSpec((None, tk, dv), lambda b, i: (b, 0, 0))],
        out_specs=[pl.BlockSpec((None, BLOCK, dv), lambda b, i: (b, i, 0)),
                   pl.BlockSpec((None, BLOCK), lambda b, i: (b, i))],
        out_shape=[jax.ShapeDtypeStruct((bh, tq, dv), q.dtype), jax.ShapeDtypeStruct((bh, tq), jnp.float32)],
        interpret=jax.default_backend() == "cpu",
    )(q3, k3, v3)
    return out.reshape(*batch, tq, dv), lse.reshape(*batch, tq)


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, causal, scale, key_blocks):
    from jax.experimental import pallas as pl

    q = q_ref[...].astype(jnp.float32) * scale
    first_row = pl.program_id(1) * BLOCK
    rows = first_row + jax.lax.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0)

    def step(j, carry):
        peak, total, acc = carry
        k = k_ref[pl.ds(j * BLOCK, BLOCK), :].astype(jnp.float32)
        v = v_ref[pl.ds(j * BLOCK, BLOCK), :].astype(jnp.float32)
        s = q @ k.T
        if causal:
            cols = j * BLOCK + jax.lax.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1)
            s = jnp.where(cols <= rows, s, -jnp.inf)
        new_peak = jnp.maximum(peak, s.max(axis=-1))
        safe_peak = jnp.where(jnp.isfinite(new_peak), new_peak, 0.0)
        p = jnp.exp(s - safe_peak[:, None])
        rescale = jnp.exp(jnp.where(jnp.isfinite(peak), peak, 0.0) - safe_peak)
        return new_peak, total * rescale + p.sum(axis=-1), acc * rescale[:, None] + p @ v

    init = (jnp.full((BLOCK,), -jnp.inf, jnp.float32), jnp.zeros((BLOCK,), jnp.float32),
            jnp.zeros((BLOCK, v_ref.shape[-1]), jnp.float32))
    peak, total, acc = jax.lax.fori_loop(0, key_blocks, step, init)
    o_ref[...] = jnp.where(total[:, None] > 0, acc / total[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(total > 0, jnp.log(total) + peak, -jnp.inf)


# ---- XLA:CPU: a loop per result ----------------------------------------------
# XLA:CPU runs a scores-softmax-matmul chain as one fast YNNPACK kernel when the
# chain has a single result and its arrays fit the caches. In one program XLA
# merges the score computations that the results share and materialises them
# whole: a causal forward of 4x16 heads of 256 tokens took 15 ms, the backward
# 23 ms. Each result computed by its own loop over blocks of heads (loop bodies
# share nothing) takes 3.5 and 11 ms.

CPU_BLOCK_BYTES = 1 << 22  # the float32 scores of one loop step
_LOWEST = float(np.finfo(np.float32).min)
_TINY = float(np.finfo(np.float32).tiny)


def _loops_fit(q, k) -> bool:
    """On XLA:CPU, whether the scores are larger than one block (smaller ones run best as one program)."""
    scores_bytes = 4 * math.prod(q.shape[:-1]) * k.shape[-2]
    return jax.default_backend() == "cpu" and scores_bytes > CPU_BLOCK_BYTES


def _per_head_loop(fn, *arrays):
    """``fn`` of one head's arrays, for every head, as one loop over blocks of heads."""
    tq, tk = arrays[0].shape[1], arrays[1].shape[1]
    return jax.lax.map(lambda head: fn(*head), arrays, batch_size=max(1, CPU_BLOCK_BYTES // (4 * tq * tk)))


def _as_heads(x, batch, rows, cols):
    """``x`` broadcast to ``batch + (rows, cols)``, as float32 ``[heads, rows, cols]``."""
    return None if x is None else jnp.broadcast_to(x, (*batch, rows, cols)).reshape(-1, rows, cols).astype(jnp.float32)


def _head_scores(q, k, bias, causal, scale, transposed=False):
    """One head's scores, ``[q, k]`` or (``transposed``) ``[k, q]``, with the bias and the causal mask."""
    s = k @ q.T * scale if transposed else q @ k.T * scale
    if bias is not None:
        s = s + (bias.T if transposed else bias)
    if causal:
        query = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1 if transposed else 0)
        key = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0 if transposed else 1)
        s = jnp.where(key <= query, s, -jnp.inf)
    return s


def _shifted_exp(s):
    """(row maximum, exp(s - maximum)); a fully masked row gives zeros."""
    peak = jnp.maximum(s.max(-1), _LOWEST)
    return peak, jnp.exp(s - peak[:, None])


def _looped_forward(q, k, v, bias, causal, scale):
    """:func:`attention` as two loops over heads: the output, then the log-sum-exp."""
    *batch, tq, _ = q.shape
    tk = k.shape[-2]
    q3, k3, v3 = (_as_heads(x, batch, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    bias3 = _as_heads(bias, batch, tq, tk)

    def output(q, k, v, bias):
        _, e = _shifted_exp(_head_scores(q, k, bias, causal, scale))
        return (e @ v) / jnp.maximum(e.sum(-1, keepdims=True), _TINY)

    def logsumexp(q, k, bias):
        peak, e = _shifted_exp(_head_scores(q, k, bias, causal, scale))
        return jnp.log(e.sum(-1)) + peak

    out = _per_head_loop(output, q3, k3, v3, bias3).reshape(*batch, tq, v.shape[-1])
    return out.astype(q.dtype), _per_head_loop(logsumexp, q3, k3, bias3).reshape(*batch, tq)


def _looped_backward(grad_out, q, k, v, bias, logsumexp, causal, scale):
    """:func:`sdpa_backward` as a loop over heads per result.

    P is a softmax shifted by the forward's log-sum-exp and normalised again by
    its own row sums (so the shift's rounding cancels: the precision of
    recomputing the softmax); ``dk`` and ``dv`` come from transposed scores,
    so every product is one XLA:CPU runs fast."""
    *batch, tq, _ = q.shape
    tk = k.shape[-2]
    q3, k3, v3, g3 = (_as_heads(x, batch, x.shape[-2], x.shape[-1]) for x in (q, k, v, grad_out))
    bias3 = _as_heads(bias, batch, tq, tk)
    shift = jnp.maximum(logsumexp.reshape(-1, tq).astype(jnp.float32), _LOWEST)

    def probabilities(q, k, bias, shift, total, transposed=False):
        s = _head_scores(q, k, bias, causal, scale, transposed)
        return jnp.exp(s - shift) / total if transposed else jnp.exp(s - shift[:, None]) / total[:, None]

    def row_total(q, k, bias, shift):
        return jnp.maximum(jnp.exp(_head_scores(q, k, bias, causal, scale) - shift[:, None]).sum(-1), _TINY)

    total = _per_head_loop(row_total, q3, k3, bias3, shift)

    def row_dot(q, k, v, g, bias, shift, total):  # sum_k P dP from the same P and dP as grad_scores
        return jnp.sum(probabilities(q, k, bias, shift, total) * (g @ v.T), -1)

    row = _per_head_loop(row_dot, q3, k3, v3, g3, bias3, shift, total)

    def grad_scores(q, k, v, g, bias, shift, total, row):
        return probabilities(q, k, bias, shift, total) * (g @ v.T - row[:, None])

    def grad_q(q, k, v, g, bias, shift, total, row):
        return grad_scores(q, k, v, g, bias, shift, total, row) @ k * scale

    def grad_k(q, k, v, g, bias, shift, total, row):
        return (probabilities(q, k, bias, shift, total, transposed=True) * (v @ g.T - row)) @ q * scale

    def grad_v(q, k, g, bias, shift, total):
        return probabilities(q, k, bias, shift, total, transposed=True) @ g

    operands = (q3, k3, v3, g3, bias3, shift, total, row)
    grad_bias = jnp.zeros((0,), q.dtype)
    if bias is not None:
        grad_s = _per_head_loop(grad_scores, *operands).reshape(*batch, tq, tk)
        grad_bias = _sum_to(grad_s, bias.shape).astype(bias.dtype)
    return (_per_head_loop(grad_q, *operands).reshape(q.shape).astype(q.dtype),
            _per_head_loop(grad_k, *operands).reshape(k.shape).astype(k.dtype),
            _per_head_loop(grad_v, q3, k3, g3, bias3, shift, total).reshape(v.shape).astype(v.dtype),
            grad_bias)


@lower(sdpa_forward_op, static_numbers=True)  # the scale is baked into the kernel
def sdpa_forward(q, k, v, bias, causal, scale):
    if _flash_fits(q, k, bias):
        return flash_attention(q, k, v, causal, scale)
    if _loops_fit(q, k):
        return _looped_forward(q, k, v, bias, causal, scale)
    return attention(q, k, v, bias, causal, scale)


@lower(sdpa_backward_op, static_numbers=True)
def sdpa_backward(grad_out, q, k, v, bias, out, logsumexp, causal, scale):
    """The gradients, with P recomputed, never stored.

    Written for precision where the softmax is peaked (large scores), where the textbook flash
    backward had 4-10x CPU's dq error against float64: P is recomputed as a softmax, not as
    exp(S - logsumexp), whose absolute rounding error exp turns into a relative error of every
    probability; and each row's sum(P * dP) comes from that P, not as rowsum(dO * O) from the
    saved output, so that the two terms of ``grad_p - row`` round alike and cancel cleanly.
    On XLA:CPU large scores take ``_looped_backward``, which needs ``logsumexp``."""
    if _loops_fit(q, k):
        return _looped_backward(grad_out, q, k, v, bias, logsumexp, causal, scale)
    del out, logsumexp
    p = _safe_softmax(_scores(q, k, bias, causal, scale))
    g = grad_out.astype(jnp.float32)
    grad_v = jnp.einsum("...qk,...qd->...kd", p, g)
    grad_p = jnp.einsum("...qd,...kd->...qk", g, v.astype(jnp.float32))
    row = jnp.sum(p * grad_p, axis=-1, keepdims=True)
    grad_s = p * (grad_p - row)
    grad_q = jnp.einsum("...qk,...kd->...qd", grad_s, k.astype(jnp.float32)) * scale
    grad_k = jnp.einsum("...qk,...qd->...kd", grad_s, q.astype(jnp.float32)) * scale
    grad_bias = jnp.zeros((0,), q.dtype) if bias is None else _sum_to(grad_s, bias.shape).astype(bias.dtype)
    return grad_q.astype(q.dtype), grad_k.astype(k.dtype), grad_v.astype(v.dtype), grad_bias


def _sum_to(x, shape):
    """``x`` summed over the dims that ``shape`` broadcast (a bias shared across batch or heads)."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x
