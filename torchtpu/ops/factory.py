"""Lowerings: factory ops that build a tensor from numbers (no random ones).

The executor runs PyTorch's meta kernel first, so the output's shape and dtype
(and every argument check) are CPU's; these lowerings only compute values of
that shape.  ``static_numbers=True`` wherever a float decides the length.

A factory's ``dtype`` argument is only seen by the functional overload; for
``out=`` calls (``torch.arange(..., out=t)``) the lowering computes in the
widest type of its arguments and the executor casts to ``t``'s dtype.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ..core import dtypes
from .registry import aten, lower

def _jax_dtype(dtype):
    return None if dtype is None else dtypes.to_jax(dtype)


def _is_integral(dtype) -> bool:
    return dtype is not None and (jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_)


# ---- arange ------------------------------------------------------------------------


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step, static_numbers=True)
def arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    # Overloads take (end), (start, end) or (start, end, step).
    start, end, step = {1: (0, *args, 1), 2: (*args, 1), 3: args}[len(args)]
    target = _jax_dtype(dtype)
    # CPU's length rule: ceil((end - start) / step) in double, except that an
    # int64 result counts with the arguments truncated to int64.
    if target == jnp.int64:
        start, end, step = int(start), int(end), int(step)
    length = max(0, math.ceil((end - start) / step)) if step else 0
    if _is_integral(target):
        # Integer results step from the truncated start by the truncated step.
        start, step = int(start), int(step)
    if isinstance(start, int) and isinstance(step, int):
        return start + step * lax.iota(jnp.int64, length)
    # CPU accumulates floats in double: start + i * step.
    return start + step * lax.iota(jnp.float64, length)


# ---- linspace / logspace -------------------------------------------------------------


def _linspace_values(start, end, steps, dtype):
    """CPU's symmetric rule: the first half counts up from start, the rest down from end.

    Like CPU, floating results are computed in their own dtype and integer
    results in double from truncated endpoints (the executor's final cast
    truncates the values).  With no dtype (an ``out=`` call) we use double.
    """
    integral = _is_integral(dtype)
    compute = jnp.float64 if dtype is None or integral else dtype
    start, end = jnp.asarray(start), jnp.asarray(end)
    if integral:
        start, end = jnp.trunc(start.real), jnp.trunc(end.real)
    start, end = start.astype(compute), end.astype(compute)
    if steps == 0:
        return jnp.zeros((0,), compute)
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = (end - start) / jnp.asarray(steps - 1, compute)
    i = lax.iota(jnp.int64, steps)
    up = start + step * i.astype(compute)
    down = end - step * (steps - 1 - i).astype(compute)
    return jnp.where(i < steps // 2, up, down)


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
       aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _linspace_values(start, end, steps, _jax_dtype(dtype))


@lower(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
       aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    target = _jax_dtype(dtype)
    if target in (jnp.float16, jnp.bfloat16):
        target = jnp.dtype(jnp.float32)  # CPU's logspace works in float for half types
    exponents = _linspace_values(start, end, steps, target)
    return jnp.power(jnp.asarray(base, exponents.dtype), exponents)


# ---- constant tensors ------------------------------------------------------------------


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value)


@lower(aten.zeros.default, aten._efficientzerotensor.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _jax_dtype(dtype) or jnp.float32)


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _jax_dtype(dtype) or jnp.float32)


@lower(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(self.shape, fill_value, _jax_dtype(dtype) or self.dtype)


@lower(aten.zeros_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(self.shape, _jax_dtype(dtype) or self.dtype)


@lower(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(self.shape, _jax_dtype(dtype) or self.dtype)


@lower(aten.new_zeros.default)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _jax_dtype(dtype) or self.dtype)


@lower(aten.new_ones.default)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _jax_dtype(dtype) or self.dtype)


@lower(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _jax_dtype(dtype) or self.dtype)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s)


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=jnp.bool_)


# ---- triangle indices --------------------------------------------------------------------


def _triangle_indices(row, col, offset, lower_triangle):
    rows, cols = [], []
    for r in range(row):
        if lower_triangle:
            cols_in_row = range(0, max(0, min(col, r + offset + 1)))
        else:
            cols_in_row = range(max(0, r + offset), col)
        rows.extend([r] * len(cols_in_row))
        cols.extend(cols_in_row)
    return jnp.asarray([rows, cols], dtype=jnp.int64).reshape(2, len(rows))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    # The indices depend only on the constant arguments: build them at trace time.
    return _triangle_indices(row, col, offset, lower_triangle=True)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, lower_triangle=False)
