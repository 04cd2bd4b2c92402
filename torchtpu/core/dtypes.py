"""The one mapping between torch dtypes and jax/numpy dtypes."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

TORCH_TO_JAX = {
    torch.bool: jnp.dtype(jnp.bool_),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(ml_dtypes.bfloat16),
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
}
JAX_TO_TORCH = {v: k for k, v in TORCH_TO_JAX.items()}


def to_jax(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"torchtpu: dtype {dtype} is not supported on the tpu device") from None


def cast(value, dtype):
    """``value`` as ``dtype``, with CPU PyTorch's rule for floats into narrow integers:
    truncate to a wide integer, then wrap (CPU gives uint8 255 for -1.0 and 44 for 300.0;
    XLA's convert saturates to 0 and 255)."""
    dtype = jnp.dtype(dtype)
    if value.dtype == dtype:
        return value
    if jnp.issubdtype(value.dtype, jnp.floating) and jnp.issubdtype(dtype, jnp.integer) and dtype.itemsize < 4:
        value = value.astype(jnp.int32)
    return value.astype(dtype)


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[jnp.dtype(dtype)]


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A copy of a host tensor's values as a C-ordered numpy array of the matching dtype (bfloat16 included).

    A copy, not ``t.numpy()``: numpy() marks the tensor's storage as not
    resizable, which would leak into the caller's tensor.
    """
    t = t.detach().resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def numpy_to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A host tensor owning a copy of ``a`` (device_get arrays are read-only)."""
    a = np.array(a, copy=True, order="C")
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def scalar_type_name(dtype) -> str:
    """PyTorch's name of a dtype in its error messages: ``Float`` for torch.float32."""
    return torch.empty(0, dtype=dtype).type().split(".")[-1].removesuffix("Tensor")
