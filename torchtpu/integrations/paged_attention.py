"""Paged attention on tpu for serving engines (vLLM's and SGLang's backends share it).

:func:`paged_attention` is the torch-op implementation: it runs on any device
and is the test oracle. Mixed prefill and decode batches, chunked prefill and
prefix-cache hits are all the same computation: each token attends to the
cached keys of its own request at positions up to its own.
:func:`chunked_paged_attention` runs it as one JAX op over a cache in either
engine's layout (``LAYOUTS``).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import torch

from torchtpu.api.bucketing import bucket_size
from torchtpu.runtime import device as runtime_device

# A finite "minus infinity": a padding token that sees no key gets a uniform
# average instead of NaN, so nothing non-finite reaches the cache.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
SMALLEST_TOKEN_BUCKET = 16


def token_bucket(num_tokens: int, limit: int) -> int:
    """The padded token count of a step: a power of two (at least 16), at most ``limit``."""
    return min(max(bucket_size(num_tokens), SMALLEST_TOKEN_BUCKET), limit)


def kv_storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a KV cache of ``dtype`` is stored in.

    On XLA:CPU a scatter into a bfloat16/float16 array converts all of it to
    float32 and back, and a bitcast of it is a copy too: each step copied
    every layer's whole cache (37 ms of a 38 ms decode step with a 64 MiB
    cache). There the cache holds the values' int16 bit patterns, which
    scatter in place; attention reinterprets only the pages it gathers.
    """
    if dtype in (torch.bfloat16, torch.float16) and runtime_device.platform() == "cpu":
        return torch.int16
    return dtype


def write_kv_cache(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
    """Store each token's key and value in its slot (``block * block_size + offset``), in place."""
    tokens, kv_heads, head_size = key.shape
    interleaved = torch.stack((key, value), dim=2).reshape(tokens, 2 * kv_heads, head_size)
    rows = interleaved.view(torch.int16) if kv_cache.dtype == torch.int16 else interleaved.to(kv_cache.dtype)
    kv_cache.view(-1, 2 * kv_heads, head_size).index_copy_(0, slots, rows)


def paged_attention(query, kv_cache, block_tables, token_request, token_position, *, scale: float,
                    sliding_window: int | None = None, soft_cap: float | None = None) -> torch.Tensor:
    """Causal attention of each token over its request's cached keys.

    query ``[T, Hq, D]``; kv_cache ``[blocks, block_size, 2*Hkv, D]``;
    block_tables ``[S, P]`` (the pages of each request); token_request and
    token_position ``[T]`` (a token sees the keys of request
    ``token_request[t]`` at positions ``<= token_position[t]``). Each token
    gathers its own request's pages, so the work is ``T x P*block_size``
    whatever the number of requests. Scores and softmax in float32, as vLLM's
    GPU kernels accumulate.
    """
    tokens, q_heads, head_size = query.shape
    _, block_size, combined_heads, _ = kv_cache.shape
    kv_heads = combined_heads // 2
    pages = block_tables.index_select(0, token_request)  # [T, P]: no host-side bounds check
    context = pages.shape[1] * block_size
    cached = kv_cache.index_select(0, pages.reshape(-1))
    if cached.dtype == torch.int16:  # bit patterns (kv_storage_dtype) of the model's dtype
        cached = cached.view(query.dtype)
    cached = cached.reshape(tokens, context, combined_heads, head_size).float()
    keys, values = cached[:, :, 0::2], cached[:, :, 1::2]
    q = query.reshape(tokens, kv_heads, q_heads // kv_heads, head_size).float()
    scores = torch.einsum("tkgd,tlkd->tkgl", q, keys) * scale
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    key_position = torch.arange(context, device=query.device)
    visible = key_position <= token_position[:, None]
    if sliding_window is not None:
        visible &= key_position > token_position[:, None] - sliding_window
    scores = scores.masked_fill(~visible[:, None, None], MASK_VALUE)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("tkgl,tlkd->tkgd", probs, values)
    return out.reshape(tokens, q_heads, head_size).to(query.dtype)


# Key positions per step of :func:`chunked_paged_attention`'s loop.
CHUNK_POSITIONS = 64


def chunk_pages(block_size: int) -> int:
    """Pages per chunk of :func:`chunked_paged_attention` (at least one)."""
    return max(1, CHUNK_POSITIONS // block_size)


def _scores(q, keys, scale, soft_cap, visible, equation):
    """Masked attention scores in float32, ``visible`` broadcast over the heads."""
    import jax.numpy as jnp

    scores = jnp.einsum(equation, q, keys) * scale
    if soft_cap:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    return jnp.where(visible[:, None, None], scores, MASK_VALUE)


def _accumulate(carry, scores, values, equation):
    """One block of an online softmax: fold ``scores`` and their ``values`` into (peak, total, acc)."""
    import jax.numpy as jnp

    peak, total, acc = carry
    new_peak = jnp.maximum(peak, scores.max(-1))
    rescale = jnp.exp(peak - new_peak)
    weights = jnp.exp(scores - new_peak[..., None])
    total = total * rescale + weights.sum(-1)
    acc = acc * rescale[..., None] + jnp.einsum(equation, weights, values)
    return new_peak, total, acc


def _in_window(key_position, token_position, sliding_window):
    return True if sliding_window is None else key_position > token_position[:, None] - sliding_window


def _interleaved_pages(caches, page_ids, dtype):
    """Keys and values of ``page_ids`` from one ``[blocks, block_size, 2*Hkv, D]`` cache (K of head h at 2h)."""
    cached = _as_dtype(caches[0][page_ids], dtype)
    pages, block_size, combined_heads, head_size = cached.shape
    cached = cached.reshape(pages * block_size, combined_heads // 2, 2, head_size)
    return cached[..., 0, :], cached[..., 1, :]


def _separate_slots(caches, slot_ids, dtype):
    """Keys and values of ``slot_ids`` from a ``[slots, Hkv, D]`` key cache and value cache (pages of one token)."""
    key_cache, value_cache = caches
    return _as_dtype(key_cache[slot_ids], dtype), _as_dtype(value_cache[slot_ids], dtype)


def _as_dtype(cached, dtype):
    import jax

    if cached.dtype != dtype:  # the int16 bit patterns of a 16-bit float cache (kv_storage_dtype)
        cached = jax.lax.bitcast_convert_type(cached, dtype)
    return cached


def _cache_kv_heads(caches) -> int:
    """The key heads of a cache in either layout: ``[..., 2*Hkv, D]`` alone, or ``[slots, Hkv, D]`` and values."""
    return caches[0].shape[-2] // (2 if len(caches) == 1 else 1)


# How each cache layout is read: (the reader, how many cache arrays the op takes).
LAYOUTS = {"interleaved": (_interleaved_pages, 1), "separate": (_separate_slots, 2)}


def _chunked_attention_jax(query, key, value, caches, block_tables, token_request, token_position, token_cached,
                           num_chunks, *, read_pages, block_size, scale, sliding_window, soft_cap, per_chunk):
    """:func:`paged_attention` in JAX, in two parts joined by an online softmax.

    1. The step's own keys (``key``/``value``, ``[T, Hkv, D]``): each token sees
       those of its request at positions up to its own. A prefill reads no cache.
    2. The keys its request cached in earlier steps, positions below
       ``token_cached[t]``, a chunk of pages at a time (``read_pages`` reads
       them from ``caches`` in their layout). The loop runs ``num_chunks``
       times, a value of the step (its longest cached prefix), not of the
       program: one program serves every context length.

    With ``key=None`` part 1 is skipped and part 2 reads every key up to the
    token's own position from the cache (a layer sharing another's cache)."""
    import jax
    import jax.numpy as jnp

    tokens, q_heads, head_size = query.shape
    positions = per_chunk * block_size
    pages = block_tables[token_request]  # [T, P]: each token's own request's pages
    kv_heads = _cache_kv_heads(caches)
    q = query.reshape(tokens, kv_heads, q_heads // kv_heads, head_size).astype(jnp.float32)
    shape = (tokens, kv_heads, q_heads // kv_heads)
    carry = (jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
             jnp.zeros(shape + (head_size,), jnp.float32))
    if key is None:
        cached_limit = token_position + 1
    else:
        cached_limit = token_cached
        same_request = token_request[:, None] == token_request[None, :]
        visible = same_request & (token_position[None, :] <= token_position[:, None]) & (token_position[None, :] >= 0)
        visible &= _in_window(token_position[None, :], token_position, sliding_window)
        scores = _scores(q, key.astype(jnp.float32), scale, soft_cap, visible, "tkgd,skd->tkgs")
        carry = _accumulate(carry, scores, value.astype(jnp.float32), "tkgs,skd->tkgd")

    def step(chunk, carry):
        chunk_pages_ = jax.lax.dynamic_slice_in_dim(pages, chunk * per_chunk, per_chunk, axis=1)
        keys, values = read_pages(caches, chunk_pages_.reshape(-1), query.dtype)
        keys = keys.reshape(tokens, positions, kv_heads, head_size).astype(jnp.float32)
        values = values.reshape(tokens, positions, kv_heads, head_size).astype(jnp.float32)
        key_position = chunk * positions + jnp.arange(positions)
        visible = (key_position < cached_limit[:, None]) & _in_window(key_position, token_position, sliding_window)
        scores = _scores(q, keys, scale, soft_cap, visible, "tkgd,tlkd->tkgl")
        return _accumulate(carry, scores, values, "tkgl,tlkd->tkgd")

    _, total, acc = jax.lax.fori_loop(0, num_chunks.astype(jnp.int32), step, carry)
    out = acc / jnp.maximum(total, 1e-30)[..., None]
    return out.reshape(tokens, q_heads, head_size).astype(query.dtype)


def _attention_of_arrays(attention, num_caches, step_keys, query, *arrays):
    """The op's positional arrays -> :func:`_chunked_attention_jax`'s arguments."""
    key, value, arrays = (arrays[0], arrays[1], arrays[2:]) if step_keys else (None, None, arrays)
    return attention(query, key, value, arrays[:num_caches], *arrays[num_caches:])


_op_ids = itertools.count()


@functools.lru_cache(maxsize=None)
def chunked_attention_op(scale: float, sliding_window, soft_cap, block_size: int, step_keys: bool = True,
                         layout: str = "interleaved"):
    """:func:`chunked_paged_attention` of one configuration as a tpu op (its numbers are constants
    of the program). Make it before tracing: defining an op inside a compiled region fails.
    ``step_keys=False`` makes the op read every key from the cache (it then takes no key and value).
    ``layout``: ``"interleaved"`` (one cache ``[blocks, block_size, 2*Hkv, D]``, vLLM's) or
    ``"separate"`` (a key cache and a value cache ``[slots, Hkv, D]``, SGLang's; ``block_size`` 1)."""
    read_pages, num_caches = LAYOUTS[layout]
    attention = functools.partial(_chunked_attention_jax, read_pages=read_pages, block_size=block_size,
                                  scale=float(scale), sliding_window=sliding_window, soft_cap=soft_cap or None,
                                  per_chunk=chunk_pages(block_size))
    fn = functools.partial(_attention_of_arrays, attention, num_caches, step_keys)
    return torch.tpu.pallas.jax_op(f"paged_attention_{next(_op_ids)}", fn)


def chunked_paged_attention(query, key, value, kv_cache, block_tables, token_request, token_position, token_cached,
                            num_chunks, *, scale: float, sliding_window: int | None = None,
                            soft_cap: float | None = None):
    """:func:`paged_attention` as one tpu op: each token's attention over the step's keys ``key``/``value``
    (``[T, Hkv, D]``) and over its request's ``token_cached[t]`` keys cached in earlier steps, read a chunk
    of :func:`chunk_pages` pages at a time for ``num_chunks`` chunks (a 0-dim tensor: the step's longest
    cached prefix). With ``key=None`` every key is read from the cache and ``num_chunks`` must cover the
    step's longest sequence."""
    op = chunked_attention_op(scale, sliding_window, soft_cap, kv_cache.shape[1], step_keys=key is not None)
    step_keys = () if key is None else (key, value)
    return op(query, *step_keys, kv_cache, block_tables, token_request, token_position, token_cached, num_chunks)


