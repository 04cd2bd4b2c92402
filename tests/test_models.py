"""Whole training programs run on tpu and on CPU give the same losses and gradients.

Each model is built once on CPU, copied to tpu, and trained for 20 optimizer
steps on identical data.  In float32 every step's loss must agree within a
relative 1e-4, and the final parameters must agree too.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from oracle import assert_same

STEPS = 20
LOSS_RTOL = 1e-4


def train(model, make_optimizer, batches, loss_fn, *, scheduler=None, accumulate=1, clip=None):
    optimizer = make_optimizer(model.parameters())
    sched = scheduler(optimizer) if scheduler else None
    losses = []
    for step, batch in enumerate(batches):
        loss = loss_fn(model, *batch) / accumulate
        loss.backward()
        losses.append(loss.detach())
        if (step + 1) % accumulate == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
            if sched:
                sched.step()
    return torch.stack(losses)


def compare_training(model, make_optimizer, batches, loss_fn, *, param_atol=1e-4, **kwargs):
    torch.manual_seed(0)
    device_model = copy.deepcopy(model).to("tpu")
    device_batches = [tuple(t.to("tpu") for t in b) for b in batches]
    cpu_losses = train(model, make_optimizer, batches, loss_fn, **kwargs)
    tpu_losses = train(device_model, make_optimizer, device_batches, loss_fn, **kwargs)
    torch.testing.assert_close(tpu_losses.cpu(), cpu_losses, rtol=LOSS_RTOL, atol=1e-6)
    for (name, p_cpu), p_tpu in zip(model.named_parameters(), device_model.parameters()):
        torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), rtol=1e-3, atol=param_atol, msg=name)
    return cpu_losses


def classification_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def random_batches(make_input, classes, steps=STEPS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(make_input(g), torch.randint(0, classes, (8,), generator=g)) for _ in range(steps)]


# ---- MLP and the optimizers ---------------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05),
}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_mlp_matches_cpu(name):
    batches = random_batches(lambda g: torch.randn(8, 16, generator=g), 5)
    losses = compare_training(mlp(), OPTIMIZERS[name], batches, classification_loss)
    assert losses[-1] < losses[0], "training should make progress"


def test_mlp_scheduler_clipping_and_accumulation():
    batches = random_batches(lambda g: torch.randn(8, 16, generator=g), 5, steps=2 * STEPS)
    compare_training(
        mlp(),
        OPTIMIZERS["adamw"],
        batches,
        classification_loss,
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
        accumulate=2,
        clip=0.5,
    )


def test_step_lr_with_sgd():
    batches = random_batches(lambda g: torch.randn(8, 16, generator=g), 5)
    compare_training(
        mlp(),
        OPTIMIZERS["sgd_momentum"],
        batches,
        classification_loss,
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5),
    )


# ---- CNN -------------------------------------------------------------------------------


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 4, 3, padding=1)
        # No bias before batch norm: its gradient is zero up to rounding noise.
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=1, padding=1, groups=2)
        self.gn = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8 * 2 * 2 + 4, 4)

    def forward(self, x):
        sequence = self.conv1d(x.flatten(2)).mean(-1)
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        x = F.avg_pool2d(F.silu(self.gn(self.conv2(x))), 2)
        return self.head(torch.cat([x.flatten(1), sequence], dim=1))


def test_cnn_matches_cpu_train_and_eval():
    torch.manual_seed(0)
    model = CNN()
    batches = random_batches(lambda g: torch.randn(8, 3, 8, 8, generator=g), 4)
    compare_training(model, OPTIMIZERS["adam"], batches, classification_loss)
    device_model = copy.deepcopy(model).to("tpu")
    model.eval()
    device_model.eval()
    x = torch.randn(4, 3, 8, 8)
    assert_same(device_model(x.to("tpu")), model(x), rtol=1e-4, atol=1e-5)
    assert_same(device_model.bn.running_mean, model.bn.running_mean, rtol=1e-4, atol=1e-5)
    assert_same(device_model.bn.running_var, model.bn.running_var, rtol=1e-4, atol=1e-5)


# ---- recurrent networks ----------------------------------------------------------------


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(6, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


@pytest.mark.parametrize("cell,opt", [(nn.LSTM, "rmsprop"), (nn.GRU, "adagrad")])
def test_recurrent_matches_cpu(cell, opt):
    torch.manual_seed(0)
    batches = random_batches(lambda g: torch.randn(8, 5, 6, generator=g), 3)
    compare_training(Recurrent(cell), OPTIMIZERS[opt], batches, classification_loss)


# ---- a GPT-style transformer ----------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, norm):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.q = nn.Linear(dim, dim)
        # No bias: softmax ignores a constant key shift, so its gradient is pure noise.
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        gqa = self.heads != self.kv_heads
        if mask is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.down(F.gelu(self.up(self.norm2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab=32, dim=32, heads=4, kv_heads=4, layers=2, norm=nn.LayerNorm, context=16):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, norm) for _ in range(layers))
        self.norm = norm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, mask=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(F.silu(self.norm(x)))


def lm_batches(vocab=32, t=12, steps=STEPS):
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps):
        idx = torch.randint(0, vocab, (4, t + 1), generator=g)
        targets = idx[:, 1:].clone()
        targets[0, :3] = -100  # ignored positions
        batches.append((idx[:, :-1].contiguous(), targets))
    return batches


def lm_loss(model, idx, targets, mask=None):
    logits = model(idx, mask)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, label_smoothing=0.1)


@pytest.mark.parametrize(
    "norm,kv_heads",
    [(nn.LayerNorm, 4), (nn.RMSNorm, 2)],
    ids=["layernorm-mha", "rmsnorm-gqa"],
)
def test_gpt_causal_matches_cpu(norm, kv_heads):
    torch.manual_seed(0)
    model = GPT(norm=norm, kv_heads=kv_heads)
    compare_training(model, OPTIMIZERS["adamw"], lm_batches(), lm_loss, clip=1.0)


def test_gpt_explicit_mask_matches_cpu():
    torch.manual_seed(0)
    model = GPT()
    t = 12
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    mask[:, 0] = True

    def loss_with_mask(model, idx, targets):
        return lm_loss(model, idx, targets, mask.to(idx.device))

    compare_training(model, OPTIMIZERS["adam"], lm_batches(t=t), loss_with_mask)


def test_dropout_reproducible_under_seed():
    x = torch.ones(64, 64, device="tpu")
    torch.manual_seed(3)
    a = F.dropout(x, 0.5, training=True)
    torch.manual_seed(3)
    b = F.dropout(x, 0.5, training=True)
    assert torch.equal(a.cpu(), b.cpu())
    kept = (a.cpu() != 0).float().mean().item()
    assert 0.4 < kept < 0.6
    assert set(a.cpu().unique().tolist()) <= {0.0, 2.0}


# ---- torch.func --------------------------------------------------------------------------


def test_func_grad_and_vmap():
    w = torch.randn(5, 3)
    xs = torch.randn(7, 5)

    def f(w, x):
        return torch.sin(x @ w).sum()

    expected_grad = torch.func.grad(f)(w, xs[0])
    expected_vmap = torch.func.vmap(f, in_dims=(None, 0))(w, xs)
    expected_per_sample = torch.func.vmap(torch.func.grad(f), in_dims=(None, 0))(w, xs)
    w_t, xs_t = w.to("tpu"), xs.to("tpu")
    assert_same(torch.func.grad(f)(w_t, xs_t[0]), expected_grad, rtol=1e-5, atol=1e-6)
    assert_same(torch.func.vmap(f, in_dims=(None, 0))(w_t, xs_t), expected_vmap, rtol=1e-5, atol=1e-6)
    assert_same(torch.func.vmap(torch.func.grad(f), in_dims=(None, 0))(w_t, xs_t), expected_per_sample, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda p, **kw: torch.optim.AdamW(p, lr=0.05, **kw),
    lambda p, **kw: torch.optim.Adam(p, lr=0.05, weight_decay=0.1, **kw),
    lambda p, **kw: torch.optim.AdamW(p, lr=0.05, amsgrad=True, maximize=True, **kw),
], ids=["adamw", "adam-weight-decay", "adamw-amsgrad-maximize"])
def test_fused_adam_matches_cpu(make):
    """fused=True (Trainer's default optimizer) runs aten::_fused_adam(w)_ as one program."""
    torch.manual_seed(0)
    params = [torch.randn(4, 3, requires_grad=True), torch.randn(5, requires_grad=True)]
    device_params = [p.detach().to("tpu").requires_grad_() for p in params]
    cpu_opt, tpu_opt = make(params), make(device_params, fused=True)
    for _ in range(4):
        for p, q in zip(params, device_params):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.to("tpu")
        cpu_opt.step()
        tpu_opt.step()
    for p, q in zip(params, device_params):
        assert_same(q.detach(), p.detach(), rtol=1e-5, atol=1e-5)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_same(tpu_opt.state[q][key], cpu_opt.state[p][key], rtol=1e-5, atol=1e-6)


def test_fused_adamw_skips_the_step_when_grad_scaler_finds_inf():
    p = torch.ones(3, device="tpu", requires_grad=True)
    optimizer = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.ones(3, device="tpu")
    found_inf = torch.ones((), device="tpu")
    optimizer.step()  # a normal step first, so the state exists
    before = p.detach().cpu().clone()
    torch.ops.aten._fused_adamw_([p], [p.grad], [optimizer.state[p]["exp_avg"]], [optimizer.state[p]["exp_avg_sq"]],
                                 [], [optimizer.state[p]["step"]], lr=0.1, beta1=0.9, beta2=0.999,
                                 weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False, found_inf=found_inf)
    assert torch.equal(p.detach().cpu(), before)
