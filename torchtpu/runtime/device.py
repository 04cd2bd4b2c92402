"""The chip this process drives, found through JAX, and how PyTorch names it.

One process drives one chip, as with torchrun and CUDA: its tensors live on
``tpu:<chip>``, where the chip is ``torch.tpu.set_device``'s argument
(torchrun's ``LOCAL_RANK`` by default), and the other indices below
``device_count()`` name the chips of the other processes on the host.  The
chip is backed by the process's local PJRT devices (``jax.local_devices()``):
a TPU where ``libtpu`` is installed, a GPU through JAX's CUDA plugin, else
XLA's CPU backend.  Discovery is lazy: it starts a PJRT client, which
``import torchtpu`` must not pay for.

Naming ``tpu:k`` for k > 0 needs the C++ device guard (``runtime/native``);
without it the only name is ``tpu:0``.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import jax
import torch

from .. import config
from . import native

# The torch device every tpu tensor of this process lives on; set_chip changes it.
TORCH_DEVICE = torch.device("tpu", 0)
_count = 1
# Whether a tensor was made on TORCH_DEVICE: after that the chip is fixed.
claimed = False
# Whether this process's malloc keeps freed large buffers (reuse_host_memory).
host_memory_reused = False


def count() -> int:
    return _count


def chip() -> int:
    return TORCH_DEVICE.index


def share_host_cores(settings=None) -> None:
    """At import, before XLA starts: on a CPU host running several processes (torchrun's
    ``LOCAL_WORLD_SIZE``), pin this one to its own share of the cores, as one chip each.

    XLA:CPU sizes a process's thread pool to the cores it may use; unpinned, N
    processes run N pools of every core's threads that preempt each other
    (TorchTitan, 4 processes on 2 cores: compiled step 0.93x -> 1.09x CPU eager)."""
    settings = settings or config.current
    if not (settings.share_host_cores and settings.local_chips > 1 and hasattr(os, "sched_setaffinity")
            and _cpu_backend_expected()):
        return
    cores = sorted(os.sched_getaffinity(0))
    processes, rank = settings.local_chips, settings.chip % settings.local_chips
    if processes <= len(cores):
        share = cores[rank * len(cores) // processes:(rank + 1) * len(cores) // processes]
    else:
        share = [cores[rank % len(cores)]]
    os.sched_setaffinity(0, share)


# glibc's mallopt parameters (malloc.h), and the size from which memory stays in the heap.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_KEPT_BYTES = 1 << 30


def reuse_host_memory(settings=None) -> bool:
    """At import, before XLA starts its threads: on XLA's CPU backend, make glibc's malloc
    keep freed large buffers for reuse; returns whether it did.

    XLA:CPU allocates a program's temporaries on every run, from its worker threads.
    A thread's arena cannot hold a block over 64 MiB, so by default each run maps
    fresh memory and pays a page fault per 4 KiB of it (Llama 10m training step:
    176 MB of faults, a fifth of the step).  One arena and high thresholds keep the
    memory mapped between runs; TPU and GPU hosts, whose buffers are not in host
    memory, keep malloc's defaults."""
    settings = settings or config.current
    if not (settings.reuse_host_memory and _cpu_backend_expected()):
        return False
    libc = _glibc()
    if libc is None:
        return False
    global host_memory_reused
    host_memory_reused = all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, _KEPT_BYTES), (_M_TRIM_THRESHOLD, _KEPT_BYTES)))
    return host_memory_reused


def _glibc():
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (AttributeError, ValueError, OSError):  # not glibc (macOS, musl)
        return None
    return ctypes.CDLL(None)


def _cpu_backend_expected() -> bool:
    """Whether JAX will run on its CPU backend: asked to, or with no TPU or GPU plugin to load."""
    platforms = jax.config.jax_platforms
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return importlib.util.find_spec("libtpu") is None and importlib.util.find_spec("jax_plugins") is None


def _configure(chip_index: int, local_chips: int) -> None:
    """Name this process's chip at import, from the settings (torchrun's environment)."""
    global _count
    if native.module is None:
        return  # tpu:0 only; set_device(LOCAL_RANK) is still accepted as "this process's chip"
    _count = max(local_chips, chip_index + 1)
    native.module.set_device_count(_count)
    _set(chip_index)


def _set(index: int) -> None:
    global TORCH_DEVICE
    native.module.set_process_device(index)
    TORCH_DEVICE = torch.device("tpu", index)


def install_guard() -> None:
    """Make the C++ guard PrivateUse1's (after torch's registration installed the Python one)."""
    if native.module is not None:
        native.module.install_guard()
        _configure(config.current.chip, config.current.local_chips)


def set_chip(device) -> None:
    """``torch.tpu.set_device``: name this process's chip; only before its first tensor."""
    index = _requested_index(device)
    if index == chip():
        return
    if native.module is None:
        if index == config.current.chip:
            return  # torchrun's LOCAL_RANK is this process's chip, named tpu:0 here
        raise RuntimeError(_no_extension(index))
    _check_range(index)
    if claimed:
        raise RuntimeError(
            f"torch.tpu.set_device({index}): this process already has tensors on {TORCH_DEVICE}; one process "
            f"drives one chip, so select it before creating tpu tensors")
    _set(index)


def _requested_index(device) -> int:
    if device is None:
        return chip()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return chip() if device.index is None else device.index


def _check_range(index: int) -> None:
    if not 0 <= index < _count:
        raise RuntimeError(f"tpu: invalid device index {index}: this host has {_count} tpu device(s) "
                           f"(one per process; torchrun's LOCAL_WORLD_SIZE)")


def _no_extension(index: int) -> str:
    return (f"tpu:{index} needs torchtpu's C++ extension, which is not built or is disabled "
            f"(TORCHTPU_NATIVE=0); without it this process's chip is named tpu:0")


def index_of(device) -> int:
    """The index of a tpu device given as None, an int, a string or a torch.device; it must be ours."""
    index = _requested_index(device)
    if index != chip():
        if native.module is None and index > 0:
            raise RuntimeError(_no_extension(index))
        _check_range(index)
        raise RuntimeError(
            f"tpu:{index} is another process's chip: this process drives {TORCH_DEVICE} (one process per "
            f"chip; select it with torch.tpu.set_device or torchrun's LOCAL_RANK)")
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
