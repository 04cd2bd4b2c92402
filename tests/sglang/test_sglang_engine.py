"""SGLang's offline engine on tpu against transformers on CPU (the oracle), with tiny random models.

SGLang finds torchtpu's platform through its ``sglang.srt.platforms`` entry
point; ``device="tpu"`` runs the model, the KV pool and the ``tpu`` attention
backend on the tpu device. Greedy tokens must equal transformers'
``generate()`` exactly, in float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch

# In-process engines: SGLang's scheduler processes signal their parent (the pytest worker) to quit when they fail,
# and the engine leaves settings in os.environ for the worker's later tests. CI runs the server test (its own
# process group) as the smoke test; these run with -m slow or TORCHTPU_SGLANG_ALL=1.
pytestmark = pytest.mark.slow

sgl = pytest.importorskip("sglang", reason="SGLang is not installed: ./scripts/setup_engines.sh installs it")

from tiny_models import tokenizer, transformers_greedy, write_model  # noqa: E402

PROMPTS = [
    "the cat sat on the mat",
    "a dog ran",
    "the big red car and the small blue bird sat under the old tree",
    "night",
]
MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}


# The one engine alive in this process. SGLang's Engine.shutdown kills every child process of this one, so
# shutting down a second engine would kill the first one's scheduler too, and the first engine's watchdog
# would then quit the whole process.
_live: dict = {}


def start_engine(path: str, dtype: str = "float32", **kwargs):
    """An ``sglang.Engine`` on tpu with a small KV pool (2048 tokens): the live one if it has these settings,
    else a new one, started after the live one is shut down."""
    settings = (path, dtype, sorted(kwargs.items()))
    if _live.get("settings") == settings:
        return _live["engine"]
    stop_engine()
    engine = sgl.Engine(model_path=path, device="tpu", dtype=dtype, max_total_tokens=2048, mem_fraction_static=0.1,
                        random_seed=0, **kwargs)
    _live.update(settings=settings, engine=engine)
    return engine


def stop_engine() -> None:
    engine = _live.pop("engine", None)
    _live.clear()
    if engine is not None:
        engine.shutdown()


def greedy(engine, prompts) -> list[list[int]]:
    return [out["output_ids"] for out in engine.generate(prompts, dict(GREEDY))]


@pytest.fixture(scope="module", autouse=True)
def stopped_at_the_end():
    yield
    stop_engine()


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory) -> str:
    return write_model(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture
def engine(llama_path):
    """The tiny Llama's engine, shared by the tests that take it (started again if a test replaced it)."""
    return start_engine(llama_path)


def test_the_tpu_platform_and_attention_backend_are_active(engine):
    from sglang.srt.platforms import current_platform

    from torchtpu.integrations.sglang.platform import TpuSRTPlatform

    assert isinstance(current_platform, TpuSRTPlatform)
    args = engine.get_server_info()
    assert args["device"] == "tpu"
    assert args["attention_backend"] == "tpu"


def test_greedy_tokens_equal_transformers_for_prompts_of_different_lengths(engine, llama_path):
    assert greedy(engine, PROMPTS) == transformers_greedy(llama_path, PROMPTS, MAX_TOKENS)


def test_a_shared_prefix_is_served_from_the_radix_cache(engine, llama_path):
    first = "the old house under the big tree and the small red car"
    second = first + " then the dog slept"
    expected = transformers_greedy(llama_path, [second], MAX_TOKENS)
    engine.generate(first, dict(GREEDY))
    out = engine.generate(second, dict(GREEDY))
    shared = len(tokenizer()(first)["input_ids"])
    # The radix tree holds the first prompt (and its generated tokens, which differ from the second's words).
    assert 0 < out["meta_info"]["cached_tokens"] <= shared
    assert out["output_ids"] == expected[0]


def test_32_requests_in_one_batch_are_all_answered(engine, llama_path):
    words = tokenizer().get_vocab()
    vocabulary = sorted(w for w in words if not w.startswith("<"))
    prompts = [" ".join(vocabulary[(7 * i + j) % len(vocabulary)] for j in range(1 + i % 9)) for i in range(32)]
    outputs = engine.generate(prompts, dict(GREEDY))
    assert len(outputs) == 32
    assert all(out["meta_info"]["finish_reason"]["type"] == "length" for out in outputs)
    assert [out["output_ids"] for out in outputs] == transformers_greedy(llama_path, prompts, MAX_TOKENS)


def test_sampling_with_top_k_1_equals_greedy(engine, llama_path):
    # Temperature, top-p and top-k go through the sampler's filtering path; top-k 1 leaves one candidate.
    params = {"temperature": 0.8, "top_p": 0.9, "top_k": 1, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    outputs = engine.generate(PROMPTS, params)
    assert [out["output_ids"] for out in outputs] == transformers_greedy(llama_path, PROMPTS, MAX_TOKENS)


def test_sampling_draws_tokens_of_the_vocabulary(engine):
    params = {"temperature": 1.0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    outputs = engine.generate(PROMPTS, params)
    vocab_size = len(tokenizer().get_vocab())
    for out in outputs:
        assert len(out["output_ids"]) == MAX_TOKENS
        assert all(0 <= t < vocab_size for t in out["output_ids"])


@pytest.mark.parametrize("arch,dtype", [("qwen3", "float32"), ("llama", "bfloat16")])
def test_greedy_tokens_equal_transformers_for_another_model_and_dtype(tmp_path, arch, dtype):
    path = write_model(tmp_path, arch)
    expected = transformers_greedy(path, PROMPTS, MAX_TOKENS, getattr(torch, dtype))
    assert greedy(start_engine(path, dtype), PROMPTS) == expected


def test_compiled_decode_equals_transformers_and_does_not_recompile(llama_path, capfd, monkeypatch):
    # --enable-torch-compile: decode steps run compiled per batch-size bucket (1, 2, 4, 8, 16, 32), all
    # compiled at start-up. Dynamo's recompile log (in the scheduler process, on our stderr) must stay
    # silent afterwards: three requests run padded to the bucket of 4, then fewer as they finish.
    # Each decode step is one graph: no graph break (the graph runner swaps SGLang's msgspec Structs).
    monkeypatch.setenv("TORCH_LOGS", "recompiles,graph_breaks")
    engine = start_engine(llama_path, enable_torch_compile=True)
    started = capfd.readouterr().err
    assert "Recompiling function" in started  # the log works: each bucket after the first is a recompile
    assert "Graph break" not in started, started[-3000:]
    prompts = PROMPTS[:3]
    assert greedy(engine, prompts) == transformers_greedy(llama_path, prompts, MAX_TOKENS)
    served = capfd.readouterr().err
    assert "Recompiling function" not in served, served[-3000:]


def test_the_ragged_paged_attention_kernel_serves_greedy_tokens(tmp_path, monkeypatch, capfd):
    """SGLang's engine with the kernel asked for (interpreted here; a TPU's default) and a head size it
    takes: the pool in the kernel's layout with pages of 16 slots (the platform's default for the kernel),
    greedy tokens equal transformers' in float32, on a radix-cache hit, and with decode compiled (nothing
    compiled again while serving)."""
    import tiny_models

    monkeypatch.setitem(tiny_models.COMMON, "head_dim", 128)
    from torchtpu import config

    monkeypatch.setenv("TORCHTPU_SGLANG_PALLAS_ATTENTION", "1")  # the scheduler process reads it at import
    monkeypatch.setattr(config.current, "sglang_pallas_attention", True)  # this process resolves the server args
    monkeypatch.setenv("TORCH_LOGS", "recompiles")
    path = tiny_models.write_model(tmp_path, "llama")
    # The last prompt spans more than a page: the radix cache matches whole pages.
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2] + " and " + PROMPTS[0]]
    expected = transformers_greedy(path, prompts, MAX_TOKENS)
    engine = start_engine(path, enable_torch_compile=True, log_level="warning")
    try:
        started = capfd.readouterr().err
        assert "SGLang attention runs JAX's ragged paged-attention Pallas kernel" in started
        assert engine.get_server_info()["page_size"] == 16
        assert greedy(engine, prompts) == expected
        again = engine.generate(prompts[2], dict(GREEDY))  # the long prompt again: served from the radix cache
        assert again["meta_info"]["cached_tokens"] >= 16 and again["output_ids"] == expected[2]
        assert "Recompiling function" not in capfd.readouterr().err
    finally:
        stop_engine()
