"""Lowerings: random sampling.

Every lowering here is ``random=True``: the executor hands it a fresh jax
PRNG key per call, folded from torch.tpu's seed and op counter, so
``torch.manual_seed`` and ``torch.tpu.get_rng_state``/``set_rng_state``
replay the same stream.  The streams are jax's, not CPU's: values match CPU
in distribution, not bit for bit.

PyTorch has no functional overload named like ``normal_.default`` or
``bernoulli_.float``, so those two in-place ops are lowered directly and
write their result back through ``writes=("self",)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .registry import aten, lower


def _float_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    dtype = _float_dtype(dtype)
    return jax.random.uniform(key, shape, dtype, jnp.asarray(low, dtype), jnp.asarray(high, dtype))


def _open_unit(key, shape, dtype):
    """Uniform in (0, 1): safe to take logs of either end."""
    u = jax.random.uniform(key, shape, _float_dtype(dtype))
    tiny = jnp.finfo(u.dtype).tiny
    return jnp.clip(u, tiny, 1 - jnp.finfo(u.dtype).epsneg)


def _standard_normal(key, shape, dtype):
    return jax.random.normal(key, shape, _float_dtype(dtype))


# ---- uniform and normal -------------------------------------------------------------


def _check_uniform_range(self, from_=0.0, to=1.0, *, generator=None, out=None):
    """CPU's checks of the bounds, which PyTorch's meta kernel for uniform_ lacks."""
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}")
    if self.dtype.is_floating_point and to - from_ > torch.finfo(self.dtype).max:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{str(self.dtype).removeprefix('torch.')}>::max(), "
            f"but found to={to:g} and from={from_:g} which result in to-from to exceed the limit")


@lower(aten.uniform.default, random=True, check=_check_uniform_range)
def uniform(self, from_=0.0, to=1.0, *, generator=None, key):
    return _uniform(key, self.shape, self.dtype, from_, to)


def _normal(key, shape, dtype, mean, std):
    z = _standard_normal(key, shape, dtype)
    return z * jnp.asarray(std, z.dtype) + jnp.asarray(mean, z.dtype)


@lower(aten.normal_functional.default, random=True)
def normal_functional(self, mean=0.0, std=1.0, *, generator=None, key):
    return _normal(key, self.shape, self.dtype, mean, std)


@lower(aten.normal_.default, random=True, writes=("self",))
def normal_inplace(self, mean=0.0, std=1.0, *, generator=None, key):
    value = _normal(key, self.shape, self.dtype, mean, std)
    return value, (value,)


@lower(aten.normal.Tensor_float, random=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return _normal(key, mean.shape, mean.dtype, mean, std)


@lower(aten.normal.float_Tensor, random=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return _normal(key, std.shape, std.dtype, mean, std)


@lower(aten.normal.Tensor_Tensor, random=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return _normal(key, shape, jnp.result_type(mean, std), mean, std)


@lower(aten.normal.float_float, random=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, key):
    from ..core import dtypes

    jdtype = dtypes.to_jax(dtype) if dtype is not None else jnp.float32
    return _normal(key, tuple(size), jdtype, mean, std)


@lower(aten.log_normal.default, random=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None, key):
    z = _standard_normal(key, self.shape, jnp.float32)
    return jnp.exp(z * std + mean).astype(_float_dtype(self.dtype))


# ---- bernoulli ----------------------------------------------------------------------------


def _bernoulli(key, shape, p, dtype):
    u = jax.random.uniform(key, shape, jnp.float32)
    return (u < jnp.asarray(p, jnp.float32)).astype(dtype)


@lower(aten.bernoulli.default, random=True)
def bernoulli(self, *, generator=None, key):
    return _bernoulli(key, self.shape, self, self.dtype)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(self, p, *, generator=None, key):
    return _bernoulli(key, self.shape, p, self.dtype)


@lower(aten.bernoulli.Tensor, random=True)
def bernoulli_tensor(self, p, *, generator=None, key):
    return _bernoulli(key, self.shape, jnp.broadcast_to(p, self.shape), self.dtype)


@lower(aten.bernoulli_.float, random=True, writes=("self",))
def bernoulli_inplace_float(self, p=0.5, *, generator=None, key):
    value = _bernoulli(key, self.shape, p, self.dtype)
    return value, (value,)


# ---- integers -------------------------------------------------------------------------------


def _default_upper(dtype):
    """Exclusive upper bound of random_() with no range: every integer the dtype holds exactly."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1) + 1
    return int(jnp.iinfo(dtype).max) + 1


def _random_integers(key, shape, dtype, low, high):
    # Draw in int64 so every dtype's range fits, then cast.  jax's bound is
    # exclusive and an int64, so the full int64 range loses its top value.
    high = min(high, int(np.iinfo(np.int64).max))
    return jax.random.randint(key, shape, low, high, dtype=jnp.int64).astype(dtype)


@lower(getattr(aten.random, "from"), random=True)
def random_from(self, from_, to=None, *, generator=None, key):
    high = _default_upper(self.dtype) if to is None else to
    return _random_integers(key, self.shape, self.dtype, from_, high)


@lower(aten.random.to, random=True)
def random_to(self, to, *, generator=None, key):
    return _random_integers(key, self.shape, self.dtype, 0, to)


@lower(aten.random.default, random=True)
def random_default(self, *, generator=None, key):
    return _random_integers(key, self.shape, self.dtype, 0, _default_upper(self.dtype))


@lower(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n).astype(jnp.int64)


# ---- other distributions ----------------------------------------------------------------------


@lower(aten.exponential.default, random=True)
def exponential(self, lambd=1.0, *, generator=None, key):
    u = _open_unit(key, self.shape, jnp.float32)
    return (-jnp.log(u) / lambd).astype(_float_dtype(self.dtype))


@lower(aten.geometric.default, random=True)
def geometric(self, p, *, generator=None, key):
    u = _open_unit(key, self.shape, jnp.float32)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1).astype(self.dtype)


@lower(aten.cauchy.default, random=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None, key):
    u = _open_unit(key, self.shape, jnp.float32)
    return (median + sigma * jnp.tan(jnp.pi * (u - 0.5))).astype(_float_dtype(self.dtype))


@lower(aten.multinomial.default, random=True)
def multinomial(self, num_samples, replacement=False, *, generator=None, key):
    probs = self.astype(jnp.float32)
    rows = probs.reshape(-1, probs.shape[-1])
    logits = jnp.where(rows > 0, jnp.log(rows), -jnp.inf)
    if replacement:
        samples = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, rows.shape[0])).T
    else:
        # Gumbel top-k: sorting perturbed logits draws without replacement.
        perturbed = logits + jax.random.gumbel(key, logits.shape)
        samples = jnp.argsort(-perturbed, axis=-1, stable=True)[:, :num_samples]
    return samples.reshape(self.shape[:-1] + (num_samples,)).astype(jnp.int64)
