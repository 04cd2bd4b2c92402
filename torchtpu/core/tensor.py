"""The tpu tensor representation.  This is the only module that reads its fields.

Other layers use its functions and ``Buffer``'s public members (``value``,
``array``, ``layout``, ``set``), never the attributes behind them.

A tpu tensor is a plain PrivateUse1 ``torch.Tensor`` with a real, non-owning
storage at a fake, unique address.  PyTorch's own CPU metadata kernels make
views of it, so aliasing, strides, offsets and version counters are exactly
CPU's.  The device data lives on the storage object as a ``Buffer``: a jax
array plus the layout ``(size, stride, offset)`` through which the array maps
onto the storage's elements.  The array keeps the shape of the tensor that
wrote it, so the common case (a tensor covering its whole storage) needs no
reshaping, and a sharded array keeps its sharding.

``view_of`` and ``with_view_written`` are pure jax functions: executors call
them inside their compiled programs, so reading or writing through a view
costs no extra dispatch.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._C import DispatchKey, DispatchKeySet

from ..runtime import context, memory, native
from ..runtime import device as runtime_device
from . import dtypes

_CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset._handle
# Fake addresses: a high range no host pointer uses, spaced so storages never overlap.
_address_lock = threading.Lock()
_next_free_address = 1 << 44


def _next_address(nbytes: int) -> int:
    global _next_free_address
    with _address_lock:
        address = _next_free_address
        _next_free_address += (nbytes // 256 + 1) * 256
    return address


# The arrays stored and not yet known to be computed, oldest first, each with
# its serial number: what ``torch.tpu.synchronize`` and an event must wait for.
# Every op's results land in a Buffer, so this covers all of torchtpu's queued
# work, and a result nobody holds any more is nothing to wait for (weak refs).
_dispatched: "collections.deque[tuple[int, weakref.ref]]" = collections.deque()
_dispatch_serial = 0
_prune_at = 1 << 14


def _pending(array) -> bool:
    """An array still to be waited for (a fused graph may have donated it: then it is nothing to wait for)."""
    return array is not None and not array.is_deleted()


def wait_for_dispatched(up_to: int | None = None) -> None:
    """Block until every array stored so far (up to serial ``up_to``) is computed.

    Arrays found computed leave the queue, so each is waited for once: a wait
    costs what it waits for, not what was ever dispatched."""
    while _dispatched and (up_to is None or _dispatched[0][0] <= up_to):
        array = _dispatched[0][1]()
        if _pending(array):
            array.block_until_ready()
        _dispatched.popleft()


def dispatched_ready(up_to: int) -> bool:
    """Whether every array stored up to serial ``up_to`` is computed (without waiting)."""
    while _dispatched and _dispatched[0][0] <= up_to:
        array = _dispatched[0][1]()
        if _pending(array) and not array.is_ready():
            return False
        _dispatched.popleft()
    return True


def _note_dispatched(array) -> None:
    global _dispatch_serial
    _dispatch_serial += 1
    _dispatched.append((_dispatch_serial, weakref.ref(array)))
    if len(_dispatched) >= _prune_at:
        _prune_dispatched()


def _prune_dispatched() -> None:
    """Drop references to arrays that are done or dead, so a program that never syncs stays bounded."""
    global _prune_at
    alive = [(n, r) for n, r in _dispatched if _pending(a := r()) and not a.is_ready()]
    _dispatched.clear()
    _dispatched.extend(alive)
    _prune_at = max(1 << 14, 2 * len(alive))


class Deferred:
    """A value that the pending fused graph will compute: shape and dtype now, data at the flush.

    Only a Buffer holds one; ``owner`` is that Buffer (weakly), so the flush
    knows which values are still wanted and where to put them.
    """

    __slots__ = ("graph", "index", "shape", "dtype", "owner", "__weakref__")

    def __init__(self, graph: int, index: int, shape: tuple, dtype):
        self.graph = graph  # serial number of the graph that makes it
        self.index = index  # position among the values that graph makes
        self.shape = shape
        self.dtype = dtype
        self.owner = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self):
        return f"Deferred(#{self.index}, {self.shape}, {self.dtype})"


def materialize(cause: str | None = None) -> None:
    """Run whatever the launcher has pending (fused mode), so every Buffer holds a real array."""
    context.current().flush(cause)


class Buffer:
    """Device data of one storage: an array, a Deferred (fused mode), or None until first written.

    ``array`` always gives a real array, running the pending graph if need
    be; executors that can handle a Deferred read ``value``, which never runs it.
    """

    __slots__ = ("_value", "layout", "address", "__weakref__")

    def __init__(self, array=None, layout=None):
        self._value = None
        self.layout = None
        self.address = None  # the fake address of the storage it backs, once it has one
        self.set(array, layout)

    @property
    def value(self):
        """The array, the Deferred that will become it, or None: whatever is there now."""
        return self._value

    @property
    def storage_dtype(self):
        """The dtype of the array the storage holds (known before a Deferred is computed), or None."""
        value = self._value
        return None if value is None else value.dtype

    @property
    def array(self):
        value = self._value
        if type(value) is Deferred:
            materialize()
            value = self._value
            if type(value) is Deferred:
                raise RuntimeError("torchtpu: the fused graph that computes this tensor failed (see the earlier error)")
        return value

    def set(self, array, layout):
        old = self._value
        if array is not old:
            memory.replaced(old, array)
        if array is not None and array is not old:
            if type(array) is Deferred:
                array.owner = weakref.ref(self)
            else:
                _note_dispatched(array)
        self._value = array
        self.layout = layout

    def __del__(self):
        if self._value is not None:
            memory.replaced(self._value, None)
        if self.address is not None:
            try:
                _forget_address(self)
            except TypeError:  # at interpreter exit, once this module's globals are gone
                pass


def contiguous_strides(size) -> tuple:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def layout_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset())


# Every live buffer by its storage's fake address (a weak reference, removed
# when the buffer dies).  C++ code sometimes wraps our address in a new
# storage (``from_blob``: legacy ``torch.save`` and ``pickle`` of a storage
# do); the address finds the buffer for it.  A plain dict of weak references
# costs a third of a WeakValueDictionary on the per-op path.
_buffers_by_address: "dict[int, weakref.ref]" = {}


def _register_address(buf: Buffer, address: int) -> None:
    _forget_address(buf)
    buf.address = address
    _buffers_by_address[address] = weakref.ref(buf)


def _forget_address(buf: Buffer) -> None:
    ref = _buffers_by_address.get(buf.address)
    if ref is not None and ref() in (buf, None):
        del _buffers_by_address[buf.address]


def _buffer_at(address: int) -> Buffer | None:
    ref = _buffers_by_address.get(address)
    return None if ref is None else ref()


def storage_buffer(storage) -> Buffer | None:
    """The Buffer torchtpu attached to a storage it made, or None (a host storage, or one C++ re-wrapped)."""
    return getattr(storage, "_tpu_buffer", None)


def buffer_of(t: torch.Tensor) -> Buffer:
    storage = t.untyped_storage()
    try:
        return storage._tpu_buffer
    except AttributeError:
        pass
    buf = _buffer_at(storage.data_ptr())
    if buf is None:
        raise RuntimeError("torchtpu: this tpu tensor has no device buffer; it was not created by torchtpu")
    storage._tpu_buffer = buf  # this alias keeps the data alive too, as a C++ DataPtr would
    return buf


def storage_numel(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def empty(size, dtype: torch.dtype, stride=None, offset: int = 0, array=None) -> torch.Tensor:
    """A new tpu tensor with its own storage, holding ``array`` (laid out as the
    tensor's view) or no data yet."""
    size = tuple(size)
    stride = contiguous_strides(size) if stride is None else tuple(stride)
    nbytes = _storage_nbytes(size, stride, offset, dtype.itemsize)
    address = _next_address(nbytes)
    device = runtime_device.TORCH_DEVICE
    runtime_device.claimed = True
    if native.module is not None:
        t = native.module.empty_at(address, nbytes, size, stride, offset, dtype, device.index)
        storage = t.untyped_storage()
    else:  # pure Python: three calls, and index 0 only
        storage = torch._C._construct_storage_from_data_pointer(address, device, nbytes)
        t = torch._C._acc.create_empty_tensor((0,), dtype)
        _SET_STORAGE.redispatch_boxed(_CPU_KEYS, t, storage, offset, size, stride)
    buf = storage._tpu_buffer = Buffer(array, None if array is None else (size, stride, offset))
    _register_address(buf, address)
    return t


@functools.lru_cache(maxsize=4096)
def _storage_nbytes(size: tuple, stride: tuple, offset: int, itemsize: int) -> int:
    """The bytes a new storage needs for a view of this layout (0 when it has no elements)."""
    if not all(size):
        return 0
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    return (offset + extent) * itemsize


def resize_storage(storage, nbytes: int) -> int | None:
    """``UntypedStorage.resize_`` of a tpu storage (FSDP2 frees and refills parameters so).

    The same storage keeps its Buffer, so every view of it stays valid: 0
    bytes releases the device array, growing keeps the bytes (the new tail
    reads as zeros), shrinking keeps the prefix.  Returns the storage's new
    fake address (the native hook then sets it and the size), or None when
    the size does not change.
    """
    old_nbytes = storage.nbytes()
    if nbytes == old_nbytes:
        return None
    buf = storage_buffer(storage) or _buffer_at(storage.data_ptr())
    if buf is None:
        raise RuntimeError("torchtpu: resize_ of a tpu storage torchtpu did not make")
    value, layout = buf.value, buf.layout
    if nbytes == 0 or value is None:
        value, layout = None, None
    elif nbytes < old_nbytes:
        value, layout = _prefix(buf.array, layout, nbytes, old_nbytes)
    address = _next_address(nbytes)
    _register_address(buf, address)
    buf.set(value, layout)
    return address


def _prefix(array, layout, nbytes: int, old_nbytes: int):
    """The first ``nbytes`` of a storage's array, flat (as bytes if they split an element)."""
    dtype = array.dtype if nbytes % array.dtype.itemsize == 0 else jnp.dtype(jnp.uint8)
    flat = ((nbytes // dtype.itemsize,), (1,), 0)
    with x64():
        return _reader(layout, flat, dtype, old_nbytes)(array), flat


def from_array(array: jax.Array, dtype: torch.dtype | None = None, stride=None) -> torch.Tensor:
    """Wrap a jax array as a new tpu tensor that owns it."""
    dtype = dtypes.to_torch(array.dtype) if dtype is None else dtype
    return empty(array.shape, dtype, stride, array=array)


def attach(t: torch.Tensor, array: jax.Array, layout) -> None:
    buffer_of(t).set(array, layout)


# ---- pure functions on arrays, used inside compiled programs ---------------


def is_contiguous_layout(layout) -> bool:
    size, stride, _ = layout
    return all(s == c or n <= 1 for s, c, n in zip(stride, contiguous_strides(size), size))


def _dense_permutation(layout):
    """The dim order that makes ``layout`` row-major and dense, or None."""
    size, stride, _ = layout
    order = sorted((i for i in range(len(size)) if size[i] > 1), key=lambda i: -stride[i])
    expected = 1
    for i in reversed(order):
        if stride[i] != expected:
            return None
        expected *= size[i]
    return order


def _index_grid(layout):
    size, stride, offset = layout
    idx = jnp.full(size, offset, dtype=jnp.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        if n > 1 and st != 0:
            idx = idx + jax.lax.broadcasted_iota(jnp.int64, size, d) * st
    return idx


def _gather(flat, layout):
    size, stride, offset = layout
    numel = math.prod(size)
    if numel == 0:
        return jnp.zeros(size, flat.dtype)
    order = _dense_permutation(layout)
    if order is not None:
        if type(offset) is int:
            block = jax.lax.slice(flat, (offset,), (offset + numel,))
        else:  # an offset passed at run time (see view_of)
            block = jax.lax.dynamic_slice(flat, (offset,), (numel,))
        block = block.reshape([size[i] for i in order])
        inverse = sorted(range(len(order)), key=lambda k: order[k])
        return jnp.transpose(block, inverse).reshape(size)
    return flat[_index_grid(layout)]


def _scatter(flat, layout, value):
    size, stride, offset = layout
    numel = math.prod(size)
    if numel == 0:
        return flat
    value = value.astype(flat.dtype).reshape(size)
    order = _dense_permutation(layout)
    if order is not None:
        squeezed = value.reshape([size[i] for i in sorted(order)])
        rank = {d: k for k, d in enumerate(sorted(order))}
        block = jnp.transpose(squeezed, [rank[d] for d in order]).reshape(-1)
        return jax.lax.dynamic_update_slice(flat, block, (offset,))
    return flat.at[_index_grid(layout)].set(value)


def _flatten(array, layout, numel):
    """The storage as a 1-d array of ``numel`` elements of ``array.dtype``."""
    if array is None:
        raise AssertionError("uninitialized buffers are handled by the caller")
    size, _, offset = layout
    if is_contiguous_layout(layout) and offset == 0 and math.prod(size) == numel:
        return array.reshape(-1)
    return _scatter(jnp.zeros((numel,), array.dtype), layout, array)


def _reinterpret(flat, dtype):
    """Bit-reinterpret a 1-d array as another dtype, like ``Tensor.view(dtype)``."""
    if flat.dtype == dtype:
        return flat
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):
        real = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
        return _reinterpret(real, dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.dtype(dtype).itemsize // 2
        real_dtype = jnp.float32 if part == 4 else jnp.float64
        pairs = _reinterpret(flat, real_dtype).reshape(-1, 2)
        return jax.lax.complex(pairs[:, 0], pairs[:, 1])
    if flat.dtype == jnp.bool_:
        return _reinterpret(flat.astype(jnp.uint8), dtype)
    if dtype == jnp.bool_:
        return _reinterpret(flat, jnp.uint8) != 0
    src, dst = jnp.dtype(flat.dtype).itemsize, jnp.dtype(dtype).itemsize
    if src == dst:
        return jax.lax.bitcast_convert_type(flat, dtype)
    if src > dst:
        return jax.lax.bitcast_convert_type(flat, dtype).reshape(-1)
    return jax.lax.bitcast_convert_type(flat.reshape(-1, dst // src), dtype)


def view_of(array, src_layout, dst_layout, dtype, nbytes, offset=None):
    """The elements a tensor with ``dst_layout`` and ``dtype`` sees in the storage.

    ``offset``, when given, is the view's storage offset as a traced value: one
    program then reads a slice wherever it starts, and ``dst_layout`` holds a
    placeholder there, never equal to a storage's own offset."""
    if array is None:
        return jnp.zeros(dst_layout[0], dtype)
    if src_layout == dst_layout and array.dtype == dtype:
        return array
    flat = _flatten(array, src_layout, nbytes // array.dtype.itemsize)
    return _gather(_reinterpret(flat, dtype), _at_offset(dst_layout, offset))


def _at_offset(layout, offset):
    return layout if offset is None else (layout[0], layout[1], offset)


def _raw_dtype(dtype):
    """The array dtype that keeps a storage's bytes when ``dtype`` writes into part of it.

    bool is lossy as a storage dtype (reading other bytes as bool keeps only
    "nonzero"), so a partial bool write keeps the storage as uint8 bytes.
    """
    return jnp.dtype(jnp.uint8) if dtype == jnp.bool_ else jnp.dtype(dtype)


def written_layout(old_dtype, src_layout, dst_layout, value_dtype, nbytes):
    """The storage's (layout, array dtype) after writing ``value_dtype`` through ``dst_layout``."""
    if math.prod(dst_layout[0]) == 0:  # an empty view writes nothing
        return src_layout, old_dtype
    numel = nbytes // jnp.dtype(value_dtype).itemsize
    if covers_storage(dst_layout, value_dtype, nbytes) or (src_layout == dst_layout and old_dtype == value_dtype):
        return dst_layout, jnp.dtype(value_dtype)
    return ((numel,), (1,), 0), _raw_dtype(value_dtype)


def covers_storage(layout, dtype, nbytes: int) -> bool:
    """A contiguous view, from offset 0, of every element of the storage (as ``dtype``)."""
    return (is_contiguous_layout(layout) and layout[2] == 0
            and math.prod(layout[0]) == nbytes // jnp.dtype(dtype).itemsize)


def with_view_written(array, src_layout, dst_layout, value, nbytes, offset=None):
    """The storage's new array after writing ``value`` through ``dst_layout`` (``offset``: as in ``view_of``)."""
    if math.prod(dst_layout[0]) == 0:
        return array
    old_dtype = None if array is None else array.dtype
    new_layout, new_dtype = written_layout(old_dtype, src_layout, dst_layout, value.dtype, nbytes)
    if new_layout == dst_layout:
        return value
    numel = new_layout[0][0]
    if array is None:
        flat = jnp.zeros((numel,), new_dtype)
    else:
        flat = _reinterpret(_flatten(array, src_layout, nbytes // array.dtype.itemsize), new_dtype)
    return _scatter(flat, _at_offset(dst_layout, offset), value)


# ---- eager reads and writes ------------------------------------------------


def x64():
    """JAX's 64-bit mode, scoped to torchtpu's own calls (never global)."""
    return jax.enable_x64(True)


_X64 = jax.enable_x64  # the thread-local state behind x64(), switched directly on the per-op path


def call_x64(fn, *args):
    """``fn(*args)`` in JAX's 64-bit mode, as ``with x64():`` but with no context-manager object per
    call (~1 us of a small eager op's ~15)."""
    previous = _X64.swap_local(True)
    try:
        return fn(*args)
    finally:
        _X64.set_local(previous)


# In a reader's view layout, in place of the storage offset: the offset is passed at run time.
_RUNTIME_OFFSET = "offset at run time"


@functools.lru_cache(maxsize=4096)
def _reader(src_layout, dst_layout, dtype, nbytes):
    if dst_layout[2] == _RUNTIME_OFFSET:
        return jax.jit(lambda a, offset: view_of(a, src_layout, dst_layout, dtype, nbytes, offset))
    return jax.jit(lambda a: view_of(a, src_layout, dst_layout, dtype, nbytes))


def read(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a jax array of its own shape and dtype."""
    buf = buffer_of(t)
    array = buf.array
    layout = layout_of(t)
    dtype = dtypes.to_jax(t.dtype)
    if array is not None and buf.layout == layout and array.dtype == dtype:
        return array
    nbytes = t.untyped_storage().nbytes()
    with x64():
        if array is None:
            return jnp.zeros(layout[0], dtype)
        size, stride, offset = layout
        if offset:  # one reader wherever the view starts: a slice that moves every step compiles once
            value = _reader(buf.layout, (size, stride, _RUNTIME_OFFSET), dtype, nbytes)(array, offset)
        else:
            value = _reader(buf.layout, layout, dtype, nbytes)(array)
    if dtype == array.dtype and covers_storage(layout, dtype, nbytes):
        # The same bytes in this view's shape: keep it as the storage's array, so
        # reading the whole tensor again (a weight written shard by shard) is free.
        buf.set(value, layout)
    return value


def holds_whole_buffer(t: torch.Tensor) -> bool:
    """``read(t)`` is the storage's own array, with no view to apply: a program that
    overwrites ``t`` may donate that array."""
    buf = buffer_of(t)
    array = buf.array
    return array is not None and buf.layout == layout_of(t) and array.dtype == dtypes.to_jax(t.dtype)


@functools.lru_cache(maxsize=4096)
def _writer(src_layout, dst_layout, nbytes):
    return jax.jit(lambda a, v: with_view_written(a, src_layout, dst_layout, v, nbytes))


def write(t: torch.Tensor, value: jax.Array) -> None:
    """Store ``value`` (already of t's shape and dtype) through t's view."""
    buf = buffer_of(t)
    layout = layout_of(t)
    nbytes = t.untyped_storage().nbytes()
    if value.size == 0:  # an empty view writes nothing
        return
    new_layout, _ = written_layout(buf.storage_dtype, buf.layout, layout, value.dtype, nbytes)
    if new_layout == layout:
        buf.set(value, layout)
        return
    old = buf.array
    with x64():
        if old is None:
            array = with_view_written(None, None, layout, value, nbytes)
        else:
            array = _writer(buf.layout, layout, nbytes)(old, value)
    buf.set(array, new_layout)


def from_host(cpu: torch.Tensor) -> torch.Tensor:
    """A new tpu tensor holding a copy of a host tensor (contiguous)."""
    return from_host_all([cpu])[0]


def from_host_all(cpus) -> list[torch.Tensor]:
    """New tpu tensors holding copies of host tensors, uploaded in one transfer call."""
    # On the CPU platform device_put may alias a suitably aligned numpy buffer:
    # torch_to_numpy's is a private copy, so later writes to the host tensor cannot leak in.
    hosts = [dtypes.torch_to_numpy(cpu) for cpu in cpus]
    with x64():
        arrays = jax.device_put(hosts)
    return [from_array(array, cpu.dtype) for array, cpu in zip(arrays, cpus)]


# Up to this storage size, a view is read by fetching its whole storage and
# slicing on the host: a transfer of at most this much instead of compiling a
# gather program for every new view layout (~100 ms each on XLA CPU).
HOST_GATHER_BYTES = 1 << 20


def _gather_on_host(t: torch.Tensor) -> bool:
    buf = buffer_of(t)
    array = buf.array
    if array is None or (buf.layout == layout_of(t) and array.dtype == dtypes.to_jax(t.dtype)):
        return False
    nbytes = t.untyped_storage().nbytes()
    return nbytes <= HOST_GATHER_BYTES or 2 * t.numel() * t.element_size() >= nbytes


def numpy_strided(flat: np.ndarray, layout) -> np.ndarray:
    """A numpy view of a 1-d array through an element ``(size, stride, offset)`` layout."""
    size, stride, offset = layout
    if math.prod(size) == 0:
        return np.zeros(size, flat.dtype)
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], size, [st * item for st in stride])


def host_view(array: np.ndarray, src_layout, dst_layout, dtype, nbytes: int) -> np.ndarray:
    """``view_of`` in numpy: the storage rebuilt on the host, seen through ``dst_layout``."""
    storage = np.zeros(nbytes, np.uint8)
    if math.prod(src_layout[0]):
        src_flat = storage[: nbytes // array.dtype.itemsize * array.dtype.itemsize].view(array.dtype)
        np.copyto(numpy_strided(src_flat, src_layout), array.reshape(src_layout[0]))
    dtype = np.dtype(dtype)
    flat = storage[: nbytes // dtype.itemsize * dtype.itemsize].view(dtype)
    return np.array(numpy_strided(flat, dst_layout), copy=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous CPU tensor with the tpu tensor's value (blocks).

    As a blocking copy on CUDA waits for its stream, the non-blocking host copies started
    before it are complete after it."""
    finish, _ = _host_reader(t)
    host = finish()
    finish_host_copies()
    return host


def _host_reader(t: torch.Tensor):
    """A function giving ``to_host(t)``'s result from the device arrays that hold t's value now,
    so that writes to t after this call do not change what it reads."""
    shape, dtype = t.shape, t.dtype
    if _gather_on_host(t):
        buf = buffer_of(t)
        array, layouts, nbytes = buf.array, (buf.layout, layout_of(t)), t.untyped_storage().nbytes()

        def finish():
            host = host_view(np.asarray(jax.device_get(array)), *layouts, dtypes.to_jax(dtype), nbytes)
            return dtypes.numpy_to_torch(host, dtype).reshape(shape)
    else:
        array = read(t)

        def finish():
            return dtypes.numpy_to_torch(np.asarray(jax.device_get(array)), dtype).reshape(shape)
    return finish, array


# ---- copies to the host that complete later (``.to("cpu", non_blocking=True)``) ----
#
# As on CUDA, the host tensor holds the value only after a synchronize that
# covers the copy: of an event recorded after it, or of the device.  The
# transfer starts at once; the host tensor is filled at that synchronize.

_host_copies: "collections.deque[tuple[int, object]]" = collections.deque()  # (serial, finish), oldest first
_host_copy_serials = itertools.count(1)
_last_host_copy = 0


def start_host_copy(t: torch.Tensor, fill) -> None:
    """Start moving t's current value to the host; ``fill(cpu_tensor)`` runs at the synchronize that covers it."""
    global _last_host_copy
    finish, array = _host_reader(t)
    array.copy_to_host_async()
    _last_host_copy = next(_host_copy_serials)
    _host_copies.append((_last_host_copy, lambda: fill(finish())))


def finish_host_copies(up_to: int | None = None) -> None:
    """Fill the host tensors of the copies started up to serial ``up_to`` (all of them by default)."""
    while _host_copies and (up_to is None or _host_copies[0][0] <= up_to):
        _host_copies.popleft()[1]()


class SyncPoint:
    """The work queued so far (arrays stored, host copies started): what a recorded event waits for."""

    __slots__ = ("host_copies", "arrays")

    def __init__(self):  # two serial numbers: a point costs the same however much work is queued
        self.host_copies = _last_host_copy
        self.arrays = _dispatch_serial

    def ready(self) -> bool:
        return not (_host_copies and _host_copies[0][0] <= self.host_copies) and dispatched_ready(self.arrays)

    def wait(self) -> None:
        wait_for_dispatched(self.arrays)
        finish_host_copies(self.host_copies)


# ---- host tensors as operands ------------------------------------------------


def device_operand(value: torch.Tensor, where: str, host_indices: bool = False) -> torch.Tensor:
    """A tensor argument of a tpu program, on the device.

    As on CUDA, a 0-dim CPU tensor may join a device op (it is a number), and
    index ops (``host_indices``) accept CPU index tensors; any other tensor on
    another device is PyTorch's device-mismatch error.  ``where`` names the op."""
    if value.device.type == "tpu":
        return value
    if value.device.type == "cpu" and (value.dim() == 0 or host_indices):
        return from_host(value)
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"tpu:0 and {value.device}! (when checking argument for {where})")
