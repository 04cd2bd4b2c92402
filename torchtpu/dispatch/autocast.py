"""Autocast on tpu: ``torch.autocast("tpu")`` with CUDA's op policy.

``torch.autocast("tpu")`` enables the AutocastPrivateUse1 dispatch key, for
which PyTorch registers kernels only for its own devices; these are ours.
"""

from __future__ import annotations

import torch

# torch.autocast("tpu") enables the AutocastPrivateUse1 dispatch key; PyTorch
# registers autocast kernels for its own devices only.  Like CUDA's policy:
# these ops run in the autocast dtype, these in float32, all others untouched.
AUTOCAST_LOWER_PRECISION = (
    "mm", "bmm", "matmul", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv", "dot", "vdot",
    "linear", "einsum", "chain_matmul", "linalg_multi_dot", "prelu",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "conv_tbc", "scaled_dot_product_attention",
)
AUTOCAST_FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm", "norm", "nll_loss",
    "cross_entropy_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
    "softmax", "log_softmax", "cumsum", "cumprod", "sum", "prod", "dist", "cosine_similarity", "renorm",
)
_AUTOCAST_KEY = torch._C.DispatchKey.AutocastPrivateUse1


def _autocast_cast(value, dtype):
    if isinstance(value, torch.Tensor):
        eligible = value.device.type == "tpu" and value.is_floating_point() and value.dtype != torch.float64
        return value.to(dtype) if eligible and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(_autocast_cast(v, dtype) for v in value)
    return value


def _autocast_kernel(op, to_float32: bool):
    def kernel(*args, **kwargs):
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype("tpu")
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST_KEY)):
            return op(*_autocast_cast(args, dtype), **{k: _autocast_cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def register(new_library) -> None:
    """Install the policy; ``new_library(namespace, kind, key)`` makes a library the caller keeps alive."""
    kernels = new_library("aten", "IMPL", "AutocastPrivateUse1")
    passthrough = new_library("_", "IMPL", "AutocastPrivateUse1")
    try:  # every other op passes through autocast unchanged, as on CUDA
        passthrough.fallback(torch.library.fallthrough_kernel)
    except RuntimeError as error:  # someone registered it already: that is all we need
        if "multiple backend fallbacks" not in str(error):
            raise
    for names, to_float32 in ((AUTOCAST_LOWER_PRECISION, False), (AUTOCAST_FLOAT32, True)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if op._schema.is_mutable or "out" in overload:
                    continue  # autocast leaves in-place and out= ops alone, like CUDA
                kernels.impl(op, _autocast_kernel(op, to_float32))
