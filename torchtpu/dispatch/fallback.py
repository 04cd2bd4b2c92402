"""Ops with no lowering: PyTorch's decomposition, the opt-in CPU fallback, or a clear error."""

from __future__ import annotations

import threading
import warnings

import torch

from .. import config
from ..core import tensor
from ..ops import decompositions
from ..runtime import metrics

# Ops that ran as their torch._decomp decomposition (ops/decompositions.py).
# Reported in docs/op_coverage.md.
DECOMPOSED: set = set()
_warned: set = set()


def missing_lowering_error(op) -> NotImplementedError:
    return NotImplementedError(
        f"torchtpu: the op '{op._schema.name}.{op._overloadname or 'default'}' has no tpu lowering. "
        "Add a lowering in torchtpu/ops/ (see docs/ops.md), or run it on the host (slow; counted in "
        "torch.tpu.metrics()) with TORCHTPU_CPU_FALLBACK=1 or torchtpu.config.update(cpu_fallback=True)."
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
    metrics.record(metrics.cpu_fallbacks, name, "cpu_fallback")
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


class _Decomposing(threading.local):
    def __init__(self):
        self.active = set()


_decomposing = _Decomposing()


def fallback(op, args, kwargs):
    decomposition = None if op in _decomposing.active else decompositions.decomposition(op)
    if decomposition is not None:
        DECOMPOSED.add(op)
        _decomposing.active.add(op)
        try:
            return decomposition(*args, **kwargs)
        finally:
            _decomposing.active.discard(op)
    if config.current.cpu_fallback:
        return run_on_host(op, args, kwargs)
    raise missing_lowering_error(op)
