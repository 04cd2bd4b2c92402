"""The vLLM model matrix on tpu: each architecture and dtype against transformers on CPU.

Slow (one engine per cell, ~1 min each here): run with ``scripts/vllm_matrix.sh``.
Greedy tokens must equal transformers' ``generate()`` in the same dtype.
"""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from tiny_models import CONFIGS, tiny_engine, transformers_greedy, vllm_greedy, write_model  # noqa: E402

PROMPTS = ["the cat sat on the mat", "a dog ran", "the big red car and the small blue bird sat under the old tree",
           "night"]
MAX_TOKENS = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_greedy_tokens_equal_transformers(tmp_path, arch, dtype):
    path = write_model(tmp_path, arch)
    expected = transformers_greedy(path, PROMPTS, MAX_TOKENS, DTYPES[dtype])
    with tiny_engine(path, dtype) as llm:
        assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == expected
