"""Native kernels that are not lowerings: allocation, metadata, transfers and host reads."""

from __future__ import annotations

import functools

import torch
from torch._C import DispatchKey, DispatchKeySet

from ..core import tensor
from ..eager import executor
from ..runtime import metrics
from ..runtime import device as runtime_device

aten = torch.ops.aten
_CPU_KEYS = DispatchKeySet(DispatchKey.CPU)

# Ops whose CPU kernel only touches sizes, strides and offsets.  Running them
# on CPU gives PyTorch's own views of our storages (the addresses are fake, and
# these kernels never read them).
METADATA_OPS = [
    aten.as_strided.default,
    aten.view.default,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
]


def metadata_kernel(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_CPU_KEYS, *args, **kwargs)

    return kernel


def _check_tpu_device(device):
    if device is not None and torch.device(device).type not in ("tpu", "privateuseone"):
        raise RuntimeError(f"torchtpu: expected a tpu device, got {device}")
    if device is not None:
        runtime_device.index_of(device)  # this process's chip, not another process's


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_tpu_device(device)
    dtype = dtype or torch.get_default_dtype()
    t = tensor.empty(size, dtype)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return t.as_strided(size, torch.empty(size, device="meta", memory_format=memory_format).stride())
    return t


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_tpu_device(device)
    return tensor.empty(size, dtype or torch.get_default_dtype(), stride)


def resize_(self, size, memory_format=None):
    """Resize in place, keeping the old elements, like CPU's resize_."""
    size = tuple(size)
    stride = tensor.contiguous_strides(size)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    needed = (self.storage_offset() + sum((s - 1) * st for s, st in zip(size, stride)) + 1) * self.element_size()
    if all(size) and needed > self.untyped_storage().nbytes():
        old = self.detach().clone() if self.numel() else None
        fresh = tensor.empty((needed // self.element_size(),), self.dtype)
        if old is not None:
            fresh[self.storage_offset(): self.storage_offset() + old.numel()].copy_(old.reshape(-1))
        self.set_(fresh.untyped_storage(), self.storage_offset(), size, stride)
    else:
        self.set_(self.untyped_storage(), self.storage_offset(), size, stride)
    return self


def set_source_tensor(self, source):
    return self.set_(source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


def set_empty(self):
    return self.set_(tensor.empty((0,), self.dtype).untyped_storage(), 0, (0,), (1,))


def copy_(self, src, non_blocking=False):
    """copy_ across devices; tpu to tpu goes through the lowering of aten.copy."""
    if self.device.type == "tpu" and src.device.type == "tpu":
        return executor.execute(aten.copy_.default, (self, src), {})
    if self.device.type == "tpu":
        src_tpu = tensor.from_host(src.to(self.dtype))
        if src.shape == self.shape and not (self.is_conj() or self.is_neg()):
            tensor.write(self, tensor.read(src_tpu))  # no program to compile for a plain upload
            return self
        return executor.execute(aten.copy_.default, (self, src_tpu), {})
    metrics.record(metrics.host_syncs, "copy to cpu", "host_sync")
    host = tensor.to_host(src)
    # The storage holds un-conjugated values; CPU's copy_ resolves the bits.
    if src.is_conj():
        host = host.conj()
    if src.is_neg():
        host = host._neg_view()
    self.copy_(host)
    return self


def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """``.to(...)`` from tpu: allocate like CPU's _to_copy would, then copy.

    PyTorch's generic version asks for pinned host memory when
    ``non_blocking=True``, which a Python backend cannot provide. A
    ``non_blocking`` copy to the host behaves as CUDA's does: it returns at
    once, and the CPU tensor holds the value after a synchronize of the device
    or of an event recorded after the copy.
    """
    like = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
    meta = aten._to_copy.default(like, dtype=dtype, memory_format=memory_format)
    target = self.device if device is None else torch.device(device)
    if target.type == "tpu":
        runtime_device.index_of(target)
        target = runtime_device.TORCH_DEVICE
    out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=target)
    if non_blocking and target.type == "cpu" and not (self.is_conj() or self.is_neg()):
        tensor.start_host_copy(self, functools.partial(_fill_host_copy, out))
        return out
    return copy_(out, self)


def _fill_host_copy(out, host) -> None:
    # The completion of the copy, not an op of the caller's: ``out`` may be an
    # inference tensor (made under inference_mode), which only inference mode may write.
    with torch.inference_mode():
        out.copy_(host)


def copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


def copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


def local_scalar_dense(self):
    metrics.record(metrics.host_syncs, "item", "host_sync")
    return tensor.to_host(self).item()


def equal(self, other):
    metrics.record(metrics.host_syncs, "equal", "host_sync")
    return bool(self.shape == other.shape and torch.equal(tensor.to_host(self), tensor.to_host(other)))


KERNELS = {
    aten.empty.memory_format: empty_memory_format,
    aten.empty_strided.default: empty_strided,
    aten.resize_.default: resize_,
    aten.set_.source_Tensor: set_source_tensor,
    aten.set_.default: set_empty,
    aten.copy_.default: copy_,
    aten._to_copy.default: to_copy,
    aten._copy_from.default: copy_from,
    aten._copy_from_and_resize.default: copy_from_and_resize,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.equal.default: equal,
}
