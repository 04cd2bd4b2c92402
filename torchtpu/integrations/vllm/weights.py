"""vLLM's linear layers and LM head multiplying by ``[in, out]`` weights on XLA:CPU
(why: ``torchtpu/integrations/weight_layout.py``)."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

from ..weight_layout import in_out_matmul, store_in_out


def k_major_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """vLLM's ``_gemm_impl`` hook: ``F.linear(x, weight, bias)`` through the layer's ``[in, out]`` weight."""
    return in_out_matmul(layer, x, bias)


def store_linear_weights_in_out(model: torch.nn.Module) -> int:
    """Re-store ``model``'s unshared half-precision linear weights ``[in, out]`` on XLA:CPU; returns how many."""
    linears, heads = store_in_out(model, UnquantizedLinearMethod, ParallelLMHead, UnquantizedEmbeddingMethod)
    for layer in linears:
        layer.quant_method._gemm_impl = k_major_gemm
    for head in heads:
        head.quant_method.apply = in_out_matmul
    return len(linears) + len(heads)
