"""Lowerings: shape ops that copy (views are PyTorch's own and need none).

Concatenation, flips and rolls, repeats, triangles, padding (and the padding
backwards), the ``*_scatter`` family that writes a view's values into a copy,
the ``*_copy`` variants of view ops, and im2col / col2im.  Shapes and dtypes
are checked by the meta kernel before these run.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .common import canonical_dim, result_dtype
from .registry import aten, lower


def _dim(dim, ndim):
    return canonical_dim(dim, ndim)


# ---- concatenation ----------------------------------------------------------------


@lower(aten.cat.default)
def cat(tensors, dim=0):
    # CPU's legacy rule: 1-d empty tensors are skipped whatever their shape.
    dtype = result_dtype(*tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    axis = _dim(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    dtype = result_dtype(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=_dim(dim, tensors[0].ndim + 1))


# ---- reordering -----------------------------------------------------------------------


@lower(aten.flip.default)
def flip(self, dims):
    if self.ndim == 0:
        return self
    return jnp.flip(self, axis=tuple(_dim(d, self.ndim) for d in dims))


@lower(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), axis=tuple(_dim(d, self.ndim) for d in dims))


@lower(aten.repeat.default)
def repeat(self, repeats):
    # Leading repeats beyond self's rank add new dims.
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


@lower(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lower(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


# ---- padding ------------------------------------------------------------------------------


def _pad_pairs(ndim, pad):
    """PyTorch's flat pad list (last dim first) as (low, high) for every dim."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    # lax.pad takes negative amounts too: they crop, as in PyTorch.
    config = [(lo, hi, 0) for lo, hi in _pad_pairs(self.ndim, pad)]
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


def _mode_pad(mode):
    def padded(x, padding):
        pairs = _pad_pairs(x.ndim, padding)
        # jnp.pad crops nothing, so negative amounts are applied as slices afterwards.
        grown = jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in pairs], mode=mode)
        crop = tuple(slice(-min(lo, 0), grown.shape[d] + min(hi, 0)) for d, (lo, hi) in enumerate(pairs))
        return grown[crop]

    return padded


_reflect = _mode_pad("reflect")
_replicate = _mode_pad("edge")


def _pad_backward(forward):
    """The adjoint of a padding: each output gradient flows back to the input element it copied."""

    def backward(grad_output, self, padding):
        _, pullback = jax.vjp(lambda x: forward(x, padding), jnp.zeros(self.shape, grad_output.dtype))
        return pullback(grad_output)[0]

    return backward


lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)(_reflect)
lower(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)(_replicate)
lower(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
      aten.reflection_pad3d_backward.default)(_pad_backward(_reflect))
lower(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
      aten.replication_pad3d_backward.default)(_pad_backward(_replicate))


# ---- diagonals ---------------------------------------------------------------------------


def _diagonal_positions(length, offset):
    """Row and column indices of a length-``length`` diagonal at ``offset``."""
    i = jnp.arange(length)
    return i + max(-offset, 0), i + max(offset, 0)


@lower(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    n = self.shape[-1]
    m = n + abs(offset)
    rows, cols = _diagonal_positions(n, offset)
    square = jnp.zeros(self.shape[:-1] + (m, m), self.dtype).at[..., rows, cols].set(self)
    ndim = self.ndim + 1
    return jnp.moveaxis(square, (-2, -1), (_dim(dim1, ndim), _dim(dim2, ndim)))


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    moved = jnp.moveaxis(self, (d1, d2), (-2, -1))
    rows, cols = _diagonal_positions(src.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


# ---- writing a view's values into a copy -------------------------------------------------------


@lower(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    where = [slice(None)] * self.ndim
    where[_dim(dim, self.ndim)] = slice(start, end, step)
    return self.at[tuple(where)].set(src.astype(self.dtype))


@lower(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    where = [slice(None)] * self.ndim
    where[_dim(dim, self.ndim)] = index
    return self.at[tuple(where)].set(src.astype(self.dtype))


def _strided_positions(size, stride, offset):
    positions = jnp.full(tuple(size), offset, jnp.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        positions = positions + lax.broadcasted_iota(jnp.int64, tuple(size), d) * st
    return positions


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    # The result is a contiguous copy of self, and the view is taken of that copy.
    positions = _strided_positions(size, stride, storage_offset or 0)
    flat = self.reshape(-1).at[positions].set(src.astype(self.dtype).reshape(tuple(size)))
    return flat.reshape(self.shape)


@lower(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    input_sizes = tuple(input_sizes)
    if not input_sizes:
        return grad_in.reshape(())
    axis = _dim(dim, len(input_sizes))
    windows = grad_in.shape[axis]
    # grad_in is (..., windows, ..., size): bring (windows, size) to the front.
    g = jnp.moveaxis(jnp.moveaxis(grad_in, axis, 0), -1, 1)
    positions = jnp.arange(windows)[:, None] * step + jnp.arange(size)[None, :]
    rest = input_sizes[:axis] + input_sizes[axis + 1:]
    total = jnp.zeros((input_sizes[axis],) + rest, grad_in.dtype).at[positions].add(g)
    return jnp.moveaxis(total, 0, axis)


# ---- copying variants of view ops ----------------------------------------------------------------


@lower(aten.alias_copy.default)
def alias_copy(self):
    return self


@lower(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
    axis = _dim(dim, self.ndim)
    if start < 0:
        start += self.shape[axis]
    return lax.slice_in_dim(self, start, start + length, axis=axis)


@lower(aten._reshape_copy.default, aten.view_copy.default)
def reshape_copy(self, size):
    return jnp.reshape(self, tuple(_infer_size(size, math.prod(self.shape))))


def _infer_size(size, numel):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = numel // known if known else 0
    return size


@lower(aten.expand_copy.default)
def expand_copy(self, size, *, implicit=False):
    lead = len(size) - self.ndim
    target = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(self, target)


@lower(aten.permute_copy.default)
def permute_copy(self, dims):
    return jnp.transpose(self, tuple(_dim(d, self.ndim) for d in dims))


@lower(aten.split_with_sizes_copy.default)
def split_with_sizes_copy(self, split_sizes, dim=0):
    axis = _dim(dim, self.ndim)
    bounds = [0]
    for s in split_sizes:
        bounds.append(bounds[-1] + s)
    return [lax.slice_in_dim(self, lo, hi, axis=axis) for lo, hi in zip(bounds, bounds[1:])]


@lower(aten.t_copy.default)
def t_copy(self):
    return self.T if self.ndim == 2 else self


@lower(aten.transpose_copy.int)
def transpose_copy(self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim))


@lower(aten.slice_copy.Tensor)
def slice_copy(self, dim=0, start=None, end=None, step=1):
    where = [slice(None)] * self.ndim
    where[_dim(dim, self.ndim)] = slice(start, end, step)
    return self[tuple(where)]


@lower(aten.select_copy.int)
def select_copy(self, dim, index):
    return jnp.take(self, index, axis=_dim(dim, self.ndim))


@lower(aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze_copy(self, dim=None):
    dims = range(self.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    axes = tuple(sorted({_dim(d, self.ndim) for d in dims if self.ndim and self.shape[_dim(d, self.ndim)] == 1}))
    return jnp.squeeze(self, axes) if axes else self


@lower(aten.unsqueeze_copy.default)
def unsqueeze_copy(self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


@lower(aten.detach_copy.default)
def detach_copy(self):
    return self


@lower(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(self, groups):
    """(N, g * c, *) -> (N, c * g, *): channel i * c + j moves to j * g + i."""
    n, channels = self.shape[:2]
    grouped = self.reshape((n, groups, channels // groups) + self.shape[2:])
    return jnp.swapaxes(grouped, 1, 2).reshape(self.shape)


@lower(aten.split_copy.Tensor)
def split_copy(self, split_size, dim=0):
    axis = _dim(dim, self.ndim)
    n = self.shape[axis]
    sizes = [min(split_size, n - lo) for lo in range(0, n, split_size)] if split_size else [n]
    return split_with_sizes_copy(self, sizes or [0], dim)


@lower(aten.diagonal_copy.default)
def diagonal_copy(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


@lower(aten.unbind_copy.int)
def unbind_copy(self, dim=0):
    axis = _dim(dim, self.ndim)
    return [jnp.take(self, i, axis=axis) for i in range(self.shape[axis])]


# ---- im2col / col2im -------------------------------------------------------------------------------


def _im2col(x, kernel_size, dilation, padding, stride):
    """Sliding blocks of a (N, C, H, W) input as (N, C * kh * kw, blocks), PyTorch's order."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    x = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out_h = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    out_w = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    blocks = [
        x[:, :, i * dh: i * dh + (out_h - 1) * sh + 1: sh, j * dw: j * dw + (out_w - 1) * sw + 1: sw]
        for i in range(kh)
        for j in range(kw)
    ]
    n, c = x.shape[:2]
    return jnp.stack(blocks, axis=2).reshape(n, c * kh * kw, out_h * out_w)


@lower(aten.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    batched = self.ndim == 4
    x = self if batched else self[None]
    cols = _im2col(x, kernel_size, dilation, padding, stride)
    return cols if batched else cols[0]


@lower(aten.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    # col2im is the adjoint of im2col: overlapping blocks sum into the image.
    batched = self.ndim == 3
    cols = self if batched else self[None]
    channels = cols.shape[1] // (kernel_size[0] * kernel_size[1])
    image = jnp.zeros((cols.shape[0], channels) + tuple(output_size), cols.dtype)
    _, pullback = jax.vjp(lambda x: _im2col(x, kernel_size, dilation, padding, stride), image)
    result = pullback(cols)[0]
    return result if batched else result[0]
