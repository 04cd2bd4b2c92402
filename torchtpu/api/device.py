"""``torch.tpu``'s device functions: what the device is, selecting it, waiting for it.

One process drives one chip, named ``tpu:<chip>`` (``set_device``, or
torchrun's ``LOCAL_RANK``); ``device_count()`` is the number of chips on the
host, one per process (torchrun's ``LOCAL_WORLD_SIZE``, else 1).  Within a
process, several chips are one device whose tensors are sharded.
"""

from __future__ import annotations

from dataclasses import dataclass


from ..core import tensor
from ..runtime import context, metrics
from ..runtime import device as runtime_device
from .memory import total_memory

_initialized = False


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _initialized


def _lazy_init() -> None:
    global _initialized
    runtime_device.jax_devices()
    _initialized = True


def device_count() -> int:
    return runtime_device.count()


def current_device() -> int:
    return runtime_device.chip()


_index = runtime_device.index_of


def set_device(device) -> None:
    """Name this process's chip (``torch.tpu.set_device(LOCAL_RANK)``), before its first tpu tensor."""
    runtime_device.set_chip(device)


class device:
    """Context manager that selects a tpu device: this process's chip (the others belong to other processes)."""

    def __init__(self, device):
        self.idx = _index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def get_device_name(device=None) -> str:
    _index(device)
    return runtime_device.name()


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    total_memory: int
    chip_count: int


def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(get_device_name(device), runtime_device.platform(), total_memory(),
                            len(runtime_device.jax_devices()))


def synchronize(device=None) -> None:
    """Wait for all queued work on the device.

    Every op's results land in a tpu storage, so waiting for the arrays
    stored since the last synchronize covers all of torchtpu's work, at a
    cost proportional to that work, not to every jax array in the process.
    """
    _index(device)
    metrics.record(metrics.host_syncs, "synchronize", "host_sync")
    context.current().flush("synchronize")
    tensor.wait_for_dispatched()
    tensor.finish_host_copies()


def _is_in_bad_fork() -> bool:
    return False
