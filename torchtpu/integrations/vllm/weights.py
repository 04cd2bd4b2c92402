"""Linear weights in the layout XLA's CPU backend multiplies fastest.

PyTorch stores a linear layer's weight ``[out, in]`` and computes
``x @ weight.T``. XLA:CPU runs that product 4-9x slower in bfloat16 than
``x @ w`` with ``w`` stored ``[in, out]`` (a decode step of the 100M bench
model: 16 x 768 x 32000, 48 ms against 5 ms; bench/README, "bf16 dot
layouts"), and a program cannot choose its inputs' layout. So on XLA:CPU,
for half-precision models, each unshared linear weight is re-stored
``[in, out]`` once after loading: ``layer.weight`` becomes a transposed view
of the new storage (same values, no second copy) and the layer multiplies by
the contiguous ``[in, out]`` tensor. vLLM's own CPU and XPU platforms repack
weights after loading for the same reason. On TPU and GPU the compiler lays
out weights itself and nothing changes.
"""

from __future__ import annotations

import collections

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

from torchtpu.runtime import device as runtime_device

HALF_DTYPES = (torch.bfloat16, torch.float16)


def k_major_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the layer's ``[in, out]`` copy of ``weight``."""
    out = torch.matmul(x, layer.weight_in_out)
    return out if bias is None else out + bias


def _apply_lm_head(layer, x, bias=None):
    return k_major_gemm(layer, x, layer.weight, bias)


def store_linear_weights_in_out(model: torch.nn.Module) -> int:
    """Re-store ``model``'s unshared half-precision linear weights ``[in, out]`` on XLA:CPU.

    Returns how many were re-stored. A weight used by two modules (tied
    embeddings) stays as it is: the embedding lookup wants ``[vocab, dim]``."""
    if runtime_device.platform() != "cpu":
        return 0
    users = collections.Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        is_linear = type(method) is UnquantizedLinearMethod
        is_lm_head = isinstance(module, ParallelLMHead) and type(method) is UnquantizedEmbeddingMethod
        if not (is_linear or is_lm_head) or weight is None or weight.ndim != 2 or weight.dtype not in HALF_DTYPES:
            continue
        if users[id(weight)] > 1 or not weight.is_contiguous():
            continue
        in_out = weight.detach().t().contiguous()
        weight.data = in_out.t()  # the same values, now a view of the [in, out] storage
        module.weight_in_out = in_out
        if is_linear:
            method._gemm_impl = k_major_gemm
        else:
            method.apply = _apply_lm_head
        count += 1
    return count
