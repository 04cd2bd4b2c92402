"""Which ops run as PyTorch's own decompositions: one policy for eager and compiled execution.

An op with no lowering of its own runs as its ``torch._decomp`` decomposition
(or one of torch.nn's fused ops as torchtpu's own, ``fused_nn.py``) when that
composes ATen ops (which have lowerings, or decompose in turn).
Decompositions from ``torch._refs`` are left out: they lower to prims, whose
eager implementation calls the same ATen op again.  Eager execution applies
the policy op by op, at dispatch (``dispatch/fallback.py``); torch.compile
applies it while AOTAutograd traces (``compile/dynamo.py``), where view ops
are left alone because a graph makes views from its metadata.  The ops that
actually ran decomposed are listed in docs/op_coverage.md.
"""

from __future__ import annotations

import functools

import torch
import torch._decomp

from .fused_nn import DECOMPOSITIONS as FUSED_NN
from .registry import LOWERINGS


def decomposition(op):
    """PyTorch's usable decomposition of ``op``, or None (it has a lowering, or no usable one)."""
    if op in LOWERINGS:
        return None
    if op in FUSED_NN:
        return FUSED_NN[op]
    found = torch._decomp.decomposition_table.get(op)
    if found is None or getattr(found, "__module__", "").startswith("torch._refs"):
        return None
    return found


@functools.cache
def for_graphs() -> dict:
    """The decomposition table torch.compile traces with: every usable one, views excepted."""
    ops = [op for op in torch._decomp.decomposition_table
           if isinstance(op, torch._ops.OpOverload) and not op.is_view and decomposition(op) is not None]
    return {**torch._decomp.get_decompositions(ops), **FUSED_NN}
