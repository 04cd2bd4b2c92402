"""The Hugging Face architecture matrix: one entry per architecture.

Adding an architecture means adding one ``Arch`` to ``ARCHITECTURES``: its
``transformers`` model type, the task (which Auto class builds it and what its
inputs look like), and a tiny config.  Every model is built from its config
with random weights; nothing is downloaded.

``xfail`` maps a cell ("forward", "backward", "generate-dynamic",
"generate-static", "bf16") to the reason it is known to fail; ``slow`` lists
the cells that the CI run leaves to ``python -m tests.hf.report``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CELLS = ("forward", "backward", "generate-dynamic", "generate-static", "bf16")
GENERATE_CELLS = ("generate-dynamic", "generate-static")

# Shared by every decoder-style config, so architectures reuse each other's
# compiled programs (same hidden size, heads and sequence lengths).
VOCAB = 128
TOKENS = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA_LIKE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,  # peaked logits: greedy decoding has no near-ties
    **TOKENS,
)
BERT_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
BART_LIKE = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    init_std=0.1,
    **TOKENS,
)


@dataclass(frozen=True)
class Arch:
    name: str  # the row's label
    model_type: str  # transformers' model_type, for AutoConfig.for_model
    task: str  # key of tests.hf.harness.TASKS
    config: dict
    xfail: dict = field(default_factory=dict)  # cell -> reason
    # Cells deselected in CI (tests/hf/conftest.py): decoding compiles a new
    # program per op per sequence length, about a minute per model on CI's
    # two cores, so CI decodes with a few representative models only.
    slow: tuple = GENERATE_CELLS

    @property
    def generative(self) -> bool:
        return self.task in ("causal-lm", "seq2seq-lm", "speech-seq2seq")

    @property
    def cells(self) -> tuple:
        return CELLS if self.generative else tuple(c for c in CELLS if c not in GENERATE_CELLS)


def llama_like(name, model_type=None, slow=GENERATE_CELLS, **overrides):
    return Arch(name, model_type or name, "causal-lm", {**LLAMA_LIKE, **overrides}, slow=slow)


ARCHITECTURES = [
    llama_like("llama", slow=()),  # CI decodes with llama only
    llama_like("mistral", sliding_window=None),
    llama_like("qwen2"),
    llama_like("qwen3", head_dim=8),
    llama_like(
        "qwen3_moe",
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
    ),
    llama_like("mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    llama_like("gemma2", head_dim=8, query_pre_attn_scalar=8, sliding_window=16),
    llama_like("gemma3", "gemma3_text", head_dim=8, query_pre_attn_scalar=8, sliding_window=16),
    llama_like("phi3", pad_token_id=0),
    Arch(
        "gpt2",
        "gpt2",
        "causal-lm",
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=0.1, **TOKENS),
    ),
    Arch(
        "gpt_neox",
        "gpt_neox",
        "causal-lm",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            initializer_range=0.1,
            **TOKENS,
        ),
    ),
    Arch(
        "opt",
        "opt",
        "causal-lm",
        dict(
            hidden_size=32,
            ffn_dim=64,
            word_embed_proj_dim=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            init_std=0.1,
            **TOKENS,
        ),
    ),
    Arch("bert", "bert", "masked-lm", dict(
        **BERT_LIKE,
        max_position_embeddings=64,
        vocab_size=VOCAB,
    )),
    Arch("roberta", "roberta", "masked-lm", dict(
        **BERT_LIKE,
        max_position_embeddings=64,
        vocab_size=VOCAB,
        pad_token_id=1,
    )),
    Arch("t5", "t5", "seq2seq-lm", dict(
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        initializer_factor=1.0,
        **TOKENS,
    )),
    Arch("bart", "bart", "seq2seq-lm", dict(
        **BART_LIKE, max_position_embeddings=128, decoder_start_token_id=2
    )),
    Arch("vit", "vit", "image-classification", dict(
        **BERT_LIKE,
        image_size=32,
        patch_size=8,
        num_labels=10,
    )),
    Arch("whisper", "whisper", "speech-seq2seq", dict(
        **BART_LIKE,
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=64,
        decoder_start_token_id=3,
    )),
]

BY_NAME = {arch.name: arch for arch in ARCHITECTURES}
