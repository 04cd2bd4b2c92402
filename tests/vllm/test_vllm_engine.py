"""vLLM's offline engine on tpu against transformers on CPU (the oracle), with a tiny Llama.

One engine serves the module (starting it costs ~50 s here: vLLM's import in a
fresh worker process and the warm-up of every token bucket). Greedy tokens
must equal transformers' ``generate()`` exactly in float32.
"""

from __future__ import annotations

import pytest
import torch
import transformers

vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from tiny_models import write_model  # noqa: E402

PROMPTS = [
    "the cat sat on the mat",
    "a dog ran",
    "the big red car and the small blue bird sat under the old tree",
    "night",
]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def llm(model_path):
    engine = vllm.LLM(model_path, dtype="float32", max_model_len=128, max_num_batched_tokens=128, max_num_seqs=8,
                      kv_cache_memory_bytes=8 << 20, enable_prefix_caching=True, seed=0)
    yield engine
    engine.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def reference(model_path):
    """transformers on CPU: the greedy continuation and its log-probabilities, by prompt."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    cache = {}

    def greedy(prompt: str, max_tokens: int = MAX_TOKENS):
        if (prompt, max_tokens) not in cache:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=0)
            tokens = out.sequences[0, ids.shape[1]:].tolist()
            logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]
            cache[prompt, max_tokens] = tokens, logprobs
        return cache[prompt, max_tokens]

    return greedy


def greedy_params(**kwargs):
    return vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, **kwargs)


def test_greedy_tokens_equal_transformers_for_prompts_of_different_lengths(llm, reference):
    # vLLM's default, asynchronous scheduling: the host prepares a step while the device runs the last one
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    outputs = llm.generate(PROMPTS, greedy_params())
    for prompt, out in zip(PROMPTS, outputs):
        assert list(out.outputs[0].token_ids) == reference(prompt)[0], prompt


def test_synchronous_scheduling_gives_the_same_tokens(model_path, reference):
    engine = vllm.LLM(model_path, dtype="float32", max_model_len=128, max_num_batched_tokens=128, max_num_seqs=8,
                      kv_cache_memory_bytes=8 << 20, async_scheduling=False, seed=0)
    try:
        assert not engine.llm_engine.vllm_config.scheduler_config.async_scheduling
        for prompt, out in zip(PROMPTS, engine.generate(PROMPTS, greedy_params())):
            assert list(out.outputs[0].token_ids) == reference(prompt)[0], prompt
    finally:
        engine.llm_engine.engine_core.shutdown()


def test_logprobs_of_greedy_tokens_match_transformers(llm, reference):
    out = llm.generate(PROMPTS[:2], greedy_params(logprobs=2))
    for prompt, result in zip(PROMPTS[:2], out):
        tokens, expected = reference(prompt)
        got = [step[token].logprob for step, token in zip(result.outputs[0].logprobs, tokens)]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=1e-4)


def test_prefix_cache_hits_are_reported_and_keep_the_tokens(llm, reference):
    first = PROMPTS[2] + " and the moon and the star"  # 20 tokens: one full block of 16 to cache
    prompt = first + " then the dog slept"
    llm.generate([first], greedy_params())
    out = llm.generate([prompt], greedy_params())[0]
    assert out.num_cached_tokens and out.num_cached_tokens >= 16  # at least one full block of 16
    assert list(out.outputs[0].token_ids) == reference(prompt)[0]


def test_a_batch_of_32_requests_loses_none(llm, reference):
    words = "the a cat dog sat ran on under mat log and then slept barked big small".split()
    prompts = [" ".join(words[i % 7: i % 7 + 1 + i % 9]) for i in range(32)]
    outputs = llm.generate(prompts, greedy_params())
    assert len(outputs) == 32
    for prompt, out in zip(prompts, outputs):
        assert out.finished and list(out.outputs[0].token_ids) == reference(prompt)[0], prompt


def test_top_k_one_sampling_is_greedy_and_seeded_sampling_repeats(llm, reference):
    top1 = llm.generate([PROMPTS[0]], vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_k=1,
                                                          ignore_eos=True))[0]
    assert list(top1.outputs[0].token_ids) == reference(PROMPTS[0])[0]
    params = vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, top_k=20, seed=1234, n=2,
                                 ignore_eos=True)
    first, second = (llm.generate([PROMPTS[1]], params)[0] for _ in range(2))
    assert len(first.outputs) == 2
    assert [list(c.token_ids) for c in first.outputs] == [list(c.token_ids) for c in second.outputs]


def test_a_stop_string_ends_the_text_before_it(llm, model_path, reference):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    words = tokenizer.decode(reference(PROMPTS[0])[0]).split()
    stop = words[3]
    out = llm.generate([PROMPTS[0]], greedy_params(stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text.split() and out.text.split() == words[:words.index(stop)]


STEP_PROGRAM = "compiled graph inference"  # the model step under torch.compile(backend="tpu")


def test_the_compiled_step_compiles_nothing_after_warm_up(llm):
    llm.generate(PROMPTS + [p + " and the dog" for p in PROMPTS], greedy_params())
    assert STEP_PROGRAM not in llm.collective_rpc("recompiles")[0]


def test_serving_compiles_nothing_after_warm_up(llm):
    """Every program a step runs (model, LM head, sampler of each kind) was compiled at start-up."""
    llm.generate(PROMPTS, greedy_params())
    llm.generate(PROMPTS[:3], greedy_params(logprobs=2))
    llm.generate(PROMPTS[:2], vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, ignore_eos=True))
    llm.generate(PROMPTS, vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, top_p=0.8, seed=3,
                                              logprobs=1, ignore_eos=True))
    assert llm.collective_rpc("recompiles") == [{}]


def test_a_repetition_penalty_takes_vllms_sampler_and_equals_transformers(llm, model_path):
    """Penalties are outside the compiled sampler: the step runs vLLM's own, op by op."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, repetition_penalty=1.5,
                              pad_token_id=0)[0, ids.shape[1]:].tolist()
    out = llm.generate([PROMPTS[0]], greedy_params(repetition_penalty=1.5))[0]
    assert list(out.outputs[0].token_ids) == expected
