"""``torch.nn.attention.flex_attention`` on tpu tensors.

PyTorch's flex attention checks its inputs' device against a fixed list
(cuda, cpu, xpu, hpu, mps; "TODO: remove once other devices are supported")
before it runs. On tpu it runs: eagerly through PyTorch's own composite
implementation (dense math, op by op), and compiled as part of the graph.
"""

from __future__ import annotations

import functools

import torch.nn.attention.flex_attention as flex


def _allowing_tpu(validate):
    @functools.wraps(validate)
    def call(query, key, value):
        if query.device.type != "tpu":
            validate(query, key, value)

    call.__torchtpu_original__ = validate
    return call


def install() -> None:
    if not hasattr(flex._validate_device, "__torchtpu_original__"):
        flex._validate_device = _allowing_tpu(flex._validate_device)
