"""The one notion of a program that every executor runs: strict, debug and fused eager, and compiled graphs.

A ``Program`` is a pure jax function of ``dynamic`` values (storage arrays,
then the storage offsets of views that start anywhere, then runtime numbers,
then the RNG seed and offset when it draws) returning
``(outputs, {storage slot: new array})``, plus what is needed to wrap its
outputs in tensors and to store what it wrote.  An eager op, a compiled
graph joining a fused graph, and a fused graph's steps are all Programs, so
the launchers (``eager/strict.py``, ``debug.py``, ``fused.py``) need no
case for where a program came from.

Also here, because every executor needs them the same way: ``conform``
(a lowering's result, cast to the dtype and shape PyTorch's metadata says),
``abstract_value`` (a Deferred as jax sees it when tracing) and the donation
policy (which argument arrays a program may overwrite).
"""

from __future__ import annotations

import math
import sys

import jax
import jax.numpy as jnp

from . import dtypes, tensor


class Program:
    """A pure jax function of ``dynamic`` values and what its launcher and wrapper need to know."""

    __slots__ = ("name", "pure", "_jitted", "out_metas", "written_layouts", "written_dtypes", "fresh_outputs", "traced",
                 "checked_numbers")

    def __init__(self, name, pure, out_metas, written_layouts, written_dtypes, fresh_outputs=True):
        self.name = name  # what it computes, for messages: "aten::add.Tensor", "compiled forward graph"
        self.pure = pure  # the function un-jitted, for the fused launcher to compose
        self._jitted = None
        self.out_metas = out_metas  # (size, stride, torch dtype) of each fresh output, None where undefined
        self.written_layouts = written_layouts  # {storage slot: layout after the program}
        self.written_dtypes = written_dtypes  # {storage slot: array dtype after the program}
        self.fresh_outputs = fresh_outputs  # False for in-place and out= ops: they return no values
        self.traced = False  # the fused launcher has traced it once (its lowering's checks ran)
        self.checked_numbers = set()  # tuples of Python numbers the meta kernel has accepted

    @property
    def fn(self):
        """The program jitted (on first use: a program only ever fused is never jitted alone)."""
        if self._jitted is None:
            self._jitted = jax.jit(self.pure)
        return self._jitted

    def __call__(self, *dynamic):
        """Run it now (asynchronously)."""
        return tensor.call_x64(self.fn, *dynamic)


def conform(value, shape, dtype, what):
    """A lowering's result as the ``dtype`` (torch) and ``shape`` that PyTorch's metadata gives.

    A lowering only needs to be right about values: the result dtype is
    always PyTorch's.  A result that broadcasts to the shape is broadcast (a
    scalar lowering of a sized op); one with the right number of elements in
    another shape is a lowering bug.  A symbolic size (dynamic shapes) is
    known only from the traced value itself."""
    value = dtypes.cast(jnp.asarray(value), dtypes.to_jax(dtype))
    shape = tuple(shape)
    if value.shape != shape and all(type(s) is int for s in shape):
        if math.prod(value.shape) == math.prod(shape) and value.ndim == len(shape):
            raise AssertionError(f"lowering of {what} returned shape {value.shape}, metadata says {shape}")
        value = jnp.broadcast_to(value, shape)
    return value


def abstract_value(value):
    """A Deferred as jax sees it when tracing: a shape and a dtype."""
    if type(value) is tensor.Deferred:
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    return value


# References to an array that only an argument list holds: the list's slot and
# getrefcount's own argument.
_LIST_ONLY = 2


def unshared(arrays: list, position: int, owners: int) -> bool:
    """The donation policy: a program may overwrite an argument array when nothing
    can read it afterwards, that is when the argument list and the ``owners``
    references that the program's results replace (a storage the program
    writes) are all that hold it.  A second tensor sharing the array, a user's
    jax reference to it, or a pending read keeps it alive and undonated."""
    return sys.getrefcount(arrays[position]) <= _LIST_ONLY + owners
