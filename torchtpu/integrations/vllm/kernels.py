"""Torch-op replacements for the Triton kernels vLLM's V1 model runner launches.

vLLM swaps a Triton kernel for a platform's function through
``vllm.triton_utils.dispatcher.register_kernels``; the function receives the
kernel's launch arguments in the kernel's order.
"""

from __future__ import annotations

import torch


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc, positions, block_table, block_table_stride,
                         slot_mapping, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
                         CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024):
    """``slot_mapping[t]``: the KV cache slot of token ``t``; ``PAD_ID`` past ``num_tokens``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("torchtpu's vLLM platform does not support context parallelism")
    tokens = torch.arange(num_tokens, device=positions.device, dtype=query_start_loc.dtype)
    request = torch.searchsorted(query_start_loc, tokens, right=True) - 1
    position = positions[:num_tokens]
    # index_select, not advanced indexing: no bounds check that waits for the device
    entry = request.to(torch.int64) * block_table_stride + position // KV_CACHE_BLOCK_SIZE
    block = block_table.reshape(-1).index_select(0, entry).to(slot_mapping.dtype)
    slot_mapping[:num_tokens] = block * KV_CACHE_BLOCK_SIZE + position % KV_CACHE_BLOCK_SIZE
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


TRITON_KERNEL_OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
}
