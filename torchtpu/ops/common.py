"""Helpers shared by the lowerings: PyTorch's type promotion, seen from jax values.

At trace time a Python number passed to a program is a weakly typed jax
value; a 0-dim tensor is a strong 0-dim array.  That is exactly the
distinction PyTorch's promotion rules draw, so we ask PyTorch itself
(``torch._prims_common.elementwise_dtypes``) with stand-ins for each operand.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promotion
from torch._prims_common import elementwise_dtypes

from ..core import dtypes

__all__ = ["Promotion", "promote", "result_dtype", "is_float", "is_complex", "is_integer", "as_array"]


def _is_weak(x) -> bool:
    return isinstance(x, (bool, int, float, complex)) or getattr(x, "weak_type", False)


def _stand_in(x):
    """What PyTorch would see for this operand: a Python number or a meta tensor."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    dtype = jnp.dtype(x.dtype)
    if _is_weak(x):
        if dtype == jnp.bool_:
            return True
        if jnp.issubdtype(dtype, jnp.complexfloating):
            return 1j
        if jnp.issubdtype(dtype, jnp.floating):
            return 1.0
        return 1
    shape = () if jnp.ndim(x) == 0 else (1,)
    return torch.empty(shape, dtype=dtypes.to_torch(dtype), device="meta")


@functools.lru_cache(maxsize=None)
def _dtypes_for(stand_in_key, kind):
    # A number enters by its Python type alone (1, 1.0 and True hash alike).
    stand_ins = [
        torch.empty(shape, dtype=dt, device="meta") if isinstance(dt, torch.dtype) else dt(1)
        for dt, shape in stand_in_key
    ]
    compute, result = elementwise_dtypes(*stand_ins, type_promotion_kind=kind)
    return dtypes.to_jax(compute), dtypes.to_jax(result)


def promote(*operands, kind=Promotion.DEFAULT):
    """(computation dtype, result dtype) of an elementwise op, by PyTorch's rules."""
    key = []
    for x in operands:
        if x is None:
            continue
        s = _stand_in(x)
        key.append((s.dtype, tuple(s.shape)) if isinstance(s, torch.Tensor) else (type(s), None))
    return _dtypes_for(tuple(key), kind)


def result_dtype(*operands, kind=Promotion.DEFAULT):
    return promote(*operands, kind=kind)[1]


def as_array(x, dtype=None):
    """``x`` as an array of ``dtype``; a Python int that does not fit wraps, as on CPU."""
    if dtype is not None and isinstance(x, int) and not isinstance(x, bool):
        return jnp.asarray(x).astype(dtype)
    return jnp.asarray(x, dtype=dtype)


def is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def is_complex(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.complexfloating)


def is_integer(x) -> bool:
    d = jnp.result_type(x)
    return jnp.issubdtype(d, jnp.integer) or d == jnp.bool_


def elementwise(operands=1, kind=Promotion.DEFAULT, compute=True):
    """Decorate an n-ary lowering: cast its tensor operands to PyTorch's computation dtype.

    The decorated function receives operands already cast, and its result is
    cast to the result dtype (the executor casts to the meta dtype as well).
    ``compute=False`` casts to the result dtype instead (for ops, like integer
    arithmetic, that must not be upcast).
    """

    def wrap(fn):
        @functools.wraps(fn)
        def lowered(*args, **kwargs):
            values = args[:operands]
            computation, result = promote(*values, kind=kind)
            target = computation if compute else result
            cast = [None if v is None else _cast_operand(v, target) for v in values]
            return fn(*cast, *args[operands:], **kwargs)

        return lowered

    return wrap


def _cast_operand(value, dtype):
    cast = as_array(value, dtype)
    if getattr(value, "dtype", None) == jnp.bool_ and cast.dtype != jnp.bool_:
        # XLA rewrites ``x * convert(mask)`` to ``select(mask, x, 0)``, which
        # turns -0.0 and NaN into 0 where CPU keeps them; the barrier stops it.
        cast = jax.lax.optimization_barrier(cast)
    return cast


def canonical_dim(dim, ndim):
    if ndim == 0:
        ndim = 1
    return dim % ndim


def dims_tuple(dim, ndim):
    """A reduction's dims as a sorted tuple; None or [] means all dims."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted(canonical_dim(d, ndim) for d in dim))


np_dtype = np.dtype
