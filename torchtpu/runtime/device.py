"""The chips this process drives, found through JAX, and how to name them.

One process drives one logical device, ``tpu:0``, backed by the process's
local PJRT devices (``jax.local_devices()``): a TPU where ``libtpu`` is
installed, a GPU through JAX's CUDA plugin, else XLA's CPU backend.
Discovery is lazy: it starts a PJRT client, which ``import torchtpu`` must
not pay for.
"""

from __future__ import annotations

import functools

import jax
import torch

# The torch device every tpu tensor of this process lives on.
TORCH_DEVICE = torch.device("tpu", 0)


def index_of(device) -> int:
    """The index of a tpu device given as None, an int, a string or a torch.device; it must be ours."""
    if device is None:
        return TORCH_DEVICE.index
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        index = device.index or 0
    if index != TORCH_DEVICE.index:
        raise RuntimeError(f"torchtpu presents one logical device, tpu:0; got tpu:{index}")
    return index


@functools.lru_cache(maxsize=None)
def jax_devices() -> tuple:
    return tuple(jax.local_devices())


def platform() -> str:
    return jax_devices()[0].platform


def name() -> str:
    """What the chip is, honestly: "TPU v6e", or "XLA CPU (no TPU found)"."""
    first = jax_devices()[0]
    if first.platform == "tpu":
        return first.device_kind if first.device_kind.startswith("TPU") else f"TPU {first.device_kind}"
    if first.platform == "gpu":
        return f"XLA GPU ({first.device_kind}; no TPU found)"
    return "XLA CPU (no TPU found)"


def runtime_memory_stats() -> dict | None:
    """PJRT's own memory statistics, summed over chips, or None where it has none (XLA CPU)."""
    per_chip = [d.memory_stats() for d in jax_devices()]
    if not per_chip or any(s is None for s in per_chip):
        return None
    total = {}
    for s in per_chip:
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    return total
