"""Block-sparse flex attention on tpu (graph/flex_attention.py) against a dense CPU definition.

The tpu lowering computes only the blocks the block mask lists; the
reference computes every score on CPU with autograd and masks by the same
rule: a score counts when its block is listed fully, or listed partly and
the mask modification says so."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

from torchtpu.runtime import metrics


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles flex_attention for its own shapes; past eight, Dynamo stops recompiling."""
    torch._dynamo.reset()
    yield


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _window(b, h, q_idx, kv_idx):  # sliding window of 40 positions: most blocks empty
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 40)


def _distance_bias(score, b, h, q_idx, kv_idx):
    return score - 0.05 * (q_idx - kv_idx) + 0.1 * h


def _documents(lengths, device="cpu"):
    """A document mask: causal within each document of the packed sequence (ids held on ``device``)."""
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)

    def mask(b, h, q_idx, kv_idx):
        return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

    return mask


def _expand(blocks: torch.Tensor, q_block: int, kv_block: int, q_len: int, kv_len: int) -> torch.Tensor:
    """A [B, H, q blocks, kv blocks] block-level table -> [B, H, q_len, kv_len]."""
    return blocks.repeat_interleave(q_block, -2).repeat_interleave(kv_block, -1)[..., :q_len, :kv_len]


def _visibility(block_mask: BlockMask, mask_mod, q_len: int, kv_len: int) -> torch.Tensor:
    """The scores flex attention counts under ``block_mask``: full blocks, and partial blocks where ``mask_mod``."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    partial = _block_table(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = _block_table(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    index = [torch.arange(n).view([-1 if d == i else 1 for d in range(4)])
             for i, n in enumerate((partial.shape[0], partial.shape[1], q_len, kv_len))]
    inside = mask_mod(*index) if mask_mod is not None else torch.ones((), dtype=torch.bool)
    return (_expand(full, q_block, kv_block, q_len, kv_len)
            | (_expand(partial, q_block, kv_block, q_len, kv_len) & inside))


def _block_table(counts, indices) -> torch.Tensor:
    """Block lists (counts [B, H, n], indices [B, H, n, m]) -> a boolean [B, H, n, kv blocks] table."""
    table = torch.zeros(*indices.shape[:-1], indices.shape[-1], dtype=torch.bool)
    if counts is None:
        return table
    listed = torch.arange(indices.shape[-1]) < counts.cpu()[..., None]
    return table.scatter(-1, indices.cpu().long(), listed)


def _reference(q, k, v, visible, score_mod=None):
    """Flex attention's definition, densely on CPU with autograd: (out, natural log-sum-exp of the scores)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    b, h, qi, ki = (torch.arange(n).view([-1 if d == i else 1 for d in range(4)])
                    for i, n in enumerate((q.shape[0], q.shape[1], q.shape[2], k.shape[2])))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = scores.logsumexp(-1)
    weights = torch.where(visible.any(-1, keepdim=True), (scores - lse.nan_to_num(neginf=0)[..., None]).exp(), 0.0)
    return weights @ v, lse


@pytest.fixture(autouse=True, params=["eager", "compiled"])
def _mode(request, monkeypatch):
    """Every test twice: flex attention called eagerly (it traces itself and, on tpu, runs torchtpu's
    backend instead of its dense composite) and inside ``torch.compile(backend="tpu")``."""
    monkeypatch.setattr(sys.modules[__name__], "MODE", request.param)


MODE = "compiled"


def _run(q, k, v, block_mask, score_mod=None, return_lse=False, enable_gqa=False):
    attend = torch.compile(flex_attention, backend="tpu", fullgraph=True) if MODE == "compiled" else flex_attention
    before = metrics.graph_fallbacks.copy()
    result = attend(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa,
                    return_aux=AuxRequest(lse=True) if return_lse else None)
    assert metrics.graph_fallbacks == before, "no graph ran op by op"
    return (result[0], result[1].lse) if return_lse else result


def _leaves(*tensors, device="cpu"):
    return [t.detach().to(device).requires_grad_() for t in tensors]


def _check_against_reference(q, k, v, mask_mod, block_mask, score_mod=None, tpu_score_mod=None, atol=2e-5,
                             enable_gqa=False):
    """Output, log-sum-exp and the gradients of all three inputs (through both) on tpu against CPU."""
    visible = _visibility(block_mask, mask_mod, q.shape[2], k.shape[2])
    ref_leaves = _leaves(q, k, v)
    ref_out, ref_lse = _reference(*ref_leaves, visible, score_mod)
    (ref_out.square().sum() + ref_lse.nan_to_num(neginf=0).sin().sum()).backward()

    leaves = _leaves(q, k, v, device="tpu")
    block_mask = block_mask.to("tpu")
    out, lse = _run(*leaves, block_mask, tpu_score_mod or score_mod, return_lse=True, enable_gqa=enable_gqa)
    (out.square().sum() + lse.nan_to_num(neginf=0).sin().sum()).backward()
    torch.testing.assert_close(out.cpu(), ref_out.detach(), atol=atol, rtol=1e-4)
    torch.testing.assert_close(lse.cpu(), ref_lse.detach(), atol=atol, rtol=1e-4)
    for leaf, reference in zip(leaves, ref_leaves):
        torch.testing.assert_close(leaf.grad.cpu(), reference.grad, atol=5 * atol, rtol=1e-4)


def _qkv(batch=2, heads=4, kv_heads=4, q_len=96, kv_len=96, dim=16, seed=0):
    torch.manual_seed(seed)
    return (torch.randn(batch, heads, q_len, dim), torch.randn(batch, kv_heads, kv_len, dim),
            torch.randn(batch, kv_heads, kv_len, dim))


@pytest.mark.parametrize("mask_mod", [_causal, _window], ids=["causal", "window"])
@pytest.mark.parametrize("lengths", [(96, 96), (100, 100), (70, 130)], ids=["even", "ragged", "cross"])
def test_block_sparse_values_and_gradients_match_the_dense_definition(mask_mod, lengths):
    """Blocks of 32: several per sequence, ragged last blocks, query and key lengths that differ."""
    q_len, kv_len = lengths
    q, k, v = _qkv(q_len=q_len, kv_len=kv_len)
    block_mask = create_block_mask(mask_mod, None, None, q_len, kv_len, device="cpu", BLOCK_SIZE=32)
    _check_against_reference(q, k, v, mask_mod, block_mask)


@pytest.mark.parametrize("case", ["score_mod+causal", "documents"])
def test_a_score_modification_and_a_mask_that_captures_a_tensor(case):
    """A score_mod of the positions and heads; a document mask over packed sequences, whose document
    ids the mask captures (a tensor on tpu: a buffer of the mask's subgraph). Blocks of 128."""
    q, k, v = _qkv(q_len=128, kv_len=128)
    mask_mod, tpu_mask_mod = ((_documents([40, 60, 28]), _documents([40, 60, 28], "tpu")) if case == "documents"
                              else (_causal, _causal))
    score_mod = _distance_bias if case == "score_mod+causal" else None
    block_mask = create_block_mask(tpu_mask_mod, None, None, 128, 128, device="tpu")
    _check_against_reference(q, k, v, mask_mod, block_mask, score_mod)


def test_blocks_the_mask_leaves_out_are_not_computed():
    """A block mask listing fewer blocks than its mask modification allows: PyTorch's kernels compute
    the listed blocks only, and so does tpu (a dense evaluation of the mask would see every key)."""
    q, k, v = _qkv(batch=1, heads=2, kv_heads=2, q_len=64, kv_len=128)
    # Each of the 2 query blocks sees key block 0 fully and key block 2 partly (through the causal-free
    # mask below, which allows everything); blocks 1 and 3 are not listed.
    full_counts = torch.ones(1, 1, 2, dtype=torch.int32)
    full_indices = torch.tensor([[[[0, 1, 2, 3], [0, 1, 2, 3]]]], dtype=torch.int32)
    counts = torch.ones(1, 1, 2, dtype=torch.int32)
    indices = torch.tensor([[[[2, 0, 1, 3], [2, 0, 1, 3]]]], dtype=torch.int32)

    def everything(b, h, q_idx, kv_idx):
        return q_idx >= 0

    block_mask = BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices, BLOCK_SIZE=32,
                                          mask_mod=everything, seq_lengths=(64, 128))
    visible = _visibility(block_mask, everything, 64, 128)
    assert visible[0, 0, 0].sum() == 64, "blocks 0 and 2 only"
    _check_against_reference(q, k, v, everything, block_mask)


def test_score_modification_with_a_learned_bias_gets_its_gradient():
    """A score_mod that captures a tensor requiring grad (a relative-position bias per head)."""
    q, k, v = _qkv(q_len=64, kv_len=64)
    torch.manual_seed(1)
    bias = torch.randn(4, 64)
    block_mask = create_block_mask(_causal, None, None, 64, 64, device="cpu", BLOCK_SIZE=32)

    def biased(table):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, (q_idx - kv_idx).abs()]
        return score_mod

    ref_bias, tpu_bias = _leaves(bias)[0], _leaves(bias, device="tpu")[0]
    visible = _visibility(block_mask, _causal, 64, 64)
    ref_leaves = _leaves(q, k, v)
    ref_out, _ = _reference(*ref_leaves, visible, biased(ref_bias))
    ref_out.square().sum().backward()
    leaves = _leaves(q, k, v, device="tpu")
    out = _run(*leaves, block_mask.to("tpu"), biased(tpu_bias))
    out.square().sum().backward()
    torch.testing.assert_close(out.cpu(), ref_out.detach(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tpu_bias.grad.cpu(), ref_bias.grad, atol=1e-4, rtol=1e-4)
    for leaf, reference in zip(leaves, ref_leaves):
        torch.testing.assert_close(leaf.grad.cpu(), reference.grad, atol=1e-4, rtol=1e-4)


def test_per_head_masks_and_grouped_query_heads():
    """A block mask with its own batch and head dimensions, and 4 query heads sharing 2 key heads."""
    q, k, v = _qkv(batch=2, heads=4, kv_heads=2, q_len=64, kv_len=64)

    def per_head(b, h, q_idx, kv_idx):  # head h sees a window of 8 * (h + 1) + 16 * b positions
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 8 * (h + 1) + 16 * b)

    block_mask = create_block_mask(per_head, 2, 4, 64, 64, device="cpu", BLOCK_SIZE=16)
    _check_against_reference(q, k, v, per_head, block_mask, enable_gqa=True)


def test_a_query_that_sees_nothing_gets_zeros_and_minus_infinity():
    q, k, v = _qkv(batch=1, heads=2, kv_heads=2, q_len=64, kv_len=64)

    def late(b, h, q_idx, kv_idx):  # queries before 32 see no key
        return (q_idx >= 32) & (kv_idx <= q_idx - 32)

    block_mask = create_block_mask(late, None, None, 64, 64, device="cpu", BLOCK_SIZE=16)
    out, lse = _run(*(t.to("tpu") for t in (q, k, v)), block_mask.to("tpu"), return_lse=True)
    assert torch.equal(out[:, :, :32].cpu(), torch.zeros(1, 2, 32, 16))
    assert torch.isneginf(lse[:, :, :32].cpu()).all()
    _check_against_reference(q, k, v, late, block_mask)


def test_bfloat16_inputs():
    q, k, v = (t.bfloat16() for t in _qkv(q_len=64, kv_len=64))
    block_mask = create_block_mask(_causal, None, None, 64, 64, device="cpu", BLOCK_SIZE=32)
    visible = _visibility(block_mask, _causal, 64, 64)
    expected, _ = _reference(q.float(), k.float(), v.float(), visible)
    out = _run(*(t.to("tpu") for t in (q, k, v)), block_mask.to("tpu"))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-2, rtol=2e-2)
