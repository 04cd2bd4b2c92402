"""Lowerings: normalization, losses, dropout and small activations.

Statistics of half-precision inputs are computed in float32, as CPU does.
Backward lowerings return None for outputs their ``output_mask`` leaves out,
matching the undefined tensors PyTorch's kernels (and meta kernels) return.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from ..core import dtypes
from .common import Promotion, elementwise
from .registry import aten, lower

_NONE, _MEAN, _SUM = 0, 1, 2  # at::Reduction


def _stat_dtype(dtype):
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _reduce(loss, reduction):
    acc = _stat_dtype(loss.dtype)
    if reduction == _MEAN:
        return jnp.mean(loss.astype(acc)).astype(loss.dtype)
    if reduction == _SUM:
        return jnp.sum(loss.astype(acc)).astype(loss.dtype)
    return loss


def _reduction_scale(grad, shape, reduction):
    """The incoming gradient of a reduced loss, spread over each element."""
    if reduction == _MEAN:
        return grad / max(math.prod(shape), 1) if math.prod(shape) else grad
    return grad


def _channel_shape(ndim):
    """Broadcast shape of a per-channel vector against an (N, C, ...) input."""
    return (1, -1) + (1,) * (ndim - 2)


def _masked(values, mask):
    return tuple(v if keep else None for v, keep in zip(values, mask))


# ---- batch norm -------------------------------------------------------------------


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    acc = _stat_dtype(input.dtype)
    x = input.astype(acc)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _channel_shape(x.ndim)
    new_mean = new_var = None
    if training:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
        invstd = lax.rsqrt(var + eps)
        count = x.size // x.shape[1] if x.shape[1] else 0
        if running_mean is not None:
            new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
        if running_var is not None:
            unbiased = var * (count / max(count - 1, 1)) if count > 1 else var * jnp.nan
            new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    else:
        mean = running_mean.astype(acc)
        invstd = lax.rsqrt(running_var.astype(acc) + eps)
        new_mean, new_var = running_mean, running_var  # unchanged; the executor writes every named arg
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * weight.astype(acc).reshape(shape)
    if bias is not None:
        out = out + bias.astype(acc).reshape(shape)
    return out.astype(input.dtype), mean, invstd, new_mean, new_var


@lower(aten.native_batch_norm.default, writes=("running_mean", "running_var"))
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return (out, mean, invstd), (new_mean, new_var)


@lower(aten._native_batch_norm_legit.default, writes=("running_mean", "running_var"))
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return (out, mean, invstd), (new_mean, new_var)


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _batch_norm(input, weight, bias, None, None, True, momentum, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    # Meta kernels give per-channel stats here (CPU gives empty ones); follow meta.
    out, mean, invstd, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return (out, mean, invstd,
            running_mean if new_mean is None else new_mean,
            running_var if new_var is None else new_var)


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    acc = _stat_dtype(input.dtype)
    x, g = input.astype(acc), grad_out.astype(acc)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _channel_shape(x.ndim)
    if train:
        mean, invstd = save_mean.astype(acc), save_invstd.astype(acc)
    else:
        mean, invstd = running_mean.astype(acc), lax.rsqrt(running_var.astype(acc) + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    scale = invstd if weight is None else invstd * weight.astype(acc)
    grad_sum = jnp.sum(g, axis=axes)
    dot = jnp.sum(g * xhat, axis=axes)
    if train:
        count = x.size // x.shape[1] if x.shape[1] else 1
        grad_input = (g - grad_sum.reshape(shape) / count - xhat * (dot / count).reshape(shape)) * scale.reshape(shape)
    else:
        grad_input = g * scale.reshape(shape)
    grad_weight = dot
    return _masked((grad_input.astype(input.dtype), grad_weight, grad_sum), output_mask)


# ---- layer norm, group norm ----------------------------------------------------------


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    acc = _stat_dtype(input.dtype)
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = input.astype(acc)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight.astype(acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return out.astype(input.dtype), mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    acc = _stat_dtype(input.dtype)
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    lead = tuple(range(input.ndim - len(normalized_shape)))
    x, g = input.astype(acc), grad_out.astype(acc)
    mean, rstd = mean.astype(acc), rstd.astype(acc)
    xhat = (x - mean) * rstd
    gxhat = g if weight is None else g * weight.astype(acc)
    grad_input = rstd * (gxhat - jnp.mean(gxhat, axis=axes, keepdims=True)
                         - xhat * jnp.mean(gxhat * xhat, axis=axes, keepdims=True))
    grad_weight = jnp.sum(g * xhat, axis=lead)
    grad_bias = jnp.sum(g, axis=lead)
    return _masked((grad_input.astype(input.dtype), grad_weight, grad_bias), output_mask)


def _grouped(x, n, group):
    return x.reshape(n, group, -1)


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    acc = _stat_dtype(input.dtype)
    x = _grouped(input.astype(acc), N, group)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True) + eps)
    out = ((x - mean) * rstd).reshape(input.shape)
    shape = _channel_shape(input.ndim)
    if weight is not None:
        out = out * weight.astype(acc).reshape(shape)
    if bias is not None:
        out = out + bias.astype(acc).reshape(shape)
    return out.astype(input.dtype), mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    acc = _stat_dtype(input.dtype)
    x = input.astype(acc).reshape(N, C, -1)
    g = grad_out.astype(acc).reshape(N, C, -1)
    per_channel_mean = jnp.repeat(mean.astype(acc), C // group, axis=1)[..., None]
    per_channel_rstd = jnp.repeat(rstd.astype(acc), C // group, axis=1)[..., None]
    xhat = (x - per_channel_mean) * per_channel_rstd
    gxhat = g if weight is None else g * weight.astype(acc).reshape(1, C, 1)
    gxhat_g = gxhat.reshape(N, group, -1)
    xhat_g = xhat.reshape(N, group, -1)
    grad_input = per_channel_rstd.reshape(N, group, -1)[..., :1] * (
        gxhat_g - jnp.mean(gxhat_g, axis=-1, keepdims=True)
        - xhat_g * jnp.mean(gxhat_g * xhat_g, axis=-1, keepdims=True))
    grad_weight = jnp.sum(g * xhat, axis=(0, 2))
    grad_bias = jnp.sum(g, axis=(0, 2))
    return _masked((grad_input.reshape(input.shape).astype(input.dtype), grad_weight, grad_bias), output_mask)


# ---- negative log likelihood ------------------------------------------------------------


def _class_axis(self):
    return 0 if self.ndim == 1 else 1


def _target_weights(self, target, weight, ignore_index):
    """Each target's class weight (0 where ignored) and the target made safe to index with."""
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    w = jnp.ones(target.shape, self.dtype) if weight is None else weight.astype(self.dtype)[safe]
    return jnp.where(valid, w, jnp.zeros((), self.dtype)), safe


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    axis = _class_axis(self)
    w, safe = _target_weights(self, target, weight, ignore_index)
    picked = jnp.squeeze(jnp.take_along_axis(self, jnp.expand_dims(safe, axis), axis=axis), axis)
    losses = -picked * w
    acc = _stat_dtype(self.dtype)
    if reduction == _NONE:
        return losses, jnp.zeros((), self.dtype)
    total_weight = jnp.sum(w.astype(acc))
    total = jnp.sum(losses.astype(acc))
    if reduction == _MEAN:
        total = total / total_weight
    return total.astype(self.dtype), total_weight.astype(self.dtype)


@lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    axis = _class_axis(self)
    w, safe = _target_weights(self, target, weight, ignore_index)
    g = grad_output.astype(self.dtype)
    if reduction == _MEAN:
        g = g / total_weight.astype(self.dtype)
    # Only each kept target's own class is written, as on CPU: an ignored target's row stays 0
    # even when the mean divides by a total weight of 0.
    per_target = jnp.where(target != ignore_index, -w * g, jnp.zeros((), self.dtype))
    one_hot = jax.nn.one_hot(safe, self.shape[axis], dtype=jnp.bool_, axis=axis)
    return jnp.where(one_hot, jnp.expand_dims(per_target, axis), jnp.zeros((), self.dtype))


# ---- margin losses over classes -----------------------------------------------------------
# Each backward is the vjp of its forward. PyTorch's decomposition of multilabel_margin_loss
# disagrees with its CPU kernel (3x the loss on a 1-D input), so both are lowered here.


def _rows(self):
    """A 1-D (or 0-dim) input as one row."""
    return self if self.ndim == 2 else self.reshape(1, -1)


def _multi_margin_losses(self, target, p, margin, weight):
    x = _rows(self)
    t = target.reshape(-1)
    picked = jnp.take_along_axis(x, t[:, None], axis=1)
    z = jnp.maximum(margin - picked + x, 0)
    z = z * z if p == 2 else z
    if weight is not None:
        z = z * weight.astype(x.dtype)[t][:, None]
    own = jax.nn.one_hot(t, x.shape[1], dtype=jnp.bool_)
    losses = jnp.sum(jnp.where(own, jnp.zeros((), x.dtype), z), axis=1) / x.shape[1]
    return losses if self.ndim == 2 else losses[0]


@lower(aten.multi_margin_loss.default, static_numbers=True)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    return _reduce(_multi_margin_losses(self, target, p, margin, weight), reduction)


@lower(aten.multi_margin_loss_backward.default, static_numbers=True)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=_MEAN):
    _, vjp = jax.vjp(lambda x: multi_margin_loss(x, target, p, margin, weight, reduction), self)
    return vjp(grad_output.astype(self.dtype))[0]


def _multilabel_targets(self, target):
    """Which positions hold a target (those before the first -1), and which classes are targets."""
    x, t = _rows(self), _rows(target)
    listed = jnp.cumprod(t != -1, axis=1).astype(jnp.bool_)
    safe = jnp.where(listed, t, 0)
    classes = jnp.arange(x.shape[1])
    is_target = jnp.any(listed[:, :, None] & (safe[:, :, None] == classes), axis=1)
    return listed, safe, is_target


def _multilabel_margin_losses(self, target):
    x = _rows(self)
    listed, safe, is_target = _multilabel_targets(self, target)
    picked = jnp.take_along_axis(x, safe, axis=1)
    z = jnp.maximum(1 - (picked[:, :, None] - x[:, None, :]), 0)
    z = jnp.where(listed[:, :, None] & ~is_target[:, None, :], z, jnp.zeros((), x.dtype))
    losses = jnp.sum(z, axis=(1, 2)) / x.shape[1]
    return losses if self.ndim == 2 else losses[0]


def _multilabel_margin_shapes(self, target, reduction):
    losses = self.new_empty(self.shape[:1] if self.dim() == 2 and reduction == _NONE else ())
    return losses, torch.empty_like(self)


def _check_long_target(self, target, *args):
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {dtypes.scalar_type_name(target.dtype)}")


# PyTorch's meta kernel gives a 1-D input's unreduced loss shape (1,); CPU gives ().
@lower(aten.multilabel_margin_loss_forward.default, meta=_multilabel_margin_shapes, check=_check_long_target)
def multilabel_margin_loss_forward(self, target, reduction):
    is_target = _multilabel_targets(self, target)[2].astype(self.dtype)
    return _reduce(_multilabel_margin_losses(self, target), reduction), is_target.reshape(self.shape)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    _, vjp = jax.vjp(lambda x: _reduce(_multilabel_margin_losses(x, target), reduction), self)
    return vjp(grad_output.astype(self.dtype))[0]


# ---- connectionist temporal classification --------------------------------------------------


def _ctc_labels(targets, target_lengths, blank):
    """Each sequence's targets with blanks around and between them: (batch, 2 * longest + 1)."""
    lengths = np.asarray(target_lengths, np.int64)
    longest = int(lengths.max()) if lengths.size else 0
    if targets.ndim == 2:
        padded = targets[:, :longest]
    else:  # concatenated: sequence b starts where the ones before it end
        starts = np.cumsum(lengths) - lengths
        index = np.minimum(starts[:, None] + np.arange(longest), max(targets.shape[0] - 1, 0))
        padded = targets[index] if targets.shape[0] else jnp.zeros(index.shape, targets.dtype)
    labels = jnp.full((lengths.size, 2 * longest + 1), blank, targets.dtype)
    return labels.at[:, 1::2].set(padded), lengths


def _log_add(a, b):
    """log(exp(a) + exp(b)), with a zero gradient, not NaN, where both are -inf."""
    peak = jnp.maximum(a, b)
    finite = jnp.isfinite(peak)
    shift = jnp.where(finite, peak, 0)
    total = jnp.where(finite, jnp.exp(a - shift) + jnp.exp(b - shift), 1)
    return jnp.where(finite, shift + jnp.log(total), peak)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank):
    """log alpha (time, batch, 2S+1) of the CTC forward recursion, and each sequence's -log p."""
    labels, lengths = _ctc_labels(targets, target_lengths, blank)
    steps = np.asarray(input_lengths, np.int64)
    width = labels.shape[1]
    position = np.arange(width)
    inside = position[None, :] < 2 * lengths[:, None] + 1
    previous_label = jnp.pad(labels[:, :-2], ((0, 0), (2, 0)), constant_values=blank)
    can_skip = (position % 2 == 1) & (position >= 2) & (labels != previous_label)
    emissions = jnp.take_along_axis(log_probs, jnp.broadcast_to(labels, log_probs.shape[:2] + (width,)), axis=2)
    lowest = jnp.asarray(-jnp.inf, log_probs.dtype)
    start = jnp.where(inside & (position < 2), emissions[0], lowest)

    def step(alpha, inputs):
        t, emission = inputs
        one_back = jnp.pad(alpha[:, :-1], ((0, 0), (1, 0)), constant_values=-jnp.inf)
        two_back = jnp.where(can_skip, jnp.pad(alpha[:, :-2], ((0, 0), (2, 0)), constant_values=-jnp.inf), lowest)
        new = _log_add(_log_add(alpha, one_back), two_back) + emission
        new = jnp.where(inside, new, lowest)
        alpha = jnp.where((t < steps)[:, None], new, alpha)  # a finished sequence keeps its last alpha
        return alpha, alpha

    times = jnp.arange(1, log_probs.shape[0])
    last, later = lax.scan(step, start, (times, emissions[1:]))
    batch = np.arange(lengths.size)
    final = _log_add(last[batch, 2 * lengths],
                          jnp.where(lengths > 0, last[batch, np.maximum(2 * lengths - 1, 0)], lowest))
    return jnp.concatenate([start[None], later]), -final


@lower(aten._ctc_loss.default, static_numbers=True)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    log_alpha, nll = _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), jnp.zeros((), nll.dtype), nll)
    return nll, jnp.transpose(log_alpha, (1, 0, 2))


@lower(aten._ctc_loss_backward.default, static_numbers=True)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                      blank, zero_infinity=False):
    """The vjp of the recursion, plus CPU's extra exp(log_probs) term: CPU's gradient assumes the
    log_probs come from a log_softmax, whose backward cancels that term."""
    def nll_of(lp):
        return _ctc_forward(lp, targets, input_lengths, target_lengths, blank)[1]

    nll, vjp = jax.vjp(nll_of, log_probs)
    g = grad.astype(log_probs.dtype)
    running = (jnp.arange(log_probs.shape[0])[:, None] < np.asarray(input_lengths))[..., None]
    result = vjp(g)[0] + jnp.where(running, jnp.exp(log_probs) * g[None, :, None], 0)
    if zero_infinity:
        result = jnp.where(jnp.isinf(nll)[None, :, None], jnp.zeros((), result.dtype), result)
    return result


# ---- pointwise losses ----------------------------------------------------------------------


@lower(aten.mse_loss.default)
@elementwise(2)
def mse_loss(self, target, reduction=_MEAN):
    return _reduce(jnp.square(self - target), reduction)


@lower(aten.mse_loss_backward.default)
@elementwise(3)
def mse_loss_backward(grad_output, self, target, reduction):
    diff = self - target
    return 2 * diff * _reduction_scale(grad_output, diff.shape, reduction)


@lower(aten.smooth_l1_loss.default)
@elementwise(2)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    d = jnp.abs(self - target)
    return _reduce(jnp.where(d < beta, 0.5 * d * d / jnp.where(beta == 0, 1, beta), d - 0.5 * beta), reduction)


@lower(aten.smooth_l1_loss_backward.default)
@elementwise(3)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    d = self - target
    g = _reduction_scale(grad_output, d.shape, reduction)
    inner = d * g / jnp.where(beta == 0, 1, beta)
    return jnp.where(d < -beta, -g, jnp.where(d > beta, g, inner))


@lower(aten.huber_loss.default)
@elementwise(2)
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    d = jnp.abs(self - target)
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward.default)
@elementwise(3)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    d = self - target
    g = _reduction_scale(grad_output, d.shape, reduction)
    return jnp.where(d < -delta, -g * delta, jnp.where(d > delta, g * delta, d * g))


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    target = target.astype(self.dtype)
    # CPU clamps each log at -100 so a 0 or 1 probability gives a finite loss.
    log_p = jnp.maximum(jnp.log(self), -100)
    log_not_p = jnp.maximum(jnp.log1p(-self), -100)
    loss = -(target * log_p + (1 - target) * log_not_p)
    if weight is not None:
        loss = loss * weight.astype(self.dtype)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    target = target.astype(self.dtype)
    g = _reduction_scale(grad_output.astype(self.dtype), self.shape, reduction)
    grad = g * (self - target) / jnp.maximum((1 - self) * self, 1e-12)
    if weight is not None:
        grad = grad * weight.astype(self.dtype)
    return grad


# ---- dropout ---------------------------------------------------------------------------------


@lower(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, key):
    if train is False:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1 - p, input.shape)
    scale = jnp.where(p == 1, 0.0, 1 / jnp.where(p == 1, 1.0, 1 - p))
    return jnp.where(keep, input * scale.astype(input.dtype), jnp.zeros((), input.dtype)), keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask.astype(grad_output.dtype) * jnp.asarray(scale, grad_output.dtype)


# ---- small activations -------------------------------------------------------------------------


def _glu(x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu.default)
def glu(self, dim=-1):
    return _glu(self, dim)


@lower(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    _, pullback = jax.vjp(lambda x: _glu(x, dim), self)
    return pullback(grad_output.astype(self.dtype))[0]


@lower(aten.log_sigmoid_forward.default)
@elementwise(1, Promotion.INT_TO_FLOAT)
def log_sigmoid_forward(self):
    return jax.nn.log_sigmoid(self), jnp.zeros_like(self)


@lower(aten.log_sigmoid_backward.default)
@elementwise(2)
def log_sigmoid_backward(grad_output, self, buffer):
    return grad_output * jax.nn.sigmoid(-self)


@lower(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    zero = jnp.zeros((), self.dtype)
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, zero)).astype(self.dtype)


@lower(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    return jnp.where((self > lambd) | (self < -lambd), self, jnp.zeros((), self.dtype))


@lower(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def shrink_backward(grad_out, self, lambd):
    return jnp.where((self > lambd) | (self < -lambd), grad_out, jnp.zeros((), grad_out.dtype))


@lower(aten._prelu_kernel.default)
def prelu_kernel(self, weight):
    return jnp.where(self > 0, self, weight.astype(self.dtype) * self)


@lower(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, self, weight):
    positive = self > 0
    grad_input = jnp.where(positive, grad_output, weight.astype(self.dtype) * grad_output)
    grad_weight = jnp.where(positive, jnp.zeros((), self.dtype), self * grad_output)
    return grad_input, grad_weight
