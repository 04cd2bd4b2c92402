"""Tiny random Hugging Face checkpoints with a real (word-level) tokenizer, written to a folder."""

from __future__ import annotations

import contextlib

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ("the a cat dog sat ran on under mat log and then slept barked big small red blue green old new "
         "house tree park road river hill car bird fish sun moon star day night").split()
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
VOCAB_SIZE = 128
WORDS += [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIALS) - len(WORDS))]  # every token id decodes to a word

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=64, decoder_sparse_step=1),
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
    # shared experts; vLLM's Qwen2-MoE takes head_dim = hidden / heads (transformers reads head_dim): 2 x 32
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**{**COMMON, "num_attention_heads": 2, "num_key_value_heads": 1},
                                                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                                     shared_expert_intermediate_size=96),
}


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")


def write_model(folder, arch: str = "llama", seed: int = 0) -> str:
    """Save a seeded random ``arch`` model (float32) and its tokenizer to ``folder``; return the path."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())
    with torch.no_grad():  # larger logits than the default init, so greedy tokens are not near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def transformers_greedy(path: str, prompts, max_tokens: int, dtype=torch.float32) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on CPU (the oracle of the vLLM tests).

    Like the tests' vLLM requests (``ignore_eos=True``), it runs past the end-of-sequence token."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    results = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
        results.append(out[0, ids.shape[1]:].tolist())
    return results


@contextlib.contextmanager
def tiny_engine(path: str, dtype: str = "float32", **kwargs):
    """A small ``vllm.LLM`` on ``path`` (8 MiB of KV cache, 128 tokens a step), shut down on exit."""
    import vllm

    llm = vllm.LLM(path, dtype=dtype, max_model_len=128, max_num_batched_tokens=128, max_num_seqs=8,
                   kv_cache_memory_bytes=8 << 20, seed=0, **kwargs)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()


def vllm_greedy(llm, prompts, max_tokens: int) -> list[list[int]]:
    """``llm``'s greedy continuation of each prompt, past the end-of-sequence token as the oracle's."""
    import vllm

    params = vllm.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
