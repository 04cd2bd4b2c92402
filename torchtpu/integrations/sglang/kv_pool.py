"""SGLang's MHA KV pool in the layout of JAX's TPU ragged paged-attention kernel.

SGLang's own pool keeps a key buffer and a value buffer per layer,
``[slots, kv_heads, head_dim]``. The kernel reads one buffer of pages,
``[pages, page_size, 2 * kv_heads, head_dim]``, with the key of head ``h`` at
``2h`` and its value at ``2h + 1`` (vLLM's cache layout on tpu). Interleaving
two separate buffers every step would copy the whole cache, so where the
kernel runs (``attention.kernel_wanted``) the platform gives SGLang this pool
instead (``get_kv_pool_cls``): one buffer per layer in the kernel's layout,
written with one scatter per layer, while ``k_buffer``/``v_buffer`` stay
SGLang's ``[slots, kv_heads, head_dim]`` as strided views of it, so the rest
of SGLang (radix cache, transfers, accounting) sees its usual pool.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from ..paged_attention import write_kv_cache


class InterleavedKVPool(MHATokenToKVPool):
    kv_buffer: list[torch.Tensor]  # per layer, [pages * page_size, 2 * kv_heads, head_dim]

    def _create_buffers_normal(self) -> None:
        if self.head_dim != self.v_head_dim:
            raise NotImplementedError("torchtpu: the interleaved KV pool needs keys and values of one head size, "
                                      f"got {self.head_dim} and {self.v_head_dim}")
        slots = self.size + self.page_size
        rows = -(-slots // self.page_size) * self.page_size  # whole pages
        self.kv_buffer = [torch.zeros((rows, 2 * self.head_num, self.head_dim), dtype=self.store_dtype,
                                      device=self.device) for _ in range(self.layer_num)]
        self.k_buffer = [buffer[:slots, 0::2] for buffer in self.kv_buffer]
        self.v_buffer = [buffer[:slots, 1::2] for buffer in self.kv_buffer]

    def _store_kv_layer(self, layer_idx: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        write_kv_cache(self.kv_buffer[layer_idx], cache_k.reshape(-1, self.head_num, self.head_dim),
                       cache_v.reshape(-1, self.head_num, self.v_head_dim), loc)

    def get_kv_pages(self, layer_id: int, page_size: int | None = None) -> torch.Tensor:
        """The layer's buffer as the kernel reads it, ``[pages, page_size, 2 * kv_heads, head_dim]``: pages of
        the pool's size, or of ``page_size`` slots (1: how the chunked op reads it, by slot)."""
        buffer = self.kv_buffer[layer_id - self.start_layer]
        return buffer.view(-1, page_size or self.page_size, *buffer.shape[1:])
