"""torch.save / torch.load / pickle / copy.deepcopy for tpu tensors.

Saving needs nothing from us.  A tpu tensor has a real storage, so
``Tensor.__reduce_ex__`` takes PyTorch's ordinary path: the pickle names
``torch._utils._rebuild_tensor_v2`` and a storage tagged ``tpu:0``, and
``torch.save`` writes the storage's bytes after ``storage.cpu()``, which
copies through our ``copy_`` kernel.  Views share one saved storage, so
sharing survives the round trip, and the file never mentions torchtpu: a
CPU-only process loads it with ``map_location="cpu"``, as with CUDA files.

What does need us is making a tpu *storage* from Python.  PyTorch does that
with ``torch.UntypedStorage(nbytes, device=...)``, which asks the C++
PrivateUse1 allocator for memory; a pure-Python backend has none, and the
call crashes the process.  Three storage paths take it: restoring a storage
in ``torch.load`` (``storage.to(device)``), ``storage.clone()`` (behind
``copy.deepcopy`` and ``copy.copy``) and ``storage.tpu()`` / ``.to("tpu")``.
We route each of them, for tpu targets only, to a storage built by
torchtpu: a uint8 tpu tensor of the storage's bytes.  ``pickle`` of a
storage goes through legacy ``torch.save``, whose C++ re-wraps our fake
address in a storage torchtpu never saw; a tpu storage pickles as its CPU
copy plus ``storage_from_pickle`` instead (so a pickle, unlike a
``torch.save`` file, names torchtpu).  Every other device keeps PyTorch's
own code.
"""

from __future__ import annotations

import torch
import torch.serialization

from ...core import tensor
from ...runtime import device as runtime_device

_PRIORITY = 19  # before PyTorch's generic PrivateUse1 entry (23), whose restore crashes
_StorageBase = torch.storage._StorageBase
_original_clone = _StorageBase.clone
_original_to = _StorageBase.to


def _is_tpu(device) -> bool:
    return torch.device(device).type == "tpu"


def storage_from_host(host: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage holding a copy of a CPU storage's bytes."""
    as_bytes = torch.empty((0,), dtype=torch.uint8).set_(host)
    return tensor.from_host(as_bytes).untyped_storage()


def clone_tpu_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage with a copy of a tpu storage's bytes (no host round trip)."""
    as_bytes = torch.empty((0,), dtype=torch.uint8, device=runtime_device.TORCH_DEVICE).set_(storage)
    return as_bytes.clone().untyped_storage()


def to_tpu(storage: torch.UntypedStorage, device=None) -> torch.UntypedStorage:
    runtime_device.index_of(device)  # this process's chip
    if storage.device.type == "tpu":
        return storage
    return storage_from_host(storage.cpu())


# ---- torch.load: restore storages tagged "tpu" / "tpu:N" ------------------------------


def _tag(storage):
    if storage.device.type == "tpu":
        return f"tpu:{storage.device.index or 0}"
    return None


def _restore(storage, location: str):
    if location == "tpu" or location.startswith("tpu:"):
        # Onto this process's chip, whichever rank saved it: one process drives one chip.
        return to_tpu(storage)
    return None


# ---- storage methods that would call the missing allocator -----------------------------


def _clone(self):
    if self.device.type == "tpu":
        return clone_tpu_storage(self)
    return _original_clone(self)


def _to(self, *, device, non_blocking=False):
    if _is_tpu(device):
        return to_tpu(self, device)
    return _original_to(self, device=device, non_blocking=non_blocking)


def _tpu(self, device=None, non_blocking=False):
    return to_tpu(self, device)


# ---- pickle: a storage reduces through legacy torch.save, which re-wraps our
# address in a storage of its own; reduce a tpu storage to its CPU copy instead.


def storage_from_pickle(host):
    """Unpickle a tpu storage from its CPU copy (typed or untyped, as it was pickled), for real
    even where a fake tensor mode is active (AOTAutograd's cache loads graphs' constants under one)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        if isinstance(host, torch.storage.TypedStorage):
            return torch.storage.TypedStorage(
                wrap_storage=storage_from_host(host._untyped_storage), dtype=host.dtype, _internal=True
            )
        return storage_from_host(host)


_original_reduce_untyped = _StorageBase.__reduce__
_original_reduce_typed = torch.storage.TypedStorage.__reduce__


def _host_copy(storage):
    """A tpu storage's CPU copy, made for real even where a fake tensor mode is active (a graph's
    tensor constants are pickled under one: AOTAutograd's cache)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return storage.cpu()


def _reduce_untyped(self):
    if self.device.type == "tpu":
        return (storage_from_pickle, (_host_copy(self),))
    return _original_reduce_untyped(self)


def _reduce_typed(self):
    if self._untyped_storage.device.type == "tpu":
        host = torch.storage.TypedStorage(wrap_storage=_host_copy(self._untyped_storage), dtype=self.dtype,
                                          _internal=True)
        return (storage_from_pickle, (host,))
    return _original_reduce_typed(self)


def install() -> None:
    if getattr(_StorageBase, "_torchtpu_serialization", False):
        return
    torch.serialization.register_package(_PRIORITY, _tag, _restore)
    _StorageBase.clone = _clone
    _StorageBase.to = _to
    _StorageBase.tpu = _tpu  # replaces the generated method, which allocates
    _StorageBase.__reduce__ = _reduce_untyped
    torch.storage.TypedStorage.__reduce__ = _reduce_typed
    _StorageBase._torchtpu_serialization = True
