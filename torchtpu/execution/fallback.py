"""Ops with no lowering: PyTorch's decomposition, the opt-in CPU fallback, or a clear error."""

from __future__ import annotations

import os
import threading
import warnings

import torch
import torch._decomp

from .. import tensor
from ..runtime import stats

# Ops we run through torch._decomp because its decomposition is exact and
# composes ops that have lowerings.  Reported in docs/op_coverage.md.
DECOMPOSED: set = set()
_warned: set = set()


def cpu_fallback_enabled() -> bool:
    return os.environ.get("TORCHTPU_CPU_FALLBACK", "0") not in ("", "0", "false", "False")


def missing_lowering_error(op) -> NotImplementedError:
    return NotImplementedError(
        f"torchtpu: the op '{op._schema.name}.{op._overloadname or 'default'}' has no tpu lowering. "
        "Add a lowering in torchtpu/ops/ (see docs/ops.md), or set TORCHTPU_CPU_FALLBACK=1 "
        "to run it on the host (slow; counted in torch.tpu.fallback_stats())."
    )


def _to_host(value):
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        return tensor.to_host(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    return value


def _to_device(value):
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return tensor.from_host(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v) for v in value)
    return value


def run_on_host(op, args, kwargs):
    """Run ``op`` on CPU copies, write mutated arguments back, return tpu results."""
    name = str(op)
    stats.cpu_fallbacks[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchtpu: {name} has no tpu lowering; running it on the CPU (TORCHTPU_CPU_FALLBACK=1)")
    host_args, host_kwargs = _to_host(args), _to_host(kwargs)
    result = op(*host_args, **host_kwargs)
    returned_alias = None
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            device_value = args[i] if i < len(args) else kwargs.get(arg.name)
            host_value = host_args[i] if i < len(args) else host_kwargs.get(arg.name)
            if isinstance(device_value, torch.Tensor):
                device_value.copy_(host_value)
                if result is host_value:
                    returned_alias = device_value
    if returned_alias is not None:
        return returned_alias
    return _to_device(result)


def _decomposition(op):
    """PyTorch's decomposition of ``op`` into other ATen ops, if it has a usable one.

    References from torch._refs lower to prims, whose eager implementation calls
    the same ATen op again, so they are no help here.
    """
    decomposition = torch._decomp.decomposition_table.get(op)
    if decomposition is None or op in _decomposing.active:
        return None
    if getattr(decomposition, "__module__", "").startswith("torch._refs"):
        return None
    return decomposition


class _Decomposing(threading.local):
    def __init__(self):
        self.active = set()


_decomposing = _Decomposing()


def fallback(op, args, kwargs):
    decomposition = _decomposition(op)
    if decomposition is not None:
        DECOMPOSED.add(op)
        _decomposing.active.add(op)
        try:
            return decomposition(*args, **kwargs)
        finally:
            _decomposing.active.discard(op)
    if cpu_fallback_enabled():
        return run_on_host(op, args, kwargs)
    raise missing_lowering_error(op)
