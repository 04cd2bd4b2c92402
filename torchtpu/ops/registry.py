"""The lowering table: ATen OpOverload -> pure function on jax arrays.

Every executor reads this one table.  A lowering receives the op's arguments
as the ATen schema names them, with jax arrays in place of tensors, and
returns jax arrays in the structure the schema returns.  It only needs to be
right about values: the executor casts each result to the dtype that
PyTorch's own meta kernel reports, so the result dtype always matches CPU.

Only functional ops are lowered.  The executor derives the in-place
(``add_.Tensor``) and ``out=`` (``add.out``) variants from the functional one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    # Python numbers are passed to the program as values, not constants,
    # so a changing learning rate does not recompile.  Ops whose output
    # shape depends on a number (arange, linspace) keep them constant.
    static_numbers: bool = False
    # The output shape depends on the data (nonzero, unique): run eagerly,
    # outside jit, with no meta kernel.
    data_dependent: bool = False
    # The lowering takes a ``key=`` PRNG key argument.
    random: bool = False
    # Arguments the op updates in place besides its results (batch norm's
    # running statistics).  The lowering then returns (results, new values),
    # one new value per name, None where the argument was None.
    writes: tuple = ()
    # CPU's checks of argument values that PyTorch's meta kernel lacks, as a
    # function of the op's arguments (meta tensors and Python numbers) that raises.
    check: Callable | None = None
    # The op's result shapes, from meta tensors, where PyTorch's own meta kernel fails on valid
    # arguments (the fused LSTM cell's reads the device of its optional biases).
    meta: Callable | None = None
    # PyTorch's meta kernel refuses valid tpu arguments under torch.compile as well (it holds CUDA's
    # rules): fake tensors on tpu get ``check`` and ``meta`` instead; other devices keep PyTorch's.
    fake: bool = False


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}

# Ops torchtpu defines itself (``torch.ops.torchtpu.*``), declared next to their lowerings
# with ``define``; the dispatch layer registers their tpu kernels with everyone else's.
NAMESPACE = "torchtpu"
_library = torch.library.Library(NAMESPACE, "DEF")


def define(schema: str, fake) -> torch._ops.OpOverload:
    """Declare the op ``torchtpu::<schema>`` with ``fake`` as its meta kernel; returns its overload."""
    name = schema.split("(", 1)[0]
    _library.define(schema)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_library)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def register(op, lowering: Lowering) -> None:
    """Add one entry to the table (``lower`` is the decorator form)."""
    if op in LOWERINGS:
        raise ValueError(f"{op} already has a lowering")
    LOWERINGS[op] = lowering


def lower(*ops, static_numbers=False, data_dependent=False, random=False, writes=(), check=None, meta=None,
          fake=False):
    """Register ``fn`` as the lowering of each OpOverload (or every overload of a packet)."""

    def decorate(fn):
        for op in ops:
            overloads = (
                [getattr(op, name) for name in op.overloads() if is_functional(getattr(op, name))]
                if isinstance(op, torch._ops.OpOverloadPacket)
                else [op]
            )
            for overload in overloads:
                register(overload, Lowering(fn, static_numbers, data_dependent, random, tuple(writes), check, meta,
                                             fake))
        return fn

    return decorate


def is_functional(op) -> bool:
    schema = op._schema
    return not schema.name.endswith("_") and not any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
    )
