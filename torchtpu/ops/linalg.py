"""Lowerings: matrix products and dense linear algebra.

Products run at the precision ``torch.tpu.precision`` selects (HIGHEST, full
float32, by default: no bf16 passes), half types accumulate in float32 and round once, integers stay
exact in their own dtype.  Factorizations return what CPU's LAPACK returns:
LU in packed form with 1-based int32 pivots, and an ``info`` that is 0 on
success or the 1-based position where the factorization broke down.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.scipy import linalg as jsl

from ..core import dtypes
from ..runtime import device as runtime_device
from ..runtime import precision
from .common import is_complex, is_integer
from .reduction import HALF_TYPES, accumulator
from .registry import aten, lower


# ---- products ---------------------------------------------------------------------------


def _product(subscripts, *operands):
    """An einsum at the selected precision, in the dtype CPU accumulates in.

    Half-precision operands stay in their dtype and accumulate in float32
    (``preferred_element_type``): the product of two bfloat16 or float16
    numbers is exact in float32, so this equals converting them first, without
    a float32 copy of each operand (a weight, every step), and it is the matrix
    units' own mode on TPU; XLA:CPU runs it 2x faster than a float32 dot."""
    dtype = jnp.result_type(*operands)
    accumulate = dtype if is_integer(jnp.zeros((), dtype)) else accumulator(dtype)
    compute = dtype if dtype in HALF_TYPES else accumulate
    operands = [o.astype(compute) for o in operands]
    return jnp.einsum(subscripts, *operands, precision=precision.matmul(), preferred_element_type=accumulate)


def _is_constant(value, number):
    return isinstance(value, (bool, int, float)) and value == number


def _add_scaled(bias, product, beta, alpha):
    """beta * bias + alpha * product, where beta == 0 ignores bias entirely (NaN included), as on CPU."""
    dtype = jnp.result_type(bias, product)
    if jnp.dtype(dtype) == jnp.bool_:
        # CPU treats bool scalars as logical "and", the sum as "or".
        product = product if alpha else jnp.zeros_like(product)
        return product | bias if beta else product
    work = product.dtype
    product = product if _is_constant(alpha, 1) else product * alpha
    if _is_constant(beta, 0):
        return jnp.broadcast_to(product, product.shape)
    term = bias.astype(work)
    term = term if _is_constant(beta, 1) else term * beta
    if not isinstance(beta, (bool, int, float)):
        term = jnp.where(beta == 0, jnp.zeros((), work), term)
    return term + product


@lower(aten.mm.default)
def mm(x, mat2):
    return _product("ij,jk->ik", x, mat2)


@lower(aten.bmm.default)
def bmm(x, mat2):
    return _product("bij,bjk->bik", x, mat2)


@lower(aten.mv.default)
def mv(x, vec):
    return _product("ij,j->i", x, vec)


@lower(aten.dot.default)
def dot(x, tensor):
    return _product("i,i->", x, tensor)


@lower(aten.vdot.default)
def vdot(x, other):
    return _product("i,i->", jnp.conj(x), other)


@lower(aten.addmm.default)
def addmm(x, mat1, mat2, *, beta=1, alpha=1):
    return _add_scaled(x, _product("ij,jk->ik", mat1, mat2), beta, alpha)


@lower(aten.addmv.default)
def addmv(x, mat, vec, *, beta=1, alpha=1):
    return _add_scaled(x, _product("ij,j->i", mat, vec), beta, alpha)


@lower(aten.baddbmm.default)
def baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _add_scaled(x, _product("bij,bjk->bik", batch1, batch2), beta, alpha)


@lower(aten.addbmm.default)
def addbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _add_scaled(x, _product("bij,bjk->ik", batch1, batch2), beta, alpha)


@lower(aten.addr.default)
def addr(x, vec1, vec2, *, beta=1, alpha=1):
    if vec1.dtype == jnp.bool_:
        return _add_scaled(x, vec1[:, None] & vec2[None, :], beta, alpha)
    return _add_scaled(x, _product("i,j->ij", vec1, vec2), beta, alpha)


@lower(aten.trace.default)
def trace(x):
    dtype = accumulator(x.dtype)
    return jnp.sum(jnp.diagonal(x).astype(dtype))


@lower(aten.linalg_cross.default)
def linalg_cross(x, other, *, dim=-1):
    shape = jnp.broadcast_shapes(x.shape, other.shape)
    return jnp.cross(jnp.broadcast_to(x, shape), jnp.broadcast_to(other, shape), axis=dim)


# ---- grouped products (mixture-of-experts layers) ------------------------------------------------

_GROUPED_MM_TYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """CPU's argument checks; PyTorch's meta kernel has CUDA's instead (bfloat16 only), also under torch.compile."""
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        if mat.dim() not in (2, 3):
            raise RuntimeError(f"{name} has to be 2 or 3d")
        if mat.dtype not in _GROUPED_MM_TYPES:
            raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, "
                               f"got {dtypes.scalar_type_name(mat.dtype)}")
    if mat_a.dtype != mat_b.dtype:
        raise RuntimeError(f"Expected mat_a and mat_b to have the same dtype, got "
                           f"{dtypes.scalar_type_name(mat_a.dtype)} and {dtypes.scalar_type_name(mat_b.dtype)}")
    if (offs is not None) != (mat_a.dim() == 2 or mat_b.dim() == 2):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None and (offs.dim() != 1 or offs.dtype != torch.int32):
        raise RuntimeError("Offsets have to be int32" if offs.dtype != torch.int32 else "offs has to be 1D")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    if out_dtype is not None and out_dtype != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if (mat_a.dim() == 3 or mat_b.dim() == 3) and mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    groups = mat_a.shape[0] if mat_a.dim() == 3 else mat_b.shape[0] if mat_b.dim() == 3 else None
    if offs is not None and groups is not None and offs.shape[0] != groups:
        raise RuntimeError("matrix batch sizes have to match")


def _grouped_mm_shape(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # groups along K: one product per group
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif mat_a.dim() == 2:  # groups of rows of mat_a, one matrix of mat_b each
        shape = (mat_a.shape[0], mat_b.shape[-1])
    elif mat_b.dim() == 2:  # groups of columns of mat_b, one matrix of mat_a each
        shape = (mat_a.shape[1], mat_b.shape[1])
    else:
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    return mat_a.new_empty(shape)


# ``offs`` holds where each group ends (cumulative sizes). Rows (or columns) past the last
# end belong to no group: their results are zeros (CPU and CUDA leave them unwritten). On TPU
# and GPU ragged_dot is one grouped program; XLA:CPU expands it into masked dense products,
# exact, at (groups)x the work.
@lower(aten._grouped_mm.default, meta=_grouped_mm_shape, check=_check_grouped_mm, fake=True)
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if offs is None:
        return _product("gmk,gkn->gmn", mat_a, mat_b)
    accumulate = accumulator(mat_a.dtype)
    options = dict(precision=precision.matmul(), preferred_element_type=accumulate)
    if runtime_device.platform() == "cpu":  # XLA:CPU's expanded dot has no half x half -> float32 kernel
        mat_a, mat_b = mat_a.astype(accumulate), mat_b.astype(accumulate)
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
    if mat_a.ndim == 2 and mat_b.ndim == 2:
        numbers = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [0]), ([], [])),
                                                lhs_ragged_dimensions=[1], rhs_group_dimensions=[])
        return lax.ragged_dot_general(mat_a, mat_b, sizes, numbers, **options)
    if mat_a.ndim == 2:
        return lax.ragged_dot(mat_a, mat_b, sizes, **options)
    # groups of mat_b's columns: the transposed product has them as groups of rows
    return lax.ragged_dot(mat_b.T, jnp.swapaxes(mat_a, 1, 2), sizes, **options).T


# ---- helpers for factorizations -------------------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if is_complex(x) else _mT(x)


def _broadcast_batch(a, b):
    """a (*, n, n) and b (*, n, k) with their batch dims broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _first_failure(bad):
    """1-based index of the first True along the last axis, or 0 (LAPACK's ``info``)."""
    if bad.shape[-1] == 0:
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    first = jnp.argmax(bad, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(bad, axis=-1), first, 0)


def _lu(a):
    """Partially pivoted LU: (packed LU, 0-based LAPACK-style pivots, permutation)."""
    if a.shape[-1] == 0 or a.shape[-2] == 0:
        k = min(a.shape[-2:])
        return a, jnp.zeros(a.shape[:-2] + (k,), jnp.int32), jnp.broadcast_to(
            jnp.arange(a.shape[-2], dtype=jnp.int32), a.shape[:-1])
    return lax.linalg.lu(a)


def _lu_info(lu):
    return _first_failure(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _lu_solve(lu, permutation, b, adjoint):
    """Solve A x = b (or A^H x = b) from A's packed LU, where P A = L U, P given as a permutation."""
    if b.size == 0:
        return b
    if not adjoint:
        b = jnp.take_along_axis(b, permutation[..., :, None].astype(jnp.int64), axis=-2)
        y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P, so solve U^H y = b, L^H z = y, then undo the permutation.
    y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True,
                                    conjugate_a=is_complex(lu))
    z = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True,
                                    transpose_a=True, conjugate_a=is_complex(lu))
    inverse = jnp.argsort(permutation, axis=-1)
    return jnp.take_along_axis(z, inverse[..., :, None].astype(jnp.int64), axis=-2)


def _lapack_pivots(pivots):
    return (pivots + 1).astype(jnp.int32)


def _permutation_from_lapack_pivots(pivots, n):
    """Undo LAPACK's sequence of row swaps (1-based) into a permutation of range(n)."""
    batch = pivots.shape[:-1]
    zero_based = pivots.astype(jnp.int32) - 1
    return lax.linalg.lu_pivots_to_permutation(zero_based, n) if pivots.shape[-1] else jnp.broadcast_to(
        jnp.arange(n, dtype=jnp.int32), batch + (n,))


# ---- LU and what is built on it -------------------------------------------------------------


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    lu, pivots, _ = _lu(A)
    return lu, _lapack_pivots(pivots), _lu_info(lu)


def _lu_triangles(lu):
    """Packed LU -> (unit lower L, upper U)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    return jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype), jnp.triu(lu[..., :k, :])


def _permutation_matrix(permutation, dtype):
    # P A = L U with P[i, permutation[i]] = 1 here; torch's P satisfies A = P L U.
    return jnp.swapaxes(jax.nn.one_hot(permutation, permutation.shape[-1], dtype=dtype), -1, -2)


@lower(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    lu, _, permutation = _lu(A)
    return (_permutation_matrix(permutation, A.dtype), *_lu_triangles(lu))


@lower(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    """(P, L, U) from linalg.lu_factor's packed form; what is not asked for is empty."""
    P = _empty(LU_data.dtype)
    if unpack_pivots:
        permutation = _permutation_from_lapack_pivots(LU_pivots, LU_data.shape[-2])
        P = _permutation_matrix(permutation, LU_data.dtype)
    L, U = _lu_triangles(LU_data) if unpack_data else (_empty(LU_data.dtype), _empty(LU_data.dtype))
    return P, L, U


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(A):
    compute = accumulator(A.dtype)
    return jsl.expm(A.astype(compute)).astype(A.dtype)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    permutation = _permutation_from_lapack_pivots(pivots, LU.shape[-1])
    if left:
        LU, B = _broadcast_batch(LU, B)
        permutation = jnp.broadcast_to(permutation, LU.shape[:-1])
        return _lu_solve(LU, permutation, B, adjoint)
    # X A = B  <=>  A^H X^H = B^H.
    LU, Bh = _broadcast_batch(LU, _mH(B))
    permutation = jnp.broadcast_to(permutation, LU.shape[:-1])
    return _mH(_lu_solve(LU, permutation, Bh, not adjoint))


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    lu, _, permutation = _lu(A)
    identity = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, permutation, identity, adjoint=False), _lu_info(lu)


def _lu_determinant_parts(lu, pivots):
    """(sign of the permutation, diagonal of U)."""
    n = lu.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(n, dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(lu.dtype)
    return parity, jnp.diagonal(lu, axis1=-2, axis2=-1)


@lower(aten._linalg_det.default)
def linalg_det(A):
    lu, pivots, _ = _lu(A)
    parity, diagonal = _lu_determinant_parts(lu, pivots)
    return parity * jnp.prod(diagonal, axis=-1), lu, _lapack_pivots(pivots)


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(A):
    lu, pivots, _ = _lu(A)
    parity, diagonal = _lu_determinant_parts(lu, pivots)
    magnitude = jnp.abs(diagonal)
    if is_complex(A):
        phase = jnp.where(magnitude == 0, 0, diagonal / jnp.where(magnitude == 0, 1, magnitude))
        sign = parity * jnp.prod(phase, axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diagonal), axis=-1)
    return sign, jnp.sum(jnp.log(magnitude), axis=-1), lu, _lapack_pivots(pivots)


def _is_vector_rhs(A, B):
    """torch.linalg.solve's rule for when B is a (batch of) vector(s)."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    # CPU factors A^T for real A (to skip a copy when A is contiguous) and solves
    # with adjoint=True; we return the same LU, pivots so that the backward
    # (linalg_lu_solve with the same convention) agrees with it.
    use_transpose = not is_complex(A)
    lu, pivots, _ = _lu(_mT(A) if use_transpose else A)
    lapack_pivots = _lapack_pivots(pivots)
    vector = _is_vector_rhs(A, B)
    rhs = B[..., None] if vector else B
    result = linalg_lu_solve(lu, lapack_pivots, rhs, left=left, adjoint=use_transpose)
    return (result[..., 0] if vector else result), lu, lapack_pivots, _lu_info(lu)


# ---- triangular solves ------------------------------------------------------------------------


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    A, B = _broadcast_batch(A, B)
    if B.size == 0:
        return B
    return lax.linalg.triangular_solve(A, B, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lower(aten.triangular_solve.default)
def triangular_solve(x, A, upper=True, transpose=False, unitriangular=False):
    A, B = _broadcast_batch(A, x)
    if B.size == 0:
        return B, A
    solution = lax.linalg.triangular_solve(A, B, left_side=True, lower=not upper, transpose_a=transpose,
                                           unit_diagonal=unitriangular)
    return solution, A


# ---- Cholesky ---------------------------------------------------------------------------------


def _cholesky_info(a):
    """LAPACK potrf's info for one Hermitian matrix (lower triangle read): an
    unblocked Cholesky that records the first non-positive pivot."""
    n = a.shape[-1]
    lower_part = jnp.tril(a)
    m = lower_part + _mH(jnp.tril(a, -1))
    rows = jnp.arange(n)

    def step(carry, k):
        m, info = carry
        pivot = m[k, k].real
        bad = ~(pivot > 0)
        info = jnp.where((info == 0) & bad, k + 1, info).astype(jnp.int32)
        column = jnp.where(rows > k, m[:, k] / jnp.sqrt(jnp.where(bad, 1, pivot)), 0)
        return (m - jnp.outer(column, jnp.conj(column)), info), None

    (_, info), _ = lax.scan(step, (m, jnp.int32(0)), jnp.arange(n))
    return info


def _cholesky_lower(a):
    """L with L L^H = a (lower triangle of a read) and info; L is NaN where a is not positive definite."""
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    L = lax.linalg.cholesky(a, symmetrize_input=False)
    batch = a.shape[:-2]
    flat = a.reshape((-1,) + a.shape[-2:])
    # Only a failed factorization pays for the slow scan that finds where it failed.
    info = lax.cond(jnp.all(jnp.isfinite(L)), lambda m: jnp.zeros(m.shape[:1], jnp.int32),
                    jax.vmap(_cholesky_info), flat)
    return jnp.tril(L), info.reshape(batch)


def _cholesky(a, upper):
    if upper:
        # U^H U = a from a's upper triangle: the lower factor of a^H, adjointed.
        L, info = _cholesky_lower(_mH(a))
        return _mH(L), info
    return _cholesky_lower(a)


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(x, *, upper=False, check_errors=False):
    return _cholesky(x, upper)


@lower(aten.cholesky.default)
def cholesky(x, upper=False):
    return _cholesky(x, upper)[0]


def _cholesky_solve(B, factor, upper):
    factor, B = _broadcast_batch(factor, B)
    if B.size == 0:
        return B
    L = _mH(factor) if upper else factor
    y = lax.linalg.triangular_solve(L, B, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True,
                                       conjugate_a=is_complex(L))


@lower(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(x, A, upper):
    return _cholesky_solve(x, A, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(x, upper=False):
    identity = jnp.broadcast_to(jnp.eye(x.shape[-1], dtype=x.dtype), x.shape)
    return _cholesky_solve(identity, x, upper)


# ---- QR, SVD, symmetric eigendecomposition ----------------------------------------------------------


def _empty(dtype):
    return jnp.zeros((0,), dtype)


@lower(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    return jnp.linalg.qr(A, mode=mode)


@lower(aten._linalg_svd.default)
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        S = jnp.linalg.svd(A, compute_uv=False)
        return _empty(A.dtype), S, _empty(A.dtype)
    return jnp.linalg.svd(A, full_matrices=full_matrices)


@lower(aten._linalg_eigh.default)
def linalg_eigh(A, UPLO="L", compute_v=True):
    values, vectors = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return values, vectors if compute_v else _empty(A.dtype)


# ---- pairwise distances -----------------------------------------------------------------------


def _p_norm(diff, p):
    """The p-norm over the last axis (p = 0 counts the nonzero entries)."""
    magnitude = jnp.abs(diff)
    if p == 0:
        return jnp.sum(magnitude != 0, axis=-1).astype(diff.dtype)
    if p == 1:
        return jnp.sum(magnitude, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(magnitude * magnitude, axis=-1))
    if p == float("inf"):
        return jnp.max(magnitude, axis=-1, initial=0)
    return jnp.sum(magnitude ** p, axis=-1) ** (1.0 / p)


def _euclidean_by_product(x1, x2):
    """||a - b|| as sqrt(|a|^2 + |b|^2 - 2 a.b), one matrix product, as CPU's fast path computes it."""
    x1_sq = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    x2_sq = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    left = jnp.concatenate([-2 * x1, x1_sq, jnp.ones_like(x1_sq)], axis=-1)
    right = jnp.concatenate([x2, jnp.ones_like(x2_sq), x2_sq], axis=-1)
    squared = _product("...pm,...rm->...pr", left, right).astype(x1.dtype)
    return jnp.sqrt(jnp.maximum(squared, 0))


@lower(aten._euclidean_dist.default)
def euclidean_dist(x1, x2):
    return _euclidean_by_product(x1, x2)


def _p_norm_slope(diff, dist, p):
    """d dist / d diff for each element of ``diff`` (dist = its p-norm), with CPU's values at 0."""
    sign = jnp.sign(diff)
    magnitude = jnp.abs(diff)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return sign
    if p == float("inf"):
        return sign * (magnitude == dist)
    safe = jnp.where(dist == 0, 1, dist)
    if p < 2:
        slope = sign * magnitude ** (p - 1) / safe ** (p - 1)
        slope = jnp.where((diff == 0) & (p < 1), 0, slope)
    elif p == 2:
        slope = diff / safe
    else:
        slope = diff * magnitude ** (p - 2) / safe ** (p - 1)
    return jnp.where(dist == 0, 0, slope)


@lower(aten._cdist_backward.default, static_numbers=True)
def cdist_backward(grad, x1, x2, p, cdist):
    """The gradient of _cdist_forward with respect to x1."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    left = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    right = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    slope = _p_norm_slope(left[..., :, None, :] - right[..., None, :, :], cdist[..., None], p)
    full = jnp.sum(grad[..., None] * slope, axis=-2)
    extra = full.ndim - x1.ndim
    full = jnp.sum(full, axis=tuple(range(extra))) if extra else full
    broadcast = tuple(d for d in range(x1.ndim - 2) if x1.shape[d] == 1 and full.shape[d] != 1)
    return jnp.sum(full, axis=broadcast, keepdims=True) if broadcast else full


@lower(aten._cdist_forward.default, static_numbers=True)
def cdist_forward(x1, x2, p, compute_mode=None):
    """Distances between the rows of x1 (..., P, M) and x2 (..., R, M).  For p = 2, CPU
    uses the matrix-product form when asked (mode 1) or, by default, when P or R exceeds 25."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    by_product = compute_mode == 1 or (compute_mode in (None, 0) and max(x1.shape[-2], x2.shape[-2]) > 25)
    if p == 2 and by_product:
        return _euclidean_by_product(x1, x2)
    return _p_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lower(aten._pdist_forward.default, static_numbers=True)
def pdist_forward(self, p=2.0):
    """Distances between every pair of rows i < j of an (N, M) matrix, row-major."""
    rows, cols = np.triu_indices(self.shape[0], 1)
    return _p_norm(self[rows] - self[cols], p)


@lower(aten._pdist_backward.default, static_numbers=True)
def pdist_backward(grad, self, p, pdist):
    """Each pair (i, j) pushes +slope into row i and -slope into row j."""
    rows, cols = np.triu_indices(self.shape[0], 1)
    push = grad[:, None] * _p_norm_slope(self[rows] - self[cols], pdist[:, None], p)
    return jnp.zeros_like(self).at[rows].add(push).at[cols].add(-push)
