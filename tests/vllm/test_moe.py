"""Mixture-of-experts on tpu through vLLM (torchtpu/integrations/vllm/moe.py), against transformers on CPU.

The layer tests compare the dense expert computation with transformers'
Qwen3-MoE block; the engine test runs the tiny Qwen3-MoE through vLLM on tpu
(~45 s: one engine) and needs transformers' greedy tokens exactly. The slow
matrix (test_vllm_matrix.py) adds bfloat16, Mixtral and Qwen2-MoE (shared experts).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from test_vllm_matrix import MAX_TOKENS, PROMPTS  # noqa: E402
from tiny_models import CONFIGS, tiny_engine, transformers_greedy, vllm_greedy, write_model  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402

from torchtpu.integrations.vllm import moe  # noqa: E402


def _moe_block(norm_topk_prob: bool, dtype: torch.dtype) -> Qwen3MoeSparseMoeBlock:
    config = CONFIGS["qwen3_moe"]()
    config.norm_topk_prob = norm_topk_prob
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for param in block.parameters():  # transformers leaves the experts uninitialised
            param.copy_(torch.randn_like(param) * 0.2)
    return block.to(dtype)


def _dense_moe(x, gate, w13, w2, top_k, renormalize):
    weights = moe.routing_weights(x @ gate.t(), top_k, renormalize, x.dtype)
    return moe.dense_experts(x, w13, w2, weights, MoEActivation.SILU)


def _grouped_moe(x, gate, w13, w2, top_k, renormalize):
    top, ids = moe.top_routes(x @ gate.t(), top_k, renormalize)
    return moe.grouped_experts(x, w13, w2, top, ids, MoEActivation.SILU)


@pytest.mark.parametrize("experts", [_dense_moe, _grouped_moe], ids=["dense", "grouped"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_experts_equal_transformers_moe_block(norm_topk_prob, dtype, experts):
    """Dense (XLA:CPU's path) and grouped (TPU's and GPU's: sparse_experts_pay) experts."""
    block = _moe_block(norm_topk_prob, dtype)
    x = torch.randn(16, block.gate.hidden_dim).to(dtype)
    with torch.no_grad():
        expected = block(x[None])[0]
        step = torch.compile(experts, backend="tpu", fullgraph=True, dynamic=False)
        args = [t.to("tpu") for t in (x, block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj)]
        got = step(*args, block.gate.top_k, norm_topk_prob).cpu()
    # bfloat16: XLA:CPU fuses the weighting into the sum over experts and skips rounding each
    # product to bfloat16 (plain jax.jit does too), so outputs may differ by an ulp of the largest.
    tolerance = {} if dtype == torch.float32 else dict(atol=4e-2, rtol=1.6e-2)
    torch.testing.assert_close(got, expected, **tolerance)


def test_unrouted_experts_get_zero_weight_and_the_rest_renormalise():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    weights = moe.routing_weights(logits, 2, True, torch.float32)
    assert weights[0, 0] == 0 and weights[0, 2] == 0
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
    plain = moe.routing_weights(logits, 2, False, torch.float32)
    torch.testing.assert_close(plain[0, [1, 3]], torch.softmax(logits, -1)[0, [1, 3]])


def _routed_experts(**changes):
    """A stand-in for vLLM's ``RoutedExperts`` with what Qwen3-MoE uses, then ``changes``."""
    parallel = SimpleNamespace(use_ep=False, dp_size=1, use_all2all_kernels=False)
    layer = SimpleNamespace(layer_name="model.layers.0.mlp.experts", activation=MoEActivation.SILU,
                            scoring_func="softmax", use_grouped_topk=False, custom_routing_function=None,
                            e_score_correction_bias=None, routed_scaling_factor=1.0,
                            apply_router_weight_on_input=False,
                            moe_config=SimpleNamespace(moe_parallel_config=parallel, has_bias=False,
                                                       has_hash_routing=False))
    for name, value in changes.items():
        setattr(layer, name, value)
    return layer


@pytest.mark.parametrize("change, named", [
    (dict(use_grouped_topk=True), "grouped top-k routing"),
    (dict(scoring_func="sigmoid"), "scoring function 'sigmoid'"),
    (dict(activation=MoEActivation.SWIGLUOAI), "activation 'swigluoai'"),
    (dict(e_score_correction_bias=torch.zeros(4)), "an expert score correction bias"),
])
def test_an_unsupported_moe_layer_is_refused_by_name(change, named):
    assert moe.unsupported_features(_routed_experts()) == []
    with pytest.raises(NotImplementedError, match=named):
        moe.TpuFusedMoEMethod.create_weights(None, _routed_experts(**change))


def test_quantized_or_expert_parallel_moe_models_are_refused_at_start():
    def config(quantization=None, ep=False, is_moe=True):
        return SimpleNamespace(model_config=SimpleNamespace(is_moe=is_moe, quantization=quantization),
                               parallel_config=SimpleNamespace(enable_expert_parallel=ep, enable_eplb=False))

    moe.check_config(config())
    moe.check_config(config(quantization="fp8", is_moe=False))  # not an MoE model: not this check's business
    with pytest.raises(NotImplementedError, match=r"quantization \(fp8\), expert parallelism"):
        moe.check_config(config(quantization="fp8", ep=True))


def test_vllm_still_hides_moe_layers_behind_an_opaque_op_out_of_tree():
    """moe.call_runner_directly is a shim for vLLM 0.32: this fails once vLLM calls the layer directly itself."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.platforms import current_platform

    assert current_platform.device_type == "tpu"
    assert MoERunner._select_forward(SimpleNamespace(_shared_experts=None)) is torch.ops.vllm.moe_forward


def test_qwen3_moe_greedy_tokens_equal_transformers_and_serving_compiles_no_step(tmp_path):
    path = write_model(tmp_path, "qwen3_moe")
    expected = transformers_greedy(path, PROMPTS, MAX_TOKENS)
    with tiny_engine(path) as llm:
        assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == expected
        # the experts are inside the compiled step (no graph ran op by op), which compiles nothing after warm-up
        assert llm.collective_rpc("graph_fallbacks") == [{}]
        assert "compiled graph inference" not in llm.collective_rpc("recompiles")[0]
