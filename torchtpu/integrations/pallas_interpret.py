"""Two gaps of jax 0.10's Pallas TPU interpreter that the ragged paged-attention kernel falls into.

Off TPU, :mod:`.ragged_attention` runs JAX's TPU kernel in the TPU
interpreter (``force_tpu_interpret_mode``), which simulates its DMAs and
semaphores on the host. As shipped, the interpreter cannot run that kernel:

- a load through a reshaped or bitcast ref (``kv_ref.reshape(...)[::step]``,
  ``ref.bitcast(uint32)``) fails: it turns transforms into a range and knows
  only indexers;
- a masked store into a ref of rank > 1 fails its bounds check, which masks
  rows by every dimension's size instead of each dimension's own.

:func:`install` teaches it both, once, only in the calls that fail today:
a load whose transforms go beyond indexing reads the indexed buffer and
applies the rest on the host (a bitcast packing along the second-minor axis,
as Mosaic does); a masked store that the bounds check refuses becomes read,
select, plain store. Nothing runs differently for a kernel the interpreter
ran before. Nothing here is used on a TPU.
"""

from __future__ import annotations

import functools

import jax
import numpy as np


def _index(index):
    """A slice or int from an interpreter indexer entry (a Slice of ints, or an int)."""
    if isinstance(index, (int, np.integer)):
        return int(index)
    start, size, stride = int(index.start), int(index.size), int(index.stride)
    return slice(start, start + size * stride, stride)


def _bitcast(value: np.ndarray, dtype) -> np.ndarray:
    """Mosaic's ref bitcast: a wider dtype packs consecutive rows (second-minor axis), the first in the low bits."""
    dtype = np.dtype(dtype)
    ratio = dtype.itemsize // value.dtype.itemsize
    if ratio == 1:
        return value.view(dtype)
    if ratio < 1:
        raise NotImplementedError(f"torchtpu: interpreter bitcast {value.dtype} -> {dtype} (to a narrower dtype)")
    *lead, rows, cols = value.shape
    packed = np.ascontiguousarray(value.reshape(*lead, rows // ratio, ratio, cols).swapaxes(-1, -2))
    return packed.view(dtype)[..., 0]


def _apply(value: np.ndarray, transform, types, indexing) -> np.ndarray:
    if isinstance(transform, types.ReshapeTransform):
        return value.reshape(transform.shape)
    if isinstance(transform, types.BitcastTransform):
        return _bitcast(value, transform.dtype)
    if isinstance(transform, indexing.NDIndexer):
        return value[tuple(_index(i) for i in jax.tree.map(int, transform).indices)]
    raise NotImplementedError(f"torchtpu: the Pallas TPU interpreter cannot load through {transform}")


@functools.cache
def install() -> None:
    """Patch the interpreter's load and store callbacks (idempotent)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
    from jax._src.state import indexing, types

    get, swap = interpreter.get.__wrapped__, interpreter.swap.__wrapped__

    def get_through_views(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        first = next((i for i, t in enumerate(transforms) if not isinstance(t, indexing.NDIndexer)), len(transforms))
        token, value = get(token, device_id, local_core_id, memory_space, buffer_id, tuple(transforms[:first]),
                           *args, **kwargs)
        for transform in transforms[first:]:
            value = _apply(value, transform, types, indexing)
        return token, value

    def masked_swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, **kwargs):
        where = (device_id, local_core_id, memory_space, buffer_id, transforms)
        try:
            return swap(token, *where, val, mask, **kwargs)
        except ValueError:
            if mask is None:
                raise
        token, old = get(token, *where, **kwargs)  # raises if the range is out of bounds after all
        mask, val = np.asarray(mask), np.asarray(val)
        token, _ = swap(token, *where, np.where(mask, val, old), None, **kwargs)
        return token, np.where(mask, old, val)  # what a masked swap returns

    # The DMA engine calls ``get.__wrapped__``: keep that attribute the undecorated function.
    interpreter.get = interpreter.fail_on_exception(get_through_views)
    interpreter.swap = interpreter.fail_on_exception(masked_swap)
