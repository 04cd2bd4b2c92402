"""Collectives as jax functions of one rank's block, for use inside any ``shard_map``.

Each function takes this rank's block ``x``, the mesh axis the ranks lie
along, and the collective's parameters, and returns this rank's block of the
result.  They depend on nothing but jax, so the process group
(``process_group.py``) and a lowering of ``torch.ops._c10d_functional.*``
inside a compiled graph can share them.

Reduce ops are named as the functional collectives name them: "sum", "avg",
"product", "min", "max", "premul_sum", "band", "bor", "bxor".
``check_reduce_op`` says, before anything is traced, which of them a dtype
allows (NCCL's rules where NCCL has them).

Every rank of a group runs the same program, so every rank gets the same
bits: reductions that XLA has no collective for (product, the bitwise ops)
gather the blocks and fold them in rank order on each rank.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor")
_BITWISE = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}


# ---- which reduce op a dtype allows -------------------------------------------------------------


def check_reduce_op(collective: str, op: str, dtype) -> None:
    """Raise a clear error for a reduce op the dtype does not allow."""
    dtype = jnp.dtype(dtype)
    if op not in REDUCE_OPS:
        raise ValueError(f"{collective}: unknown reduce op {op!r} (expected one of {', '.join(REDUCE_OPS)})")
    floating = jnp.issubdtype(dtype, jnp.inexact)
    if op == "avg" and not floating:
        raise RuntimeError(f"{collective}: ReduceOp.AVG needs a floating-point tensor, got {dtype} "
                           f"(as with NCCL; use SUM and divide)")
    if op == "premul_sum" and not floating:
        raise RuntimeError(f"{collective}: ReduceOp.PREMUL_SUM needs a floating-point tensor, got {dtype}")
    if op in _BITWISE and floating:
        raise RuntimeError(f"{collective}: ReduceOp.{op.upper()} needs an integer or bool tensor, got {dtype}")
    if op in ("min", "max") and jnp.issubdtype(dtype, jnp.complexfloating):
        raise RuntimeError(f"{collective}: ReduceOp.{op.upper()} is undefined for complex tensors ({dtype})")


# ---- reductions ---------------------------------------------------------------------------------


def all_reduce(x, axis, op: str, factor=None):
    """Every rank's ``x`` reduced with ``op``; ``factor`` (an array) for "premul_sum"."""
    if x.dtype == jnp.bool_:
        return _all_reduce_bool(x, axis, op)
    if op == "sum":
        return lax.psum(x, axis)
    if op == "avg":
        return _average(lax.psum(x, axis), axis, x.dtype)
    if op == "premul_sum":
        return lax.psum(_premultiply(x, factor), axis)
    if op == "max":
        return lax.pmax(x, axis)
    if op == "min":
        return lax.pmin(x, axis)
    blocks = lax.all_gather(x, axis)  # XLA has no product or bitwise collective
    if op == "product":
        return jnp.prod(blocks, axis=0, dtype=x.dtype)
    return _fold(_BITWISE[op], blocks)


def _all_reduce_bool(x, axis, op: str):
    """bool as NCCL reduces it: sum and max are "any", product and min are "all"."""
    bits = x.astype(jnp.uint8)
    if op in ("sum", "max", "bor"):
        return lax.pmax(bits, axis).astype(jnp.bool_)
    if op in ("product", "min", "band"):
        return lax.pmin(bits, axis).astype(jnp.bool_)
    if op == "bxor":  # parity of the count; uint8 wrap-around keeps the parity
        return (lax.psum(bits, axis) & 1).astype(jnp.bool_)
    raise RuntimeError(f"reduce op {op!r} is undefined for bool tensors")


def _average(total, axis, dtype):
    return (total / lax.axis_size(axis)).astype(dtype)


def _premultiply(x, factor):
    # The factor is an operand, not a constant: a new factor is no new program.
    return x * factor.reshape(()).astype(x.dtype)


def _fold(fn, blocks):
    """fn over the gathered blocks in rank order: the same bits on every rank."""
    return functools.reduce(fn, [blocks[i] for i in range(blocks.shape[0])])


def reduce_scatter(x, axis, op: str, factor=None):
    """``x`` (n equal blocks along dim 0) reduced over ranks; rank i keeps block i."""
    if x.dtype != jnp.bool_ and op in ("sum", "avg", "premul_sum"):
        if op == "premul_sum":
            x = _premultiply(x, factor)
        block = lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
        return _average(block, axis, x.dtype) if op == "avg" else block
    reduced = all_reduce(x, axis, op, factor)  # no scatter form for the others: reduce, keep own block
    size = x.shape[0] // lax.axis_size(axis)
    return lax.dynamic_slice_in_dim(reduced, lax.axis_index(axis) * size, size, axis=0)


# ---- data movement ------------------------------------------------------------------------------


def all_gather(x, axis):
    """Every rank's block, stacked in rank order: shape (n, *x.shape)."""
    return lax.all_gather(x, axis)


def broadcast(x, axis, root: int):
    """The root's ``x`` on every rank, bit for bit (NaN payloads and -0.0 included).

    Its bits are summed as unsigned integers with zeros from the other ranks:
    exact, and no rank holds more than one block (an all-gather would hold n).
    Complex values have no integer view in XLA; they are gathered instead.
    """
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return lax.all_gather(x, axis)[root]
    bits = _as_unsigned(x)
    mine = jnp.where(lax.axis_index(axis) == root, bits, jnp.zeros_like(bits))
    return _from_unsigned(lax.psum(mine, axis), x.dtype)


def _as_unsigned(x):
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def _from_unsigned(bits, dtype):
    if dtype == jnp.bool_:
        return bits.astype(jnp.bool_)
    return lax.bitcast_convert_type(bits, dtype)


def all_to_all(x, axis):
    """``x`` cut into n equal blocks along dim 0; block j goes to rank j, and the
    blocks a rank receives are concatenated in source-rank order."""
    return lax.all_to_all(x, axis, 0, 0, tiled=True)


def scatter(x, axis, root: int):
    """Block i of the root's ``x`` (n equal blocks along dim 0) on rank i.

    The other ranks' ``x`` only gives the shape; its values are never read.
    """
    received = all_to_all(x, axis)
    size = x.shape[0] // lax.axis_size(axis)
    return received[root * size:(root + 1) * size]


def permute(x, axis, pairs):
    """Rank ``src``'s block to rank ``dst`` for each ``(src, dst)`` in ``pairs``; zeros
    where nothing arrives.  Both ends must run it (a send/recv pair)."""
    return lax.ppermute(x, axis, perm=list(pairs))
