"""The Llama benchmark's model, data and optimizer settings, shared by every peer.

Imports only torch and transformers, so that PyTorch/XLA's own virtual
environment (bench/ptxla_peer.py) can build exactly the same model.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {
    "10m": dict(vocab_size=16000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=4),
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                 num_attention_heads=12, num_key_value_heads=4),
}
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1
BATCH, SEQUENCE = 4, 128


def make_model(size: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(**SIZES[size], max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def make_batch(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab_size, (BATCH, SEQUENCE), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def make_optimizer(model, **kwargs):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kwargs)
