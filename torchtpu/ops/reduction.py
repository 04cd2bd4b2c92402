"""Lowerings: reductions, scans, softmax, sorting and order statistics.

Conventions shared by every op here:

* Half types (float16, bfloat16) accumulate in float32 and round once at the
  end, as CPU PyTorch's kernels do; integer and bool sums accumulate in int64.
* NaN propagates the way CPU's comparisons make it: max/min/median return NaN
  (and the index of the first NaN); sorting treats every NaN as the largest
  value and -0.0 as equal to 0.0.
* Ties pick CPU's index: first occurrence for max/min/argmax, last occurrence
  for cummax/cummin and mode; sorts are stable.
* A 0-dim tensor reduces over "dim 0 or -1" as the identity.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..core import dtypes
from .common import dims_tuple, canonical_dim, is_complex, is_float, is_integer
from .registry import aten, lower

HALF_TYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


# ---- helpers -----------------------------------------------------------------------


def _axes(x, dim):
    """A reduction's axes as jax sees them; a 0-dim tensor has none to reduce."""
    return dims_tuple(dim, x.ndim) if x.ndim else ()


def _axis(x, dim):
    return canonical_dim(dim, x.ndim)


def accumulator(dtype):
    """The dtype CPU accumulates ``dtype`` in."""
    dtype = jnp.dtype(dtype)
    if dtype in HALF_TYPES:
        return jnp.dtype(jnp.float32)
    if dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.integer):
        return jnp.dtype(jnp.int64)
    return dtype


def _cast_for_sum(x, dtype):
    """``x`` in the dtype a sum-like op accumulates it in (``dtype=`` wins)."""
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    return x.astype(accumulator(x.dtype))


def _count(x, axes):
    count = 1
    for a in axes:
        count *= x.shape[a]
    return count


def _require_nonempty(x, dim, name):
    """CPU refuses to reduce an empty dim for ops without an identity (the meta kernel does not)."""
    if x.ndim and x.shape[_axis(x, dim)] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {dim} to have non-zero size.")


def _is_nan(x):
    return jnp.isnan(x) if is_float(x) or is_complex(x) else jnp.zeros(x.shape, bool)


def _index_iota(shape, axis):
    return lax.broadcasted_iota(jnp.int64, shape, axis)


def _take(x, position, axis, keepdim):
    """x[..., position, ...] along ``axis``; ``position`` has x's shape with that axis kept as 1."""
    picked = jnp.take_along_axis(x, position, axis=axis)
    return picked if keepdim else jnp.squeeze(picked, axis)


def _on_axis(fn, x, dim, keepdim):
    """Apply ``fn(x, axis) -> tuple of arrays with the axis kept`` to one dim; 0-dim is a 1-vector."""
    scalar = x.ndim == 0
    axis = 0 if scalar else _axis(x, dim)
    results = fn(x.reshape(1) if scalar else x, axis)
    if scalar:
        return tuple(r.reshape(()) for r in results)
    return tuple(r if keepdim else jnp.squeeze(r, axis) for r in results)


# ---- sums, means, products -------------------------------------------------------------


@lower(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_cast_for_sum(x, dtype), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    x = jnp.where(_is_nan(x), jnp.zeros((), x.dtype), x)
    return sum_(x, dim, keepdim, dtype=dtype)


@lower(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    axes = _axes(x, dim)
    total = jnp.sum(_cast_for_sum(x, dtype), axis=axes, keepdims=keepdim)
    return total / _count(x, axes)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(_cast_for_sum(x, dtype), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=jnp.int64)


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_axes(x, dim), keepdims=keepdim)


# ---- variance and standard deviation ------------------------------------------------------


def _var(x, dim, correction, keepdim):
    """Variance with Bessel-style ``correction``; divides by max(0, N - correction) like CPU."""
    axes = _axes(x, dim)
    x = x.astype(accumulator(x.dtype)) if is_float(x) or is_complex(x) else x.astype(jnp.float32)
    n = _count(x, axes)
    mean_ = jnp.sum(x, axis=axes, keepdims=True) / n
    deviation = x - mean_
    squares = (deviation * jnp.conj(deviation)).real if is_complex(x) else deviation * deviation
    correction = 1 if correction is None else correction
    divisor = jnp.maximum(n - correction, 0)
    var = jnp.sum(squares, axis=axes, keepdims=keepdim) / divisor
    return var, mean_ if keepdim else jnp.squeeze(mean_, axes)


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    var_, mean_ = _var(x, dim, correction, keepdim)
    return jnp.sqrt(var_), mean_


# ---- max, min and their indices -------------------------------------------------------------


def _as_ordered(x):
    """bool compares as an integer."""
    return x.astype(jnp.int8) if x.dtype == jnp.bool_ else x


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(_as_ordered(x), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(_as_ordered(x), axis=_axes(x, dim), keepdims=keepdim)


def _first_index_of(x, value, axis):
    """First position along ``axis`` where x equals ``value`` (kept dims), NaN matching NaN."""
    hit = (x == value) | (_is_nan(x) & _is_nan(value))
    return jnp.argmax(hit, axis=axis, keepdims=True).astype(jnp.int64)


def _extreme_with_index(reduce):
    def along(x, axis):
        x = _as_ordered(x)
        value = reduce(x, axis=axis, keepdims=True)
        return value, _first_index_of(x, value, axis)

    return along


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    _require_nonempty(x, dim, "max")
    return _on_axis(_extreme_with_index(jnp.max), x, dim, keepdim)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    _require_nonempty(x, dim, "min")
    return _on_axis(_extreme_with_index(jnp.min), x, dim, keepdim)


def _full_reduction_guard(x, name):
    if x.size == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument.")


@lower(aten.max.default)
def max_(x):
    _full_reduction_guard(x, "max")
    return jnp.max(_as_ordered(x))


@lower(aten.min.default)
def min_(x):
    _full_reduction_guard(x, "min")
    return jnp.min(_as_ordered(x))


@lower(aten.max.other)
def max_other(x, other):
    return jnp.maximum(x, other)


@lower(aten.min.other)
def min_other(x, other):
    return jnp.minimum(x, other)


def _arg_extreme(reduce, name):
    def lowered(x, dim=None, keepdim=False):
        if dim is None:
            if x.size == 0:
                raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
            flat = x.reshape(-1)
            index = _extreme_with_index(reduce)(flat, 0)[1].reshape(())
            return jnp.reshape(index, (1,) * x.ndim) if keepdim else index
        _require_nonempty(x, dim, name)
        return _on_axis(_extreme_with_index(reduce), x, dim, keepdim)[1]

    return lowered


lower(aten.argmax.default)(_arg_extreme(jnp.max, "argmax"))
lower(aten.argmin.default)(_arg_extreme(jnp.min, "argmin"))


@lower(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if (dim is None and x.size == 0) or (dim is not None and x.ndim and x.shape[_axis(x, dim)] == 0):
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.")
    axes = None if dim is None else _axes(x, dim)
    ordered = _as_ordered(x)
    if axes is None and keepdim:
        shape = (1,) * x.ndim
        return jnp.min(ordered).reshape(shape), jnp.max(ordered).reshape(shape)
    return jnp.min(ordered, axis=axes, keepdims=keepdim), jnp.max(ordered, axis=axes, keepdims=keepdim)


# ---- log-sum-exp and norms --------------------------------------------------------------------


def _float_compute(x):
    """Integers reduce as float32 (their result type); half types as float32."""
    if is_integer(x):
        return x.astype(jnp.float32)
    return x.astype(accumulator(x.dtype))


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    axes = _axes(x, dim)
    x = _float_compute(x)
    if x.size == 0:
        return jnp.log(jnp.sum(jnp.exp(x), axis=axes, keepdims=keepdim))
    # Shift by the max, but not by an infinite one (all -inf stays -inf, +inf stays +inf).
    peak = jnp.max(x, axis=axes, keepdims=True)
    peak = jnp.where(jnp.isinf(peak), jnp.zeros((), x.dtype), peak)
    total = jnp.log(jnp.sum(jnp.exp(x - peak), axis=axes, keepdims=True)) + peak
    return total if keepdim else jnp.squeeze(total, axes)


def _vector_norm(x, ord, dim, keepdim, dtype):
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    axes = _axes(x, dim)
    magnitude = jnp.abs(_float_compute(x))
    if ord == float("inf"):
        return jnp.max(magnitude, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(magnitude, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(magnitude != 0, axis=axes, keepdims=keepdim).astype(magnitude.dtype)
    if ord == 1:
        return jnp.sum(magnitude, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(magnitude * magnitude, axis=axes, keepdims=keepdim))
    return jnp.sum(magnitude ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


# ``ord`` decides which computation runs, so it must be a constant.
@lower(aten.linalg_vector_norm.default, static_numbers=True)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(x, ord, dim, keepdim, dtype)


@lower(aten.renorm.default, static_numbers=True)
def renorm(self, p, dim, maxnorm):
    """Scale each slice along ``dim`` whose p-norm exceeds ``maxnorm`` down to norm ``maxnorm``."""
    dim = canonical_dim(dim, self.ndim)
    norm = _vector_norm(self, p, [d for d in range(self.ndim) if d != dim], True, None)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return (self.astype(factor.dtype) * factor).astype(self.dtype)


@lower(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dtype, aten.norm.ScalarOpt_dim_dtype,
       static_numbers=True)
def norm(x, p=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(x, 2 if p is None else p, dim, keepdim, dtype)


# ---- scans -------------------------------------------------------------------------------------


def _scan_input(x, dim, dtype):
    x = _cast_for_sum(x, dtype)
    return (x.reshape(1) if x.ndim == 0 else x), (0 if x.ndim == 0 else _axis(x, dim))


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    shape = x.shape
    x, axis = _scan_input(x, dim, dtype)
    return lax.cumsum(x, axis).reshape(shape)


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    shape = x.shape
    x, axis = _scan_input(x, dim, dtype)
    return lax.cumprod(x, axis).reshape(shape)


@lower(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    shape = x.shape
    x = _float_compute(x)
    x, axis = (x.reshape(1), 0) if x.ndim == 0 else (x, _axis(x, dim))
    return lax.cumlogsumexp(x, axis).reshape(shape) if x.size else x.reshape(shape)


def _running_extreme(better_or_equal):
    """cummax/cummin as an associative scan over (value, index) pairs.

    A later element replaces the running one if it is NaN, or if neither is
    NaN and it ties or beats it: so the index is the last occurrence, and a
    NaN sticks (its index moving to each later NaN), as on CPU.
    """

    def combine(earlier, later):
        (v1, i1), (v2, i2) = earlier, later
        take_later = _is_nan(v2) | (~_is_nan(v1) & better_or_equal(v2, v1))
        return jnp.where(take_later, v2, v1), jnp.where(take_later, i2, i1)

    def lowered(x, dim):
        shape = x.shape
        ordered = _as_ordered(x)
        ordered, axis = (ordered.reshape(1), 0) if x.ndim == 0 else (ordered, _axis(x, dim))
        if ordered.size == 0:
            return x, jnp.zeros(shape, jnp.int64)
        values, indices = lax.associative_scan(combine, (ordered, _index_iota(ordered.shape, axis)), axis=axis)
        return values.reshape(shape), indices.reshape(shape)

    return lowered


lower(aten.cummax.default)(_running_extreme(jnp.greater_equal))
lower(aten.cummin.default)(_running_extreme(jnp.less_equal))


# ---- softmax ------------------------------------------------------------------------------------


def _softmax_input(x, dim):
    scalar = x.ndim == 0
    x = x.astype(accumulator(x.dtype))
    return (x.reshape(1), 0) if scalar else (x, _axis(x, dim))


@lower(aten._softmax.default)
def softmax(x, dim, half_to_float):
    shape = x.shape
    x, axis = _softmax_input(x, dim)
    shifted = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True)) if x.size else x
    return (shifted / jnp.sum(shifted, axis=axis, keepdims=True)).reshape(shape)


@lower(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    shape = x.shape
    x, axis = _softmax_input(x, dim)
    if x.size == 0:
        return x.reshape(shape)
    shifted = x - jnp.max(x, axis=axis, keepdims=True)
    return (shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))).reshape(shape)


@lower(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    shape = grad_output.shape
    grad, axis = _softmax_input(grad_output, dim)
    out, _ = _softmax_input(output, dim)
    return (out * (grad - jnp.sum(grad * out, axis=axis, keepdims=True))).reshape(shape)


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    shape = grad_output.shape
    grad, axis = _softmax_input(grad_output, dim)
    out, _ = _softmax_input(output, dim)
    return (grad - jnp.exp(out) * jnp.sum(grad, axis=axis, keepdims=True)).reshape(shape)


# ---- sorting and order statistics ------------------------------------------------------------


def _sort_keys(x, descending):
    """Keys whose ascending lexicographic order is CPU's sort order for ``x``."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    if not is_float(x):
        return (jnp.invert(x) if descending else x,)  # ~x reverses order without overflow
    nan = jnp.isnan(x)
    # CPU compares with <, so -0.0 == 0.0 and every NaN is above everything.
    value = jnp.where(nan | (x == 0), jnp.zeros((), x.dtype), x)
    if descending:
        return (jnp.logical_not(nan).astype(jnp.int8), -value)
    return (nan.astype(jnp.int8), value)


def _sorted_along(x, axis, descending=False):
    """Stable sort along ``axis``: (values, original indices)."""
    keys = _sort_keys(x, descending)
    *_, values, indices = lax.sort((*keys, x, _index_iota(x.shape, axis)), dimension=axis,
                                   is_stable=True, num_keys=len(keys))
    return values, indices


@lower(aten.sort.default, aten.sort.stable)
def sort(x, dim=-1, descending=False, *, stable=None):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _sorted_along(x, _axis(x, dim), descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    values, indices = _sorted_along(x, axis, descending=largest)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)


def _pick_sorted(position_of):
    """An order statistic: sort along the axis, then take ``position_of(sorted values, axis)``."""

    def along(x, axis):
        values, indices = _sorted_along(x, axis)
        position = position_of(values, axis)
        return jnp.take_along_axis(values, position, axis), jnp.take_along_axis(indices, position, axis)

    return along


def _nan_aware_median_position(skip_nan):
    """The lower median's sorted position; NaN sorts last, so counting them finds it.

    median: a row holding NaN answers its first NaN (sorted just after the
    numbers).  nanmedian: the lower median of the numbers, or the first NaN if
    the row holds nothing else.
    """

    def position_of(values, axis):
        n = values.shape[axis]
        numbers = jnp.sum(~_is_nan(values), axis=axis, keepdims=True)
        if skip_nan:
            return jnp.maximum(numbers - 1, 0) // 2
        return jnp.where(numbers < n, numbers, (n - 1) // 2)

    return position_of


def _median(skip_nan, name):
    def full(x):
        if x.size == 0:
            return jnp.full((), jnp.nan, x.dtype)
        values, _ = _pick_sorted(_nan_aware_median_position(skip_nan))(x.reshape(-1), 0)
        return values.reshape(())

    def along(x, dim, keepdim=False):
        _require_nonempty(x, dim, name)
        return _on_axis(_pick_sorted(_nan_aware_median_position(skip_nan)), x, dim, keepdim)

    return full, along


_median_full, _median_dim = _median(False, "median")
_nanmedian_full, _nanmedian_dim = _median(True, "median")
lower(aten.median.default)(_median_full)
lower(aten.median.dim)(_median_dim)
lower(aten.nanmedian.default)(_nanmedian_full)
lower(aten.nanmedian.dim)(_nanmedian_dim)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    _require_nonempty(x, dim, "kthvalue")
    kth = _pick_sorted(lambda values, axis: jnp.full(
        values.shape[:axis] + (1,) + values.shape[axis + 1:], k - 1, jnp.int64))
    return _on_axis(kth, x, dim, keepdim)


def _mode_along(x, axis):
    """Most frequent value (smallest among ties) and its last index, from a stable sort.

    Along the sorted axis, the running length of each run of equal values
    peaks at the run's last element, whose original index is the value's last
    occurrence; the first peak overall belongs to the smallest modal value.
    """
    values, indices = _sorted_along(x, axis)
    position = _index_iota(values.shape, axis)
    previous = jnp.concatenate([lax.slice_in_dim(values, 0, 1, axis=axis),
                                lax.slice_in_dim(values, 0, values.shape[axis] - 1, axis=axis)], axis)
    starts = (position == 0) | (values != previous)
    run_start = lax.cummax(jnp.where(starts, position, 0), axis)
    run_length = position - run_start + 1
    peak = jnp.argmax(run_length, axis=axis, keepdims=True)
    return jnp.take_along_axis(values, peak, axis), jnp.take_along_axis(indices, peak, axis)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    _require_nonempty(x, dim, "mode")
    return _on_axis(_mode_along, x, dim, keepdim)
