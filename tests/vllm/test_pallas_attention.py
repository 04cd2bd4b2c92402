"""JAX's TPU ragged paged-attention Pallas kernel, run through our adapter, against the torch-op oracle.

No TPU here: the kernel runs in Pallas' TPU interpreter
(``force_tpu_interpret_mode``), which simulates its DMAs into VMEM, its
double-buffer semaphores and its masked stores on the host. jax 0.10.2's
interpreter needs two fixes for this kernel (``pallas_interpret.py``);
everything else is the kernel as shipped. The oracle is
``attention.paged_attention`` in plain PyTorch on CPU.
"""

import logging

import pytest
import torch
import torch.nn.functional as F

from torchtpu import config
from torchtpu.integrations.vllm import pallas_attention
from torchtpu.integrations.paged_attention import kv_storage_dtype, paged_attention, write_kv_cache
from torchtpu.integrations.vllm.attention import build_host_metadata
from torchtpu.runtime import device as runtime_device

# Head size 128: the kernel's lane width. Blocks of 2 pages (8 positions) and 8 queries
# (ragged_attention.INTERPRET_BLOCKS): the step below spans 2 query blocks and up to 2 KV blocks.
BLOCK, KV_HEADS, Q_HEADS, HEAD = 4, 2, 4, 128
MAX_REQS, MAX_PAGES, NUM_BLOCKS = 4, 4, 10
SCALE = HEAD ** -0.5


def _step(device, dtype, q_heads=Q_HEADS, kv_heads=KV_HEADS):
    """A mixed step on a cache of ``dtype`` (stored as on tpu): request 0 decodes (5 cached + 1 new),
    request 1 prefills 6 tokens, request 2 is a chunked prefill (6 cached + 3 new: its query starts
    mid-sequence and crosses the query-block boundary at token 8). 10 tokens pad to the bucket of 16."""
    torch.manual_seed(0)
    cached, new = [5, 0, 6], [1, 6, 3]
    tables = torch.tensor([[3, 1, 0, 0], [2, 5, 0, 0], [4, 6, 9, 0]])
    keys = [torch.randn(c + n, kv_heads, HEAD) for c, n in zip(cached, new)]
    values = [torch.randn(c + n, kv_heads, HEAD) for c, n in zip(cached, new)]
    storage = kv_storage_dtype(dtype) if device == "tpu" else dtype
    cache = torch.zeros(NUM_BLOCKS, BLOCK, 2 * kv_heads, HEAD, dtype=storage, device=device)
    for r, c in enumerate(cached):  # earlier steps' keys and values
        if c:
            slots = torch.tensor([int(tables[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(c)], device=device)
            write_kv_cache(cache, keys[r][:c].to(device, dtype), values[r][:c].to(device, dtype), slots)
    query_start = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()]).numpy()
    seq_lens = torch.tensor([c + n for c, n in zip(cached, new)]).numpy()
    meta = build_host_metadata(query_start, seq_lens, tables.numpy(), BLOCK, num_tokens=sum(new), max_tokens=64,
                               max_reqs=MAX_REQS, max_pages=MAX_PAGES)
    meta = {k: torch.from_numpy(v).to(device) for k, v in meta.items()}
    pad = meta["slot_mapping"].shape[0] - sum(new)
    new_k = F.pad(torch.cat([k[c:] for k, c in zip(keys, cached)]), (0, 0, 0, 0, 0, pad))
    new_v = F.pad(torch.cat([v[c:] for v, c in zip(values, cached)]), (0, 0, 0, 0, 0, pad))
    write_kv_cache(cache, new_k.to(device, dtype), new_v.to(device, dtype), meta["slot_mapping"])
    query = F.pad(torch.randn(sum(new), q_heads, HEAD), (0, 0, 0, 0, 0, pad)).to(device, dtype)
    return query, cache, meta, sum(new)


def _oracle(dtype, window, soft_cap, **heads):
    query, cache, meta, real = _step("cpu", dtype, **heads)
    out = paged_attention(query, cache, meta["block_tables"], meta["token_request"], meta["token_position"],
                          scale=SCALE, sliding_window=window, soft_cap=soft_cap)
    return out.float()[:real]


def _kernel(dtype, window, soft_cap, compiled=False, **heads):
    query, cache, meta, real = _step("tpu", dtype, **heads)
    op = pallas_attention.ragged_attention_op(SCALE, window, soft_cap)
    run = torch.compile(op, backend="tpu", dynamic=False, fullgraph=True) if compiled else op
    out = run(query, cache, meta["block_tables"], meta["kv_lens"], meta["cu_q_lens"], meta["num_seqs"])
    return out.float().cpu(), real


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (3, None), (None, 2.0)],
                         ids=["causal", "sliding_window", "soft_cap"])
def test_kernel_matches_the_torch_op_oracle(dtype, window, soft_cap):
    out, real = _kernel(dtype, window, soft_cap)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out[:real], _oracle(dtype, window, soft_cap), **tol)
    assert (out[real:] == 0).all()  # padding tokens: zeros, not the interpreter's NaN or stale rows


def test_kernel_walks_several_head_blocks():
    # 16 interleaved K/V heads in float32 tile as 2 blocks of 8: the kernel prefetches across them.
    out, real = _kernel(torch.float32, None, None, q_heads=16, kv_heads=8)
    torch.testing.assert_close(out[:real], _oracle(torch.float32, None, None, q_heads=16, kv_heads=8),
                               atol=2e-5, rtol=2e-5)


def test_kernel_runs_inside_the_compiled_step():
    out, real = _kernel(torch.float32, None, None, compiled=True)
    torch.testing.assert_close(out[:real], _oracle(torch.float32, None, None), atol=2e-5, rtol=2e-5)


def test_metadata_gives_the_kernel_fixed_shape_int32_arrays():
    _, _, meta, _ = _step("cpu", torch.float32)
    assert meta["kv_lens"].tolist() == [6, 6, 9, 0]
    assert meta["cu_q_lens"].tolist() == [0, 1, 7, 10, 10]  # padding requests own no tokens
    assert meta["num_seqs"].tolist() == [3]
    assert {meta[k].dtype for k in ("kv_lens", "cu_q_lens", "num_seqs")} == {torch.int32}
    assert meta["kv_lens"].shape == (MAX_REQS,) and meta["cu_q_lens"].shape == (MAX_REQS + 1,)


def test_kernel_is_used_on_tpu_or_when_asked_and_falls_back_with_a_reason(caplog):
    args = dict(num_heads=Q_HEADS, num_kv_heads=KV_HEADS, dtype=torch.bfloat16, scale=SCALE, sliding_window=None,
                soft_cap=None)
    if runtime_device.platform() != "tpu":
        assert pallas_attention.layer_op(head_size=HEAD, **args) is None  # the chunked op by default
    with config.override(vllm_pallas_attention=True):
        assert pallas_attention.layer_op(head_size=HEAD, **args) is pallas_attention.ragged_attention_op(
            SCALE, None, None)
        with caplog.at_level(logging.WARNING):
            assert pallas_attention.layer_op(head_size=64, **args) is None
    assert "head size 64 is not a multiple of 128" in caplog.text


@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,dtype,reason", [
    (4, 2, 128, torch.float32, None),
    (8, 8, 256, torch.bfloat16, None),
    (4, 2, 80, torch.bfloat16, "head size 80"),
    (4, 2, 128, torch.float16, "float16"),
    (6, 3, 128, torch.float32, "can not be XLA fully tiled"),  # 6 combined K/V heads
])
def test_unsupported_configurations_are_named(num_heads, num_kv_heads, head_size, dtype, reason):
    found = pallas_attention.unsupported_reason(num_heads, num_kv_heads, head_size, dtype)
    assert found is None if reason is None else reason in found


@pytest.mark.slow
def test_vllm_engine_generates_through_the_kernel(tmp_path, monkeypatch, capfd):
    """vLLM's engine with the kernel asked for (interpreted here) and a head size it takes: greedy tokens
    equal transformers' in float32, also on prefix-cache hits."""
    vllm = pytest.importorskip("vllm", reason="the vLLM extra is not installed (pip install -e '.[vllm]')")
    import tiny_models

    monkeypatch.setitem(tiny_models.COMMON, "head_dim", HEAD)
    monkeypatch.setenv("TORCHTPU_VLLM_PALLAS_ATTENTION", "1")  # the engine's process reads it at import
    path = tiny_models.write_model(tmp_path, "llama")
    prompts = ["the cat sat on the mat", "a dog ran", "the big red car and the small blue bird sat under the old tree"]
    expected = tiny_models.transformers_greedy(path, prompts, 6)
    llm = vllm.LLM(path, dtype="float32", max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4,
                   kv_cache_memory_bytes=8 << 20, enable_prefix_caching=True, seed=0)
    try:
        for _ in range(2):  # the second time the prompts hit the prefix cache
            outs = llm.generate(prompts, vllm.SamplingParams(max_tokens=6, temperature=0))
            assert [list(o.outputs[0].token_ids) for o in outs] == expected
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert "runs JAX's ragged paged-attention Pallas kernel" in "".join(capfd.readouterr())
