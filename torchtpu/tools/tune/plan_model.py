"""The model a plan is made for: sizes read from a Hugging Face config, a cached HF model, or a built-in name.

Only the shapes matter to the planner: layer count, widths, heads, experts and vocabulary.  Parameter counts
and FLOPs per token follow from them (``params``, ``active_params``, ``flops_per_token``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's width (SwiGLU: gate, up and down projections)
    vocab: int
    experts: int = 0  # routed experts per MoE layer; 0 for a dense model
    active_experts: int = 0  # experts each token is routed to
    moe_intermediate: int = 0  # one expert's MLP width
    shared_experts: int = 0  # experts every token goes through (DeepSeek-style), width moe_intermediate
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    tied_embeddings: bool = False

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    # -- parameters, by where they live (the planner shards dense and expert parameters differently)
    def attention_params(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v + 2 * self.hidden  # plus the two norms of the block

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def expert_params(self) -> int:
        """One routed expert."""
        return 3 * self.hidden * self.moe_intermediate

    def moe_layer_dense_params(self) -> int:
        """The replicated-like part of an MoE layer: router and shared experts."""
        return self.hidden * self.experts + self.shared_experts * self.expert_params()

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    def dense_params(self) -> int:
        """Everything except the routed experts."""
        return (self.layers * self.attention_params() + self.dense_layers_count() * self.dense_mlp_params()
                + self.moe_layers * self.moe_layer_dense_params() + self.embedding_params())

    def dense_layers_count(self) -> int:
        return self.dense_layers if self.is_moe else self.layers

    def routed_expert_params(self) -> int:
        return self.moe_layers * self.experts * self.expert_params()

    def params(self) -> int:
        return self.dense_params() + self.routed_expert_params()

    def active_params(self) -> int:
        """Parameters one token uses: the routed experts count only ``active_experts`` times."""
        return self.dense_params() + self.moe_layers * self.active_experts * self.expert_params()

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token as TorchTitan and PaLM count them for MFU: 6 per active non-embedding
        parameter (forward 2, backward 4) plus the attention scores, 12 * layers * heads * head_dim * seq."""
        matmul_params = self.active_params() - self.vocab * self.hidden * (0 if self.tied_embeddings else 1)
        matmul_params -= self.hidden  # the final norm
        return 6 * matmul_params + 12 * self.layers * self.heads * self.head_dim * seq


BUILTIN = {
    # huggingface.co/Qwen/Qwen3-235B-A22B (config.json): 94 layers, 64 query / 4 kv heads, 128 experts, 8 active
    "qwen3-235b-a22b": ModelSpec("qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
                                 intermediate=12288, vocab=151936, experts=128, active_experts=8,
                                 moe_intermediate=1536),
    # huggingface.co/Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                               intermediate=6144, vocab=151936, experts=128, active_experts=8, moe_intermediate=768),
    # huggingface.co/meta-llama/Meta-Llama-3-8B
    "llama3-8b": ModelSpec("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                           intermediate=14336, vocab=128256),
    # a small dense model whose numbers can be checked by hand
    "tiny": ModelSpec("tiny", layers=4, hidden=256, heads=8, kv_heads=4, head_dim=32, intermediate=768, vocab=4096,
                      tied_embeddings=True),
}

# Hugging Face config keys, in the order they are tried, for each field.
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab": ("vocab_size",),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "active_experts": ("num_experts_per_tok", "moe_topk", "top_k"),
    "moe_intermediate": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts",),
    "dense_layers": ("first_k_dense_replace",),
}
_REQUIRED = ("layers", "hidden", "heads", "vocab")


class ModelConfigError(ValueError):
    """A model description the planner cannot use, with what is missing."""


def from_hf_config(config: dict, name: str = "model") -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` dictionary (``text_config`` is used when present)."""
    config = config.get("text_config", config)
    found = {field: next((config[k] for k in keys if config.get(k) is not None), None)
             for field, keys in _HF_KEYS.items()}
    missing = [f"{field} ({' / '.join(_HF_KEYS[field])})" for field in _REQUIRED if found[field] is None]
    experts = int(found["experts"] or 0)
    if experts and found["moe_intermediate"] is None and found["intermediate"] is None:
        missing.append("moe_intermediate (moe_intermediate_size)")
    if not experts and found["intermediate"] is None:
        missing.append("intermediate (intermediate_size)")
    if missing:
        raise ModelConfigError(f"model config {name!r} lacks: {', '.join(missing)}")
    heads, hidden = int(found["heads"]), int(found["hidden"])
    intermediate = int(found["intermediate"] or found["moe_intermediate"])
    return ModelSpec(
        name=name, layers=int(found["layers"]), hidden=hidden, heads=heads,
        kv_heads=int(found["kv_heads"] or heads), head_dim=int(found["head_dim"] or hidden // heads),
        intermediate=intermediate, vocab=int(found["vocab"]), experts=experts,
        active_experts=int(found["active_experts"] or (1 if experts else 0)),
        moe_intermediate=int(found["moe_intermediate"] or (intermediate if experts else 0)),
        shared_experts=int(found["shared_experts"] or 0), dense_layers=int(found["dense_layers"] or 0),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)))


def _cached_hf_config(model_id: str) -> pathlib.Path | None:
    """config.json of ``model_id`` in the local Hugging Face cache (huggingface_hub's lookup,
    which honours HF_HOME and HF_HUB_CACHE); never the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # the hub client comes with transformers; without it there is no cache to read
        return None
    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except HFValidationError:  # not a repository id at all
        return None
    return pathlib.Path(found) if isinstance(found, str) else None


def load(model: str) -> ModelSpec:
    """A built-in name, a path to a config.json (or its folder), or a Hugging Face id found in the local cache."""
    if model.lower() in BUILTIN:
        return BUILTIN[model.lower()]
    path = pathlib.Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        path = _cached_hf_config(model) or path
    if not path.is_file():
        raise ModelConfigError(f"unknown model {model!r}: not a built-in ({', '.join(BUILTIN)}), not a config.json "
                               "path, and not in the local Hugging Face cache (the planner never downloads)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelConfigError(f"{path} is not valid JSON: {error}") from None
    return from_hf_config(config, name=model)
