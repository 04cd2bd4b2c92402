"""The compiled vLLM sampler on tpu against vLLM's own sampling ops and exact distributions on CPU."""

import functools

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")

from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p  # noqa: E402

from torchtpu.integrations.vllm.sampler import (SamplingKind, exponential_noise_op, keep_top_k_top_p,  # noqa: E402
                                                request_bucket, request_buckets, sample_rows)

VOCAB = 16


def _sampler(kind: SamplingKind, compiled: bool):
    fn = functools.partial(sample_rows, kind=kind, noise=exponential_noise_op(VOCAB))
    return torch.compile(fn, backend="tpu", dynamic=False, fullgraph=True) if compiled else fn


def _inputs(rows, temperature=1.0, top_k=VOCAB, top_p=1.0, seed=7, offset=0, salts=None):
    full = functools.partial(torch.full, (rows,))
    salts = torch.arange(1, rows + 1) if salts is None else salts
    host = [full(temperature), full(top_k, dtype=torch.int64), full(top_p), full(seed, dtype=torch.int64),
            full(offset, dtype=torch.int64), salts]
    return [t.to("tpu") for t in host]


def test_request_buckets_are_powers_of_two_from_eight_up_to_the_limit():
    assert [request_bucket(n, 256) for n in (1, 8, 9, 200, 256)] == [8, 8, 16, 256, 256]
    assert request_bucket(3, 5) == 5 and request_buckets(20) == [8, 16, 20]


@pytest.mark.parametrize("top_k,top_p", [(VOCAB, 1.0), (3, 1.0), (VOCAB, 0.5), (5, 0.7), (1, 0.9)])
def test_top_k_top_p_keeps_the_tokens_vllm_keeps(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB) * 3
    k, p = torch.full((6,), top_k), torch.full((6,), top_p)
    expected = torch.isfinite(apply_top_k_top_p(logits.clone(), k, p))
    kept, order = keep_top_k_top_p(logits.to("tpu"), k.to("tpu"), p.to("tpu"))
    got = torch.zeros_like(expected).scatter_(-1, order.cpu(), torch.isfinite(kept.cpu()))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("compiled", [False, True])
def test_greedy_tokens_and_logprobs_equal_cpu(compiled):
    torch.manual_seed(1)
    logits = torch.randn(8, VOCAB)
    tokens, ids, values, ranks = _sampler(SamplingKind(logprobs=4), compiled)(logits.to("tpu"), *_inputs(8))
    logprobs = logits.log_softmax(-1)
    top_values, top_ids = logprobs.topk(4, -1)
    expected_tokens = logits.argmax(-1)
    assert tokens.shape == (8, 1) and tokens.dtype == ids.dtype == torch.int32  # vLLM's layouts
    assert torch.equal(tokens.cpu().flatten().long(), expected_tokens)
    assert torch.equal(ids.cpu().long(), torch.cat((expected_tokens[:, None], top_ids), 1))
    torch.testing.assert_close(values.cpu(), torch.cat((logprobs.gather(-1, expected_tokens[:, None]), top_values), 1))
    assert torch.equal(ranks.cpu(), torch.ones(8, dtype=torch.int64))  # the argmax ranks first


@pytest.mark.parametrize("top_k,top_p", [(VOCAB, 1.0), (4, 1.0), (VOCAB, 0.6)])
def test_random_tokens_follow_the_softmax_of_the_kept_tokens(top_k, top_p):
    rows, temperature = 4096, 0.8
    torch.manual_seed(2)
    logits = torch.randn(VOCAB)
    kind = SamplingKind(random=True, top_k_top_p=(top_k, top_p) != (VOCAB, 1.0))
    (tokens,) = _sampler(kind, compiled=True)(logits.expand(rows, VOCAB).to("tpu"),
                                              *_inputs(rows, temperature, top_k, top_p))
    kept = torch.isfinite(apply_top_k_top_p((logits / temperature)[None].clone(), torch.tensor([top_k]),
                                            torch.tensor([top_p])))[0]
    expected = torch.where(kept, logits / temperature, float("-inf")).softmax(-1)
    frequency = torch.bincount(tokens.cpu().flatten(), minlength=VOCAB).float() / rows
    assert (frequency[~kept] == 0).all()
    assert (frequency - expected).abs().max() < 0.03, (frequency, expected)


def test_seeded_rows_repeat_and_the_counter_moves_them_on():
    kind = SamplingKind(random=True)
    sample = _sampler(kind, compiled=True)
    logits = torch.zeros(8, VOCAB, device="tpu")  # uniform: every token equally likely
    salts = torch.zeros(8, dtype=torch.int64)  # a request's own generator: the row does not matter
    first, again = (sample(logits, *_inputs(8, seed=1234, salts=salts))[0].cpu().flatten() for _ in range(2))
    later = sample(logits, *_inputs(8, seed=1234, offset=4, salts=salts))[0].cpu().flatten()
    other_seed = sample(logits, *_inputs(8, seed=99, salts=salts))[0].cpu().flatten()
    assert torch.equal(first, again)
    assert (first == first[0]).all()  # same seed and counter: the same draw in every row
    assert later[0] != first[0] or other_seed[0] != first[0]
    rows = sample(logits, *_inputs(8))[0].cpu().flatten()  # the global stream: each row its own salt
    assert len(set(rows.tolist())) > 1


def test_greedy_rows_of_a_random_batch_take_the_argmax():
    torch.manual_seed(3)
    logits = torch.randn(8, VOCAB)
    temperature, top_k, top_p, seeds, offsets, salts = _inputs(8)
    temperature = torch.tensor([0.0, 1.0] * 4, device="tpu")
    (tokens,) = _sampler(SamplingKind(random=True, top_k_top_p=True), compiled=True)(
        logits.to("tpu"), temperature, top_k, top_p, seeds, offsets, salts)
    assert torch.equal(tokens.cpu().flatten().long()[0::2], logits.argmax(-1)[0::2])
