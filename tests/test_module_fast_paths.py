"""torch.nn's fused fast paths on tpu: eval mode under ``no_grad``, as on CUDA.

``TransformerEncoderLayer`` and ``MultiheadAttention`` then call one fused op
each (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``,
``_masked_softmax``), which torchtpu runs as compositions (ops/fused_nn.py).
The CPU takes the same fast paths on the same module: that is the oracle.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from oracle import assert_same, to_device

import torchtpu
from torchtpu.dispatch import fallback

aten = torch.ops.aten
PADDING = torch.tensor([[False] * 5, [False, False, False, True, True]])  # left-aligned, as the nested path wants


def inference(module, *args, **kwargs):
    """(tpu result, CPU result) of the module in eval mode under no_grad."""
    module = module.eval()
    on_tpu = copy.deepcopy(module).to("tpu")
    with torch.no_grad():
        return on_tpu(*to_device(args, "tpu"), **to_device(kwargs, "tpu")), module(*args, **kwargs)


def tokens(seed=0, shape=(2, 5, 16)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_encoder_layer_fast_path(activation, norm_first, masks):
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation=activation, norm_first=norm_first)
    kwargs = {}
    if masks in ("padding", "both"):
        kwargs["src_key_padding_mask"] = PADDING
    if masks in ("causal", "both"):
        kwargs["src_mask"] = nn.Transformer.generate_square_subsequent_mask(5)
    actual, expected = inference(layer, tokens(), **kwargs)
    assert_same(actual, expected, atol=1e-5, rtol=1e-5)


def test_the_encoder_layer_runs_the_fused_op():
    """Not PyTorch's slow path: the fused op is what ran (and was decomposed) on tpu."""
    fallback.DECOMPOSED.discard(aten._transformer_encoder_layer_fwd.default)
    inference(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), tokens())
    assert aten._transformer_encoder_layer_fwd.default in fallback.DECOMPOSED


@pytest.mark.parametrize("padding", ["left-aligned", "not-left-aligned"])
@pytest.mark.parametrize("norm", [False, True])
def test_encoder_with_nested_tensors_gives_cpus_values(padding, norm):
    """CPU packs the unpadded tokens into a nested tensor (when the padding is left-aligned) and
    pads the result with zeros; tpu runs the same layers dense with the padding mask and zeroes
    the same positions: equal everywhere, padded positions included."""
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if norm else None, enable_nested_tensor=True)
    if norm:
        nn.init.normal_(encoder.norm.bias)  # zeros would hide a missing norm at padded positions
    mask = PADDING if padding == "left-aligned" else PADDING.flip(1)
    actual, expected = inference(encoder, tokens(), src_key_padding_mask=mask)
    assert_same(actual, expected, atol=1e-5, rtol=1e-5)


def test_transformer_whose_decoder_reads_the_padded_encoder_output():
    """nn.Transformer with a source padding mask but no memory mask: the decoder attends to the
    encoder's padded positions, so they must hold CPU's values."""
    model = nn.Transformer(16, 4, 1, 1, 32, dropout=0.0, batch_first=True)
    actual, expected = inference(model, tokens(0), tokens(1, (2, 4, 16)), src_key_padding_mask=PADDING)
    assert_same(actual, expected, atol=1e-5, rtol=1e-5)


def test_the_encoder_keeps_its_nested_tensor_setting():
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2).eval().to("tpu")
    with torch.no_grad():
        encoder(tokens().to("tpu"), src_key_padding_mask=PADDING.to("tpu"))
    assert encoder.use_nested_tensor


def test_decoder_layer_fast_path_self_attention():
    layer = nn.TransformerDecoderLayer(16, 4, 32, batch_first=True)
    actual, expected = inference(layer, tokens(0), tokens(1, (2, 7, 16)),
                                 tgt_mask=nn.Transformer.generate_square_subsequent_mask(5))
    assert_same(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights, average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("masks", ["none", "padding", "attention", "both"])
def test_multihead_attention_fast_path(need_weights, average, masks):
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    x = tokens()
    kwargs = {"need_weights": need_weights, "average_attn_weights": average}
    if masks in ("padding", "both"):
        kwargs["key_padding_mask"] = PADDING
    if masks in ("attention", "both"):
        kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(5) == float("-inf")
    (out, weights), (expected_out, expected_weights) = _self_attention(attention, x, **kwargs)
    assert_same(out, expected_out, atol=1e-5, rtol=1e-5)
    if expected_weights is None:
        assert weights is None
    else:
        assert_same(weights, expected_weights, atol=1e-6, rtol=1e-5)


def _self_attention(attention, x, **kwargs):
    """Self-attention (query, key and value the same tensor: the fast path's condition)."""
    attention = attention.eval()
    on_tpu, xt = copy.deepcopy(attention).to("tpu"), x.to("tpu")
    kwargs_tpu = to_device(kwargs, "tpu")
    with torch.no_grad():
        return on_tpu(xt, xt, xt, **kwargs_tpu), attention(x, x, x, **kwargs)


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
def test_masked_softmax_like_cpu(mask_type):
    """True is left out; a row with every key left out gives zeros."""
    scores = torch.randn(2, 3, 4, 4)
    masks = {None: torch.rand(2, 3, 4, 4) > 0.6, 0: torch.rand(4, 4) > 0.6, 1: torch.rand(2, 4) > 0.6,
             2: torch.rand(2, 3, 4, 4) > 0.6}
    mask = masks[mask_type]
    if mask_type == 1:
        mask[0] = True  # every key of one batch element left out
    expected = aten._masked_softmax(scores, mask, 3, mask_type)
    actual = aten._masked_softmax(scores.to("tpu"), mask.to("tpu"), 3, mask_type)
    assert_same(actual, expected, atol=1e-6, rtol=1e-5)
