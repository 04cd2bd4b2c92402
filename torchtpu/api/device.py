"""``torch.tpu``'s device functions: what the device is, selecting it, waiting for it.

We present one logical device, ``tpu:0``, whatever the number of chips:
sharding spreads a tensor's data over chips, and ``device_count()`` stays 1,
which is what PyTorch's Python device guard supports.
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
    return 1


def current_device() -> int:
    return 0


_index = runtime_device.index_of


def set_device(device) -> None:
    _index(device)


class device:
    """Context manager that selects a tpu device (only tpu:0 exists)."""

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
    metrics.host_syncs["synchronize"] += 1
    context.current().flush("synchronize")
    tensor.wait_for_dispatched()


def _is_in_bad_fork() -> bool:
    return False
