"""Lowerings: indexing ops (advanced indexing, gather/scatter, index_*, masks, search, unique).

Out-of-range indices.  CPU raises ("index 5 is out of bounds for dimension 0
with size 3"); a compiled program cannot.  Our rule:

- ops that already run eagerly because their output shape depends on the data
  (``index.Tensor``, which must count a boolean mask's ``True``s, and
  ``masked_select``, ``nonzero``, ``unique``) check their indices on the host
  and raise CPU's error;
- compiled ops (gather, scatter, index_select, index_put, take, put,
  embedding backward...) do not check.  An out-of-range read is clamped by
  XLA and an out-of-range write is dropped, like a CUDA kernel that skips its
  device-side assert.  The tests mark this as a strict xfail.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..core import dtypes
from ..runtime import device as runtime_device
from .common import canonical_dim, is_integer
from .registry import aten, lower


def _dim(dim, ndim):
    return canonical_dim(dim, ndim)


def _is_mask(index) -> bool:
    return index is not None and index.dtype in (jnp.bool_, jnp.uint8)


def _meta(array):
    return torch.empty(array.shape, dtype=dtypes.to_torch(array.dtype), device="meta")


# ---- advanced indexing: index.Tensor ------------------------------------------------------


def _mask_to_indices(self_shape, indices):
    """Replace each boolean mask by the integer indices of its Trues (reads the mask).

    A k-dim mask stands for k consecutive dims of self, as in PyTorch.
    """
    expanded, dim = [], 0
    for index in indices:
        if not _is_mask(index):
            expanded.append(index)
            dim += 1
            continue
        for k, n in enumerate(index.shape):
            if dim + k >= len(self_shape) or self_shape[dim + k] != n:
                raise IndexError(
                    f"The shape of the mask {list(index.shape)} at index {k} does not match the shape of "
                    f"the indexed tensor {list(self_shape)} at index {dim + k}")
        if index.ndim == 0:
            # PyTorch turns a Python bool index into unsqueeze before it reaches us.
            raise NotImplementedError("torchtpu: indexing with a 0-dim boolean mask tensor is not supported")
        expanded.extend(jnp.nonzero(index))
        dim += index.ndim
    return expanded


@jax.jit
def _first_out_of_range(index, size):
    """(any out of range?, first such value) for one index array."""
    bad = (index < -size) | (index >= size)
    flat = index.reshape(-1)
    return jnp.any(bad), flat[jnp.argmax(bad.reshape(-1))]


def _raise_out_of_range(self_shape, indices, positions, bad) -> None:
    """CPU's IndexError for the first index array with an entry out of range."""
    for position, out_of_range in zip(positions, bad):
        if out_of_range:
            size = self_shape[position]
            _, value = _first_out_of_range(indices[position], jnp.asarray(size, indices[position].dtype))
            raise IndexError(f"index {int(value)} is out of bounds for dimension {position} with size {size}")


@functools.partial(jax.jit, static_argnums=(2,))
def _gather_advanced(self, arrays, positions):
    """self[indices] with None entries as full slices (PyTorch's index.Tensor), and for
    each index array whether an entry is out of range: one program, one read of the flags."""
    where = [slice(None)] * self.ndim
    bad = []
    for position, array in zip(positions, arrays):
        where[position] = array
        size = self.shape[position]
        bad.append(jnp.any((array < -size) | (array >= size)))
    return self[tuple(where)], jnp.stack(bad) if bad else jnp.zeros((0,), bool)


@lower(aten.index.Tensor, data_dependent=True)
def index(self, indices):
    indices = _mask_to_indices(self.shape, indices)
    # PyTorch's meta kernel raises CPU's errors for index dtypes, counts and broadcasting.
    aten.index.Tensor(_meta(self), [None if i is None else _meta(i) for i in indices])
    positions = tuple(p for p, i in enumerate(indices) if i is not None)
    result, bad = _gather_advanced(self, [indices[p] for p in positions], positions)
    # Eager mode raises CPU's IndexError; inside a compiled graph the values are
    # not known yet and, as on CUDA, the check is skipped.
    if not isinstance(bad, jax.core.Tracer) and np.asarray(bad).any():
        _raise_out_of_range(self.shape, indices, positions, np.asarray(bad))
    return result


@lower(aten._unsafe_index.Tensor)
def unsafe_index(self, indices):
    # Used by decompositions with indices known to be in range; no masks, no checks.
    where = tuple(slice(None) if i is None else i for i in indices)
    return self[where]


# ---- writes that move bits ---------------------------------------------------------------------


def set_bits(x, where, values):
    """``x.at[where].set(values, mode="drop")``, moving the values' bits unchanged.

    XLA:CPU scatters bfloat16 and float16 through float32, converting all of
    ``x`` and back (NaN payloads canonicalised, float32 copies of the whole
    operand). There it scatters the 16-bit patterns instead: the bits are kept
    as by PyTorch's copy, and its two bitcasts copy half as many bytes (XLA:CPU
    materialises them too). TPU and GPU scatter 16-bit floats natively.
    """
    values = jnp.asarray(values).astype(x.dtype)
    if x.dtype not in (jnp.bfloat16, jnp.float16) or runtime_device.platform() != "cpu":
        return x.at[where].set(values, mode="drop")
    bits = lax.bitcast_convert_type(x, jnp.uint16).at[where].set(lax.bitcast_convert_type(values, jnp.uint16),
                                                                 mode="drop")
    return lax.bitcast_convert_type(bits, x.dtype)


# ---- index_put ----------------------------------------------------------------------------------


def _masks_as_padded_indices(self_shape, indices):
    """Boolean masks as integer indices padded to the mask size with an out-of-range
    position, so a compiled scatter (mode='drop') skips the padding.

    Returns the index list and, if a mask was present, its padded length.
    """
    expanded, dim, padded = [], 0, None
    for index in indices:
        if not _is_mask(index):
            expanded.append(index)
            dim += 1
            continue
        if index.ndim == 0:
            raise NotImplementedError("torchtpu: index_put with a 0-dim boolean mask is not supported")
        size = index.size
        coordinates = jnp.nonzero(index, size=size, fill_value=0)
        valid = jnp.arange(size) < jnp.count_nonzero(index)
        for k, c in enumerate(coordinates):
            # Past the last True, point at position self_shape (out of range: dropped).
            expanded.append(jnp.where(valid, c, self_shape[dim + k]))
        dim += index.ndim
        padded = size
    return expanded, padded


def _result_axis_of_mask(self_ndim, indices):
    """Where the (last) broadcast index dim lands in the indexing result, numpy's rule."""
    positions = [p for p, i in enumerate(indices) if i is not None]
    broadcast = jnp.broadcast_shapes(*[indices[p].shape for p in positions])
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    start = positions[0] if adjacent else 0
    return start + len(broadcast) - 1, broadcast


@lower(aten.index_put.default, aten._index_put_impl.default)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    indices, padded = _masks_as_padded_indices(self.shape, indices)
    indices = indices + [None] * (self.ndim - len(indices))
    values = values.astype(self.dtype)
    if padded is not None:
        values = _pad_values_to_mask(self, indices, values, padded)
    where = tuple(slice(None) if i is None else i for i in indices)
    if not accumulate:
        return set_bits(self, where, values)
    target = self.at[where]
    if self.dtype == jnp.bool_:
        return target.max(values, mode="drop")
    return target.add(values, mode="drop")


def _pad_values_to_mask(self, indices, values, padded):
    """Values given for the mask's Trues, padded along that dim to the padded mask length."""
    axis, broadcast = _result_axis_of_mask(self.ndim, indices)
    result_ndim = self.ndim - sum(i is not None for i in indices) + len(broadcast)
    value_axis = axis - (result_ndim - values.ndim)
    if value_axis < 0 or values.shape[value_axis] in (1, padded):
        return values
    missing = padded - values.shape[value_axis]
    if missing < 0:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to the indexing result")
    widths = [(0, 0)] * values.ndim
    widths[value_axis] = (0, missing)
    return jnp.pad(values, widths)


# ---- index_select / index_add / index_copy / index_fill ------------------------------------------


def _along(ndim, dim, index):
    where = [slice(None)] * max(ndim, 1)
    where[_dim(dim, ndim)] = index
    return tuple(where)


@lower(aten.index_select.default)
def index_select(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1)[index.reshape(-1)].reshape(())  # CPU allows a 1-element index here
    return jnp.take(self, index.reshape(-1), axis=_dim(dim, self.ndim), mode="clip")


def _at_index(self, dim, index):
    flat = self.reshape(1) if self.ndim == 0 else self
    return flat, flat.at[_along(self.ndim, dim, index.reshape(-1))]


def _source_along(self, dim, source, index):
    """source shaped like self with dim replaced by the index length."""
    if self.ndim == 0:
        return source.reshape(index.reshape(-1).shape)
    return source.astype(self.dtype)


@lower(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    _, target = _at_index(self, dim, index)
    scaled = source if isinstance(alpha, (int, bool)) and alpha == 1 else source * alpha
    if self.dtype == jnp.bool_:
        result = target.max(_source_along(self, dim, scaled.astype(bool), index), mode="drop")
    else:
        result = target.add(_source_along(self, dim, scaled.astype(self.dtype), index), mode="drop")
    return result.reshape(self.shape)


@lower(aten.index_copy.default)
def index_copy(self, dim, index, source):
    flat = _flat_if_scalar(self)
    where = _along(self.ndim, dim, index.reshape(-1))
    return set_bits(flat, where, _source_along(self, dim, source, index)).reshape(self.shape)


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    flat = _flat_if_scalar(self)
    return set_bits(flat, _along(self.ndim, dim, index.reshape(-1)), jnp.asarray(value)).reshape(self.shape)


@lower(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if self.ndim == 0:
        return _reduce_into(self.reshape(1), (index.reshape(-1),), source.reshape(-1), reduce,
                            include_self).reshape(())
    return _reduce_into(self, _along(self.ndim, dim, index.reshape(-1)), source.astype(self.dtype),
                        reduce, include_self)


# ---- gather / scatter ----------------------------------------------------------------------------------


def _grid(index, dim):
    """Full coordinates of every index element: iotas everywhere but ``dim``."""
    if index.ndim == 0:
        return (index.reshape(()),)
    return tuple(
        index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim)
    )


def _flat_if_scalar(x):
    return x.reshape(1) if x.ndim == 0 else x


@lower(aten.gather.default)
def gather(self, dim, index, *, sparse_grad=False):
    if index.size == 0:  # CPU skips its shape checks for an empty index
        return jnp.zeros(index.shape, self.dtype)
    if self.ndim == 0:
        return self.reshape(1)[index.reshape(-1)].reshape(index.shape)
    return self[_grid(index, _dim(dim, self.ndim))]


def _source_block(src, index):
    """The leading block of src that lines up with index (src may be larger)."""
    if jnp.ndim(src) == 0:
        return src
    return src[tuple(slice(0, n) for n in index.shape)]


def _unchanged_by_empty_index(scatter_fn):
    """A scatter with an empty index returns ``self``: CPU skips its shape checks then."""

    @functools.wraps(scatter_fn)
    def lowered(self, dim, index, *args, **kwargs):
        if index.size == 0:
            return self
        return scatter_fn(self, dim, index, *args, **kwargs)

    return lowered


def _scatter_target(self, dim, index):
    x = _flat_if_scalar(self)
    return x, _grid(_flat_if_scalar(index), _dim(dim, self.ndim))


@lower(aten.scatter.src, aten.scatter.value)
@_unchanged_by_empty_index
def scatter(self, dim, index, src=None, value=None):
    src = value if src is None else src
    x, grid = _scatter_target(self, dim, index)
    block = _source_block(jnp.asarray(src), _flat_if_scalar(index))
    return set_bits(x, grid, block).reshape(self.shape)


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
@_unchanged_by_empty_index
def scatter_reduce_legacy(self, dim, index, src=None, value=None, *, reduce):
    src = value if src is None else src
    x, grid = _scatter_target(self, dim, index)
    block = _source_block(jnp.asarray(src), _flat_if_scalar(index)).astype(x.dtype)
    block = jnp.broadcast_to(block, grid[0].shape)
    reduced = x.at[grid].multiply(block, mode="drop") if reduce == "multiply" else _add_at(x, grid, block)
    return reduced.reshape(self.shape)


def _add_at(x, where, values):
    target = x.at[where]
    return target.max(values, mode="drop") if x.dtype == jnp.bool_ else target.add(values, mode="drop")


@lower(aten.scatter_add.default)
@_unchanged_by_empty_index
def scatter_add(self, dim, index, src):
    x, grid = _scatter_target(self, dim, index)
    return _add_at(x, grid, _source_block(src, _flat_if_scalar(index)).astype(x.dtype)).reshape(self.shape)


def _identity(reduce, dtype):
    """The value that leaves a reduction unchanged, for include_self=False."""
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _reduce_into(x, where, values, reduce, include_self):
    """Reduce ``values`` into ``x`` at ``where``, PyTorch's scatter_reduce / index_reduce semantics."""
    values = jnp.broadcast_to(values.astype(x.dtype), x[where].shape)
    base = x if include_self else x.at[where].set(_identity(reduce, x.dtype), mode="drop")
    target = base.at[where]
    if reduce in ("sum", "mean"):
        result = _add_at(base, where, values) if x.dtype == jnp.bool_ else target.add(values, mode="drop")
    elif reduce == "prod":
        result = target.multiply(values, mode="drop")
    elif reduce == "amax":
        result = target.max(values, mode="drop")
    else:
        result = target.min(values, mode="drop")
    if reduce == "mean":
        counts = jnp.zeros(x.shape, jnp.int64).at[where].add(1, mode="drop") + (1 if include_self else 0)
        safe = jnp.maximum(counts, 1).astype(x.dtype)
        divided = jnp.floor_divide(result, safe) if is_integer(result) else result / safe
        result = jnp.where(counts > 0, divided, x)
    return result


@lower(aten.scatter_reduce.two)
@_unchanged_by_empty_index
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    x, grid = _scatter_target(self, dim, index)
    block = _source_block(src, _flat_if_scalar(index))
    return _reduce_into(x, grid, block, reduce, include_self).reshape(self.shape)


# ---- masks ------------------------------------------------------------------------------------------------


@lower(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    # The k-th True takes source's k-th element: its rank among the Trues is a cumsum.
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    x, m = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
    flat_mask = m.reshape(-1)
    rank = jnp.cumsum(flat_mask.astype(jnp.int64)) - 1
    flat_source = source.reshape(-1).astype(self.dtype)
    if flat_source.size == 0:
        return x
    taken = flat_source[jnp.clip(rank, 0, flat_source.size - 1)]
    return jnp.where(flat_mask, taken, x.reshape(-1)).reshape(shape)


def _broadcast_error(a, b):
    return RuntimeError(
        f"The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension")


@lower(aten.masked_select.default, data_dependent=True)
def masked_select(self, mask):
    if mask.dtype != jnp.bool_:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    try:
        shape = jnp.broadcast_shapes(self.shape, mask.shape)
    except ValueError:
        aten.masked_select.default(_meta(self), _meta(mask))  # CPU's broadcasting error
        raise
    return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]


@lower(aten.nonzero.default, data_dependent=True)
def nonzero(self):
    if self.ndim == 0:
        return jnp.zeros((int(self != 0), 0), jnp.int64)
    return jnp.argwhere(self).astype(jnp.int64)


@lower(aten.nonzero_static.default, static_numbers=True)
def nonzero_static(self, *, size, fill_value=-1):
    """The first ``size`` rows of nonzero(self), padded with ``fill_value``: a static shape."""
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    coordinates = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack(coordinates, axis=1).astype(jnp.int64)


@lower(aten.argwhere.default, data_dependent=True)
def argwhere(self):
    return nonzero(self)


# ---- take / put ---------------------------------------------------------------------------------------------


@lower(aten.take.default)
def take(self, index):
    return self.reshape(-1)[index]


@lower(aten.put.default)
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    values = source.reshape(-1).astype(self.dtype)
    where = index.reshape(-1)
    result = _add_at(flat, where, values) if accumulate else flat.at[where].set(values, mode="drop")
    return result.reshape(self.shape)


# ---- embedding backward ----------------------------------------------------------------------------------------


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = grad_output.reshape(flat.shape[0], -1)
    keep = (flat != padding_idx)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat].add(1, mode="drop")
        grad = grad / counts[flat][:, None]
    grad = jnp.where(keep, grad, jnp.zeros((), grad.dtype))
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[flat].add(grad, mode="drop")


# ---- searching --------------------------------------------------------------------------------------------------


def _search(sorted_sequence, values, side, sorter):
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    values = jnp.asarray(values)
    if sorted_sequence.ndim <= 1:
        return jnp.searchsorted(sorted_sequence, values, side=side)
    lead = sorted_sequence.shape[:-1]
    seqs = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    vals = values.reshape(seqs.shape[0], -1)
    found = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(seqs, vals)
    return found.reshape(lead + values.shape[-1:])


def _side(right, side):
    return side if side is not None else ("right" if right else "left")


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if not hasattr(self, "dtype") or self.dtype != sorted_sequence.dtype:
        self = jnp.asarray(self).astype(jnp.result_type(sorted_sequence, self))
        sorted_sequence = sorted_sequence.astype(self.dtype)
    return _search(sorted_sequence, self, _side(right, side), sorter)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return searchsorted(boundaries, self, right=right)


# ---- unique / histc -------------------------------------------------------------------------------------------------


@lower(aten._unique2.default, data_dependent=True)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # CPU sorts whether or not it is asked to.
    values, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    inverse = inverse.reshape(self.shape).astype(jnp.int64) if return_inverse else jnp.zeros((0,), jnp.int64)
    counts = counts.astype(jnp.int64) if return_counts else jnp.zeros((0,), jnp.int64)
    return values, inverse, counts


@lower(aten.unique_consecutive.default, data_dependent=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    """Collapse runs of equal elements (of equal slices along ``dim``) to one."""
    axis = 0 if dim is None else _dim(dim, self.ndim)
    x = self.reshape(-1) if dim is None else jnp.moveaxis(self, axis, 0)
    if x.shape[0] == 0:
        starts = jnp.zeros((0,), bool)
    else:
        differs = (x[1:] != x[:-1]).reshape(x.shape[0] - 1, math.prod(x.shape[1:])).any(axis=1)
        starts = jnp.concatenate([jnp.ones((1,), bool), differs])
    values = x[starts] if dim is None else jnp.moveaxis(x[starts], 0, axis)
    run = jnp.cumsum(starts) - 1
    inverse = (run.reshape(self.shape) if dim is None else run) if return_inverse else jnp.zeros((0,), jnp.int64)
    counts = jnp.diff(jnp.append(jnp.flatnonzero(starts), x.shape[0])) if return_counts else jnp.zeros((0,))
    return values, inverse.astype(jnp.int64), counts.astype(jnp.int64)


@lower(aten.repeat_interleave.Tensor, data_dependent=True)
def repeat_interleave(repeats, *, output_size=None):
    """``i`` repeated ``repeats[i]`` times, for each i in order."""
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.size and int(jnp.min(repeats)) < 0:
        raise RuntimeError("repeats can not be negative")
    total = int(jnp.sum(repeats)) if output_size is None else output_size
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=total)


@lower(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    # min == max means "use the data's range"; a constant range is widened by one each way.
    data = self.reshape(-1)
    lo, hi = jnp.asarray(min, self.dtype), jnp.asarray(max, self.dtype)
    empty = data.size == 0
    lo, hi = (
        jnp.where(lo == hi, jnp.min(data) if not empty else 0, lo),
        jnp.where(lo == hi, jnp.max(data) if not empty else 0, hi),
    )
    lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    position = ((data - lo) * bins / (hi - lo)).astype(jnp.int64)
    position = jnp.where(data == hi, bins - 1, position)
    inside = (data >= lo) & (data <= hi)
    return jnp.zeros((bins,), self.dtype).at[jnp.where(inside, position, bins)].add(1, mode="drop")
