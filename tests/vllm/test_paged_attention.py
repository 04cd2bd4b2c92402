"""The torch-op paged attention (the oracle for TPU kernels) against plain causal attention on CPU."""

import pytest
import torch
import torch.nn.functional as F

from torchtpu.integrations import paged_attention as attention
from torchtpu.integrations.paged_attention import chunked_paged_attention, kv_storage_dtype, paged_attention, \
    write_kv_cache
from torchtpu.integrations.vllm.attention import build_host_metadata

BLOCK, KV_HEADS, Q_HEADS, HEAD = 4, 2, 4, 8


def _reference(q, k, v, window=None):
    """Causal attention of the last len(q) positions over all of k and v (one request)."""
    n, length = q.shape[0], k.shape[0]
    position = torch.arange(length - n, length)[:, None]
    key = torch.arange(length)[None, :]
    mask = key <= position
    if window is not None:
        mask &= key > position - window
    rep = Q_HEADS // KV_HEADS
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.repeat_interleave(rep, 1).transpose(0, 1)[None],
                                         v.repeat_interleave(rep, 1).transpose(0, 1)[None], attn_mask=mask,
                                         scale=HEAD ** -0.5)
    return out[0].transpose(0, 1)


IMPLEMENTATIONS = [("torch ops", "cpu"), ("torch ops", "tpu"), ("chunked", "tpu"), ("chunked, cache only", "tpu")]


@pytest.mark.parametrize("implementation,device", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("cached_lens,new_lens,cached_chunks,num_chunks", [
    # request 0: 5 cached tokens + 1 new (decode); request 1: a 6-token prefill; request 2: 6 cached + 3 new.
    # Chunks of 2 pages (8 positions): the longest cached prefix spans one, the longest sequence two.
    ([5, 0, 6], [1, 6, 3], 1, 2),
    ([0, 0, 0], [1, 6, 9], 0, 2),  # prefills only: nothing is read from the cache
], ids=["mixed", "prefills"])
def test_mixed_prefill_and_decode_batch_matches_causal_attention(implementation, device, dtype, window, cached_lens,
                                                                  new_lens, cached_chunks, num_chunks, monkeypatch):
    monkeypatch.setattr(attention, "CHUNK_POSITIONS", 2 * BLOCK)
    torch.manual_seed(0)
    seq_lens = [c + n for c, n in zip(cached_lens, new_lens)]
    tables = torch.tensor([[3, 1, 0, 0], [2, 5, 0, 0], [4, 6, 7, 0]])
    keys = [torch.randn(n, KV_HEADS, HEAD) for n in seq_lens]
    values = [torch.randn(n, KV_HEADS, HEAD) for n in seq_lens]
    storage = kv_storage_dtype(dtype) if device == "tpu" else dtype
    cache = torch.zeros(8, BLOCK, 2 * KV_HEADS, HEAD, dtype=storage, device=device)

    def slots(r, positions):
        return torch.tensor([int(tables[r, p // BLOCK]) * BLOCK + p % BLOCK for p in positions], device=device)

    for r, c in enumerate(cached_lens):  # earlier steps' keys and values
        if c:
            write_kv_cache(cache, keys[r][:c].to(device, dtype), values[r][:c].to(device, dtype), slots(r, range(c)))
    query_start = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()]).numpy()
    meta = build_host_metadata(query_start, torch.tensor(seq_lens).numpy(), tables.numpy(), BLOCK,
                               num_tokens=sum(new_lens), max_tokens=64, max_reqs=4, max_pages=4)
    meta = {k: torch.from_numpy(v).to(device) for k, v in meta.items()}
    padded = meta["slot_mapping"].shape[0]
    new_k = torch.cat([keys[r][c:] for r, c in enumerate(cached_lens)])
    new_v = torch.cat([values[r][c:] for r, c in enumerate(cached_lens)])
    pad = padded - new_k.shape[0]
    new_k, new_v = F.pad(new_k, (0, 0, 0, 0, 0, pad)), F.pad(new_v, (0, 0, 0, 0, 0, pad))
    queries = [torch.randn(n, Q_HEADS, HEAD) for n in new_lens]
    query = F.pad(torch.cat(queries), (0, 0, 0, 0, 0, pad))
    write_kv_cache(cache, new_k.to(device, dtype), new_v.to(device, dtype), meta["slot_mapping"])
    query = query.to(device, dtype)
    table_args = (meta["block_tables"], meta["token_request"], meta["token_position"])
    if implementation == "chunked":  # the step's keys as given, the cached ones from the cache
        assert int(meta["cached_chunks"]) == cached_chunks
        out = chunked_paged_attention(query, new_k.to(device, dtype), new_v.to(device, dtype), cache, *table_args,
                                      meta["token_cached"], meta["cached_chunks"], scale=HEAD ** -0.5,
                                      sliding_window=window)
    elif implementation == "chunked, cache only":  # a layer reading another's cache: every key from the cache
        assert int(meta["num_chunks"]) == num_chunks
        out = chunked_paged_attention(query, None, None, cache, *table_args, meta["token_cached"],
                                      meta["num_chunks"], scale=HEAD ** -0.5, sliding_window=window)
    else:
        out = paged_attention(query, cache, *table_args, scale=HEAD ** -0.5, sliding_window=window)
    out = out.float().cpu()

    start = 0
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for r, n in enumerate(new_lens):
        k, v = keys[r].to(dtype).float(), values[r].to(dtype).float()
        expected = _reference(queries[r].to(dtype).float(), k, v, window)
        torch.testing.assert_close(out[start:start + n], expected, **tol)
        start += n
    assert torch.isfinite(out[start:]).all()  # padding tokens see no key but stay finite
