"""``Module.to("tpu")`` keeps each Parameter object, as ``Module.to("cuda")`` does.

For CPU to CUDA, PyTorch moves a parameter by ``param.data = moved``, so the
Parameter object survives and weights tied between modules stay tied.  That
path is closed to PrivateUse1 tensors (``_has_compatible_shallow_copy_type``
lists only built-in backends), and PyTorch would instead make a new Parameter
per module, silently untying shared weights.  For conversions to or from tpu, we
switch on PyTorch's own swap path (``torch.utils.swap_tensors``), which keeps
identity.  Modules that neither hold nor receive tpu tensors are untouched.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

_original_to = torch.nn.Module.to


@contextlib.contextmanager
def _swap_parameters_on_conversion():
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def _involves_tpu(module, args, kwargs) -> bool:
    """The conversion moves tensors to tpu, or the module already holds tpu tensors."""
    device = torch._C._nn._parse_to(*args, **kwargs)[0]
    if device is not None and device.type == "tpu":
        return True
    return any(t.device.type == "tpu" for t in module.parameters())


@functools.wraps(_original_to)
def _module_to(self, *args, **kwargs):
    if not _involves_tpu(self, args, kwargs):
        return _original_to(self, *args, **kwargs)
    try:
        with _swap_parameters_on_conversion():
            return _original_to(self, *args, **kwargs)
    except RuntimeError as swap_error:
        # swap_tensors refuses a parameter that something else still holds,
        # such as a live autograd graph.  Fall back to PyTorch's other path,
        # which makes new Parameters (and so unties shared weights).
        if "Couldn't swap" not in str(swap_error):
            raise
        warnings.warn(
            "torchtpu: Module.to could not keep Parameter identity (a parameter is still "
            "referenced, e.g. by an autograd graph); new Parameters were made and tied "
            "weights, if any, are no longer tied.",
            stacklevel=2,
        )
        return _original_to(self, *args, **kwargs)


def _module_tpu(self, device=None):
    """Move all parameters and buffers to the tpu device (like ``Module.cuda``)."""
    return self.to(torch.device("tpu", 0 if device is None else device))


def install() -> None:
    torch.nn.Module.to = _module_to
    torch.nn.Module.tpu = _module_tpu
