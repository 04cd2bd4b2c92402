"""Registration with PyTorch: the ``tpu`` device, and a PrivateUse1 kernel for every op we run.

``register_device`` installs the ``torch.tpu`` module, the hooks and the
device guard.  ``register_kernels`` installs, in one place, every kernel the
backend has: the metadata kernels that make views, the native kernels of
``kernels.py`` (allocation, copies, host reads), one eager-executor kernel for
each op the lowering table covers (with its in-place and out= variants), the
SDPA autograd kernel, autocast, and the catch-all fallback for the rest.
"""

from __future__ import annotations

import torch
import torch.utils.backend_registration as backend_registration

from ..eager import executor, plan
from ..ops.registry import LOWERINGS, NAMESPACE
from ..core import tensor
from ..runtime import device as runtime_device
from ..runtime import native
from . import attention, autocast, fallback, kernels

aten = torch.ops.aten
_libraries = []  # keep the torch.library objects alive


class Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register_device(device_module) -> None:
    if torch._C._get_privateuse1_backend_name() == "tpu" and hasattr(torch, "tpu"):
        return
    if native.module is not None:  # first: hooks register once, and ours resize storages
        native.module.install_hooks(tensor.resize_storage)
    backend_registration._setup_privateuseone_for_python_backend(
        "tpu", device_module, Hooks(), DeviceGuard()
    )
    # Then the C++ guard, where built, replaces the Python one: it can name tpu:k for k > 0.
    runtime_device.install_guard()


def _lowered_overloads():
    """Every ATen OpOverload the table covers, with the in-place and out= variants derived from it."""
    seen = set()
    for functional in LOWERINGS:
        if functional.namespace != "aten":
            continue
        packet_name = functional._schema.name.split("::")[1]
        for name in (packet_name, packet_name + "_"):
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload_name in packet.overloads():
                op = getattr(packet, overload_name)
                if op not in seen and plan.plan_for(op) is not None and not _decomposes_above_us(op):
                    seen.add(op)
                    yield op


def _decomposes_above_us(op) -> bool:
    """CompositeImplicitAutograd ops decompose before reaching a backend, and their
    autograd comes from that decomposition: a kernel of ours would bypass it."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # TorchScript-only overloads such as index.Tensor_hacked_twin
        return False


def lowered_kernel(op):
    """The PrivateUse1 kernel of an op the lowering table covers: the eager executor."""
    op_plan = plan.plan_for(op)

    def kernel(*args, **kwargs):
        return executor.run(op_plan, args, kwargs)

    return kernel


def _fallback_kernel(keyset, op, *args, **kwargs):
    return fallback.fallback(op, args, kwargs)


def _fake_kernel(op, lowering):
    """Fake tensors on tpu: the lowering's checks and result shapes; elsewhere PyTorch's meta kernel."""
    from torch._decomp import meta_table

    def fake(*args, **kwargs):
        if not any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in args):
            return meta_table[op](*args, **kwargs)
        lowering.check(*args, **kwargs)
        return lowering.meta(*args, **kwargs)

    return fake


def _library(namespace, kind, key):
    lib = torch.library.Library(namespace, kind, key)
    _libraries.append(lib)
    return lib


def register_kernels() -> None:
    if _libraries:
        return
    from .. import ops  # noqa: F401  (fills the lowering table)

    lib = _library("aten", "IMPL", "PrivateUse1")
    in_cpp = set(native.module.register_view_kernels()) if native.module is not None else set()
    for op in kernels.METADATA_OPS:
        if op._schema.name.split("::")[1] not in in_cpp:
            lib.impl(op, kernels.metadata_kernel(op))
    for op, kernel in kernels.KERNELS.items():
        lib.impl(op, kernel)
    for op in _lowered_overloads():
        if op not in kernels.KERNELS:
            lib.impl(op, lowered_kernel(op))
    autograd = _library("aten", "IMPL", "AutogradPrivateUse1")
    for op, kernel in attention.AUTOGRAD_KERNELS.items():
        autograd.impl(op, kernel)
    own = _library(NAMESPACE, "IMPL", "PrivateUse1")  # the ops torchtpu defines (ops/registry.define)
    for op in [op for op in LOWERINGS if op.namespace == NAMESPACE]:
        own.impl(op._schema.name.split("::")[1], lowered_kernel(op))
    for op, lowering in LOWERINGS.items():
        if lowering.fake:
            torch.library.register_fake(op, _fake_kernel(op, lowering), lib=_library("aten", "FRAGMENT", ""),
                                        allow_override=True)
    catch_all = _library("_", "IMPL", "PrivateUse1")
    catch_all.fallback(_fallback_kernel, with_keyset=True)
    autocast.register(_library)
