"""Linear weights in the layout XLA's CPU backend multiplies fastest, for the serving integrations.

PyTorch stores a linear layer's weight ``[out, in]`` and computes
``x @ weight.T``. XLA:CPU runs that product 4-9x slower in bfloat16 than
``x @ w`` with ``w`` stored ``[in, out]`` (a decode step of the 100M bench
model: 16 x 768 x 32000, 48 ms against 5 ms; bench/README, "bf16 dot
layouts"), and a program cannot choose its inputs' layout. So on XLA:CPU,
for half-precision models, each unshared linear weight is re-stored
``[in, out]`` once after loading: ``layer.weight`` becomes a transposed view
of the new storage (same values, no second copy) and the layer multiplies by
the contiguous ``[in, out]`` tensor, ``layer.weight_in_out``. vLLM's own CPU
and XPU platforms repack weights after loading for the same reason. On TPU
and GPU the compiler lays out weights itself and nothing changes.

Which modules are linear layers, and how their products are routed to
``weight_in_out``, is each engine's business (``vllm/weights.py``,
``sglang/weights.py``).
"""

from __future__ import annotations

import collections

import torch

from torchtpu.runtime import device as runtime_device

HALF_DTYPES = (torch.bfloat16, torch.float16)


def in_out_matmul(layer: torch.nn.Module, x: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, layer.weight, bias)`` through the layer's ``[in, out]`` copy of its weight."""
    out = torch.matmul(x, layer.weight_in_out)
    return out if bias is None else out + bias


def store_in_out(model: torch.nn.Module, linear_method: type, lm_head: type, embedding_method: type):
    """Re-store ``[in, out]`` on XLA:CPU the weights of ``model``'s linear layers (modules whose
    ``quant_method`` is a ``linear_method``) and LM heads (``lm_head`` modules with an
    ``embedding_method``); returns the linear layers and the heads re-stored, each with its
    ``weight_in_out``.

    Only 2-d, half-precision, contiguous weights that no other module uses:
    a tied weight stays as it is (the embedding lookup wants ``[vocab, dim]``)."""
    if runtime_device.platform() != "cpu":
        return [], []

    def is_linear(module):
        return type(getattr(module, "quant_method", None)) is linear_method

    def is_lm_head(module):
        return isinstance(module, lm_head) and type(module.quant_method) is embedding_method

    users = collections.Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    linears, heads = [], []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not (is_linear(module) or is_lm_head(module)) or weight is None or weight.ndim != 2:
            continue
        if weight.dtype not in HALF_DTYPES or users[id(weight)] > 1 or not weight.is_contiguous():
            continue
        in_out = weight.detach().t().contiguous()
        weight.data = in_out.t()  # the same values, now a view of the [in, out] storage
        module.weight_in_out = in_out
        (linears if is_linear(module) else heads).append(module)
    return linears, heads
