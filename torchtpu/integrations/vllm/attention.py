"""Paged attention on tpu for vLLM: the ``TORCHTPU`` attention backend.

The KV cache of a layer is one tensor ``[num_blocks, block_size, 2 * kv_heads,
head_size]`` with K and V heads interleaved (K of head h at 2h, V at 2h+1): the
layout of the TPU ragged paged-attention kernel. A step's metadata is built on
the host and uploaded padded to fixed sizes (tokens to the step's token
bucket, requests to ``max_num_seqs``, pages to what ``max_model_len`` needs),
so the compiled step has one program per token bucket.

:func:`paged_attention` is the torch-op implementation: it runs on any device
and is the test oracle. Mixed prefill and decode batches, chunked prefill and
prefix-cache hits are all the same computation: each token attends to the
cached keys of its own request at positions up to its own.
:func:`chunked_paged_attention` runs it as one JAX op; on TPU, JAX's ragged
paged-attention Pallas kernel runs it instead wherever it takes the layer
(``pallas_attention.py``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.config import get_current_vllm_config
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType,
                                       MultipleOf)

from torchtpu.api.bucketing import bucket_size
from torchtpu.core import tensor
from torchtpu.runtime import device as runtime_device

from . import ATTENTION_BACKEND, pallas_attention
from .compiled import check_same_rows

# A finite "minus infinity": a padding token that sees no key gets a uniform
# average instead of NaN, so nothing non-finite reaches the cache.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
SMALLEST_TOKEN_BUCKET = 16


def token_bucket(num_tokens: int, limit: int) -> int:
    """The padded token count of a step: a power of two (at least 16), at most ``limit``."""
    return min(max(bucket_size(num_tokens), SMALLEST_TOKEN_BUCKET), limit)


def kv_cache_shape(num_blocks: int, spec) -> tuple[int, int, int, int]:
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        raise NotImplementedError("torchtpu: keys and values of different head sizes are not supported yet")
    return (num_blocks, spec.block_size, 2 * spec.num_kv_heads, spec.head_size)


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


def _chunked_attention_jax(query, key, value, kv_cache, block_tables, token_request, token_position, token_cached,
                           num_chunks, *, scale, sliding_window, soft_cap, per_chunk):
    """:func:`paged_attention` in JAX, in two parts joined by an online softmax.

    1. The step's own keys (``key``/``value``, ``[T, Hkv, D]``): each token sees
       those of its request at positions up to its own. A prefill reads no cache.
    2. The keys its request cached in earlier steps, positions below
       ``token_cached[t]``, a chunk of pages at a time. The loop runs
       ``num_chunks`` times, a value of the step (its longest cached prefix),
       not of the program: one program serves every context length.

    With ``key=None`` part 1 is skipped and part 2 reads every key up to the
    token's own position from the cache (a layer sharing another's cache)."""
    import jax
    import jax.numpy as jnp

    tokens, q_heads, head_size = query.shape
    _, block_size, combined_heads, _ = kv_cache.shape
    kv_heads = combined_heads // 2
    positions = per_chunk * block_size
    pages = block_tables[token_request]  # [T, P]: each token's own request's pages
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
        cached = kv_cache[chunk_pages_.reshape(-1)]
        if cached.dtype != query.dtype:  # the int16 bit patterns of a 16-bit float cache
            cached = jax.lax.bitcast_convert_type(cached, query.dtype)
        cached = cached.reshape(tokens, positions, kv_heads, 2, head_size).astype(jnp.float32)
        key_position = chunk * positions + jnp.arange(positions)
        visible = (key_position < cached_limit[:, None]) & _in_window(key_position, token_position, sliding_window)
        scores = _scores(q, cached[..., 0, :], scale, soft_cap, visible, "tkgd,tlkd->tkgl")
        return _accumulate(carry, scores, cached[..., 1, :], "tkgl,tlkd->tkgd")

    _, total, acc = jax.lax.fori_loop(0, num_chunks.astype(jnp.int32), step, carry)
    out = acc / jnp.maximum(total, 1e-30)[..., None]
    return out.reshape(tokens, q_heads, head_size).astype(query.dtype)


def _without_step_keys(attention, query, *cache_args):
    return attention(query, None, None, *cache_args)


_op_ids = itertools.count()


@functools.lru_cache(maxsize=None)
def chunked_attention_op(scale: float, sliding_window, soft_cap, block_size: int, step_keys: bool = True):
    """:func:`chunked_paged_attention` of one configuration as a tpu op (its numbers are constants
    of the program). Make it before tracing: defining an op inside a compiled region fails.
    ``step_keys=False`` makes the op read every key from the cache (it then takes no key and value)."""
    fn = functools.partial(_chunked_attention_jax, scale=float(scale), sliding_window=sliding_window,
                           soft_cap=soft_cap or None, per_chunk=chunk_pages(block_size))
    if not step_keys:
        fn = functools.partial(_without_step_keys, fn)
    return torch.tpu.pallas.jax_op(f"vllm_paged_attention_{next(_op_ids)}", fn)


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


@dataclass
class TpuAttentionMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor     # [T] int64, padding tokens write the reserved null block
    token_request: torch.Tensor    # [T] int64
    token_position: torch.Tensor   # [T] int64, -1 for padding
    token_cached: torch.Tensor     # [T] int64, the positions of the token's request cached before this step
    block_tables: torch.Tensor     # [S, P] int64, P a multiple of chunk_pages(block_size)
    cached_chunks: torch.Tensor    # [] int64: chunks of pages that the step's longest cached prefix spans
    num_chunks: torch.Tensor       # [] int64: chunks of pages that the step's longest sequence spans
    # The ragged paged-attention kernel's view of the step (pallas_attention.py):
    kv_lens: torch.Tensor          # [S] int32, each request's sequence length, 0 for padding
    cu_q_lens: torch.Tensor        # [S + 1] int32, where each request's tokens start, then the token count
    num_seqs: torch.Tensor         # [1] int32, the requests of the step


# The metadata sized by the step's token bucket (the others have fixed sizes).
PER_TOKEN_FIELDS = ("slot_mapping", "token_request", "token_position", "token_cached")


def build_host_metadata(query_start_loc: np.ndarray, seq_lens: np.ndarray, block_table: np.ndarray,
                        block_size: int, num_tokens: int, max_tokens: int, max_reqs: int,
                        max_pages: int) -> dict[str, np.ndarray]:
    """The per-token and per-request arrays of one step, on the host, padded to fixed sizes:
    tokens to the step's bucket, requests to ``max_reqs``, pages to ``max_pages``."""
    num_reqs = len(seq_lens)
    padded_tokens = token_bucket(num_tokens, max_tokens)
    query_lens = np.diff(query_start_loc)
    cached_lens = seq_lens - query_lens  # positions each request cached in earlier steps
    request = np.repeat(np.arange(num_reqs), query_lens)
    position = np.arange(num_tokens) - np.repeat(query_start_loc[:-1], query_lens) + np.repeat(cached_lens, query_lens)
    slot = block_table[request, position // block_size].astype(np.int64) * block_size + position % block_size
    tables = np.zeros((max_reqs, max_pages), np.int64)
    used = min(max_pages, block_table.shape[1])
    tables[:num_reqs, :used] = block_table[:num_reqs, :used]
    pad = padded_tokens - num_tokens
    chunk = chunk_pages(block_size) * block_size
    return {
        "slot_mapping": np.pad(slot, (0, pad)),
        "token_request": np.pad(request, (0, pad)),
        "token_position": np.pad(position, (0, pad), constant_values=-1),
        "token_cached": np.pad(np.repeat(cached_lens, query_lens), (0, pad)).astype(np.int64),
        "block_tables": tables,
        "cached_chunks": np.array(-(-int(cached_lens.max(initial=0)) // chunk), np.int64),
        "num_chunks": np.array(max(1, -(-int(seq_lens.max(initial=0)) // chunk)), np.int64),
        "kv_lens": np.pad(seq_lens, (0, max_reqs - num_reqs)).astype(np.int32),
        "cu_q_lens": np.pad(query_start_loc, (0, max_reqs - num_reqs), mode="edge").astype(np.int32),
        "num_seqs": np.array([num_reqs], np.int32),
    }


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_reqs = vllm_config.scheduler_config.max_num_seqs
        pages = -(-vllm_config.model_config.max_model_len // self.block_size)
        self.max_pages = -(-pages // chunk_pages(self.block_size)) * chunk_pages(self.block_size)

    # The runner's host copy of this group's block table (``BlockTable.block_table.np``),
    # set by the tpu model runner: reading the device copy back would wait for the chip.
    host_block_table: np.ndarray | None = None

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> TpuAttentionMetadata:
        meta = common_attn_metadata
        num_reqs = meta.num_reqs
        query_start_loc = meta.query_start_loc_cpu[:num_reqs + 1].numpy()
        num_tokens = int(query_start_loc[-1])
        # Exact outside speculative decoding, which this backend does not run.
        seq_lens = (meta.seq_lens[:num_reqs].cpu() if meta.seq_lens_cpu_upper_bound is None
                    else meta.seq_lens_cpu_upper_bound[:num_reqs]).numpy()
        block_table = (meta.block_table_tensor[:num_reqs].cpu().numpy() if self.host_block_table is None
                       else self.host_block_table[:num_reqs])
        arrays = build_host_metadata(query_start_loc, seq_lens, block_table, self.block_size, num_tokens,
                                     self.max_tokens, self.max_reqs, self.max_pages)
        uploaded = dict(zip(arrays, tensor.from_host_all([torch.from_numpy(a) for a in arrays.values()])))
        for name in PER_TOKEN_FIELDS:  # one compiled step serves every token bucket
            torch._dynamo.mark_dynamic(uploaded[name], 0)
        return TpuAttentionMetadata(num_actual_tokens=num_tokens, **uploaded)


class TpuAttentionImpl(AttentionImpl[TpuAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None):
        if alibi_slopes is not None:
            raise NotImplementedError("torchtpu: ALiBi attention is not supported on tpu yet")
        if sinks is not None:
            raise NotImplementedError("torchtpu: attention sinks are not supported on tpu yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torchtpu: {attn_type} attention is not supported on tpu yet")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"torchtpu: KV cache dtype {kv_cache_dtype!r} is not supported on tpu yet")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        vllm_config = get_current_vllm_config()
        # A layer that reads another layer's cache (KV sharing) reads every key from it.
        self.attention = chunked_attention_op(self.scale, sliding_window, logits_soft_cap,
                                              vllm_config.cache_config.block_size,
                                              step_keys=kv_sharing_target_layer_name is None)
        # On TPU (or when a setting asks), JAX's ragged paged-attention Pallas kernel, where it takes the layer.
        self.pallas = pallas_attention.layer_op(num_heads, self.num_kv_heads, head_size, vllm_config.model_config.dtype,
                                                self.scale, sliding_window, logits_soft_cap)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torchtpu: fused output quantization is not supported")
        if attn_metadata is None:  # a profiling run without a KV cache
            return output.fill_(0)
        check_same_rows("the step's queries and attention metadata", query,
                        *(getattr(attn_metadata, name) for name in PER_TOKEN_FIELDS))
        if self.kv_sharing_target_layer_name is None:
            write_kv_cache(kv_cache, key, value, attn_metadata.slot_mapping)
        if self.pallas is not None:
            out = self.pallas(query, kv_cache, attn_metadata.block_tables, attn_metadata.kv_lens,
                              attn_metadata.cu_q_lens, attn_metadata.num_seqs)
        elif self.kv_sharing_target_layer_name is None:
            out = self.attention(query, key, value, kv_cache, attn_metadata.block_tables, attn_metadata.token_request,
                                 attn_metadata.token_position, attn_metadata.token_cached,
                                 attn_metadata.cached_chunks)
        else:
            out = self.attention(query, kv_cache, attn_metadata.block_tables, attn_metadata.token_request,
                                 attn_metadata.token_position, attn_metadata.token_cached, attn_metadata.num_chunks)
        output.copy_(out.view_as(output))
        return output


class TpuAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return ATTENTION_BACKEND

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER
