"""The ``tpu`` attention backend's op over SGLang's KV layout against causal attention on CPU.

SGLang keeps separate key and value buffers ``[slots, kv_heads, head_dim]`` and
each request's slots in its row of ``req_to_token``; the op reads the cached
keys 64 slots at a time and the step's new keys as given.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang", reason="SGLang is not installed: ./scripts/setup_engines.sh installs it")

from torchtpu.core import tensor  # noqa: E402
from torchtpu.integrations.paged_attention import chunked_attention_op  # noqa: E402
from torchtpu.integrations.sglang.attention import (SLOTS_PER_CHUNK, extend_bucket,  # noqa: E402
                                                    host_metadata, padded_block_tables, padded_step)

KV_HEADS, Q_HEADS, HEAD, SLOTS, CONTEXT = 2, 4, 8, 256, 80
SCALE = HEAD ** -0.5


def causal_attention(q, k, v, window=None, scale=SCALE):
    """Attention of the last len(q) positions of one request over all of its keys, in float32 on CPU."""
    n, length = q.shape[0], k.shape[0]
    position = torch.arange(length - n, length)[:, None]
    key = torch.arange(length)[None, :]
    mask = key <= position
    if window is not None:
        mask &= key > position - window
    rep = Q_HEADS // KV_HEADS
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.repeat_interleave(rep, 1).transpose(0, 1)[None],
                                         v.repeat_interleave(rep, 1).transpose(0, 1)[None], attn_mask=mask,
                                         scale=scale)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded-to-bucket"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_mixed_batch_over_separate_key_and_value_buffers_matches_causal_attention(dtype, window, padded):
    # A decode step whose context crosses a chunk of 64 slots, a prefill, and a prefix-cache hit.
    cached_lens, new_lens = [70, 0, 40], [1, 9, 5]
    request_rows = [3, 1, 2]  # rows of req_to_token (SGLang's req_pool_indices)
    torch.manual_seed(0)
    seq_lens = [c + n for c, n in zip(cached_lens, new_lens)]
    keys = [torch.randn(n, KV_HEADS, HEAD).to(dtype) for n in seq_lens]
    values = [torch.randn(n, KV_HEADS, HEAD).to(dtype) for n in seq_lens]
    queries = [torch.randn(n, Q_HEADS, HEAD).to(dtype) for n in new_lens]
    # Each request's slots: scattered over the pool, none at the reserved slot 0.
    slots = torch.randperm(SLOTS - 1)[:sum(seq_lens)] + 1
    req_to_token = torch.zeros(4, CONTEXT, dtype=torch.int32)
    key_cache = torch.zeros(SLOTS, KV_HEADS, HEAD, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    start = 0
    for r, row in enumerate(request_rows):
        own = slots[start:start + seq_lens[r]]
        start += seq_lens[r]
        req_to_token[row, :seq_lens[r]] = own.int()
        key_cache[own[:cached_lens[r]]] = keys[r][:cached_lens[r]]  # only what earlier steps cached
        value_cache[own[:cached_lens[r]]] = values[r][:cached_lens[r]]

    arrays = host_metadata(np.array(cached_lens), np.array(new_lens))
    assert int(arrays["cached_chunks"]) == 2  # 70 cached slots: two chunks of 64
    new_queries = torch.cat(queries)
    new_keys = torch.cat([k[c:] for k, c in zip(keys, cached_lens)])
    new_values = torch.cat([v[c:] for v, c in zip(values, cached_lens)])
    if padded:  # 15 tokens padded to 16 with tokens whose keys are large: no real token may see them
        arrays, _ = padded_step(step_inputs(arrays), arrays)
        assert len(arrays["token_position"]) == extend_bucket(15) == 16
        new_queries, new_keys, new_values = (torch.cat([t, 100 * torch.ones_like(t[:1])])
                                             for t in (new_queries, new_keys, new_values))
    meta = dict(zip(arrays, tensor.from_host_all([torch.from_numpy(a) for a in arrays.values()])))
    tables = padded_block_tables(req_to_token.to("tpu"), torch.tensor(request_rows, device="tpu"))
    assert tables.shape == (3, 2 * SLOTS_PER_CHUNK)  # 80 slots padded to whole chunks
    op = chunked_attention_op(SCALE, window, None, 1, layout="separate")
    out = op(new_queries.to("tpu"), new_keys.to("tpu"), new_values.to("tpu"), key_cache.to("tpu"),
             value_cache.to("tpu"), tables, meta["token_request"], meta["token_position"], meta["token_cached"],
             meta["cached_chunks"]).float().cpu()

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    start = 0
    for r, n in enumerate(new_lens):
        expected = causal_attention(queries[r].float(), keys[r].float(), values[r].float(), window)
        torch.testing.assert_close(out[start:start + n], expected, **tol)
        start += n
    assert torch.isfinite(out[start:]).all()  # a padding token's output: unused, but finite


def step_inputs(arrays):
    """A stand-in for SGLang's ForwardBatch: the model inputs of the step ``arrays`` describe, on tpu."""
    tokens = len(arrays["token_position"])
    return SimpleNamespace(input_ids=torch.arange(10, 10 + tokens, device="tpu"),
                           positions=torch.from_numpy(arrays["token_position"]).to("tpu"),
                           out_cache_loc=torch.arange(50, 50 + tokens, device="tpu"))


@pytest.mark.parametrize("tokens, bucket", [(1, 16), (16, 16), (17, 20), (100, 112), (128, 128), (129, 160),
                                            (3081, 3584), (4096, 4096)])
def test_extend_buckets_are_four_sizes_per_power_of_two(tokens, bucket):
    assert extend_bucket(tokens) == bucket
    assert (bucket - tokens) * 4 <= max(bucket, 64)  # padding adds at most a quarter (beyond the smallest bucket)


def test_padding_tokens_come_last_write_the_reserved_slot_and_are_invisible_to_attention():
    arrays = host_metadata(np.array([3, 0]), np.array([2, 15]))  # 17 tokens: bucket 20
    padded, inputs = padded_step(step_inputs(arrays), arrays)
    assert padded["token_request"].tolist() == [0, 0] + [1] * 15 + [0] * 3
    assert padded["token_position"].tolist() == [3, 4] + list(range(15)) + [-1] * 3
    assert padded["token_cached"].tolist() == [3, 3] + [0] * 15 + [0] * 3
    assert inputs["input_ids"].tolist() == list(range(10, 27)) + [0] * 3
    assert inputs["positions"].tolist() == [3, 4] + list(range(15)) + [0] * 3  # the model's rotary needs >= 0
    assert inputs["out_cache_loc"].tolist() == list(range(50, 67)) + [0] * 3  # slot 0: SGLang's padding slot


def test_host_metadata_places_each_token_after_its_requests_cached_prefix():
    arrays = host_metadata(np.array([3, 0]), np.array([2, 1]))
    assert arrays["token_request"].tolist() == [0, 0, 1]
    assert arrays["token_position"].tolist() == [3, 4, 0]
    assert arrays["token_cached"].tolist() == [3, 3, 0]
    assert int(arrays["cached_chunks"]) == 1


# The ragged paged-attention kernel over SGLang's pool in its layout (kv_pool.py), interpreted here: head size
# 128 (the kernel's lane width), pages of one slot (SGLang's default) or of four.
KERNEL_HEAD = 128
KERNEL_SCALE = KERNEL_HEAD ** -0.5


def _interleaved_pool(page_size: int, dtype):
    from torchtpu.integrations.sglang.kv_pool import InterleavedKVPool

    return InterleavedKVPool(size=SLOTS - page_size, page_size=page_size, dtype=dtype, head_num=KV_HEADS,
                             head_dim=KERNEL_HEAD, layer_num=1, device="tpu", enable_memory_saver=False)


def _kernel_step(page_size: int, dtype):
    """A decode step, a prefill and a prefix-cache hit written into an interleaved pool: cached keys by an
    earlier step, the step's own keys now (the kernel reads every key from the pool)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    cached_lens, new_lens, request_rows = [21, 0, 9], [1, 10, 5], [3, 1, 2]
    torch.manual_seed(0)
    seq_lens = [c + n for c, n in zip(cached_lens, new_lens)]
    keys = [torch.randn(n, KV_HEADS, KERNEL_HEAD).to(dtype) for n in seq_lens]
    values = [torch.randn(n, KV_HEADS, KERNEL_HEAD).to(dtype) for n in seq_lens]
    queries = [torch.randn(n, Q_HEADS, KERNEL_HEAD).to(dtype) for n in new_lens]
    # Each request's pages scattered over the pool, none the reserved page 0; slots page-aligned.
    pages = (torch.randperm(SLOTS // page_size - 1) + 1).tolist()
    req_to_token = torch.zeros(4, CONTEXT, dtype=torch.int32)
    for r, row in enumerate(request_rows):
        own = [pages.pop() for _ in range(-(-seq_lens[r] // page_size))]
        req_to_token[row, :seq_lens[r]] = torch.tensor([own[p // page_size] * page_size + p % page_size
                                                        for p in range(seq_lens[r])], dtype=torch.int32)
    pool = _interleaved_pool(page_size, dtype)
    layer = SimpleNamespace(layer_id=0)
    for r, row in enumerate(request_rows):
        for span in (slice(0, cached_lens[r]), slice(cached_lens[r], seq_lens[r])):  # earlier step, this step
            if span.stop > span.start:
                loc = req_to_token[row, span].long().to("tpu")
                pool.set_kv_buffer(layer, KVWriteLoc(loc, None), keys[r][span].to("tpu"), values[r][span].to("tpu"))
    return pool, req_to_token, request_rows, (cached_lens, new_lens), (queries, keys, values)


def _expected(step):
    return torch.cat([causal_attention(q.float(), k.float(), v.float(), scale=KERNEL_SCALE) for q, k, v in zip(*step)])


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_over_the_interleaved_pool_matches_causal_attention(page_size, dtype):
    from torchtpu.integrations import ragged_attention
    from torchtpu.integrations.sglang.attention import kernel_metadata, kernel_page_indices

    pool, req_to_token, rows, (cached_lens, new_lens), step = _kernel_step(page_size, dtype)
    arrays = kernel_metadata(np.array(cached_lens), np.array(new_lens))
    assert arrays["kv_lens"].tolist() == [22, 10, 14, 0]  # 3 requests padded to 4
    assert arrays["cu_q_lens"].tolist() == [0, 1, 11, 16, 16]
    meta = {name: torch.from_numpy(a).to("tpu") for name, a in arrays.items()}
    page_indices = kernel_page_indices(req_to_token.to("tpu"), torch.tensor(rows, device="tpu"), 4, page_size)
    assert page_indices.shape == (4, CONTEXT // page_size)
    query = F.pad(torch.cat(step[0]), (0, 0, 0, 0, 0, 4))  # 16 tokens, 4 of padding: zeros out
    out = ragged_attention.ragged_attention_op(KERNEL_SCALE, None, None)(
        query.to("tpu"), pool.get_kv_pages(0), page_indices, meta["kv_lens"], meta["cu_q_lens"],
        meta["num_seqs"]).float().cpu()

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out[:16], _expected(step), **tol)
    assert (out[16:] == 0).all()


def test_the_interleaved_pool_is_sglangs_pool_to_the_rest_of_sglang():
    """k_buffer/v_buffer are SGLang's [slots, heads, dim] views of the one buffer: what a write stores shows
    through them, and the chunked op reads the same buffer (layers the kernel cannot take)."""
    pool, req_to_token, rows, (cached_lens, new_lens), (queries, keys, values) = _kernel_step(1, torch.float32)
    slots = req_to_token[rows[0], :cached_lens[0] + new_lens[0]].long()
    assert pool.k_buffer[0].shape == (SLOTS, KV_HEADS, KERNEL_HEAD)
    torch.testing.assert_close(pool.get_key_buffer(0).cpu()[slots], keys[0])
    torch.testing.assert_close(pool.get_value_buffer(0).cpu()[slots], values[0])

    arrays = host_metadata(np.array(cached_lens), np.array(new_lens))
    meta = dict(zip(arrays, tensor.from_host_all([torch.from_numpy(a) for a in arrays.values()])))
    tables = padded_block_tables(req_to_token.to("tpu"), torch.tensor(rows, device="tpu"))
    new_keys = torch.cat([k[c:] for k, c in zip(keys, cached_lens)]).to("tpu")
    new_values = torch.cat([v[c:] for v, c in zip(values, cached_lens)]).to("tpu")
    op = chunked_attention_op(KERNEL_SCALE, None, None, 1, layout="interleaved")
    out = op(torch.cat(queries).to("tpu"), new_keys, new_values, pool.get_kv_pages(0, page_size=1),
             tables, meta["token_request"], meta["token_position"], meta["token_cached"],
             meta["cached_chunks"]).cpu()
    torch.testing.assert_close(out, _expected((queries, keys, values)), atol=1e-5, rtol=1e-5)
