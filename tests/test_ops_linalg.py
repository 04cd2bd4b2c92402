"""Matrix products and dense linear algebra on tpu against CPU PyTorch."""

import pytest
import torch
from oracle import assert_same, check, check_grad, to_device

NAN = float("nan")


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def ints(*shape, dtype=torch.int64, seed=0, low=-5, high=6):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def spd(n, batch=(), seed=0):
    """A well-conditioned symmetric positive definite matrix (batch)."""
    a = rand(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


def half_tolerance(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype in (torch.bfloat16, torch.float16) else {}


# ---- products ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32])
def test_products(dtype):
    make = (lambda *s, seed=0: ints(*s, dtype=dtype, seed=seed)) if not dtype.is_floating_point else (
        lambda *s, seed=0: rand(*s, dtype=dtype, seed=seed))

    def program(m, v):
        a, b, batch1 = m[0, :3, :4], m[1], m[:, 1:, :4]  # views: strided operands
        return (a @ b, torch.bmm(batch1, m), a @ v[:4], torch.dot(v, v), torch.addmm(b[:3], a, b, beta=2, alpha=3))

    check(program, make(2, 4, 5), make(5, seed=4), **half_tolerance(dtype))


def test_add_products_with_scalars():
    def program(c, a, b, batch1, batch2, v, w):
        return (
            torch.addmm(c, a, b, beta=0.5, alpha=-1.5),
            torch.addmv(v[:3], a, w, beta=2),
            torch.baddbmm(c, batch1, batch2, alpha=0.25),
            torch.addbmm(c, batch1, batch2, beta=-1),
            torch.addr(c, v[:3], v, alpha=2),
            torch.vdot(w, w),
        )

    check(program, rand(3, 5), rand(3, 4, seed=1), rand(4, 5, seed=2), rand(2, 3, 4, seed=3), rand(2, 4, 5, seed=4),
          rand(5, seed=5), rand(4, seed=6))


def test_complex_products():
    a = torch.randn(3, 4, dtype=torch.complex64)
    b = torch.randn(4, dtype=torch.complex64)
    check(lambda a, b: (a @ b, torch.vdot(b, b), a @ a.mT), a, b)


def test_product_with_conjugate_view():
    check(lambda a: a @ a.mH.resolve_conj(), torch.randn(3, 4, dtype=torch.complex64))


def test_beta_zero_ignores_nan_in_self():
    c = torch.full((3, 5), NAN)
    check(lambda c, a, b: (torch.addmm(c, a, b, beta=0), torch.addmm(c, a, b, beta=0.0, alpha=2.0),
                           torch.addmv(c[:, 0], a, b[:, 0], beta=0)),
          c, rand(3, 4), rand(4, 5))


def test_integer_matmul_is_exact():
    # Products above 2**53 would round in any floating point path.
    a = torch.tensor([[2**31 + 7, 3], [5, -(2**30) - 1]], dtype=torch.int64)
    b = torch.tensor([[2**31 - 1, 11], [13, 2**29 + 3]], dtype=torch.int64)
    check(lambda a, b: (a @ b, torch.mv(a, b[0]), torch.dot(a[0], b[0])), a, b, atol=0, rtol=0)


def test_float32_matmul_at_full_precision():
    # One bf16 pass would miss by ~1e-3 relative; full precision agrees with float64 to ~1e-6.
    a, b = rand(64, 64), rand(64, 64, seed=1)
    exact = (a.double() @ b.double()).float()
    result = (a.to("tpu") @ b.to("tpu")).cpu()
    torch.testing.assert_close(result, exact, atol=1e-5, rtol=1e-5)


def test_non_contiguous_and_empty_operands():
    def program(a, b, e):
        return a.t() @ b[::2], torch.mm(b.t()[:, 1::2].t(), a.t()), e @ e.t(), torch.mm(e.t(), e), torch.mv(e, e[0])

    check(program, rand(4, 3), rand(8, 3, seed=1), torch.empty(3, 0))


def test_out_and_inplace_variants():
    def program(c, a, b, batch1, batch2):
        out = torch.empty(0, device=a.device)
        torch.mm(a, b, out=out)
        c1 = c.clone()
        c1.addmm_(a, b, beta=0.5)
        c2 = c.expand(2, 3, 5).clone()
        c2.baddbmm_(batch1, batch2)
        return out, c1, c2

    check(program, rand(3, 5), rand(3, 4, seed=1), rand(4, 5, seed=2), rand(2, 3, 4, seed=3), rand(2, 4, 5, seed=4))


def test_product_gradients():
    def program(a, b, v, batch):
        loss = (torch.addmm(v, a, b, beta=0.5) * b[:3]).sum() + (torch.bmm(batch, batch) * b).sum()
        loss.backward()
        return a.grad, b.grad, v.grad, batch.grad

    check(program, rand(3, 4).requires_grad_(), rand(4, 4, seed=1).requires_grad_(), rand(4, seed=2).requires_grad_(),
          rand(2, 4, 4, seed=3).requires_grad_())


# ---- grouped products (torch._grouped_mm, mixture-of-experts layers) -----------------------------

GROUP_ENDS = torch.tensor([3, 3, 8, 16], dtype=torch.int32)  # the second group is empty

# (CPU wants every row of an operand to start 16 bytes after the previous one.)
# name -> (mat_a, mat_b, offs): rows of mat_a by group, columns of mat_b by group, K by group, batched
GROUPED_PRODUCTS = {
    "rows": lambda dtype: (rand(16, 8, dtype=dtype), rand(4, 16, 8, dtype=dtype, seed=1).transpose(-2, -1), GROUP_ENDS),
    "columns": lambda dtype: (rand(4, 6, 8, dtype=dtype), rand(8, 16, dtype=dtype, seed=1), GROUP_ENDS),
    "contraction": lambda dtype: (rand(6, 16, dtype=dtype), rand(16, 8, dtype=dtype, seed=1), GROUP_ENDS),
    "batched": lambda dtype: (rand(4, 6, 8, dtype=dtype), rand(4, 8, 16, dtype=dtype, seed=1), None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", GROUPED_PRODUCTS)
def test_grouped_products_and_their_gradients(layout, dtype):
    mat_a, mat_b, offs = GROUPED_PRODUCTS[layout](dtype)
    tolerance = dict(atol=5e-2, rtol=2e-2) if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    check_grad(lambda a, b: torch._grouped_mm(a, b, offs=None if offs is None else offs.to(a.device)),
               mat_a, mat_b, **tolerance)


def test_rows_past_the_last_group_come_out_zero():
    """CPU and CUDA leave them unwritten (whatever memory held); tpu writes zeros, the value
    TorchTitan's experts loop gives its alignment padding."""
    a, b = rand(19, 8).requires_grad_(), rand(4, 8, 16, seed=1).requires_grad_()
    grad = rand(19, 16, seed=2)
    expected = torch._grouped_mm(a, b, offs=GROUP_ENDS)
    (expected[:16] * grad[:16]).sum().backward()
    ta, tb = to_device(a, "tpu"), to_device(b, "tpu")
    actual = torch._grouped_mm(ta, tb, offs=GROUP_ENDS.to("tpu"))
    (actual * grad.to("tpu")).sum().backward()
    assert_same(actual[:16], expected[:16], atol=1e-4, rtol=1e-4)
    assert torch.equal(actual[16:].cpu(), torch.zeros(3, 16))
    assert_same(ta.grad[:16], a.grad[:16], atol=1e-4, rtol=1e-4)
    assert torch.equal(ta.grad[16:].cpu(), torch.zeros(3, 8))
    assert_same(tb.grad, b.grad, atol=1e-4, rtol=1e-4)  # the padding rows add nothing to the weights' gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_products_compile(dtype):
    """PyTorch's meta kernel admits bfloat16 only (CUDA's rule); tpu's fake tensors take CPU's dtypes."""
    a, b = rand(16, 8, dtype=dtype).requires_grad_(), rand(4, 8, 16, dtype=dtype, seed=1).requires_grad_()

    def experts(a, b, offs):
        return torch.nn.functional.silu(torch._grouped_mm(a, b, offs=offs)) * 2

    compiled = torch.compile(experts, backend="tpu", fullgraph=True)
    tolerance = half_tolerance(dtype) or dict(atol=1e-4, rtol=1e-4)
    ta, tb = to_device(a, "tpu"), to_device(b, "tpu")
    actual, expected = compiled(ta, tb, GROUP_ENDS.to("tpu")), experts(a, b, GROUP_ENDS)
    assert_same(actual, expected, **tolerance)
    actual.sum().backward()
    expected.sum().backward()
    # bfloat16: the compiled program keeps silu's gradient in float32; CPU rounds each op's result.
    tolerance = dict(atol=1.5e-1, rtol=5e-2) if dtype == torch.bfloat16 else tolerance
    assert_same(ta.grad, a.grad, **tolerance)
    assert_same(tb.grad, b.grad, **tolerance)


def test_trace_and_cross():
    check(lambda m, i, a, b: (m.trace(), i.trace(), torch.linalg.cross(a, b)),
          rand(4, 3), ints(3, 3), rand(2, 3), rand(1, 3, seed=1))


# ---- factorizations ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cholesky_inverse_det_solve(dtype):
    def program(m, b):
        return (
            torch.linalg.cholesky(m), torch.linalg.cholesky(m, upper=True), torch.linalg.inv(m),
            torch.linalg.det(m), torch.linalg.slogdet(m), torch.linalg.solve(m, b), torch.linalg.solve(m, b[..., 0]),
        )

    check(program, spd(4, (2,)).to(dtype), rand(2, 4, 3, seed=1).to(dtype), atol=1e-4, rtol=1e-4)


def test_factorization_error_info():
    not_pd = torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # leading 2x2 minor is singular
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])

    def program(not_pd, m, singular):
        return (torch.linalg.cholesky_ex(not_pd).info, torch.linalg.cholesky_ex(m), torch.linalg.inv_ex(singular).info,
                torch.linalg.det(singular), torch.linalg.slogdet(singular))

    check(program, not_pd, spd(3), singular)


def test_cholesky_error_raises_like_cpu():
    not_pd = -torch.eye(3)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(not_pd)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(not_pd.to("tpu"))


def test_determinants_signs_and_lu():
    def program(a):
        return (torch.linalg.det(a), torch.linalg.slogdet(a), torch.linalg.lu_factor(a), torch.linalg.lu(a),
                torch.linalg.lu(a[:, :3]))

    check(program, rand(5, 5, seed=3), atol=1e-5, rtol=1e-4)


def test_solve_variants():
    def program(a, b, rows, lu_b):
        lu, pivots = torch.linalg.lu_factor(a)
        return (
            torch.linalg.solve(a, b, left=False),
            torch.linalg.solve(a.expand(2, 4, 4), rows),
            torch.linalg.lu_solve(lu, pivots, lu_b),
            torch.linalg.lu_solve(lu, pivots, lu_b, adjoint=True),
            torch.linalg.lu_solve(lu, pivots, lu_b.mT, left=False),
        )

    check(program, rand(4, 4, seed=1) + 4 * torch.eye(4), rand(3, 4, seed=2), rand(2, 4, seed=3), rand(4, 2, seed=4),
          atol=1e-5, rtol=1e-4)


def test_triangular_solves():
    a = rand(4, 4, seed=1) + 4 * torch.eye(4)

    def program(a, b):
        return (
            torch.linalg.solve_triangular(a, b, upper=True),
            torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
            torch.linalg.solve_triangular(a, b.mT, upper=True, left=False),
            torch.triangular_solve(b, a),
            torch.triangular_solve(b, a, upper=False, transpose=True),
        )

    check(program, a, rand(2, 4, 3, seed=2), atol=1e-5, rtol=1e-4)


def test_cholesky_solve_and_inverse():
    L = torch.linalg.cholesky(spd(4))
    check(lambda L, b: (torch.cholesky_solve(b, L), torch.cholesky_solve(b, L.mT, upper=True), torch.cholesky_inverse(L)),
          L, rand(4, 2, seed=1), atol=1e-5, rtol=1e-4)


def test_qr_up_to_signs():
    def normalized(q, r):
        # QR is unique once R's diagonal is made positive.
        signs = torch.sgn(torch.diagonal(r, dim1=-2, dim2=-1))
        return q * signs.unsqueeze(-2), r * signs.unsqueeze(-1)

    def program(a):
        reduced = normalized(*torch.linalg.qr(a))
        complete_q, complete_r = torch.linalg.qr(a, mode="complete")
        return reduced, complete_q @ complete_r, torch.linalg.qr(a, mode="r")[0]

    check(program, rand(2, 5, 3), atol=1e-5, rtol=1e-4)


def test_svd_and_eigh_up_to_signs():
    def program(a, s):
        u, sv, vh = torch.linalg.svd(a, full_matrices=False)
        values, vectors = torch.linalg.eigh(s)
        return (sv, u.abs(), vh.abs(), (u * sv.unsqueeze(-2)) @ vh, torch.linalg.svdvals(a),
                values, vectors.abs(), torch.linalg.eigvalsh(s, UPLO="U"))

    check(program, rand(2, 5, 3), spd(4, seed=2), atol=1e-4, rtol=1e-4)


def test_full_svd_shapes():
    check(lambda a: [t.shape for t in torch.linalg.svd(a, full_matrices=True)], rand(5, 3))


def test_linalg_gradients():
    def program(m, b):
        loss = torch.linalg.det(m) + (torch.linalg.solve(m, b) * b).sum()
        loss.backward()
        return m.grad, b.grad

    check(program, spd(3).requires_grad_(), rand(3, 2, seed=1).requires_grad_(), atol=1e-4, rtol=1e-4)
