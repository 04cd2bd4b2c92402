"""How an ATen op maps onto a lowering: functional, in-place or ``out=``.

Computed once per OpOverload from its schema.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..ops.registry import LOWERINGS, Lowering, is_functional

aten = torch.ops.aten
# Factory arguments a functional op may take that its out= variant lacks.
_FACTORY_ARGS = {"dtype", "layout", "device", "pin_memory", "memory_format"}


@dataclasses.dataclass(frozen=True)
class Plan:
    op: torch._ops.OpOverload  # the op as called
    functional: torch._ops.OpOverload  # the op whose lowering computes the values
    lowering: Lowering
    kind: str  # "functional", "inplace" or "out"
    mutated: tuple  # (position, name) of each argument written to, in result order
    arg_names: tuple  # names of the functional op's arguments
    returns: str  # the shape of the op's return value: "tensor", "list", "tuple" or "none"


def _mutated_args(op) -> tuple:
    return tuple(
        (i, a.name)
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _signature(op, drop=()):
    return [
        (a.name, str(a.type))
        for a in op._schema.arguments
        if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
        and a.name not in drop
    ]


def functional_of(op):
    """The functional overload an in-place or out= op computes, or None."""
    packet_name = op._schema.name.split("::")[1]
    if packet_name.endswith("_"):
        packet = getattr(aten, packet_name[:-1], None)
        if packet is not None and op._overloadname in packet.overloads():
            return getattr(packet, op._overloadname)
        # Overload names may differ (floor_divide_.Tensor computes floor_divide.default).
        return None if packet is None else _overload_like(packet, _signature(op), ())
    if not op._schema.is_mutable:
        return None
    packet = getattr(aten, packet_name)
    wanted = _signature(op)
    # Factory arguments the out= variant lacks (its out tensor fixes them).
    implied = _FACTORY_ARGS - {name for name, _ in wanted}
    return _overload_like(packet, wanted, implied)


def _overload_like(packet, wanted, implied):
    """The functional overload in ``packet`` whose arguments, less ``implied``, are ``wanted``."""
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if is_functional(candidate) and _signature(candidate, implied) == wanted:
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def plan_for(op) -> Plan | None:
    """The plan for ``op``, or None when no lowering covers it."""
    returns = _return_shape(op)
    if op in LOWERINGS:
        lowering = LOWERINGS[op]
        names = _names(op)
        writes = tuple((names.index(n), n) for n in lowering.writes)
        return Plan(op, op, lowering, "functional", writes, names, returns)
    functional = functional_of(op)
    if functional is None or functional not in LOWERINGS:
        return None
    kind = "inplace" if op._schema.name.endswith("_") else "out"
    mutated = _mutated_args(op)
    if kind == "inplace" and len(functional._schema.returns) < len(mutated):
        mutated = mutated[:1]  # the result overwrites self; other written arguments are the lowering's writes
    # (an in-place op whose functional form returns every written argument, such as
    # _fused_adamw_ with its five lists, takes them all back, in order)
    return Plan(op, functional, LOWERINGS[functional], kind, mutated, _names(functional), returns)


def _return_shape(op) -> str:
    schema_returns = op._schema.returns
    if not schema_returns:
        return "none"
    if len(schema_returns) == 1:
        return "list" if str(schema_returns[0].type) == "List[Tensor]" else "tensor"
    return "tuple"


def _names(op) -> tuple:
    return tuple(a.name for a in op._schema.arguments)
