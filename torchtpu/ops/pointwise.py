"""Elementwise lowerings: arithmetic, comparisons, math functions, activations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import torch
from jax.scipy import special as jsp

from ..core import dtypes

from .common import Promotion, as_array, elementwise, is_complex, is_float, is_integer, promote
from .registry import aten, lower

# ---- unary ops that keep integer dtypes ----------------------------------------

for _op, _fn in {
    aten.neg: lambda x: jnp.zeros_like(x) - x if is_complex(x) else jnp.negative(x),  # CPU: complex -x is 0 - x
    aten.abs: jnp.abs,
    aten.bitwise_not: lambda x: jnp.invert(x) if x.dtype != jnp.bool_ else jnp.logical_not(x),
    aten.sign: jnp.sign,
    aten.floor: lambda x: jnp.floor(x) if is_float(x) else x,
    aten.ceil: lambda x: jnp.ceil(x) if is_float(x) else x,
    aten.trunc: lambda x: jnp.trunc(x) if is_float(x) else x,
    aten.frac: lambda x: x - jnp.trunc(x),
    aten.positive: lambda x: x,
    aten.conj_physical: jnp.conj,
    aten.relu: lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
}.items():
    lower(_op.default)(elementwise(1, compute=False)(_fn))


@lower(aten.round.default)
@elementwise(1, compute=False)
def round_(x):
    return jnp.round(x) if is_float(x) else x


@lower(aten.round.decimals)
@elementwise(1, compute=False)
def round_decimals(x, *, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


@lower(aten.sgn.default)
def sgn(x):
    if is_complex(x):
        magnitude = jnp.abs(x)
        return jnp.where(magnitude == 0, 0, x / jnp.where(magnitude == 0, 1, magnitude))
    return jnp.sign(x)


# ---- unary ops that promote integers to float ----------------------------------

_erfinv = jsp.erfinv


def _logit(x, eps=None):
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


for _op, _fn in {
    aten.exp: jnp.exp,
    aten.exp2: jnp.exp2,
    aten.expm1: jnp.expm1,
    aten.log: jnp.log,
    aten.log2: jnp.log2,
    aten.log10: jnp.log10,
    aten.log1p: jnp.log1p,
    aten.sqrt: jnp.sqrt,
    aten.rsqrt: lax.rsqrt,
    aten.sin: jnp.sin,
    aten.cos: jnp.cos,
    aten.tan: jnp.tan,
    aten.asin: jnp.arcsin,
    aten.acos: jnp.arccos,
    aten.atan: jnp.arctan,
    aten.sinh: jnp.sinh,
    aten.cosh: jnp.cosh,
    aten.tanh: jnp.tanh,
    aten.asinh: jnp.arcsinh,
    aten.acosh: jnp.arccosh,
    aten.atanh: jnp.arctanh,
    aten.sigmoid: jax.nn.sigmoid,
    aten.erf: jsp.erf,
    aten.erfc: jsp.erfc,
    aten.erfinv: _erfinv,
    aten.lgamma: jsp.gammaln,
    aten.i0: jsp.i0,
    aten.sinc: jnp.sinc,
    aten.reciprocal: jnp.reciprocal,
    aten.deg2rad: jnp.deg2rad,
    aten.rad2deg: jnp.rad2deg,
}.items():
    lower(_op.default)(elementwise(1, Promotion.INT_TO_FLOAT)(_fn))


@lower(aten.logit.default)
@elementwise(1, Promotion.INT_TO_FLOAT)
def logit(x, eps=None):
    return _logit(x, eps)


@lower(aten.logit_backward.default, static_numbers=True)
@elementwise(2, Promotion.INT_TO_FLOAT)
def logit_backward(grad, x, eps=None):
    """grad / (x (1 - x)); outside [eps, 1 - eps] 0 (NaN outside [0, 1] without eps), inf-signed at 0 and 1."""
    inside = grad / (x * (1 - x))
    inside = jnp.where((x == 0) | (x == 1), grad * jnp.inf, inside)
    if eps is None or eps < 0:
        return jnp.where((x < 0) | (x > 1), jnp.nan, inside)
    return jnp.where((x < eps) | (x > 1 - eps), 0.0, inside)


@lower(aten.square.default)
@elementwise(1, compute=False)
def square(x):
    return x * x


# ---- predicates ------------------------------------------------------------------


def _is_nan(x):
    return jnp.isnan(x) if not is_integer(x) else jnp.zeros(jnp.shape(x), bool)


lower(aten.isnan.default)(_is_nan)
lower(aten.isinf.default)(lambda x: jnp.isinf(x) if not is_integer(x) else jnp.zeros(jnp.shape(x), bool))
lower(aten.isfinite.default)(lambda x: jnp.isfinite(x) if not is_integer(x) else jnp.ones(jnp.shape(x), bool))
lower(aten.isposinf.default)(lambda x: jnp.isposinf(x) if not is_integer(x) else jnp.zeros(jnp.shape(x), bool))
lower(aten.isneginf.default)(lambda x: jnp.isneginf(x) if not is_integer(x) else jnp.zeros(jnp.shape(x), bool))
lower(aten.signbit.default)(lambda x: jnp.signbit(x) if not is_integer(x) or x.dtype == bool else x < 0)
lower(aten.logical_not.default)(lambda x: jnp.logical_not(x))


@lower(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if is_integer(x):
        return x
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), 0.0 if nan is None else nan, x)
    x = jnp.where(jnp.isposinf(x), info.max if posinf is None else posinf, x)
    return jnp.where(jnp.isneginf(x), info.min if neginf is None else neginf, x)


# ---- binary arithmetic -------------------------------------------------------------


def _scaled(other, alpha):
    """alpha * other.  CPU multiplies complex values by alpha even when it is 1: (1+0j) * (b-0j) has imaginary
    part +0 when b > 0, so skipping the product would differ from CPU in the sign of zero."""
    if jnp.iscomplexobj(other) and not hasattr(alpha, "dtype"):
        # Spelled out in real parts: XLA folds a complex `other * 1` into `other`.
        a = complex(1 if alpha is None else alpha)
        re, im = jnp.real(other), jnp.imag(other)
        return jax.lax.complex(re * a.real - im * a.imag, im * a.real + re * a.imag)
    return other if alpha is None or (not hasattr(alpha, "dtype") and alpha == 1) else other * alpha


@lower(aten.add.Tensor, aten.add.Scalar)
@elementwise(2)
def add(x, y, *, alpha=None):
    if x.dtype == jnp.bool_:
        return jnp.logical_or(x, _scaled(y, alpha))
    return x + _scaled(y, alpha).astype(x.dtype)


@lower(aten.sub.Tensor, aten.sub.Scalar)
@elementwise(2)
def sub(x, y, *, alpha=None):
    return _subtract(x, y, alpha)


def _subtract(x, y, alpha):
    if jnp.iscomplexobj(x):  # CPU subtracts complex values as x + (-alpha) * y, which decides the sign of zeros
        return x + _scaled(y.astype(x.dtype), -(1 if alpha is None else alpha))
    return x - _scaled(y, alpha).astype(x.dtype)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
@elementwise(2)
def rsub(x, y, *, alpha=None):
    return _subtract(y, x, alpha).astype(x.dtype)


@lower(aten.mul.Tensor, aten.mul.Scalar)
@elementwise(2)
def mul(x, y):
    return jnp.logical_and(x, y) if x.dtype == jnp.bool_ else x * y


@lower(aten.div.Tensor, aten.div.Scalar)
@elementwise(2, Promotion.INT_TO_FLOAT)
def div(x, y):
    return x / y


def _trunc_divide(x, y):
    if is_integer(x):
        return lax.div(x, jnp.where(y == 0, 1, y))
    return jnp.trunc(x / y)


def _floor_divide(x, y):
    if is_integer(x):
        return jnp.floor_divide(x, jnp.where(y == 0, 1, y))
    return jnp.floor(x / y)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
@elementwise(2)
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode == "trunc":
        return _trunc_divide(x, y)
    if rounding_mode == "floor":
        return _floor_divide(x, y)
    return x / y


lower(aten.floor_divide.default, aten.floor_divide.Scalar)(elementwise(2)(_floor_divide))


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@elementwise(2)
def remainder(x, y):
    if is_integer(x):
        return jnp.remainder(x, jnp.where(y == 0, 1, y))
    r = jnp.fmod(x, y)
    return jnp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
@elementwise(2)
def fmod(x, y):
    if is_integer(x):
        return jnp.fmod(x, jnp.where(y == 0, 1, y))
    return jnp.fmod(x, y)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
@elementwise(2)
def pow_(x, y):
    if is_integer(x):
        return lax.integer_pow(x, int(y)) if isinstance(y, int) else jnp.power(x, y)
    return jnp.power(x, y)


@lower(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)
def float_power(x, y):
    dtype = jnp.complex128 if is_complex(x) or is_complex(y) else jnp.float64
    return jnp.power(jnp.asarray(x, dtype), jnp.asarray(y, dtype))


@lower(aten.atan2.default)
@elementwise(2, Promotion.INT_TO_FLOAT)
def atan2(x, y):
    return jnp.arctan2(x, y)


@lower(aten.hypot.default)
@elementwise(2)
def hypot(x, y):
    return jnp.hypot(x, y)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
@elementwise(2, Promotion.INT_TO_FLOAT)
def copysign(x, y):
    return jnp.copysign(x, y)


@lower(aten.nextafter.default)
@elementwise(2)
def nextafter(x, y):
    return jnp.nextafter(x, y)


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
@elementwise(2, Promotion.INT_TO_FLOAT)
def xlogy(x, y):
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log(y)))


@lower(aten.maximum.default)
@elementwise(2)
def maximum(x, y):
    return jnp.maximum(x, y)


@lower(aten.minimum.default)
@elementwise(2)
def minimum(x, y):
    return jnp.minimum(x, y)


# fmax/fmin ignore NaN; maximum/minimum propagate it.
@lower(aten.fmax.default)
@elementwise(2)
def _fmax(x, y):
    return jnp.where(jnp.isnan(x), y, jnp.where(jnp.isnan(y), x, jnp.maximum(x, y))) if is_float(x) else jnp.maximum(x, y)


@lower(aten.fmin.default)
@elementwise(2)
def _fmin(x, y):
    return jnp.where(jnp.isnan(x), y, jnp.where(jnp.isnan(y), x, jnp.minimum(x, y))) if is_float(x) else jnp.minimum(x, y)


# ---- comparisons and logic ---------------------------------------------------------

for _name, _fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}.items():
    _packet = getattr(aten, _name)
    lower(_packet.Tensor, _packet.Scalar)(elementwise(2, compute=False, kind=Promotion.DEFAULT)(_fn))

for _name, _fn in {
    "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor,
}.items():
    lower(getattr(aten, _name).default)(lambda x, y, _fn=_fn: _fn(x != 0, y != 0))

for _name, _fn in {
    "bitwise_and": jnp.bitwise_and,
    "bitwise_or": jnp.bitwise_or,
    "bitwise_xor": jnp.bitwise_xor,
}.items():
    _packet = getattr(aten, _name)
    lower(_packet.Tensor, _packet.Scalar, _packet.Scalar_Tensor)(elementwise(2, compute=False)(_fn))


def _shift(fn):
    def shifted(x, y):
        bits = jnp.iinfo(x.dtype).bits
        too_far = (y >= bits) | (y < 0)
        out = fn(x, jnp.where(too_far, 0, y).astype(x.dtype))
        overflow = jnp.where(x < 0, -1, 0).astype(x.dtype) if fn is jnp.right_shift else jnp.zeros((), x.dtype)
        return jnp.where(too_far, overflow, out)

    return elementwise(2, compute=False)(shifted)


lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
      aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift(jnp.left_shift))
lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor,
      aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_shift(jnp.right_shift))


# ---- selection, clamping, blending ---------------------------------------------------


def select_bits(condition, x, y):
    """``jnp.where`` that moves bits unchanged, as PyTorch's select does.

    XLA:CPU computes bfloat16 through float32 and returns canonical NaNs, so a
    NaN payload written through an int16 view would change; selecting on the
    int16 bit patterns keeps it (a bitcast is free in XLA).
    """
    if x.dtype != jnp.bfloat16:
        return jnp.where(condition, x, y)
    bits = jnp.where(condition, lax.bitcast_convert_type(x, jnp.int16), lax.bitcast_convert_type(y, jnp.int16))
    return lax.bitcast_convert_type(bits, jnp.bfloat16)


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, x, y):
    dtype = promote(x, y)[1]
    return select_bits(condition, as_array(x, dtype), as_array(y, dtype))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return select_bits(mask, as_array(value, x.dtype), x)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    dtype = promote(x, *[v for v in (min, max) if v is not None])[1]
    x = x.astype(dtype)
    if min is not None:
        x = jnp.where(jnp.isnan(x), x, jnp.maximum(x, jnp.asarray(min, dtype))) if is_float(x) else jnp.maximum(x, jnp.asarray(min, dtype))
    if max is not None:
        x = jnp.where(jnp.isnan(x), x, jnp.minimum(x, jnp.asarray(max, dtype))) if is_float(x) else jnp.minimum(x, jnp.asarray(max, dtype))
    return x


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return clamp(x, min=min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return clamp(x, max=max)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
@elementwise(3)
def lerp(start, end, weight):
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight))


@lower(aten.addcmul.default)
@elementwise(3)
def addcmul(x, t1, t2, *, value=1):
    return x + value * t1 * t2


@lower(aten.addcdiv.default)
@elementwise(3)
def addcdiv(x, t1, t2, *, value=1):
    return x + value * t1 / t2


# ---- copies and fills -------------------------------------------------------------


@lower(aten.copy.default)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(dtypes.cast(jnp.asarray(src), x.dtype), x.shape)


@lower(aten.clone.default)
def clone(x, *, memory_format=None):
    return x


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.broadcast_to(as_array(value, x.dtype), x.shape)


@lower(aten.zero.default)
def zero(x):
    return jnp.zeros(x.shape, x.dtype)


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return x


# ---- activations and their derivatives ---------------------------------------------


@lower(aten.gelu.default)
@elementwise(1)
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lower(aten.gelu_backward.default)
@elementwise(2)
def gelu_backward(grad, x, *, approximate="none"):
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)
    return vjp(grad)[0]


@lower(aten.silu.default)
@elementwise(1)
def silu(x):
    return x * jax.nn.sigmoid(x)


@lower(aten.silu_backward.default)
@elementwise(2)
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lower(aten.mish.default)
@elementwise(1)
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lower(aten.sigmoid_backward.default)
@elementwise(2)
def sigmoid_backward(grad, out):
    return grad * out * (1 - out)


@lower(aten.tanh_backward.default)
@elementwise(2)
def tanh_backward(grad, out):
    return grad * (1 - out * out)


@lower(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value, x.dtype), x)


@lower(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lower(aten.leaky_relu.default)
@elementwise(1)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward.default)
@elementwise(2)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.elu.default)
@elementwise(1)
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(aten.elu_backward.default, static_numbers=True)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    # ``self_or_result`` is elu's output when ``is_result`` (in-place elu_), else its input.
    x = self_or_result
    if is_result:
        negative = grad * input_scale * (x + alpha * scale)
    else:
        negative = grad * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x <= 0, negative, grad * scale).astype(grad.dtype)


@lower(aten.hardtanh.default)
@elementwise(1, compute=False)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, min_val, max_val)


@lower(aten.hardtanh_backward.default)
@elementwise(2)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), 0, grad)


@lower(aten.hardsigmoid.default)
@elementwise(1)
def hardsigmoid(x):
    return jnp.clip(x / 6 + 0.5, 0, 1)


@lower(aten.hardswish.default)
@elementwise(1)
def hardswish(x):
    return x * jnp.clip(x / 6 + 0.5, 0, 1)


@lower(aten.softplus.default)
@elementwise(1)
def softplus(x, beta=1, threshold=20):
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lower(aten.softplus_backward.default)
@elementwise(2)
def softplus_backward(grad, x, beta, threshold):
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


# ---- dtype conversion (graphs; eager's ``.to`` is a transfer kernel) -------------------


@lower(aten._to_copy.default)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    return self if dtype is None else dtypes.cast(self, dtypes.to_jax(dtype))


@lower(torch.ops.prims.convert_element_type.default)
def convert_element_type(a, dtype):
    return dtypes.cast(a, dtypes.to_jax(dtype))


# ---- special functions ---------------------------------------------------------------


for _op, _fn in {
    aten.special_i0e: jsp.i0e,
    aten.special_i1: jsp.i1,
    aten.special_i1e: jsp.i1e,
    aten.special_ndtr: jsp.ndtr,
    aten.special_ndtri: jsp.ndtri,
    aten.special_log_ndtr: jsp.log_ndtr,
    aten.special_erfcx: jsp.erfcx,
    aten.special_entr: jsp.entr,
}.items():
    lower(_op.default)(elementwise(1, Promotion.INT_TO_FLOAT)(_fn))


@lower(aten.special_xlog1py)
@elementwise(2, Promotion.INT_TO_FLOAT)
def xlog1py(x, y):
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, x * jnp.log1p(y)))


@lower(aten.special_zeta)
@elementwise(2, Promotion.INT_TO_FLOAT)
def zeta(x, q):
    return jsp.zeta(x, q)


@lower(aten.igamma.default)
@elementwise(2, Promotion.INT_TO_FLOAT)
def igamma(a, x):
    return jsp.gammainc(a, x)


@lower(aten.igammac.default)
@elementwise(2, Promotion.INT_TO_FLOAT)
def igammac(a, x):
    return jsp.gammaincc(a, x)


@lower(aten.logaddexp.default)
@elementwise(2)
def logaddexp(x, y):
    return jnp.logaddexp(x, y)


@lower(aten.logaddexp2.default)
@elementwise(2)
def logaddexp2(x, y):
    return jnp.logaddexp2(x, y)


@lower(aten.heaviside.default)
@elementwise(2, compute=False)
def heaviside(x, values):
    return jnp.where(x == 0, values, (x > 0).astype(values.dtype))


@lower(aten.gcd.default)
@elementwise(2, compute=False)
def gcd(x, y):
    return jnp.gcd(x, y)


@lower(aten.lcm.default)
@elementwise(2, compute=False)
def lcm(x, y):
    return jnp.lcm(x, y)


@lower(aten.complex.default)
def complex_(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lower(aten.polar.default)
def polar(abs, angle):  # noqa: A002 - the ATen schema's name
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lower(aten.frexp.Tensor)
def frexp(self):
    mantissa, exponent = jnp.frexp(self)
    return mantissa, exponent.astype(jnp.int32)


@lower(aten.angle.default)
@elementwise(1, Promotion.INT_TO_FLOAT)
def angle(x):
    """The argument of a complex number; for reals pi below zero, else 0 (NaN stays NaN)."""
    if is_complex(x):
        return jnp.arctan2(jnp.imag(x), jnp.real(x))
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0))
