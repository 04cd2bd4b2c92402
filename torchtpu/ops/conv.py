"""Lowerings: convolution, pooling and upsampling.

Convolution goes through ``lax.conv_general_dilated``; a transposed
convolution is the input-gradient of a plain one (dilate the input by the
stride, flip the kernel, swap its channel axes).  Backward passes are the
jax VJP of the same forward, so forward and gradient can never disagree.

Pooling gathers every window explicitly (output positions x kernel offsets)
so max pooling can return PyTorch's flat indices: the position of the
maximum inside its input plane, first maximum in row-major window order.
Every index and divisor depends only on shapes, so it is computed with
numpy at trace time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime import precision
from .registry import aten, lower

# ---- convolution --------------------------------------------------------------


def _spatial_letters(n):
    return "DHW"[-n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))


def _accumulation_dtype(dtype):
    # CPU accumulates half-precision convolutions in float32.
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else None


def _transposed_weight(weight, groups):
    """(Cin, Cout/g, k...) weights of a transposed conv as (Cout, Cin/g, k...) of a plain one, flipped."""
    cin, cout_g = weight.shape[:2]
    kernel = weight.shape[2:]
    w = weight.reshape(groups, cin // groups, cout_g, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def _conv(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    letters = _spatial_letters(n)
    numbers = ("NC" + letters, "OI" + letters, "NC" + letters)
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    if transposed:
        output_padding = _expand(output_padding, n)
        kernel = weight.shape[2:]
        rhs = _transposed_weight(weight, groups)
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)
        ]
        out = lax.conv_general_dilated(
            x, rhs.astype(x.dtype), window_strides=(1,) * n, padding=pads, lhs_dilation=stride,
            rhs_dilation=dilation, dimension_numbers=numbers, feature_group_count=groups,
            precision=precision.matmul(), preferred_element_type=_accumulation_dtype(x.dtype))
    else:
        out = lax.conv_general_dilated(
            x, weight.astype(x.dtype), window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=numbers, feature_group_count=groups,
            precision=precision.matmul(), preferred_element_type=_accumulation_dtype(x.dtype))
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * n)
    return out.astype(x.dtype)


def _expand(values, n):
    values = tuple(values)
    return values * n if len(values) == 1 else values


@lower(aten.convolution.default, aten.convolution_overrideable.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lower(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(x, w):
        return _conv(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(forward, input, weight)
    grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        reduce_dims = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output.astype(jnp.float32), axis=reduce_dims).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


@lower(aten.convolution_backward_overrideable.default)
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups, output_mask):
    return convolution_backward(grad_output, input, weight, None, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask)


# ---- window gathering shared by the pools ---------------------------------------


def _pool_output_size(size, kernel, stride, pad, dilation, ceil_mode):
    """PyTorch's pooling_output_shape."""
    numerator = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _window_positions(size, kernel, stride, pad, dilation, ceil_mode):
    """Input positions (out, kernel) of every window element, and which are inside the input."""
    out = _pool_output_size(size, kernel, stride, pad, dilation, ceil_mode)
    positions = np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation
    return positions, (positions >= 0) & (positions < size)


def _gather_windows(x, grids):
    """x (..., *spatial) -> windows (..., *out, prod(kernel)) plus validity mask and flat input index.

    ``grids`` holds one (positions, valid) pair per spatial dim, each (out, kernel).
    Window elements are ordered kernel-row-major, as PyTorch scans them.
    """
    n = len(grids)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    for i, (positions, _) in enumerate(grids):
        axis = lead + 2 * i
        clipped = np.clip(positions, 0, spatial[i] - 1)
        x = jnp.take(x, jnp.asarray(clipped.reshape(-1)), axis=axis)
        x = x.reshape(x.shape[:axis] + positions.shape + x.shape[axis + 1:])
    # (..., o0, k0, o1, k1, ...) -> (..., o0, o1, ..., k0, k1, ...)
    order = list(range(lead)) + [lead + 2 * i for i in range(n)] + [lead + 2 * i + 1 for i in range(n)]
    x = jnp.transpose(x, order)
    outs = tuple(p.shape[0] for p, _ in grids)
    x = x.reshape(x.shape[:lead] + outs + (math.prod(p.shape[1] for p, _ in grids),))
    valid = np.ones((), bool)
    flat = np.zeros((), np.int64)
    for i, (positions, ok) in enumerate(grids):
        # broadcast dim i's (out_i, k_i) grid into the (o0..on, k0..kn) layout
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = positions.shape
        valid = valid & ok.reshape(shape)
        flat = flat * spatial[i] + positions.reshape(shape)
    return x, valid.reshape(outs + (-1,)), flat.reshape(outs + (-1,))


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _pool_params(x, n, kernel_size, stride, padding, dilation):
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n) if len(stride) else kernel
    return kernel, stride, _expand(padding, n), _expand(dilation, n)


def _max_pool(x, n, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_params(x, n, kernel_size, stride, padding, dilation)
    spatial = x.shape[-n:]
    grids = [_window_positions(*args, ceil_mode) for args in zip(spatial, kernel, stride, padding, dilation)]
    return _max_over_windows(x, grids)


def _max_over_windows(x, grids):
    windows, valid, flat = _gather_windows(x, grids)
    windows = jnp.where(jnp.asarray(valid), windows, jnp.asarray(_lowest(x.dtype), x.dtype))
    return _window_maxima(windows, flat)


def _window_maxima(windows, flat):
    """Each window's (last axis) maximum and the flat input index it came from."""
    if jnp.issubdtype(windows.dtype, jnp.floating):
        # NaN wins, as on CPU: make it the largest value for argmax.
        is_nan = jnp.isnan(windows)
        position = jnp.argmax(jnp.where(is_nan, jnp.inf, windows), axis=-1)
        position = jnp.where(jnp.any(is_nan, axis=-1), jnp.argmax(is_nan, axis=-1), position)
    else:
        position = jnp.argmax(windows, axis=-1)
    values = jnp.take_along_axis(windows, position[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(jnp.asarray(flat), windows.shape)
    indices = jnp.take_along_axis(flat, position[..., None], axis=-1)[..., 0]
    return values, indices.astype(jnp.int64)


def _scatter_to_plane(grad, indices, input_shape, n):
    """Add each grad element at its flat plane index: the backward of every max pool."""
    lead = input_shape[: len(input_shape) - n]
    plane = math.prod(input_shape[len(input_shape) - n:])
    rows = math.prod(lead)
    g = grad.reshape(rows, -1)
    idx = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), grad.dtype).at[jnp.arange(rows)[:, None], idx].add(g)
    return out.reshape(input_shape)


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3)


# ---- fractional max pooling -----------------------------------------------------


def _fractional_starts(sample, size, out, kernel):
    """CPU's pseudo-random window starts along one dim, per plane: (..., out) from samples (...)."""
    if out == 1:
        return jnp.full(sample.shape + (1,), size - kernel, jnp.int32)
    alpha = jnp.asarray((size - kernel) / (out - 1), sample.dtype)
    i = jnp.arange(out, dtype=sample.dtype)
    starts = (jnp.floor((i + sample[..., None]) * alpha) - jnp.floor(sample[..., None] * alpha)).astype(jnp.int32)
    return starts.at[..., -1].set(size - kernel)


def _fractional_max_pool(x, n, kernel_size, output_size, samples):
    """Max over one pseudo-random window per output position; the windows differ per plane.
    CPU reads a plane's samples in (width, height) order in 2-D and (time, height, width) in 3-D."""
    batched = x.ndim == n + 2
    x = x if batched else x[None]
    spatial = x.shape[2:]
    flat = jnp.zeros((), jnp.int32)
    for i in range(n):
        which = n - 1 - i if n == 2 else i
        starts = _fractional_starts(samples[..., which].astype(x.dtype), spatial[i], output_size[i], kernel_size[i])
        positions = starts[..., None] + jnp.arange(kernel_size[i])  # (N, C, out_i, k_i)
        shape = list(positions.shape[:2]) + [1] * (2 * n)
        shape[2 + i], shape[2 + n + i] = positions.shape[2:]
        flat = flat * spatial[i] + positions.reshape(shape)
    outs, window = flat.shape[2:2 + n], math.prod(kernel_size)  # explicit sizes: a batch may be empty
    flat = flat.reshape(flat.shape[:2] + outs + (window,))
    planes = x.reshape(x.shape[:2] + (math.prod(spatial),))
    windows = jnp.take_along_axis(planes, flat.reshape(flat.shape[:2] + (math.prod(outs) * window,)), axis=2)
    values, indices = _window_maxima(windows.reshape(flat.shape), flat)
    return (values, indices) if batched else (values[0], indices[0])


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, 2, kernel_size, output_size, random_samples)


@lower(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, 3, kernel_size, output_size, random_samples)


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


@lower(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3)


# ---- average pooling ------------------------------------------------------------


def _avg_divisors(size, kernel, stride, pad, ceil_mode, count_include_pad):
    """Per-output-position divisor along one dim (the product over dims is the full one)."""
    out = _pool_output_size(size, kernel, stride, pad, 1, ceil_mode)
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, _ = _pool_params(x, n, kernel_size, stride, padding, (1,))
    spatial = x.shape[-n:]
    grids = [_window_positions(s, k, st, p, 1, ceil_mode) for s, k, st, p in zip(spatial, kernel, stride, padding)]
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    windows, valid, _ = _gather_windows(x.astype(compute), grids)
    total = jnp.sum(jnp.where(jnp.asarray(valid), windows, 0), axis=-1)
    if divisor_override:
        divisor = np.asarray(divisor_override)
    else:
        divisor = np.ones((), np.int64)
        for i, args in enumerate(zip(spatial, kernel, stride, padding)):
            per_dim = _avg_divisors(*args, ceil_mode, count_include_pad)
            shape = [1] * n
            shape[i] = per_dim.shape[0]
            divisor = divisor * per_dim.reshape(shape)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return (total // jnp.asarray(divisor, total.dtype)).astype(x.dtype)
    return (total / jnp.asarray(divisor, compute)).astype(x.dtype)


@lower(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _vjp(forward, x, grad):
    _, pullback = jax.vjp(forward, x)
    return pullback(grad.astype(x.dtype))[0]


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _vjp(lambda x: _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                    divisor_override), self, grad_output)


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _vjp(lambda x: _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                    divisor_override), self, grad_output)


# ---- adaptive pooling -----------------------------------------------------------


def _adaptive_bounds(size, out):
    starts = (np.arange(out) * size) // out
    ends = -((-(np.arange(out) + 1) * size) // out)  # ceil
    return starts, ends


def _adaptive_grid(size, out):
    starts, ends = _adaptive_bounds(size, out)
    width = int((ends - starts).max()) if out else 1
    positions = starts[:, None] + np.arange(width)[None, :]
    return positions, positions < ends[:, None]


def _adaptive_avg(x, output_size):
    """Average over adaptive windows: one averaging matrix per spatial dim."""
    n = len(output_size)
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    out = x.astype(compute)
    for i, o in enumerate(output_size):
        size = x.shape[x.ndim - n + i]
        starts, ends = _adaptive_bounds(size, o)
        cols = np.arange(size)[None, :]
        weights = ((cols >= starts[:, None]) & (cols < ends[:, None])) / (ends - starts)[:, None]
        axis = x.ndim - n + i
        out = jnp.moveaxis(jnp.tensordot(out, jnp.asarray(weights, compute), axes=[[axis], [1]],
                                         precision=precision.matmul()), -1, axis)
    return out.astype(x.dtype)


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), self, grad_output)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), self, grad_output)


def _adaptive_max(x, output_size):
    n = len(output_size)
    spatial = x.shape[-n:]
    return _max_over_windows(x, [_adaptive_grid(s, o) for s, o in zip(spatial, output_size)])


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3)


# ---- upsampling -----------------------------------------------------------------


def _source_scale(in_size, out_size, scale, align_corners=False):
    """PyTorch's area_pixel_compute_scale, in float32 like CPU's float kernels."""
    if align_corners:
        return np.float32((in_size - 1) / (out_size - 1)) if out_size > 1 else np.float32(0)
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(in_size / out_size)


def _nearest_indices(in_size, out_size, scale, exact):
    s = _source_scale(in_size, out_size, scale)
    dst = np.arange(out_size, dtype=np.float32)
    src = np.floor((dst + np.float32(0.5)) * s) if exact else np.floor(dst * s)
    return np.minimum(src.astype(np.int64), in_size - 1)


def _upsample_nearest(x, output_size, scales, exact=False):
    n = len(output_size)
    for i, (o, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - n + i
        x = jnp.take(x, jnp.asarray(_nearest_indices(x.shape[axis], o, scale, exact)), axis=axis)
    return x


def _linear_weights(in_size, out_size, scale, align_corners):
    s = _source_scale(in_size, out_size, scale, align_corners)
    dst = np.arange(out_size, dtype=np.float32)
    if align_corners:
        src = dst * s
    else:
        src = np.maximum((dst + np.float32(0.5)) * s - np.float32(0.5), np.float32(0))
    low = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    frac = (src - low).astype(np.float32)
    return low, high, frac


def _upsample_linear(x, output_size, align_corners, scales):
    n = len(output_size)
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    out = x.astype(compute)
    for i, (o, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - n + i
        low, high, frac = _linear_weights(out.shape[axis], o, scale, align_corners)
        shape = [1] * out.ndim
        shape[axis] = o
        frac = jnp.asarray(frac, compute).reshape(shape)
        a = jnp.take(out, jnp.asarray(low), axis=axis)
        b = jnp.take(out, jnp.asarray(high), axis=axis)
        out = a * (1 - frac) + b * frac
    return out.astype(x.dtype)


def _scales(n, *scales):
    return tuple(scales[:n]) + (None,) * (n - len(scales))


@lower(aten.upsample_nearest1d.default, static_numbers=True)
def upsample_nearest1d(self, output_size, scales=None):
    return _upsample_nearest(self, tuple(output_size), (scales,))


@lower(aten.upsample_nearest2d.default, static_numbers=True)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w))


@lower(aten.upsample_nearest3d.default, static_numbers=True)
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_d, scales_h, scales_w))


@lower(aten._upsample_nearest_exact2d.default, static_numbers=True)
def upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w), exact=True)


def _zeros_input(input_size, grad):
    return jnp.zeros(tuple(input_size), grad.dtype)


@lower(aten.upsample_nearest1d_backward.default, static_numbers=True)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _vjp(lambda x: _upsample_nearest(x, tuple(output_size), (scales,)),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten.upsample_nearest2d_backward.default, static_numbers=True)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _vjp(lambda x: _upsample_nearest(x, tuple(output_size), (scales_h, scales_w)),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten.upsample_nearest3d_backward.default, static_numbers=True)
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    return _vjp(lambda x: _upsample_nearest(x, tuple(output_size), (scales_d, scales_h, scales_w)),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten._upsample_nearest_exact2d_backward.default, static_numbers=True)
def upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _vjp(lambda x: _upsample_nearest(x, tuple(output_size), (scales_h, scales_w), exact=True),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten.upsample_linear1d.default, static_numbers=True)
def upsample_linear1d(self, output_size, align_corners, scales=None):
    return _upsample_linear(self, tuple(output_size), align_corners, (scales,))


@lower(aten.upsample_bilinear2d.default, static_numbers=True)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(self, tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_trilinear3d.default, static_numbers=True)
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear(self, tuple(output_size), align_corners, (scales_d, scales_h, scales_w))


@lower(aten.upsample_linear1d_backward.default, static_numbers=True)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    return _vjp(lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales,)),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten.upsample_bilinear2d_backward.default, static_numbers=True)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    return _vjp(lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales_h, scales_w)),
                _zeros_input(input_size, grad_output), grad_output)


@lower(aten.upsample_trilinear3d_backward.default, static_numbers=True)
def upsample_trilinear3d_backward(grad_output, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    return _vjp(lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales_d, scales_h, scales_w)),
                _zeros_input(input_size, grad_output), grad_output)
