"""``torch.accelerator``'s memory functions, answered by ``torch.tpu``.

PyTorch implements ``torch.accelerator.empty_cache``, ``memory_allocated`` and
the rest through a C++ ``DeviceAllocator`` that only a C++ backend can
register; for a Python backend they fail with an internal assert.  Libraries
that are device-generic (accelerate, and through it the Hugging Face Trainer)
call them, so while the current accelerator is tpu each one is routed to the
``torch.tpu`` function of the same meaning; for any other device the original
runs unchanged.
"""

from __future__ import annotations

import functools

import torch

# torch.accelerator name -> torch.tpu name
_ROUTED = {
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "get_memory_info": "mem_get_info",
}


def _on_tpu(device) -> bool:
    if device is None or isinstance(device, int):
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == "tpu"
    return torch.device(device).type == "tpu"


def _routed(original, tpu_name):
    @functools.wraps(original)
    def call(*args, **kwargs):
        device = args[0] if args else kwargs.get("device_index", kwargs.get("device"))
        if not _on_tpu(device):
            return original(*args, **kwargs)
        return getattr(torch.tpu, tpu_name)(*args, **kwargs)

    call.__torchtpu_original__ = original
    return call


def install() -> None:
    for name, tpu_name in _ROUTED.items():
        original = getattr(torch.accelerator, name, None)
        if original is not None and not hasattr(original, "__torchtpu_original__"):
            setattr(torch.accelerator, name, _routed(original, tpu_name))
