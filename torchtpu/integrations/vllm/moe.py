"""Mixture-of-experts layers of vLLM's models on tpu: routing and experts in plain torch ops.

vLLM 0.32 gives an out-of-tree platform no expert kernel
(``select_unquantized_moe_backend`` answers ``OOT`` with no kernel class, "OOT
handles internally"), and its routers call vLLM's compiled C ops. So the
general plugin registers :class:`TpuFusedMoEMethod` in place of
``UnquantizedFusedMoEMethod`` (``CustomOp.register_oot``). It is
*monolithic* in vLLM's terms: it takes the router logits and does the routing
itself, so vLLM's router is never called.

On TPU and GPU the experts run sparsely: the (token, expert) pairs sorted by
expert go through grouped products (``torch._grouped_mm``, ``jax.lax.ragged_dot``),
``tokens * top_k`` rows whatever the routing. On XLA:CPU, which expands a grouped
product into one masked product per expert, they run densely instead: every
token through every expert, the outputs summed with each token's routing
weights, zero outside its top k (``num_experts / top_k`` times the sparse work,
``1 / top_k`` times the expanded grouped one). Either way the shapes depend only
on the step's token bucket, so the step compiles to one program per bucket.

vLLM calls an MoE layer through an opaque custom op (``vllm.moe_forward``)
on an out-of-tree platform, which the compiled step cannot lower; on its own
CPU and TPU platforms it calls the Python function the op wraps.
:func:`call_runner_directly` makes each layer do that on tpu too (a shim
for vLLM 0.32; ``tests/vllm/test_moe.py`` fails once vLLM no longer needs it).

Routing is transformers' (the test oracle): softmax in float32, top k,
renormalised when the config says so (``norm_topk_prob``), cast to the
activations' dtype before it scales each expert's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from vllm.config import get_current_vllm_config
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.runner import moe_runner
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from torchtpu.runtime import device as runtime_device

# The gated activations of an expert's first projection (``[gate, up]`` halves).
GATED_ACTIVATIONS = {
    MoEActivation.SILU: F.silu,
    MoEActivation.GELU: F.gelu,
    MoEActivation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
}


def top_routes(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top ``top_k`` experts: their float32 weights and their ids, ``[tokens, top_k]`` each."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, ids


def routing_weights(router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> torch.Tensor:
    """``[tokens, experts]``: each token's weight for each expert, zero outside its top ``top_k``."""
    top, ids = top_routes(router_logits, top_k, renormalize)
    return torch.zeros_like(router_logits, dtype=torch.float32).scatter(-1, ids, top).to(dtype)


def dense_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  activation: MoEActivation) -> torch.Tensor:
    """Every token through every expert, summed with ``weights`` (``[tokens, experts]``).

    ``w13`` is ``[experts, 2 * inter, hidden]`` (gate rows, then up rows) and
    ``w2`` ``[experts, hidden, inter]``, vLLM's layout of the expert weights."""
    gate, up = torch.matmul(x, w13.transpose(1, 2)).chunk(2, dim=-1)  # [experts, tokens, inter] each
    out = torch.matmul(GATED_ACTIVATIONS[activation](gate) * up, w2.transpose(1, 2))  # [experts, tokens, hidden]
    # Zero-weighted experts add exact zeros: in float32 with top-2 routing the
    # sum is the sparse sum's. transformers also scales in the activations' dtype.
    return (out * weights.t().unsqueeze(-1)).sum(dim=0)


def grouped_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top: torch.Tensor, ids: torch.Tensor,
                    activation: MoEActivation) -> torch.Tensor:
    """Each token through its top k experts only: the (token, expert) pairs sorted by expert,
    two grouped products over them (``torch._grouped_mm``), the weighted results summed back
    per token. The shapes are ``tokens * top_k`` rows whatever the routing."""
    pairs = ids.reshape(-1)
    order = torch.argsort(pairs, stable=True)
    token = order // ids.shape[1]
    counts = torch.zeros(w13.shape[0], dtype=torch.int32, device=x.device).scatter_add(
        0, pairs, torch.ones_like(pairs, dtype=torch.int32))
    ends = counts.cumsum(0, dtype=torch.int32)
    gate, up = torch._grouped_mm(x[token], w13.transpose(1, 2), offs=ends).chunk(2, dim=-1)
    out = torch._grouped_mm(GATED_ACTIVATIONS[activation](gate) * up, w2.transpose(1, 2), offs=ends)
    weighted = out * top.reshape(-1)[order].to(x.dtype).unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, token, weighted)


def sparse_experts_pay() -> bool:
    """Grouped (sparse) experts where the compiler has a grouped product (TPU, GPU); XLA:CPU
    expands it into one masked product per expert, which costs ``top_k`` times the dense path."""
    return runtime_device.platform() != "cpu"


def check_config(vllm_config) -> None:
    """Refuse at start-up, by name, the mixture-of-experts setups tpu cannot run."""
    model = vllm_config.model_config
    if model is None or not model.is_moe:
        return
    parallel = vllm_config.parallel_config
    checks = {
        f"quantization ({model.quantization})": model.quantization is not None,
        "expert parallelism (enable_expert_parallel)": parallel.enable_expert_parallel,
        "expert load balancing (enable_eplb)": parallel.enable_eplb,
    }
    unsupported = [name for name, used in checks.items() if used]
    if unsupported:
        raise NotImplementedError(f"torchtpu: mixture-of-experts models with {', '.join(unsupported)} do not "
                                  "run on tpu yet")


def unsupported_features(layer) -> list[str]:
    """What ``layer`` (vLLM's ``RoutedExperts``) asks for that :class:`TpuFusedMoEMethod` does not do."""
    moe = layer.moe_config
    parallel = moe.moe_parallel_config
    checks = {
        "expert parallelism": parallel.use_ep,
        "data-parallel experts": parallel.dp_size > 1,
        "all-to-all expert kernels": parallel.use_all2all_kernels,
        "expert biases": moe.has_bias,
        f"activation {layer.activation.value!r}": layer.activation not in GATED_ACTIVATIONS,
        f"scoring function {layer.scoring_func!r}": layer.scoring_func != "softmax",
        "grouped top-k routing": layer.use_grouped_topk,
        "a custom routing function": layer.custom_routing_function is not None,
        "an expert score correction bias": layer.e_score_correction_bias is not None,
        "a routed scaling factor": layer.routed_scaling_factor != 1.0,
        "router weights applied to the input": layer.apply_router_weight_on_input,
        "hash routing": moe.has_hash_routing,
    }
    return [name for name, used in checks.items() if used]


def call_runner_directly(runner) -> None:
    """Have vLLM's ``MoERunner`` call the Python function behind its opaque op, as on vLLM's CPU platform."""
    if runner._forward_entry is torch.ops.vllm.moe_forward:
        runner._forward_entry = moe_runner._moe_forward
    elif runner._forward_entry is torch.ops.vllm.moe_forward_shared:
        runner._forward_entry = moe_runner._moe_forward_shared


class TpuFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method with the routing and the experts in torch ops (see the module)."""

    @property
    def is_monolithic(self) -> bool:
        return True  # routes from the logits itself: vLLM's routers call C ops

    def create_weights(self, layer, *args, **kwargs):
        unsupported = unsupported_features(layer)
        if unsupported:
            raise NotImplementedError(f"torchtpu: the mixture-of-experts layer {layer.layer_name} uses "
                                      f"{', '.join(unsupported)}, which tpu does not support yet")
        super().create_weights(layer, *args, **kwargs)
        # The layer's runner is built after its weights, under the same name.
        self._layers_by_name = get_current_vllm_config().compilation_config.static_forward_context

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        # Set now, not by the first step inside the compiled region (a guard: one more compile).
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        self.sparse = sparse_experts_pay()  # asked here: the device lookup is not traceable
        call_runner_directly(self._layers_by_name[layer.layer_name])

    def apply_monolithic(self, layer, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.sparse:
            top, ids = top_routes(router_logits, layer.top_k, layer.renormalize)
            return grouped_experts(x, layer.w13_weight, layer.w2_weight, top, ids, layer.activation)
        weights = routing_weights(router_logits, layer.top_k, layer.renormalize, x.dtype)
        return dense_experts(x, layer.w13_weight, layer.w2_weight, weights, layer.activation)


def register() -> None:
    """Make vLLM build :class:`TpuFusedMoEMethod` wherever it builds ``UnquantizedFusedMoEMethod`` (idempotent)."""
    name = UnquantizedFusedMoEMethod.__name__
    if name not in op_registry_oot:
        CustomOp.register_oot(TpuFusedMoEMethod, name=name)
