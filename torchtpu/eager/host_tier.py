"""Cold shapes of small integer ops run on the host; a shape that comes back compiles.

Every eager program is compiled for its shapes, and some code makes a new
shape at nearly every call: a serving engine's bookkeeping (the free list of
KV-cache slots, its prefix tree's slot indices, per-step positions) cats,
slices and counts small integer tensors of ever-new lengths. Compiling a
program to run it once costs ~25 ms on XLA:CPU (more on TPU); running CPU
PyTorch's kernel on a host copy costs well under a millisecond. So a call
whose key has no program yet, if all its tensors are small integer or bool
tensors, runs on the host, up to ``host_runs_before_compile`` times per key;
the next call with that key compiles, so a steady shape still runs as a
program. Integer results are exact on both paths. ``torch.tpu.metrics()``
counts these runs under ``host_runs``.

The host copy is of whole storages (a view keeps its layout, and two views
of one storage stay one storage), and a written storage goes back whole, so
no write program compiles either. Only strict eager mode does this: fused
mode must not wait for values, and debug mode checks compiled programs.
"""

from __future__ import annotations

import jax
import numpy as np
import torch

from .. import config
from ..core import dtypes, tensor
from ..runtime import context, metrics
from . import parity

# The largest storage (bytes) a host run reads or writes, and the most in all.
STORAGE_BYTES = 1 << 16
TOTAL_BYTES = 1 << 18
# Integer ops whose CPU kernel raises on some values (a zero divisor): a host run would raise where the
# program, later, would not.
VALUE_CHECKED_OPS = frozenset({"aten::div", "aten::div_", "aten::remainder", "aten::remainder_", "aten::fmod",
                               "aten::fmod_", "aten::floor_divide", "aten::floor_divide_"})

# Host runs so far of each key without a program (cleared when it grows large: keys of ever-new shapes).
_runs: dict = {}
_MAX_KEYS = 1 << 16


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _exact(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def runs_on_host(plan, key, args, kwargs, metas) -> bool:
    """Whether this call, whose key has no program, runs on the host (and counts it if so)."""
    limit = config.current.host_runs_before_compile
    if (limit == 0 or plan.kind not in ("functional", "inplace") or plan.lowering.random
            or plan.op._schema.name in VALUE_CHECKED_OPS or context.current().launcher.name != "strict"):
        return False
    runs = _runs.get(key, 0)
    if runs >= limit or not _small_and_exact(args, kwargs, metas):
        return False
    if len(_runs) >= _MAX_KEYS:
        _runs.clear()
    _runs[key] = runs + 1
    return True


def _small_and_exact(args, kwargs, metas) -> bool:
    total = 0
    for t in (*_tensors(args), *_tensors(list(kwargs.values()))):
        if not _exact(t.dtype):
            return False
        if t.device.type == "tpu":
            nbytes = t.untyped_storage().nbytes()
            if nbytes > STORAGE_BYTES:
                return False
            total += nbytes
    outs = [m for m in metas or () if m is not None]
    if metas is None or not all(_exact(m.dtype) for m in outs):
        return False
    return total + sum(m.numel() * m.element_size() for m in outs) <= TOTAL_BYTES


# What ``run`` returns when CPU has no kernel for the call (some integer dtypes): it must compile.
NO_CPU_KERNEL = object()


def run(plan, key, args, kwargs):
    """The op run by CPU PyTorch on host copies of the call's storages; written storages go back whole."""
    copies = _HostCopies([t for t in (*_tensors(args), *_tensors(list(kwargs.values()))) if t.device.type == "tpu"])
    try:
        result = plan.op(*copies.of(args), **{name: copies.of(v) for name, v in kwargs.items()})
    except NotImplementedError:  # e.g. "histogram_cpu" not implemented for 'Long'; nothing was written back
        _runs[key] = config.current.host_runs_before_compile
        return NO_CPU_KERNEL
    metrics.count(metrics.host_runs, str(plan.op))
    if plan.kind == "inplace":
        copies.write_back(parity.written_tensors(plan, args, kwargs))
        return None if plan.returns == "none" else args[0]
    outs = [_upload(r) if isinstance(r, torch.Tensor) else r for r in
            ([result] if isinstance(result, torch.Tensor) else result)]
    if plan.returns == "tensor":
        return outs[0]
    return outs if plan.returns == "list" else tuple(outs)


class _HostCopies:
    """Host copies of the storages of some tpu tensors (one download), and each tensor's view of its copy."""

    def __init__(self, device_tensors):
        self.storages = {}  # storage address -> (Buffer, host bytes; the host views write into them)
        for t in device_tensors:
            address = t.untyped_storage().data_ptr()
            if address not in self.storages:
                self.storages[address] = (tensor.buffer_of(t), t.untyped_storage().nbytes())
        arrays = iter(jax.device_get([buf.array for buf, _ in self.storages.values() if buf.array is not None]))
        for address, (buf, nbytes) in self.storages.items():
            raw = np.zeros(nbytes, np.uint8)
            if buf.array is not None:
                raw = tensor.host_view(np.asarray(next(arrays)), buf.layout, ((nbytes,), (1,), 0), np.uint8, nbytes)
            self.storages[address] = (buf, raw)

    def of(self, value):
        """``value`` with each tpu tensor replaced by its view of the host copy (a tpu device by cpu)."""
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            _, raw = self.storages[value.untyped_storage().data_ptr()]
            return torch.empty(0, dtype=value.dtype).set_(torch.from_numpy(raw).untyped_storage(),
                                                          value.storage_offset(), value.shape, value.stride())
        if isinstance(value, (list, tuple)):
            return type(value)(self.of(v) for v in value)
        if isinstance(value, torch.device) and value.type == "tpu":
            return torch.device("cpu")
        return value

    def write_back(self, written) -> None:
        """Upload the host copy of each storage that ``written`` tensors view, as its new array: in the
        array's own dtype and layout where that covers the storage (later programs keep their keys)."""
        for address in {t.untyped_storage().data_ptr() for t in written}:
            buf, raw = self.storages[address]
            dtype, layout = buf.storage_dtype, buf.layout
            if dtype is None or not tensor.covers_storage(layout, dtype, raw.size):
                dtype = dtypes.to_jax(written[0].dtype)
                layout = ((raw.size // np.dtype(dtype).itemsize,), (1,), 0)
            flat = raw[: raw.size // np.dtype(dtype).itemsize * np.dtype(dtype).itemsize].view(dtype)
            with tensor.x64():
                buf.set(jax.device_put(np.array(tensor.numpy_strided(flat, layout))), layout)


def _upload(host: torch.Tensor) -> torch.Tensor:
    """A tpu tensor with the host result's value, size and strides."""
    if host.stride() == tensor.contiguous_strides(host.shape):
        return tensor.from_host(host)
    size, stride = tuple(host.shape), host.stride()
    with tensor.x64():
        array = jax.device_put(dtypes.torch_to_numpy(host))
    out = tensor.empty(size, host.dtype, stride)
    tensor.attach(out, array, (size, stride, 0))
    return out
