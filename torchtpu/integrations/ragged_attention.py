"""JAX's TPU ragged paged-attention Pallas kernel as a tpu op, for every serving engine's attention backend.

``jax.experimental.pallas.ops.tpu.ragged_paged_attention`` takes the KV cache
as ``[pages, page_size, 2 * kv_heads, head_size]`` with K and V heads
interleaved, and a step described per request: ``kv_lens`` (each request's
sequence length), ``page_indices`` (its pages), ``cu_q_lens`` (where its
tokens start in the query) and ``num_seqs``. The engines' metadata builders
upload those padded to a fixed number of requests, so every token bucket has
one program.

The kernel runs on a real TPU, picking its block sizes from its tuned table;
elsewhere, when an engine's setting asks, in Pallas' TPU interpreter (slow;
for tests) with small fixed blocks, so that a tiny step still spans several
query and KV blocks. Where it cannot take a layer (:func:`unsupported_reason`)
the engine runs its chunked op (``paged_attention.chunked_attention_op``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

from torchtpu.core import dtypes
from torchtpu.runtime import device as runtime_device

from . import pallas_interpret

# The kernel's softmax state is [rows, 128] and is broadcast over head_size.
LANES = 128
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
# Blocks of the interpreted kernel: (KV pages, query tokens) per block.
INTERPRET_BLOCKS = (2, 8)


def on_tpu() -> bool:
    return runtime_device.platform() == "tpu"


def unsupported_reason(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot take this attention layer, or None if it can."""
    if head_size % LANES:
        return f"head size {head_size} is not a multiple of {LANES}"
    if dtype not in KERNEL_DTYPES:
        return f"the KV cache dtype is {dtype}; the kernel takes float32 or bfloat16"
    if num_heads % num_kv_heads:
        return f"{num_heads} query heads do not divide into {num_kv_heads} KV heads"
    try:  # the kernel's own check of how K/V heads tile
        kernel.get_min_heads_per_blk(num_heads, 2 * num_kv_heads, dtypes.to_jax(dtype), dtypes.to_jax(dtype))
    except ValueError as error:
        return str(error)
    return None


def request_arrays(query_start: np.ndarray, seq_lens: np.ndarray, max_reqs: int) -> dict[str, np.ndarray]:
    """The kernel's per-request arrays for a step of ``len(seq_lens)`` requests, padded to ``max_reqs``:
    ``kv_lens`` (0 for padding), ``cu_q_lens`` (``query_start``, the requests' ``len + 1`` token offsets,
    its last value repeated) and ``num_seqs``."""
    num_reqs = len(seq_lens)
    return {
        "kv_lens": np.pad(seq_lens, (0, max_reqs - num_reqs)).astype(np.int32),
        "cu_q_lens": np.pad(query_start, (0, max_reqs - num_reqs), mode="edge").astype(np.int32),
        "num_seqs": np.array([num_reqs], np.int32),
    }


def _ragged_attention_jax(query, kv_cache, block_tables, kv_lens, cu_q_lens, num_seqs, *, scale, sliding_window,
                          soft_cap, interpret):
    """The kernel on our step arrays; padding tokens (past ``cu_q_lens[num_seqs]``) get zeros."""
    if kv_cache.dtype != query.dtype:  # the int16 bit patterns of a 16-bit float cache (kv_storage_dtype)
        kv_cache = jax.lax.bitcast_convert_type(kv_cache, query.dtype)
    pages_per_seq = block_tables.shape[1]
    blocks = {}
    if interpret:  # the tuned table reads the TPU's version
        blocks = dict(num_kv_pages_per_block=min(INTERPRET_BLOCKS[0], pages_per_seq),
                      num_queries_per_block=min(INTERPRET_BLOCKS[1], query.shape[0]))
    kv_lens, page_indices, cu_q_lens, num_seqs = (a.astype(jnp.int32) for a in (kv_lens, block_tables, cu_q_lens,
                                                                                 num_seqs))
    # The kernel's index arithmetic mixes int32 with Python ints: it traces only in 32-bit mode, not in
    # the 64-bit mode torchtpu traces its programs in.
    with jax.enable_x64(False), pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext():
        out = kernel.ragged_paged_attention(query, kv_cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                                            sm_scale=scale, sliding_window=sliding_window, soft_cap=soft_cap, **blocks)
    # The kernel leaves rows past the last request unwritten: stale or, interpreted, NaN.
    real = jnp.arange(query.shape[0]) < cu_q_lens[num_seqs[0]]
    return jnp.where(real[:, None, None], out, jnp.zeros((), out.dtype))


_op_ids = itertools.count()


@functools.lru_cache(maxsize=None)
def ragged_attention_op(scale: float, sliding_window, soft_cap):
    """The kernel of one configuration as a tpu op, ``op(query, kv_cache, block_tables, kv_lens, cu_q_lens,
    num_seqs)``. Make it before tracing: defining an op inside a compiled region fails."""
    interpret = not on_tpu()
    if interpret:
        pallas_interpret.install()
    fn = functools.partial(_ragged_attention_jax, scale=float(scale), sliding_window=sliding_window,
                           soft_cap=soft_cap or None, interpret=interpret)
    # The output is the query's shape; the kernel's own code cannot run on a symbolic token count (it picks
    # its blocks from it), which is what a step traced once for every token bucket gives it.
    return torch.tpu.pallas.jax_op(f"ragged_paged_attention_{next(_op_ids)}", fn, shapes=_query_shaped)


def _query_shaped(query, *_):
    return jax.ShapeDtypeStruct(query.shape, query.dtype)
