"""The key of one eager call: what its program depends on, and the values it passes at run time.

Tensors are described by storage slot, layout and dtype (a view's storage
offset is a runtime value unless it is 0 or the storage's own); Python floats and
complex numbers are runtime values (so a changing learning rate does not
recompile) unless the lowering needs them static; everything else is a
constant of the program.  One pass over the arguments builds both the key
and the list of dynamic inputs, and nothing here allocates device memory
except a 0-dim host tensor joining the op.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core import tensor
from ..runtime import precision

_Tensor = torch.Tensor
_DYNAMIC_NUMBERS = (float, complex)
# Ops that, as on CUDA, accept CPU index tensors for a device tensor.
HOST_INDEX_OPS = {"aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
                   "aten::_index_put_impl", "aten::_index_put_impl_"}


class TensorRef(NamedTuple):
    """A tensor argument in a program key: its storage slot, view layout and dtype."""

    slot: int
    size: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    # PyTorch's lazy conjugate and negative bits (complex views): (is_conj, is_neg).
    lazy: tuple = (False, False)

    @property
    def layout(self):
        return (self.size, self.stride, self.offset)


_NOT_LAZY = (False, False)
# A NamedTuple built without its Python-level __new__ (a third of the cost, per tensor argument).
_new_tuple = tuple.__new__


class MovableOffset(NamedTuple):
    """A view's storage offset passed at run time, as the call's ``index``-th offset: one program
    serves a slice of a storage wherever it starts (a request's row of a table, a span of a list)."""

    index: int


class NumberRef(NamedTuple):
    """A Python number passed to the program as a runtime value."""

    kind: type


class ConstRef(NamedTuple):
    """A bool or float constant: 1, 1.0 and True are equal keys, so the type is kept."""

    kind: type
    value: object


class GeneratorRef(NamedTuple):
    """A torch.Generator argument; the program draws from the tpu stream instead."""


class Call:
    """One call described: its key, and the dynamic inputs gathered on the way."""

    __slots__ = ("key", "arg_key", "kw_key", "storage_key", "storages", "offsets", "numbers", "_slots", "_op",
                 "_static")

    def __init__(self, plan, args, kwargs):
        self._op = plan.op
        self._static = plan.lowering.static_numbers
        self._slots = {}  # storage id -> slot
        self.storages = []  # (Buffer, nbytes) of each distinct storage, by slot
        self.offsets = []  # the storage offset of every view described by a MovableOffset
        self.numbers = []  # every dynamic Python number, in order
        describe = self._describe
        self.arg_key = tuple([describe(a) for a in args])
        self.kw_key = tuple([(k, describe(v)) for k, v in kwargs.items()]) if kwargs else ()
        self.storage_key = tuple([(buf.layout, buf.storage_dtype, nbytes) for buf, nbytes in self.storages])
        self.key = (plan.op, self.arg_key, self.kw_key, self.storage_key, precision.current())

    def _describe(self, value):
        """A hashable description of one argument; records its dynamic parts."""
        if isinstance(value, _Tensor):
            storage = value.untyped_storage()
            buffer = getattr(storage, "_tpu_buffer", None)  # tensor.storage_buffer, inlined: the hot path
            if buffer is None:
                if value.device.type == "tpu":  # a storage C++ re-wrapped around our address
                    buffer = tensor.buffer_of(value)
                else:
                    value = tensor.device_operand(value, self._op._schema.name,
                                                  self._op._schema.name in HOST_INDEX_OPS)
                    storage = value.untyped_storage()
                    buffer = tensor.storage_buffer(storage)
            cdata = storage._cdata
            slot = self._slots.get(cdata)
            if slot is None:
                slot = self._slots[cdata] = len(self.storages)
                self.storages.append((buffer, storage.nbytes()))
            dtype = value.dtype
            lazy = (value.is_conj(), value.is_neg()) if dtype.is_complex else _NOT_LAZY
            size, stride, offset = value.shape, value.stride(), value.storage_offset()
            if offset and (size, stride, offset) != buffer.layout:
                self.offsets.append(offset)
                offset = MovableOffset(len(self.offsets) - 1)
            return _new_tuple(TensorRef, (slot, size, stride, offset, dtype, lazy))
        if isinstance(value, (list, tuple)):
            return tuple([self._describe(v) for v in value])
        if isinstance(value, _DYNAMIC_NUMBERS) and not self._static:
            self.numbers.append(value)
            return NumberRef(type(value))
        if isinstance(value, torch.Generator):
            return GeneratorRef()
        if type(value) in (bool, float):
            return ConstRef(type(value), value)
        return value


def tensor_refs(desc) -> list:
    """Every TensorRef in a (nested) argument description."""
    if type(desc) is TensorRef:
        return [desc]
    if type(desc) is tuple:
        return [ref for sub in desc for ref in tensor_refs(sub)]
    return []
