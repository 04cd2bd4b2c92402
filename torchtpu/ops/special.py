"""Lowerings: PyTorch's special functions that jax has no counterpart for.

Orthogonal polynomials (``torch.special.*_polynomial_*``), Bessel and Airy
functions, and ``polygamma``.  CPU PyTorch is the oracle, so each function
follows the algorithm of CPU's kernel (ATen/native/Math.h): the same special
cases, recurrences and approximation forms, evaluated in the same order and
precision, so results agree to rounding.

The Bessel and Airy approximations are those of the Cephes Math Library
(S. L. Moshier): rational functions of ``x**2`` for small arguments,
Hankel-style asymptotic forms for large ones, and Chebyshev series for
``K0``/``K1``.  Their coefficient tables are at the end of this file.

Recurrences whose length depends on the degree tensor ``n`` run as one
``lax.while_loop`` to the largest degree, each element freezing once it has
reached its own degree (or turned NaN, where CPU stops early).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax.numpy as jnp
from jax import lax
from jax.scipy import special as jsp

from .common import Promotion, elementwise
from .registry import aten, lower

# ---- evaluation helpers ------------------------------------------------------------------------------


def _horner(coefficients, z):
    """The polynomial with these coefficients (highest power first) at ``z`` (Cephes's polevl)."""
    acc = jnp.zeros_like(z)
    for c in coefficients:
        acc = acc * z + c
    return acc


def _chebyshev_series(coefficients, t):
    """Clenshaw's sum of a Chebyshev series at ``t`` (Cephes's chbevl)."""
    b0, b1, b2 = jnp.full_like(t, coefficients[0]), jnp.zeros_like(t), jnp.zeros_like(t)
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = t * b1 - b2 + c
    return 0.5 * (b0 - b2)


def _select(default, *cases):
    """``cases`` are (condition, value) pairs, the first true one winning, as an if/elif chain."""
    out = default
    for condition, value in reversed(cases):
        out = jnp.where(condition, value, out)
    return out


# ---- orthogonal polynomials --------------------------------------------------------------------------


def _degree(n):
    """The degree CPU uses: ``n`` cast to int64, as a float.  NaN, inf and values out of
    int64's range cast to INT64_MIN there, which every polynomial maps to 0 like any n < 0."""
    in_range = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    return jnp.where(in_range, jnp.trunc(n), -1.0)


def _recurrence(p, q, degree, step):
    """Advance ``(p, q) -> (q, step(k, p, q))`` for k = 1 .. degree - 1, element by element.

    ``q`` starts as the polynomial of degree 1 and ends as that of ``degree``.  An element stops
    early once ``q`` is NaN, as CPU's loops do; the loop runs to the largest degree.
    """

    def running(k, q):
        return (k < degree) & ~jnp.isnan(q)

    def body(state):
        k, p, q = state
        go = running(k, q)
        return k + 1, jnp.where(go, q, p), jnp.where(go, step(k, p, q), q)

    start = jnp.ones((), q.dtype)
    _, _, q = lax.while_loop(lambda s: jnp.any(running(s[0], s[2])), body, (start, p, q))
    return q


def _odd_even(even, value):
    return jnp.where(even, value, -value)


def _chebyshev_at_ends(kind, y, n, even):
    """Chebyshev polynomials at y = +-1 (and the limits CPU's trigonometric forms fall back to)."""
    plus = y > 0
    if kind == "t":
        return jnp.where(plus | even, 1.0, -1.0)
    if kind == "u":
        return jnp.where(plus | even, n + 1, -(n + 1))
    if kind == "v":
        return jnp.where(plus, 1.0, _odd_even(even, n + n + 1))
    return jnp.where(plus, n + n + 1, _odd_even(even, 1.0))


def _chebyshev_trig(kind, y, n, even):
    """The trigonometric forms CPU uses for high degrees inside (-1, 1)."""
    theta = jnp.arccos(y)
    if kind == "t":
        return jnp.cos(n * theta)
    if kind == "u":
        s = jnp.sin(theta)
        return jnp.where(s != 0, jnp.sin((n + 1) * theta) / s, (n + 1) * jnp.cos((n + 1) * theta) / y)
    if kind == "v":
        return jnp.where(jnp.sin(theta / 2) != 1, jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2),
                         _chebyshev_at_ends(kind, y, n, even))
    return jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2),
                     _chebyshev_at_ends(kind, y, n, even))


def _chebyshev(kind, y, n, trig_above):
    """Chebyshev polynomial of the first (t), second (u), third (v) or fourth (w) kind."""
    y, n = jnp.broadcast_arrays(y, _degree(n))
    even = jnp.fmod(n, 2) == 0
    two_y = y + y
    first = {"t": y, "u": two_y, "v": two_y - 1, "w": two_y + 1}[kind]
    at_ends = jnp.abs(y) == 1
    trig = (n > trig_above) & (jnp.abs(y) < 1)
    loop_degree = jnp.where(at_ends | trig, 0, n)
    looped = _recurrence(jnp.ones_like(y), first, loop_degree, lambda k, p, q: two_y * q - p)
    return _select(
        looped,
        (n < 0, 0.0),
        (at_ends, _chebyshev_at_ends(kind, y, n, even)),
        (trig, _chebyshev_trig(kind, y, n, even)),
        (n == 0, 1.0),
        (n == 1, first),
    )


# (kind, degree above which CPU switches to the trigonometric form) per op; the shifted
# polynomials are the plain ones at 2x - 1.
for _kind, _trig_above, _shifted_trig_above in (("t", 6, 6), ("u", 8, 6), ("v", 8, 6), ("w", 8, 4)):

    def _plain(x, n, kind=_kind, trig_above=_trig_above):
        return _chebyshev(kind, x, n, trig_above)

    def _shifted(x, n, kind=_kind, trig_above=_shifted_trig_above):
        return _chebyshev(kind, x + x - 1, n, trig_above)

    lower(getattr(aten, f"special_chebyshev_polynomial_{_kind}"))(elementwise(2, Promotion.INT_TO_FLOAT)(_plain))
    lower(getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}"))(
        elementwise(2, Promotion.INT_TO_FLOAT)(_shifted))


def _hermite_limit(dtype):
    """Above this degree CPU returns NaN rather than run the recurrence."""
    return {jnp.dtype(jnp.float32): 128, jnp.dtype(jnp.float64): 512}.get(jnp.dtype(dtype), 1024)


def _hermite(x, n, first, step):
    x, n = jnp.broadcast_arrays(x, _degree(n))
    too_high = n > _hermite_limit(x.dtype)
    looped = _recurrence(jnp.ones_like(x), first(x), jnp.where(too_high, 0, n), step(x))
    return _select(looped, (n < 0, 0.0), (n == 0, 1.0), (n == 1, first(x)), (too_high, jnp.nan))


@lower(aten.special_hermite_polynomial_h)
@elementwise(2, Promotion.INT_TO_FLOAT)
def hermite_polynomial_h(x, n):
    """Physicists' Hermite polynomial: H_{k+1} = 2x H_k - 2k H_{k-1}."""
    return _hermite(x, n, lambda x: x + x, lambda x: lambda k, p, q: (x + x) * q - (k + k) * p)


@lower(aten.special_hermite_polynomial_he)
@elementwise(2, Promotion.INT_TO_FLOAT)
def hermite_polynomial_he(x, n):
    """Probabilists' Hermite polynomial: He_{k+1} = x He_k - k He_{k-1}."""
    return _hermite(x, n, lambda x: x, lambda x: lambda k, p, q: x * q - k * p)


@lower(aten.special_laguerre_polynomial_l)
@elementwise(2, Promotion.INT_TO_FLOAT)
def laguerre_polynomial_l(x, n):
    """Laguerre polynomial: (k+1) L_{k+1} = (2k + 1 - x) L_k - k L_{k-1}."""
    x, n = jnp.broadcast_arrays(x, _degree(n))
    looped = _recurrence(jnp.ones_like(x), 1 - x, jnp.where(x == 0, 0, n),
                         lambda k, p, q: (((k + k) + (1 - x)) * q - k * p) / (k + 1))
    return _select(looped, (n < 0, 0.0), (x == 0, 1.0), (n == 0, 1.0), (n == 1, 1 - x))


@lower(aten.special_legendre_polynomial_p)
@elementwise(2, Promotion.INT_TO_FLOAT)
def legendre_polynomial_p(x, n):
    """Legendre polynomial: (k+1) P_{k+1} = (2k+1) x P_k - k P_{k-1}."""
    x, n = jnp.broadcast_arrays(x, _degree(n))
    at_ends = jnp.abs(x) == 1
    looped = _recurrence(jnp.ones_like(x), x, jnp.where(at_ends, 0, n),
                         lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1))
    ends = jnp.where((x > 0) | (jnp.fmod(n, 2) == 0), 1.0, -1.0)
    return _select(looped, (n < 0, 0.0), (at_ends, ends), (n == 0, 1.0), (n == 1, x))


# ---- Bessel functions of the first and second kind -----------------------------------------------------

_QUARTER_PI = 0.785398163397448309615660845819875721
_THREE_QUARTER_PI = 2.356194490192344928846982537459627163
_SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737
_TWO_OVER_PI = 0.636619772367581343075535053490057448


def _hankel(x, z, p_num, p_den, q_num, q_den, phase, second_kind):
    """The large-x form sqrt(2/(pi x)) (P cos(x - phase) - (5/x) Q sin(x - phase)) of J,
    or (P sin + (5/x) Q cos) of Y, with P and Q rational in ``z``."""
    p = _horner(p_num, z) / _horner(p_den, z)
    q = 5.0 / x * (_horner(q_num, z) / _horner(q_den, z))
    if second_kind:
        wave = p * jnp.sin(x - phase) + q * jnp.cos(x - phase)
    else:
        wave = p * jnp.cos(x - phase) - q * jnp.sin(x - phase)
    return wave * _SQRT_TWO_OVER_PI / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    xx = x * x
    small = (xx - 5.78318596294678452118) * (xx - 30.4712623436620863991) * _horner(_J0_SMALL_NUM, xx) \
        / _horner(_J0_SMALL_DEN, xx)
    large = _hankel(x, 25.0 / xx, _J0_P_NUM, _J0_P_DEN, _J0_Q_NUM, _J0_Q_DEN, _QUARTER_PI, False)
    return _select(large, (x < 1e-5, 1 - xx / 4), (x <= 5, small))


def _j1(x):
    sign, x = jnp.where(x < 0, -1.0, 1.0), jnp.abs(x)
    xx = x * x
    small = _horner(_J1_SMALL_NUM, xx) / _horner(_J1_SMALL_DEN, xx) * x * (xx - 14.6819706421238932572) \
        * (xx - 49.2184563216946036703)
    z = 5.0 / x * (5.0 / x)
    large = _hankel(x, z, _J1_P_NUM, _J1_P_DEN, _J1_Q_NUM, _J1_Q_DEN, _THREE_QUARTER_PI, False)
    return sign * jnp.where(x <= 5, small, large)


def _y0(x):
    xx = x * x
    small = _horner(_Y0_SMALL_NUM, xx) / _horner(_Y0_SMALL_DEN, xx) + _TWO_OVER_PI * jnp.log(x) * _j0(x)
    large = _hankel(x, 25.0 / xx, _J0_P_NUM, _J0_P_DEN, _J0_Q_NUM, _J0_Q_DEN, _QUARTER_PI, True)
    return _select(large, (x == 0, -jnp.inf), (x < 0, jnp.nan), (x <= 5, small))


def _y1(x):
    xx = x * x
    small = x * (_horner(_Y1_SMALL_NUM, xx) / _horner(_Y1_SMALL_DEN, xx)) \
        + _TWO_OVER_PI * (_j1(x) * jnp.log(x) - 1 / x)
    z = 5.0 / x * (5.0 / x)
    large = _hankel(x, z, _J1_P_NUM, _J1_P_DEN, _J1_Q_NUM, _J1_Q_DEN, _THREE_QUARTER_PI, True)
    return _select(large, (x == 0, -jnp.inf), (x < 0, jnp.nan), (x <= 5, small))


def _spherical_j0(x):
    xx = x * x
    series = 1 + xx * _horner((1 / 6227020800, -1 / 39916800, 1 / 362880, -1 / 5040, 1 / 120, -1 / 6), xx)
    return _select(jnp.sin(x) / x, (jnp.isinf(x), 0.0), (jnp.abs(x) < 0.5, series))


# ---- modified Bessel functions ---------------------------------------------------------------------------


def _k0_parts(x):
    """K0 for x <= 2, and exp(x) sqrt(x) K0 for x > 2."""
    small = _chebyshev_series(_K0_SMALL_CHEB, x * x - 2) - jnp.log(0.5 * x) * jsp.i0(x)
    return small, _chebyshev_series(_K0_BIG_CHEB, 8.0 / x - 2)


def _k1_parts(x):
    """K1 for x <= 2, and exp(x) sqrt(x) K1 for x > 2."""
    small = jnp.log(0.5 * x) * jsp.i1(x) + _chebyshev_series(_K1_SMALL_CHEB, x * x - 2) / x
    return small, _chebyshev_series(_K1_BIG_CHEB, 8.0 / x - 2)


def _modified_k(parts, scaled):
    """K0 or K1 (``parts``), or exp(x) times it when ``scaled``."""

    def k(x):
        small, large = parts(x)
        if scaled:
            value = jnp.where(x <= 2, small * jnp.exp(x), large / jnp.sqrt(x))
        else:
            value = jnp.where(x <= 2, small, jnp.exp(-x) * large / jnp.sqrt(x))
        return _select(value, (x == 0, jnp.inf), (x < 0, jnp.nan))

    return k


# ---- Airy function ---------------------------------------------------------------------------------------

_AIRY_C1 = 0.355028053887817239260  # Ai(0)
_AIRY_C2 = 0.258819403792806798405  # -Ai'(0)
_INV_SQRT_PI = 5.64189583547756286948e-01


def _airy_maclaurin(x):
    """Ai(x) = c1 f(x) - c2 g(x) by the power series of f and g, summed until the terms of f
    drop below float epsilon (every element together, each freezing once it has converged)."""
    eps = jnp.finfo(x.dtype).eps
    z = x * x * x
    one = jnp.ones_like(x)

    def body(state):
        f, g, k, m, n, t = state
        go = t > eps
        m2 = m * z / (k + 1)
        n2 = n * z / (k + 2)
        m2 = m2 / (k + 2)
        n2 = n2 / (k + 3)
        f2, g2 = f + m2, g + n2
        new = (f2, g2, k + 3, m2, n2, jnp.abs(m2 / f2))
        return tuple(jnp.where(go, a, b) for a, b in zip(new, state))

    state = (one, x, one, one, x, one)
    f, g, *_ = lax.while_loop(lambda s: jnp.any(s[5] > eps), body, state)
    return _AIRY_C1 * f - _AIRY_C2 * g


def _airy_ai(x):
    negative = x < -2.09
    positive = x >= 2.09
    # Oscillating asymptotic form for x < -2.09.
    xn = jnp.where(negative, x, -3.0)
    zeta_n = -2.0 * xn * jnp.sqrt(-xn) / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    f = 1.0 + zz * _horner(_AIRY_NEG_F_NUM, zz) / _horner(_AIRY_NEG_F_DEN, zz)
    g = z * _horner(_AIRY_NEG_G_NUM, zz) / _horner(_AIRY_NEG_G_DEN, zz)
    t = zeta_n + 0.25 * jnp.asarray(math.pi, x.dtype)
    oscillating = _INV_SQRT_PI / jnp.sqrt(jnp.sqrt(-xn)) * (jnp.sin(t) * f - jnp.cos(t) * g)
    # Decaying asymptotic form for x >= 2.09.
    xp = jnp.where(positive, x, 3.0)
    zeta_p = 2.0 * xp * jnp.sqrt(xp) / 3.0
    ratio = _horner(_AIRY_BIG_NUM, 1.0 / zeta_p) / _horner(_AIRY_BIG_DEN, 1.0 / zeta_p)
    decaying = _INV_SQRT_PI * ratio / (2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta_p))
    series = _airy_maclaurin(jnp.where(negative | positive, 0.0, x))
    return _select(series, (jnp.isinf(x), jnp.nan), (x > 103.892, 0.0), (negative, oscillating),
                   (positive, decaying))


for _op, _fn in {
    aten.special_bessel_j0: _j0,
    aten.special_bessel_j1: _j1,
    aten.special_bessel_y0: _y0,
    aten.special_bessel_y1: _y1,
    aten.special_spherical_bessel_j0: _spherical_j0,
    aten.special_modified_bessel_i0: jsp.i0,
    aten.special_modified_bessel_i1: jsp.i1,
    aten.special_modified_bessel_k0: _modified_k(_k0_parts, scaled=False),
    aten.special_modified_bessel_k1: _modified_k(_k1_parts, scaled=False),
    aten.special_scaled_modified_bessel_k0: _modified_k(_k0_parts, scaled=True),
    aten.special_scaled_modified_bessel_k1: _modified_k(_k1_parts, scaled=True),
    aten.special_airy_ai: _airy_ai,
}.items():
    lower(_op.default)(elementwise(1, Promotion.INT_TO_FLOAT)(_fn))


# ---- polygamma ---------------------------------------------------------------------------------------------


def _trigamma(x):
    """psi'(x): reflection below 1/2, six steps of the recurrence, then the asymptotic series."""
    pi = jnp.asarray(math.pi, x.dtype)
    reflect = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    total = jnp.where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), 0.0)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        total = total + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    total = total + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -total, total)


_MACHEP = 1.11022302462515654042e-16
# Bernoulli numbers B_2, B_4, ..., B_24, for the Euler-Maclaurin tail of the zeta sum.
_BERNOULLI = (Fraction(1, 6), Fraction(-1, 30), Fraction(1, 42), Fraction(-1, 30), Fraction(5, 66),
              Fraction(-691, 2730), Fraction(7, 6), Fraction(-3617, 510), Fraction(43867, 798),
              Fraction(-174611, 330), Fraction(854513, 138), Fraction(-236364091, 2730))
_EULER_MACLAURIN = tuple(float(math.factorial(2 * i + 2) / b) for i, b in enumerate(_BERNOULLI))


def _hurwitz_zeta(s, q):
    """zeta(s, q) = sum_k (q + k)**-s for an integer s >= 2, as Cephes sums it: terms directly
    while k < 9 or q + k <= 9 (stopping once a term is below machine precision relative to
    the sum), then an Euler-Maclaurin tail.  ``q`` is float64, CPU's accumulation type."""

    def running(state):
        i, a, b, total, done = state
        return ~done & ((i < 9) | (a <= 9))

    def body(state):
        i, a, b, total, done = state
        go = running(state)
        a2 = a + 1
        b2 = a2 ** -s
        total2 = total + b2
        converged = (-_MACHEP * total2 < b2) & (b2 < _MACHEP * total2)
        return (i + 1, jnp.where(go, a2, a), jnp.where(go, b2, b), jnp.where(go, total2, total),
                done | (go & converged))

    pole = (q <= 0) & (q == jnp.floor(q))
    start = (jnp.zeros((), jnp.int32), q, jnp.zeros_like(q), q ** -s, pole)
    _, a, b, total, done = lax.while_loop(lambda st: jnp.any(running(st)), body, start)
    w = a
    total = total + b * w / (s - 1)
    total = total - 0.5 * b
    factor, k = 1.0, 0.0
    for coefficient in _EULER_MACLAURIN:
        factor = factor * (s + k)
        b = b / w
        term = factor * b / coefficient
        total2 = total + term
        total = jnp.where(done, total, total2)
        done = done | (jnp.abs(term / total2) < _MACHEP)
        k += 1
        factor = factor * (s + k)
        b = b / w
        k += 1
    return jnp.where(pole, jnp.inf, total)


@lower(aten.digamma.default)
@elementwise(1, Promotion.INT_TO_FLOAT)
def digamma(x):
    # CPU: psi(+-0) = -+inf (jax gives NaN there); negative integers are poles, NaN.
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jsp.digamma(x))


@lower(aten.polygamma.default, static_numbers=True)
def polygamma(n, x):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return _polygamma(x, n)


@elementwise(1, Promotion.INT_TO_FLOAT)
def _polygamma(x, n):
    if n == 0:
        return digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    factorial = float(math.factorial(n)) if n <= 170 else math.inf  # exact, where CPU has exp(lgamma)
    return sign * factorial * _hurwitz_zeta(n + 1, x.astype(jnp.float64)).astype(x.dtype)


# ---- coefficient tables (Cephes) -------------------------------------------------------------------------

_AIRY_BIG_NUM = (
    0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442,
    70.53609068404442, 14.026469116338967, 1.0,
)
_AIRY_BIG_DEN = (
    0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297,
    71.47784008255756, 14.095913560783403, 1.0,
)
_AIRY_NEG_F_NUM = (
    -0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191,
    -0.04919001326095003, -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06,
    -1.6778769848911465e-08,
)
_AIRY_NEG_F_DEN = (
    13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642,
    0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07,
)
_AIRY_NEG_G_NUM = (
    0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502,
    0.35146565610554764, 0.06338889196289255, 0.005858041130483885, 0.000282851600836737,
    6.98793669997261e-06, 8.117892395543892e-08, 3.415517847659236e-10,
)
_AIRY_NEG_G_DEN = (
    9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619,
    0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06,
    4.9183457006293e-09,
)
_J0_P_NUM = (
    0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
    5.303240382353949, 1.0,
)
_J0_P_DEN = (
    0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171,
    8.761908832370695, 5.306052882353947, 1.0,
)
_J0_Q_NUM = (
    -0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
    -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285,
)
_J0_Q_DEN = (
    64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
    2062.0933166032783, 242.0057402402914,
)
_J0_SMALL_NUM = (
    -4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0,
)
_J0_SMALL_DEN = (
    499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
    310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18,
)
_J1_P_NUM = (
    0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076,
    8.424045901417724, 5.214515986823615, 1.0,
)
_J1_P_DEN = (
    0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
    5.209828486823619, 1.0,
)
_J1_Q_NUM = (
    0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
    597.4896124006136, 211.68875710057213, 25.207020585802372,
)
_J1_Q_DEN = (
    74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
    2826.1927851763908, 336.0936078106983,
)
_J1_SMALL_NUM = (
    -899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0,
)
_J1_SMALL_DEN = (
    620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
    784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18,
)
_Y0_SMALL_NUM = (
    15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
    -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16,
)
_Y0_SMALL_DEN = (
    1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
    3171577528429750.5, 2.5059625617265306e+17,
)
_Y1_SMALL_NUM = (
    1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0,
    2.024394757135949e+17, -7.788771962659501e+17,
)
_Y1_SMALL_DEN = (
    594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
    620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18,
)
_K0_SMALL_CHEB = (
    1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
    2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,
    0.3442898999246285, -0.5353273932339028,
)
_K0_BIG_CHEB = (
    5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
    5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
    8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
    1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
    8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
    1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
    2.4403030820659555,
)
_K1_SMALL_CHEB = (
    -7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
    -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
    -0.12261118082265715, -0.3531559607765449, 1.5253002273389478,
)
_K1_BIG_CHEB = (
    -5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
    -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
    -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
    -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
    -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
    -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
    2.7206261904844427,
)
