"""The runner's compiled steps: one Dynamo trace for every bucket, one XLA program per bucket."""

from __future__ import annotations

import functools

import torch


def compile_per_bucket(fn):
    """``fn`` compiled for tpu with the first dimension of its tensor arguments dynamic to Dynamo.

    A step is padded to a bucket (tokens, or requests), and each bucket is a
    program of its own; tracing the step once for all of them instead of once
    per bucket is most of a start-up's time. ``mark_dynamic`` fails loudly if
    the trace specialises a bucket's size after all."""
    compiled = torch.compile(fn, backend="tpu", dynamic=None, fullgraph=True)

    @functools.wraps(fn)
    def per_bucket(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                torch._dynamo.mark_dynamic(value, 0)
        return compiled(*args, **kwargs)

    return per_bucket


def check_same_rows(what: str, *tensors: torch.Tensor) -> None:
    """Raise unless the tensors have the same first dimension. Inside a
    :func:`compile_per_bucket` trace this also tells Dynamo that their
    dynamic sizes are one, which a JAX op (shape-checked as a whole) needs."""
    rows = tensors[0].shape[0]
    for t in tensors[1:]:
        if t.shape[0] != rows:
            raise RuntimeError(f"torchtpu: {what}: first dimensions {[t.shape[0] for t in tensors]} differ")
