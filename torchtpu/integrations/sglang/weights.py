"""SGLang's linear layers and LM head multiplying by ``[in, out]`` weights on XLA:CPU
(why: ``torchtpu/integrations/weight_layout.py``). Run by the platform's ``post_load_model``."""

from __future__ import annotations

import functools

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

from ..weight_layout import in_out_matmul, store_in_out


def _in_out_apply_into(layer: torch.nn.Module, x: torch.Tensor, output: torch.Tensor, bias=None) -> torch.Tensor:
    """``UnquantizedLinearMethod.apply_into`` (a caller-owned output) for a re-stored layer."""
    return output.copy_(in_out_matmul(layer, x, bias))


def _install_lm_head_product() -> None:
    """SGLang's logits processor multiplies by ``lm_head.weight.T`` itself (an unquantized head skips
    its quant method); a re-stored head multiplies by its ``[in, out]`` tensor instead."""
    original = LogitsProcessor._compute_lm_head
    if getattr(original, "torchtpu_in_out", False):
        return

    @functools.wraps(original)
    def compute_lm_head(self, hidden_states, lm_head, embedding_bias=None, *, out=None):
        in_out = getattr(lm_head, "weight_in_out", None)
        if in_out is None or embedding_bias is not None or self.use_fp32_lm_head or \
                self.rl_on_policy_target is not None or hasattr(lm_head, "apply_lora"):
            return original(self, hidden_states, lm_head, embedding_bias, out=out)
        return torch.matmul(hidden_states.to(in_out.dtype), in_out)  # SGLang's own product, re-laid out

    compute_lm_head.torchtpu_in_out = True
    LogitsProcessor._compute_lm_head = compute_lm_head


def store_linear_weights_in_out(model: torch.nn.Module) -> int:
    """Re-store ``model``'s unshared half-precision linear weights ``[in, out]`` on XLA:CPU; returns how many."""
    linears, heads = store_in_out(model, UnquantizedLinearMethod, ParallelLMHead, UnquantizedEmbeddingMethod)
    for layer in linears:  # each layer has its own method object
        layer.quant_method.apply = in_out_matmul
        layer.quant_method.apply_into = _in_out_apply_into
    if heads:
        _install_lm_head_product()
    return len(linears) + len(heads)
