"""Paged attention on tpu for vLLM: the ``TORCHTPU`` attention backend.

The KV cache of a layer is one tensor ``[num_blocks, block_size, 2 * kv_heads,
head_size]`` with K and V heads interleaved (K of head h at 2h, V at 2h+1): the
layout of the TPU ragged paged-attention kernel. A step's metadata is built on
the host and uploaded padded to fixed sizes (tokens to the step's token
bucket, requests to ``max_num_seqs``, pages to what ``max_model_len`` needs),
so the compiled step has one program per token bucket.

The computation is ``torchtpu.integrations.paged_attention``'s, shared with
SGLang's backend; on TPU, JAX's ragged paged-attention Pallas kernel runs it
instead wherever it takes the layer (``pallas_attention.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.config import get_current_vllm_config
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType,
                                       MultipleOf)

from torchtpu.core import tensor

from ..paged_attention import chunk_pages, chunked_attention_op, token_bucket, write_kv_cache
from .. import ragged_attention
from . import ATTENTION_BACKEND, pallas_attention
from .compiled import check_same_rows

def kv_cache_shape(num_blocks: int, spec) -> tuple[int, int, int, int]:
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        raise NotImplementedError("torchtpu: keys and values of different head sizes are not supported yet")
    return (num_blocks, spec.block_size, 2 * spec.num_kv_heads, spec.head_size)


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
    # The ragged paged-attention kernel's view of the step (integrations/ragged_attention.py):
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
        **ragged_attention.request_arrays(query_start_loc, seq_lens, max_reqs),
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
