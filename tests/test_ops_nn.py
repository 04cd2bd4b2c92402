"""Normalization, losses, dropout, attention and small activations against CPU: values and gradients."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_same, check, check_grad, to_device


torch.manual_seed(0)
X = torch.randn(4, 6, 5, 5)
W6, B6 = torch.randn(6), torch.randn(6)


# ---- batch norm ----------------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm2d_module(train):
    cpu = nn.BatchNorm2d(6, momentum=0.3)
    with torch.no_grad():
        cpu.weight.copy_(W6), cpu.bias.copy_(B6)
        cpu.running_mean.copy_(torch.randn(6)), cpu.running_var.copy_(torch.rand(6) + 0.5)
    tpu = nn.BatchNorm2d(6, momentum=0.3).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    cpu.train(train), tpu.train(train)
    x = X.clone().requires_grad_()
    tx = x.detach().to("tpu").requires_grad_()
    for _ in range(2):  # twice: running stats feed the second step
        expected, actual = cpu(x), tpu(tx)
        assert_same(actual, expected, atol=1e-4, rtol=1e-4)
    assert_same(tpu.running_mean, cpu.running_mean, atol=1e-5, rtol=1e-5)
    assert_same(tpu.running_var, cpu.running_var, atol=1e-5, rtol=1e-5)
    assert tpu.num_batches_tracked.item() == cpu.num_batches_tracked.item()
    grad = torch.randn_like(expected)
    expected.backward(grad)
    actual.backward(grad.to("tpu"))
    for c, t in ((x, tx), (cpu.weight, tpu.weight), (cpu.bias, tpu.bias)):
        assert_same(t.grad, c.grad, atol=1e-4, rtol=1e-4)


def test_batch_norm_functional_variants():
    check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), X, W6, B6)
    check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), torch.randn(5, 6, 7), W6, B6)
    check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), torch.randn(8, 6), W6, B6)
    check(lambda x: F.batch_norm(x, None, None, training=True), X.bfloat16(), atol=3e-2, rtol=3e-2)


def test_batch_norm_legit_overloads():
    aten = torch.ops.aten
    rm, rv = torch.randn(6), torch.rand(6) + 0.5

    def legit(x, w, b, rm, rv):
        rm, rv = rm.clone(), rv.clone()
        out = aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.2, 1e-5)
        return (*out, rm, rv)

    check(legit, X, W6, B6, rm, rv, atol=1e-5, rtol=1e-5)
    check(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.2, 1e-5),
          X, W6, B6, rm, rv, atol=1e-5, rtol=1e-5)
    check(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.2, 1e-5)[0],
          X, W6, B6, rm, rv, atol=1e-5, rtol=1e-5)
    check(lambda x: aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.2, 1e-5), X, atol=1e-5, rtol=1e-5)


# ---- group norm, layer norm, rms norm ----------------------------------------------------------


def test_group_norm():
    check_grad(lambda x, w, b: F.group_norm(x, 3, w, b), X, W6, B6)
    check_grad(lambda x, w, b: F.group_norm(x, 6, w, b, eps=1e-3), torch.randn(2, 6, 7), W6, B6)
    check_grad(lambda x, w, b: F.group_norm(x, 2, w, b), torch.randn(3, 6), W6, B6)


def test_layer_norm():
    check_grad(lambda x, w, b: F.layer_norm(x, (5, 5), w, b), X, torch.randn(5, 5), torch.randn(5, 5))
    check_grad(lambda x, w, b: F.layer_norm(x, (5,), w, b, eps=1e-3), X, torch.randn(5), torch.randn(5))
    check(lambda x, w, b: F.layer_norm(x, (5,), w, b), X.bfloat16(), torch.randn(5).bfloat16(),
          torch.randn(5).bfloat16(), atol=2e-2, rtol=2e-2)


def test_norm_modules():
    for cpu in (nn.LayerNorm(5), nn.GroupNorm(2, 6), nn.RMSNorm(5)):
        with torch.no_grad():
            for p in cpu.parameters():
                p.copy_(torch.randn_like(p))
        tpu = copy.deepcopy(cpu).to("tpu")
        x = X.clone().requires_grad_()
        tx = x.detach().to("tpu").requires_grad_()
        expected, actual = cpu(x), tpu(tx)
        assert_same(actual, expected, atol=1e-4, rtol=1e-4)
        grad = torch.randn_like(expected)
        expected.backward(grad)
        actual.backward(grad.to("tpu"))
        assert_same(tx.grad, x.grad, atol=1e-4, rtol=1e-4)
        assert_same(tpu.weight.grad, cpu.weight.grad, atol=1e-4, rtol=1e-4)


def test_norms_without_weight_grads():
    # output_mask drops outputs: the backward kernels return undefined tensors for them
    check_grad(lambda x: F.batch_norm(x, None, None, training=True), X)
    check_grad(lambda x, w, b: F.layer_norm(x, (5,), w, b), X, torch.randn(5), torch.randn(5), grad_args=(0,))
    check_grad(lambda x, w, b: F.group_norm(x, 3, w, b), X, W6, B6, grad_args=(1,))


# ---- losses ----------------------------------------------------------------------------------

LOGP = torch.randn(7, 5).log_softmax(1)
TARGET = torch.tensor([0, 1, 4, -100, 2, 2, 3])
CLASS_W = torch.rand(5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    w = CLASS_W if weighted else None
    check_grad(lambda x: F.nll_loss(x, TARGET.to(x.device), None if w is None else w.to(x.device),
                                    reduction=reduction), LOGP)


def test_nll_loss_ignore_index_and_shapes():
    check_grad(lambda x: F.nll_loss(x, TARGET.clamp(min=0).to(x.device), ignore_index=2), LOGP)
    check_grad(lambda x: F.nll_loss(x, TARGET[0].to(x.device)), LOGP[0])
    target = torch.randint(0, 5, (2, 3, 4))
    target[0, 0, 0] = -100
    check_grad(lambda x: F.nll_loss(x, target.to(x.device), CLASS_W.to(x.device)), torch.randn(2, 5, 3, 4))
    # every target ignored: mean is 0/0 = nan, as on CPU, and the gradient is 0, not nan
    check_grad(lambda x: F.nll_loss(x, torch.full((3,), -100, device=x.device)), LOGP[:3])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("rows", [(4, 5), (5,)], ids=["batch", "one-row"])
def test_multilabel_margin_loss(reduction, rows):
    """Targets listed up to the first -1; a one-row input's unreduced loss is 0-dim, as on CPU."""
    target = torch.tensor([[3, 0, -1, 1, 2], [1, -1, 4, 4, 0], [4, 3, 2, 1, 0], [-1, 2, 3, 0, 1]])
    target = target[: rows[0]] if len(rows) == 2 else target[0]
    check_grad(lambda x: F.multilabel_margin_loss(x, target.to(x.device), reduction=reduction),
               torch.randn(rows))


@pytest.mark.parametrize("p, margin, weighted", [(1, 1.0, False), (2, 0.5, True)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_multi_margin_loss(p, margin, weighted, reduction):
    weight = torch.rand(5) if weighted else None
    check_grad(lambda x: F.multi_margin_loss(x, TARGET.clamp(min=0).to(x.device), p=p, margin=margin,
                                             weight=None if weight is None else weight.to(x.device),
                                             reduction=reduction), torch.randn(7, 5))


def test_cross_entropy():
    check_grad(lambda x: F.cross_entropy(x, TARGET.to(x.device)), torch.randn(7, 5))
    check_grad(lambda x: F.cross_entropy(x, TARGET.to(x.device), weight=CLASS_W.to(x.device), label_smoothing=0.1),
               torch.randn(7, 5))
    check_grad(lambda x: F.cross_entropy(x, TARGET.clamp(min=0).to(x.device), ignore_index=2, label_smoothing=0.2),
               torch.randn(7, 5))


@pytest.mark.parametrize("loss", ["mse", "l1", "smooth_l1", "smooth_l1_beta0", "huber"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_regression_losses(loss, reduction):
    fn = {
        "mse": F.mse_loss, "l1": F.l1_loss,
        "smooth_l1": lambda a, b, reduction: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5),
        "smooth_l1_beta0": lambda a, b, reduction: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0),
        "huber": lambda a, b, reduction: F.huber_loss(a, b, reduction=reduction, delta=0.7),
    }[loss]
    check_grad(lambda a, b: fn(a, b, reduction=reduction), torch.randn(3, 4), torch.randn(3, 4))


def test_binary_cross_entropy():
    p, t, w = torch.rand(4, 3), torch.rand(4, 3), torch.rand(3)
    check_grad(lambda p, t, w: F.binary_cross_entropy(p, t, w), p, t, w, grad_args=(0,))
    check_grad(lambda p, t: F.binary_cross_entropy(p, t, reduction="sum"), p, t)
    # probabilities of exactly 0 and 1: CPU clamps the logs at -100
    check(lambda p, t: F.binary_cross_entropy(p, t, reduction="none"), torch.tensor([0., 1., 0.5]),
          torch.tensor([1., 0., 0.5]))
    check_grad(lambda x, t, pw: F.binary_cross_entropy_with_logits(x, t, pos_weight=pw), torch.randn(4, 3), t,
               torch.rand(3), grad_args=(0,))


# ---- activations ------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [
    lambda x: F.glu(x, 1),
    F.logsigmoid,
    lambda x: F.softshrink(x, 0.3),
    lambda x: F.hardshrink(x, 0.3),
])
def test_activations(fn):
    check_grad(fn, X)


def test_prelu():
    check_grad(F.prelu, X, torch.rand(6))
    check_grad(F.prelu, X, torch.rand(1))


# ---- dropout ----------------------------------------------------------------------------------


def test_dropout_statistics_and_gradient():
    x = torch.ones(20000, device="tpu", requires_grad=True)
    out = F.dropout(x, 0.25)
    kept = out.detach().cpu() != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.02
    torch.testing.assert_close(out.detach().cpu()[kept], torch.full((int(kept.sum()),), 1 / 0.75))
    out.backward(torch.full_like(out, 2.0))
    torch.testing.assert_close(x.grad.cpu(), torch.where(kept, 2 / 0.75, 0.0))
    assert torch.equal(F.dropout(x, 0.25, training=False).cpu(), x.detach().cpu())
    assert F.dropout(x, 1.0).detach().cpu().abs().sum().item() == 0


def test_dropout_reproducible_under_seed():
    x = torch.ones(64, device="tpu")
    torch.manual_seed(7)
    a = F.dropout(x, 0.5).cpu()
    torch.manual_seed(7)
    b = F.dropout(x, 0.5).cpu()
    c = F.dropout(x, 0.5).cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)


# ---- attention --------------------------------------------------------------------------------

Q, K, V = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
BOOL_MASK = torch.rand(6, 7) > 0.3
FLOAT_MASK = torch.randn(6, 7)


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(is_causal=True),
    dict(attn_mask=BOOL_MASK),
    dict(attn_mask=FLOAT_MASK, scale=0.3),
])
def test_scaled_dot_product_attention(kwargs):
    def sdpa(q, k, v):
        kw = {k_: to_device(v_, q.device.type) for k_, v_ in kwargs.items()}
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, **kw)

    check_grad(sdpa, Q, K, V, atol=1e-4, rtol=1e-4)


def test_scaled_dot_product_attention_gqa():
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
               Q, K[:, :2], V[:, :2])


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_recurrent_layers_without_biases(cell):
    """The fused cells' optional biases absent (PyTorch's meta kernel of the LSTM cell fails then)."""
    torch.manual_seed(0)
    layers = {"cpu": cell(3, 4, bias=False)}
    layers["tpu"] = copy.deepcopy(layers["cpu"]).to("tpu")
    check_grad(lambda x: layers[x.device.type](x)[0], torch.randn(5, 2, 3))


@pytest.mark.parametrize("layout", ["padded", "concatenated"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_values_and_gradient(layout, zero_infinity):
    """Sequences of different lengths; the third target cannot fit its input (an infinite loss,
    zeroed with zero_infinity). The gradient is CPU's, extra exp(log_probs) term included."""
    generator = torch.Generator().manual_seed(0)
    input_lengths, target_lengths = [12, 10, 3], [4, 2, 3]
    targets = torch.randint(1, 5, (3, 4), generator=generator)
    targets[2, :3] = 2  # three repeats need five steps: 3 cannot hold them
    if layout == "concatenated":
        targets = torch.cat([targets[b, :n] for b, n in enumerate(target_lengths)])
    log_probs = torch.randn(12, 3, 5, generator=generator).log_softmax(2)

    def loss(lp):
        return F.ctc_loss(lp, targets.to(lp.device), input_lengths, target_lengths,
                          reduction="sum" if zero_infinity else "none", zero_infinity=zero_infinity)

    if zero_infinity:
        check_grad(loss, log_probs, atol=1e-5, rtol=1e-5)
    else:
        check(loss, log_probs)
