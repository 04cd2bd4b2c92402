"""Compiled static-cache decoding: each program compiles once, prompts are bucketed.

``generate(cache_implementation="static")`` keeps the KV cache in tensors of a
fixed size, so every decode step has the same shapes.  With the model's
forward compiled by ``torch.compile(backend="tpu")``, the prefill compiles one
program per prompt-length bucket (prompts are left-padded to a bucket with
``torch.tpu.pad_to_bucket(..., side="left")``) and the decode step compiles
once; the tokens are CPU eager's greedy tokens exactly.

Compiles are counted by ``torch.tpu.compile_cache_stats()["misses"]``, which
counts compiled-graph programs only (eager ops have their own cache).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from .architectures import BY_NAME, VOCAB
from .harness import build_model

ARCH = BY_NAME["llama"]
NEW_TOKENS = 12
PAD = ARCH.config["pad_token_id"]


def bucketed_prompt(length: int, seed: int):
    """Two random prompts of ``length`` tokens, left-padded to their bucket, with the attention mask."""
    ids = torch.randint(3, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))
    padded, size = torch.tpu.pad_to_bucket(ids, 1, value=PAD, side="left")
    mask, _ = torch.tpu.pad_to_bucket(torch.ones_like(ids), 1, value=0, side="left")
    assert size == length
    return padded, mask


def generate(model, ids, mask, new_tokens=NEW_TOKENS):
    device = next(model.parameters()).device
    return model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
    )


def compiles_during(fn):
    """``fn()``'s result and the number of compiled-graph programs it compiled."""
    before = torch.tpu.compile_cache_stats()["misses"]
    result = fn()
    return result, torch.tpu.compile_cache_stats()["misses"] - before


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo's per-code recompile limit is shared by every model that ran before in this
    process (transformers' forward wrapper is one code object): start from a clean slate."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def models():
    cpu_model = build_model(ARCH)
    return cpu_model, copy.deepcopy(cpu_model).to("tpu")


def test_compiled_forward_compiles_prefill_per_bucket_and_decode_once(models):
    cpu_model, tpu_model = models
    tpu_model.forward = torch.compile(tpu_model.forward, backend="tpu", dynamic=False, fullgraph=True)
    breaks = sum(counters["graph_break"].values())
    # (prompt length, compiles expected): 5 and 7 share bucket 8, 12 is in bucket 16.
    for seed, (length, expected_compiles) in enumerate([(5, 2), (7, 0), (12, 2)]):
        ids, mask = bucketed_prompt(length, seed)
        tokens, compiles = compiles_during(lambda: generate(tpu_model, ids, mask))
        assert compiles == expected_compiles, f"prompt length {length} (bucket {ids.shape[1]}): {compiles} compiles"
        expected = generate(cpu_model, ids, mask)
        assert tokens.shape == (2, ids.shape[1] + NEW_TOKENS)
        torch.testing.assert_close(tokens.cpu(), expected, rtol=0, atol=0)
    assert sum(counters["graph_break"].values()) == breaks  # fullgraph: one graph per program


def test_generate_compiles_the_decode_step_by_itself(models):
    """Without any torch.compile of ours, transformers compiles the decode step for a
    static cache on a "tpu" device (backend "tpu", static shapes); the prefill runs eagerly.

    A cache length of its own (8 + 16 tokens), so that no program of the test above
    serves it: programs are shared between models of the same shapes."""
    cpu_model, tpu_model = models
    new_tokens = NEW_TOKENS + 4
    for seed, (length, expected_compiles) in enumerate([(6, 1), (8, 0)]):
        ids, mask = bucketed_prompt(length, seed)
        tokens, compiles = compiles_during(lambda: generate(tpu_model, ids, mask, new_tokens))
        assert compiles == expected_compiles, f"prompt length {length}: {compiles} compiles"
        torch.testing.assert_close(tokens.cpu(), generate(cpu_model, ids, mask, new_tokens), rtol=0, atol=0)


def test_pad_to_bucket_left():
    ids = torch.arange(1, 7).view(2, 3)
    padded, size = torch.tpu.pad_to_bucket(ids, 1, value=0, side="left")
    assert size == 3
    assert padded.tolist() == [[0, 1, 2, 3], [0, 4, 5, 6]]
    with pytest.raises(ValueError, match="side"):
        torch.tpu.pad_to_bucket(ids, 1, side="middle")
