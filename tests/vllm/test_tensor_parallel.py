"""vLLM with ``tensor_parallel_size=2`` on tpu: two worker processes, one chip each, over the tpu c10d backend.

Greedy tokens must equal transformers' on CPU, both op by op and with the
compiled step: one SPMD program over the two ranks per token bucket, whose
all-reduces run inside the program (each rank's graph bakes in its own
vocabulary range; those numbers become inputs of the one program). The
engine's workers are vLLM's own processes (spawned, killed by vLLM at
shutdown); a test that hangs is ended by vLLM's own startup and RPC timeouts.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from tiny_models import transformers_greedy, write_model  # noqa: E402

PROMPTS = ["the cat sat on the mat", "a dog ran under the big old tree", "the red car"]
MAX_TOKENS = 6


@pytest.mark.parametrize("enforce_eager", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["compiled", "eager"])
def test_two_way_tensor_parallel_equals_transformers(tmp_path, enforce_eager):
    model_path = write_model(tmp_path / "tiny_llama", "llama")
    engine = vllm.LLM(model_path, dtype="float32", max_model_len=128, max_num_batched_tokens=64, max_num_seqs=4,
                      kv_cache_memory_bytes=8 << 20, tensor_parallel_size=2, enforce_eager=enforce_eager, seed=0)
    try:
        params = vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        tokens = [list(o.outputs[0].token_ids) for o in engine.generate(PROMPTS, params)]
        assert tokens == transformers_greedy(model_path, PROMPTS, MAX_TOKENS)
        if not enforce_eager:
            # the whole step ran compiled on both ranks, with programs compiled at start-up only
            assert engine.collective_rpc("graph_fallbacks") == [{}, {}]
            assert engine.collective_rpc("recompiles") == [{}, {}]
    finally:
        engine.llm_engine.engine_core.shutdown()
