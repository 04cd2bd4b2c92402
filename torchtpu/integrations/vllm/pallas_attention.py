"""vLLM attention through JAX's TPU ragged paged-attention Pallas kernel (``integrations/ragged_attention.py``).

The KV cache is already in the kernel's layout; the metadata builder uploads
the kernel's per-request arrays padded to ``max_num_seqs`` (see
``attention.build_host_metadata``). On a TPU the kernel runs every layer it
can take; elsewhere only when ``TORCHTPU_VLLM_PALLAS_ATTENTION`` asks
(interpreted). A layer it cannot take runs ``attention.chunked_paged_attention``
and the log says why, once.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger

from torchtpu import config

from ..ragged_attention import on_tpu, ragged_attention_op, unsupported_reason

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger, which prints INFO


def wanted() -> bool:
    """The kernel runs vLLM's attention on a real TPU, and elsewhere when a setting asks for it (interpreted)."""
    return on_tpu() or config.current.vllm_pallas_attention


def layer_op(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype, scale: float, sliding_window,
             soft_cap):
    """The kernel's op for one attention layer, or None where it is not wanted or cannot take the layer
    (said once in the log: the layer then runs the chunked op)."""
    if not wanted():
        return None
    reason = unsupported_reason(num_heads, num_kv_heads, head_size, dtype)
    if reason is not None:
        logger.warning_once(f"torchtpu: vLLM attention runs the chunked op, not the ragged paged-attention "
                            f"Pallas kernel: {reason}")
        return None
    if on_tpu():
        logger.info_once("torchtpu: vLLM attention runs JAX's ragged paged-attention Pallas kernel")
    else:
        logger.warning_once("torchtpu: vLLM attention runs JAX's ragged paged-attention Pallas kernel in Pallas' "
                            "TPU interpreter (slow: for testing)")
    return ragged_attention_op(scale, sliding_window, soft_cap)
