"""Front layer: register the PrivateUse1 key as ``tpu`` and install its kernels."""

from __future__ import annotations

import torch
import torch.utils.backend_registration as backend_registration

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
    backend_registration._setup_privateuseone_for_python_backend(
        "tpu", device_module, Hooks(), DeviceGuard()
    )


def _lowered_overloads():
    """Every OpOverload the table covers, with the in-place and out= variants derived from it."""
    from .execution import plan
    from .ops.registry import LOWERINGS

    seen = set()
    for functional in LOWERINGS:
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


def _execute_kernel(op):
    from .execution import plan, strict

    op_plan = plan.plan_for(op)

    def kernel(*args, **kwargs):
        return strict.run(op_plan, args, kwargs)

    return kernel


def _fallback_kernel(keyset, op, *args, **kwargs):
    from .execution import fallback

    return fallback.fallback(op, args, kwargs)


def register_kernels() -> None:
    if _libraries:
        return
    from . import ops  # noqa: F401  (fills the lowering table)
    from .execution import builtins

    lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    _libraries.append(lib)
    for op in builtins.METADATA_OPS:
        lib.impl(op, builtins.metadata_kernel(op))
    for op, kernel in builtins.KERNELS.items():
        lib.impl(op, kernel)
    for op in _lowered_overloads():
        if op not in builtins.KERNELS:
            lib.impl(op, _execute_kernel(op))
    autograd = torch.library.Library("aten", "IMPL", "AutogradPrivateUse1")
    _libraries.append(autograd)
    for op, kernel in builtins.AUTOGRAD_KERNELS.items():
        autograd.impl(op, kernel)
    own = torch.library.Library("torchtpu", "IMPL", "PrivateUse1")  # ops torchtpu defines (ops/attention.py)
    _libraries.append(own)
    from .ops.registry import LOWERINGS

    for op in [op for op in LOWERINGS if op.namespace == "torchtpu"]:
        own.impl(op._schema.name.split("::")[1], _execute_kernel(op))
    catch_all = torch.library.Library("_", "IMPL", "PrivateUse1")
    _libraries.append(catch_all)
    catch_all.fallback(_fallback_kernel, with_keyset=True)
