"""Discrete Fourier transforms: the three ATen primitives every torch.fft function reaches.

``normalization`` is ATen's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n,
applied whatever the direction.  jax names the scaling per direction, so we
pick the jax ``norm`` that gives that scaling for the direction we compute.
"""

from __future__ import annotations

import jax.numpy as jnp

from .registry import aten, lower

_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}  # scaling of a forward transform
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}  # scaling of an inverse transform


def _complex(x):
    return x if jnp.issubdtype(x.dtype, jnp.complexfloating) else x.astype(jnp.result_type(x, jnp.complex64))


@lower(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    x = _complex(self)
    if not dim:
        return x
    if forward:
        return jnp.fft.fftn(x, axes=dim, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(x, axes=dim, norm=_INVERSE_NORM[normalization])


@lower(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    norm = _FORWARD_NORM[normalization]
    if onesided:
        return jnp.fft.rfftn(self, axes=dim, norm=norm)
    return jnp.fft.fftn(_complex(self), axes=dim, norm=norm)


@lower(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(self, s=sizes, axes=dim, norm=_INVERSE_NORM[normalization])
