"""``torchtpu demo``: train a small character-level GPT on the tpu device.

The model, the optimizer and the training loop are ordinary PyTorch; the only
tpu-specific line is ``device="tpu"``.  Pass ``device="cpu"`` to run the very
same code on the host for comparison.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS = pathlib.Path(__file__).parent / "data" / "tiny_corpus.txt"


@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = 0  # set from the text
    block_size: int = 64  # characters of context
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.1
    tie_weights: bool = True  # share the token embedding with the output head


@dataclasses.dataclass
class TrainConfig:
    steps: int = 150
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    log_every: int = 10
    device: str = "tpu"
    seed: int = 0
    sample_chars: int = 200
    temperature: float = 0.8
    compile: bool = False  # torch.compile the forward and backward (backend "tpu" on tpu, inductor on cpu)


# ---- model ---------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        batch, time_, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        # (batch, time, channels) -> (batch, heads, time, head size)
        q, k, v = (t.view(batch, time_, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, time_, channels)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.position_embedding = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(_init_weights)
        self.tie_weights()

    def tie_weights(self):
        """Share the embedding with the output head (``Module.to`` keeps it shared)."""
        if self.cfg.tie_weights:
            self.head.weight = self.token_embedding.weight

    def forward(self, idx, targets=None):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.dropout(self.token_embedding(idx) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss


def _init_weights(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


# ---- data ----------------------------------------------------------------------


class CharTokenizer:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def load_corpus(path: pathlib.Path = CORPUS) -> str:
    return path.read_text(encoding="utf-8")


def get_batch(data: torch.Tensor, cfg: ModelConfig, batch_size: int, generator: torch.Generator, device):
    """Random windows of the text, cut on the host and sent to the device in one transfer each."""
    starts = torch.randint(len(data) - cfg.block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[s : s + cfg.block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + cfg.block_size] for s in starts.tolist()])
    return x.to(device), y.to(device)


# ---- training ------------------------------------------------------------------


def train(model: GPT, data: torch.Tensor, cfg: TrainConfig, log=print) -> list[float]:
    """AdamW with gradient clipping; logs step, loss and tokens/s every ``log_every`` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    tokens_per_step = cfg.batch_size * model.cfg.block_size
    losses = []
    model.train()
    window_start, window_steps = time.perf_counter(), 0
    loss_and_grad = _loss_and_grad
    if cfg.compile:  # the optimizer stays eager: its learning rate changes every step
        loss_and_grad = torch.compile(_loss_and_grad, backend="tpu" if cfg.device.startswith("tpu") else "inductor")
    for step in range(1, cfg.steps + 1):
        lr = _learning_rate(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(data, model.cfg, cfg.batch_size, generator, cfg.device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_and_grad(model, x, y)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        window_steps += 1
        if step % cfg.log_every == 0 or step == cfg.steps or step == 1:
            value = loss.item()  # a host sync: only on logging steps
            elapsed = time.perf_counter() - window_start
            losses.append(value)
            note = " (includes compiling)" if step == 1 else ""
            log(f"step {step:4d}/{cfg.steps} | loss {value:.4f} | lr {lr:.2e} | "
                f"{window_steps * tokens_per_step / elapsed:8.0f} tokens/s{note}")
            window_start, window_steps = time.perf_counter(), 0
    return losses


def _loss_and_grad(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _, loss = model(x, y)
    loss.backward()
    return loss.detach()


def _learning_rate(step: int, cfg: TrainConfig) -> float:
    """Short linear warm-up, then cosine decay to a tenth of the peak."""
    warmup = max(1, min(20, cfg.steps // 10))
    if step <= warmup:
        return cfg.lr * step / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---- generation ----------------------------------------------------------------


@torch.no_grad()
def generate(model: GPT, context: torch.Tensor, n_chars: int, temperature: float = 0.8) -> torch.Tensor:
    """Sample ``n_chars`` tokens after ``context`` (1, block_size).

    The window keeps a fixed length, so every step runs the same shapes and
    reuses the programs compiled for the first one.
    """
    model.eval()
    sample = Sampler(temperature)
    window, produced = context, []
    for _ in range(n_chars):
        logits, _ = model(window)
        next_id = sample(logits[:, -1, :])
        produced.append(next_id)
        window = torch.cat([window[:, 1:], next_id], dim=1)
    return torch.cat(produced, dim=1)[0]


class Sampler:
    """Multinomial sampling with temperature; greedy argmax where the device lacks multinomial."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.greedy = False

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.greedy:
            try:
                return torch.multinomial(F.softmax(logits / self.temperature, dim=-1), 1)
            except NotImplementedError as error:
                print(f"(multinomial unavailable on this device, sampling greedily: {error})")
                self.greedy = True
        return logits.argmax(dim=-1, keepdim=True)


# ---- entry point ---------------------------------------------------------------


def run(train_cfg: TrainConfig | None = None, model_cfg: ModelConfig | None = None, log=print) -> str:
    """Train on the shipped text and return a generated sample."""
    train_cfg = train_cfg or TrainConfig()
    if train_cfg.device.startswith("tpu"):
        import torchtpu  # noqa: F401  registers the device (torch's autoload usually has already)
    text = load_corpus()
    tokenizer = CharTokenizer(text)
    data = tokenizer.encode(text)
    model_cfg = model_cfg or ModelConfig()
    model_cfg.vocab_size = tokenizer.vocab_size
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg).to(train_cfg.device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"training a {n_params / 1e3:.0f}K-parameter character GPT on {len(text) / 1e3:.0f} KB of text "
        f"for {train_cfg.steps} steps on device '{train_cfg.device}'")
    start = time.perf_counter()
    train(model, data, train_cfg, log)
    log(f"trained in {time.perf_counter() - start:.1f} s")
    context = torch.full((1, model_cfg.block_size), tokenizer.index["\n"], dtype=torch.long)
    torch.manual_seed(train_cfg.seed)  # seeds the tpu generator too
    ids = generate(model, context.to(train_cfg.device), train_cfg.sample_chars, train_cfg.temperature)
    sample = tokenizer.decode(ids.cpu().tolist())
    log("---- sample ----")
    log(sample)
    log("----------------")
    return sample
