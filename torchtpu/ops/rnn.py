"""Lowerings: the fused LSTM and GRU cells that nn.LSTM and nn.GRU reach.

The workspace each forward returns is ours to define; only its shape is
PyTorch's.  We keep exactly what the matching backward needs:
LSTM: the activated gates [i, f, g, o]; GRU: [r, z, n, h, hidden part of n].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import aten, lower


def _with_bias(gates, bias):
    return gates if bias is None else gates + bias


def _fused_lstm_cell_shapes(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


@lower(aten._thnn_fused_lstm_cell.default, meta=_fused_lstm_cell_shapes)  # PyTorch's fails without biases
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _with_bias(input_gates, input_bias) + _with_bias(hidden_gates, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(workspace, 4, axis=1)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = (jnp.zeros_like(cy) if grad_cy is None else grad_cy) + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate(
        [
            grad_c * g * i * (1 - i),
            grad_c * cx * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        axis=1,
    )
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@lower(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, iz, in_ = jnp.split(_with_bias(input_gates, input_bias), 3, axis=1)
    hr, hz, hn = jnp.split(_with_bias(hidden_gates, hidden_bias), 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = (1 - z) * n + z * hx
    return hy, jnp.concatenate([r, z, n, hx, hn], axis=1)


@lower(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = jnp.split(workspace, 5, axis=1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([grad_r, grad_z, grad_n], axis=1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=1)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
