"""SGLang's HTTP server (``python -m sglang.launch_server --device tpu``) runs a tiny Llama on the ``tpu`` device.

One server process serves the whole module (about 40 s to start on an idle 2-core machine, warm-up included).
Greedy answers of the native ``/generate`` route (token ids and text, streamed or not, alone, with a cached prefix,
or eight at once) and of the OpenAI routes are checked against transformers on CPU; bad requests must get SGLang's
error JSON without taking the server down.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed: ./scripts/setup_engines.sh installs it")

import transformers  # noqa: E402

from server_process import free_port, post, post_stream, running_server  # noqa: E402
from tiny_models import WORDS, transformers_greedy, write_model  # noqa: E402

STARTUP_DEADLINE_S = 300  # ~40 s on an idle 2-core machine; more while other engines run beside it
CONTEXT_LENGTH = 128
MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}

PROMPT = "the cat sat on"
IDS_PROMPT = "a big red dog ran under the old tree"
# A shared-prefix pair that no other prompt of the module starts like (so nothing else is cached under it):
# 39 shared tokens, then different last words.
SHARED_PREFIX = " ".join(WORDS[-39:])
PREFIX_A = SHARED_PREFIX + " cat sat"
PREFIX_B = SHARED_PREFIX + " dog ran"
# Eight different prompts of different lengths for the concurrent requests.
CONCURRENT_PROMPTS = [" ".join(WORDS[3 * i:3 * i + 2 + i]) for i in range(8)]
CHAT_MESSAGES = [{"role": "user", "content": "the dog ran under the tree"}]
# The tiny tokenizer has no chat template; a plain join is enough to turn messages into a prompt.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"

# SGLang detokenizes a request's output in the context of the last prompt tokens
# (INIT_INCREMENTAL_DETOKENIZATION_OFFSET in sglang/srt/managers/schedule_batch.py), so a word-level token gets its
# leading space: the text is decode(context + output) with decode(context) cut off.
DETOKENIZATION_CONTEXT = 5


def server_command(model: str, port: int, chat_template: str) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--device", "tpu", "--model-path", model,
            "--dtype", "float32", "--context-length", str(CONTEXT_LENGTH), "--max-total-tokens", "2048",
            "--mem-fraction-static", "0.1", "--random-seed", "0", "--chat-template", chat_template,
            "--host", "127.0.0.1", "--port", str(port)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return write_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """Base URL of a running server; the process group is always killed afterwards."""
    work = tmp_path_factory.mktemp("sglang_server")
    template = work / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE)
    port = free_port()
    # /health answers 503 until SGLang's own warm-up request is through, so a healthy server is a warm one.
    with running_server(server_command(model_path, port, str(template)), port, work / "server.log",
                        STARTUP_DEADLINE_S, dict(HF_HUB_OFFLINE="1")) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return transformers.AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def chat_prompt(tokenizer) -> str:
    return tokenizer.apply_chat_template(CHAT_MESSAGES, chat_template=CHAT_TEMPLATE, tokenize=False)


@pytest.fixture(scope="module")
def reference(model_path, chat_prompt) -> dict[str, list[int]]:
    """transformers' greedy continuation on CPU (past the end-of-sequence token) of every prompt of the module."""
    prompts = [PROMPT, IDS_PROMPT, PREFIX_A, PREFIX_B, chat_prompt, *CONCURRENT_PROMPTS]
    return dict(zip(prompts, transformers_greedy(model_path, prompts, MAX_TOKENS)))


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer(prompt).input_ids  # the tiny tokenizer adds no BOS; transformers_greedy tokenizes the same way


def sglang_text(tokenizer, prompt: str, output_ids: list[int]) -> str:
    """The text SGLang's detokenizer makes of ``output_ids`` after ``prompt`` (special tokens skipped, its default)."""
    context = prompt_ids(tokenizer, prompt)[-DETOKENIZATION_CONTEXT:]
    whole = tokenizer.decode(context + output_ids, skip_special_tokens=True)
    return whole[len(tokenizer.decode(context, skip_special_tokens=True)):]


def generate(server: str, prompt: str, **sampling) -> dict:
    status, answer = post(server, "/generate", {"text": prompt, "sampling_params": {**GREEDY, **sampling}})
    assert status == 200, answer
    return answer


# --- the native /generate route -------------------------------------------------------------------------------


def test_generate_from_input_ids_matches_transformers(server, tokenizer, reference):
    ids = prompt_ids(tokenizer, IDS_PROMPT)
    status, answer = post(server, "/generate", {"input_ids": ids, "sampling_params": GREEDY})
    assert status == 200, answer
    assert answer["output_ids"] == reference[IDS_PROMPT]
    assert answer["meta_info"]["prompt_tokens"] == len(ids)
    assert answer["meta_info"]["completion_tokens"] == MAX_TOKENS
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_TOKENS}


def test_generate_from_text_matches_transformers(server, tokenizer, reference):
    answer = generate(server, PROMPT)
    # SGLang tokenizes the text as transformers does (no BOS added): same prompt length, same greedy tokens.
    assert answer["meta_info"]["prompt_tokens"] == len(prompt_ids(tokenizer, PROMPT))
    assert answer["output_ids"] == reference[PROMPT]
    assert answer["text"] == sglang_text(tokenizer, PROMPT, reference[PROMPT])
    assert answer["text"].startswith(" ")  # detokenized after the prompt, not on its own


def test_streamed_generate_equals_non_streamed(server, tokenizer, reference):
    body = {"text": PROMPT, "sampling_params": GREEDY}
    events = post_stream(server, "/generate", body)  # SSE `data: {...}` events, then `data: [DONE]`
    assert len(events) > 1  # really streamed, not one final chunk
    # Each event carries the whole text and token ids so far (SGLang's default, non-incremental streaming).
    for before, after in zip(events, events[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_TOKENS}
    assert events[-1]["output_ids"] == reference[PROMPT]
    assert events[-1]["text"] == sglang_text(tokenizer, PROMPT, reference[PROMPT])
    assert events[-1]["text"] == generate(server, PROMPT)["text"]


def test_shared_prefix_is_served_from_the_radix_cache(server, tokenizer, reference):
    ids_a, ids_b = prompt_ids(tokenizer, PREFIX_A), prompt_ids(tokenizer, PREFIX_B)
    shared = next(i for i, (a, b) in enumerate(zip(ids_a, ids_b)) if a != b)
    assert shared == len(prompt_ids(tokenizer, SHARED_PREFIX)) == 39
    first = generate(server, PREFIX_A)
    assert first["meta_info"]["cached_tokens"] == 0  # no earlier prompt starts like this one
    assert first["output_ids"] == reference[PREFIX_A]
    second = generate(server, PREFIX_B)
    assert 0 < second["meta_info"]["cached_tokens"] <= shared
    assert second["output_ids"] == reference[PREFIX_B]  # computed on top of A's cached keys and values


def test_concurrent_requests_each_get_their_own_answer(server, tokenizer, reference):
    def request(prompt):
        return post(server, "/generate", {"text": prompt, "sampling_params": GREEDY})

    with ThreadPoolExecutor(len(CONCURRENT_PROMPTS)) as pool:
        answers = list(pool.map(request, CONCURRENT_PROMPTS))
    for prompt, (status, answer) in zip(CONCURRENT_PROMPTS, answers):
        assert status == 200, answer
        assert answer["output_ids"] == reference[prompt], prompt
        assert answer["text"] == sglang_text(tokenizer, prompt, reference[prompt])


# --- the OpenAI-compatible routes ------------------------------------------------------------------------------


def completion_body(model: str, **overrides) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            **overrides}


def chat_body(model: str, **overrides) -> dict:
    return {"model": model, "messages": CHAT_MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, **overrides}


def test_completion_matches_transformers(server, model_path, tokenizer, reference):
    status, answer = post(server, "/v1/completions", completion_body(model_path, return_token_ids=True))
    assert status == 200, answer
    assert answer["model"] == model_path
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids(tokenizer, PROMPT)
    assert choice["token_ids"] == reference[PROMPT]
    assert choice["text"] == sglang_text(tokenizer, PROMPT, reference[PROMPT])
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS


def test_streamed_completion_equals_non_streamed(server, model_path, tokenizer, reference):
    events = post_stream(server, "/v1/completions", completion_body(model_path))
    assert len(events) > 1  # really streamed, not one final chunk
    assert "".join(e["choices"][0]["text"] for e in events) == sglang_text(tokenizer, PROMPT, reference[PROMPT])
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_completion_matches_transformers(server, model_path, tokenizer, chat_prompt, reference):
    status, answer = post(server, "/v1/chat/completions", chat_body(model_path, return_token_ids=True))
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    # The server's --chat-template renders the messages as transformers does with the same template.
    assert choice["prompt_token_ids"] == prompt_ids(tokenizer, chat_prompt)
    assert choice["response_token_ids"] == reference[chat_prompt]
    assert choice["message"]["content"] == sglang_text(tokenizer, chat_prompt, reference[chat_prompt])
    assert choice["finish_reason"] == "length"


def test_streamed_chat_equals_non_streamed(server, model_path, tokenizer, chat_prompt, reference):
    events = post_stream(server, "/v1/chat/completions", chat_body(model_path))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0].get("role") == "assistant"
    assert len(deltas) > 2  # the role, then the text in pieces
    streamed = "".join(d.get("content") or "" for d in deltas)
    assert streamed == sglang_text(tokenizer, chat_prompt, reference[chat_prompt])
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_unknown_model_name_is_served_not_refused(server, tokenizer, reference):
    # Unlike vLLM (404), SGLang does not check the OpenAI `model` field against the served model on any device:
    # serving_base.py only splits a "base:adapter" name for LoRA. The request is answered by the one model.
    status, answer = post(server, "/v1/completions", completion_body("no-such-model"))
    assert status == 200, answer
    assert answer["model"] == "no-such-model"
    assert answer["choices"][0]["text"] == sglang_text(tokenizer, PROMPT, reference[PROMPT])


# --- bad requests ----------------------------------------------------------------------------------------------

# 200 one-word tokens: longer than --context-length. The checks are SGLang's own (TokenizerManager's length check,
# SamplingParams.verify), before the request reaches the tpu scheduler.
LONG_PROMPT = " ".join(["a"] * 200)
BAD_GENERATE = {
    "prompt_longer_than_context": (dict(text=LONG_PROMPT), {},
                                   "The input (200 tokens) is longer than the model's context length (128 tokens)."),
    "prompt_and_new_tokens_longer_than_context": (dict(text=PROMPT), dict(max_new_tokens=200),
                                                  "exceeds the model's maximum context length of 128 tokens"),
    "negative_temperature": (dict(text=PROMPT), dict(temperature=-1),
                             "temperature must be a non-negative finite number"),
    "top_p_above_one": (dict(text=PROMPT), dict(top_p=2), "top_p must be in (0, 1]"),
}
BAD_COMPLETION = {
    "prompt_longer_than_context": (dict(prompt=LONG_PROMPT),
                                   "The input (200 tokens) is longer than the model's context length (128 tokens)."),
    "negative_temperature": (dict(temperature=-1), "temperature must be a non-negative finite number"),
    "top_p_above_one": (dict(top_p=2), "top_p must be in (0, 1]"),
}


def assert_still_serving(server, tokenizer, reference):
    """A refused request must not have hurt the engine: a normal request still gets the reference answer."""
    answer = generate(server, PROMPT)
    assert answer["output_ids"] == reference[PROMPT]
    assert answer["text"] == sglang_text(tokenizer, PROMPT, reference[PROMPT])


@pytest.mark.parametrize("case", list(BAD_GENERATE))
def test_bad_generate_request_gets_error_and_server_keeps_serving(server, tokenizer, reference, case):
    inputs, sampling, expected_words = BAD_GENERATE[case]
    status, answer = post(server, "/generate", {**inputs, "sampling_params": {**GREEDY, **sampling}})
    assert status == 400, answer
    assert expected_words in answer["error"]["message"]
    assert_still_serving(server, tokenizer, reference)


@pytest.mark.parametrize("case", list(BAD_COMPLETION))
def test_bad_completion_request_gets_error_and_server_keeps_serving(server, model_path, tokenizer, reference,
                                                                    case):
    overrides, expected_words = BAD_COMPLETION[case]
    status, answer = post(server, "/v1/completions", completion_body(model_path, **overrides))
    assert status == 400, answer
    assert answer["object"] == "error"
    assert answer["code"] == 400
    assert answer["type"] == "BadRequestError"
    assert expected_words in answer["message"]
    assert_still_serving(server, tokenizer, reference)
