"""scaled_dot_product_attention on tpu: the fused ops (and the Pallas flash kernel) against CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracle import check, check_grad

import torchtpu
from torchtpu.runtime import metrics


def qkv(tq=8, tk=10, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, tq, d, generator=g), torch.randn(2, 3, tk, d, generator=g), torch.randn(2, 3, tk, d, generator=g)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3}], ids=["plain", "causal", "scale"])
def test_sdpa_values_and_gradients(kwargs):
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), *qkv())


def test_sdpa_runs_as_one_fused_op_each_way():
    q, k, v = (t.to("tpu").requires_grad_() for t in qkv(tq=5, tk=7, d=4))  # shapes no other test uses
    metrics.compiles.clear()
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    compiled = set(metrics.compiles)
    assert {"torchtpu.sdpa_forward.default", "torchtpu.sdpa_backward.default"} <= compiled
    assert not any("bmm" in op or "softmax" in op for op in compiled)


@pytest.mark.parametrize("mask", ["bool", "float", "broadcast-bool"])
def test_sdpa_masks_and_bias_gradient(mask):
    q, k, v = qkv()
    g = torch.Generator().manual_seed(3)
    if mask == "bool":
        m = torch.rand(8, 10, generator=g) > 0.3
    elif mask == "float":
        m = torch.randn(3, 8, 10, generator=g)
    else:
        m = torch.rand(2, 1, 1, 10, generator=g) > 0.2
    if m.dtype == torch.bool:
        check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m,
                   grad_args=(0, 1, 2))
    else:
        check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)


def test_fully_masked_row_gives_zeros_like_cpu():
    q, k, v = qkv()
    mask = torch.ones(8, 10, dtype=torch.bool)
    mask[2] = False
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)


def test_gqa_and_dropout_take_the_math_path():
    q, k, v = qkv()
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True), q, k, v)
    x = torch.ones(1, 1, 16, 8, device="tpu")
    torch.manual_seed(0)
    a = F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    torch.manual_seed(0)
    b = F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    assert torch.equal(a.cpu(), b.cpu())


def test_bfloat16_attention_close_to_cpu():
    q, k, v = (t.bfloat16() for t in qkv())
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_flash_kernel_matches_cpu(monkeypatch, causal):
    """The Pallas kernel, run in the interpreter on the CPU backend (it is the default on TPU)."""
    monkeypatch.setattr(torchtpu.config.current, "flash_attention", True)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 256, 32, generator=g) for _ in range(3))
    if not causal:
        k, v = k[:, :, :128], v[:, :, :128]
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v)


def test_compiled_attention_is_one_node():
    q, k, v = (t.to("tpu") for t in qkv())
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), backend="tpu")
    torch.testing.assert_close(compiled(q, k, v).cpu(),
                               F.scaled_dot_product_attention(*qkv(), is_causal=True), rtol=1e-5, atol=1e-6)


# ---- flex attention -------------------------------------------------------------------------------


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _distance_bias(score, b, h, q_idx, kv_idx):
    return score - 0.05 * (q_idx - kv_idx) + 0.1 * h


def _dense_reference(q, k, v, score_mod, mask_mod):
    """Flex attention's definition, densely on CPU with autograd: every score modified, then masked."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    b, h, qi, ki = (torch.arange(n).view([-1 if d == i else 1 for d in range(4)])
                    for i, n in enumerate((q.shape[0], q.shape[1], q.shape[2], k.shape[2])))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, qi, ki), float("-inf"))
    return scores.softmax(-1) @ v


def _documents(lengths, device="cpu"):
    """A document mask: causal within each document of the packed sequence (ids held on ``device``)."""
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)

    def mask(b, h, q_idx, kv_idx):
        return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

    return mask


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", ["causal", "score_mod+causal", "documents", "gqa"])
def test_flex_attention_values_and_gradients_match_the_dense_definition(case, compiled):
    """Eager runs PyTorch's composite implementation on tpu; compiled, the op and its backward are
    lowered into the graph's program (graph/flex_attention.py), with no eager fallback."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    heads_kv = 2 if case == "gqa" else 4
    q = torch.randn(2, 4, 128, 16)
    k, v = torch.randn(2, heads_kv, 128, 16), torch.randn(2, heads_kv, 128, 16)
    score_mod = _distance_bias if case == "score_mod+causal" else None
    mask_mod = _documents([40, 60, 28]) if case == "documents" else _causal
    expected_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _dense_reference(*expected_leaves, score_mod, mask_mod)
    expected.square().sum().backward()

    leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    if case == "documents":
        mask_mod = _documents([40, 60, 28], "tpu")
    block_mask = create_block_mask(mask_mod, None, None, 128, 128, device="tpu")
    attend = torch.compile(flex_attention, backend="tpu", fullgraph=True) if compiled else flex_attention
    before = metrics.graph_fallbacks.copy()
    out = attend(*leaves, score_mod=score_mod, block_mask=block_mask, enable_gqa=case == "gqa")
    out.square().sum().backward()
    assert metrics.graph_fallbacks == before, "no graph ran op by op"
    torch.testing.assert_close(out.cpu(), expected.detach(), atol=2e-5, rtol=1e-4)
    for leaf, reference in zip(leaves, expected_leaves):
        torch.testing.assert_close(leaf.grad.cpu(), reference.grad, atol=1e-4, rtol=1e-4)
