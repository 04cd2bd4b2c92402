"""vLLM's Transformers modeling backend (``model_impl="transformers"``, for architectures vLLM lacks) on tpu.

The backend wraps transformers' own model classes in vLLM's layers (attention,
linear, fused MoE), so nothing in the plugin is specific to it: these tests
check that it runs inside the compiled step and that its greedy tokens equal
transformers' on CPU. The Llama test runs in CI (~45 s: one engine); the
mixture-of-experts one (``TransformersMoEForCausalLM``, through moe.py) is slow.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from test_vllm_matrix import MAX_TOKENS, PROMPTS  # noqa: E402
from tiny_models import tiny_engine, transformers_greedy, vllm_greedy, write_model  # noqa: E402

BACKEND_CLASSES = {"llama": "TransformersForCausalLM", "qwen3_moe": "TransformersMoEForCausalLM"}


@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen3_moe", marks=pytest.mark.slow)])
def test_transformers_backend_greedy_tokens_equal_transformers(tmp_path, arch):
    path = write_model(tmp_path, arch)
    expected = transformers_greedy(path, PROMPTS, MAX_TOKENS)
    with tiny_engine(path, model_impl="transformers") as llm:
        assert llm.llm_engine.model_config.architecture == BACKEND_CLASSES[arch]
        assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == expected
        assert llm.collective_rpc("graph_fallbacks") == [{}]  # the whole model ran in the compiled step
        assert "compiled graph inference" not in llm.collective_rpc("recompiles")[0]
