"""Factory lowerings (arange, linspace, logspace, eye, full, zeros/ones, scalar_tensor,
tril/triu_indices) against CPU."""

import pytest
import torch
from oracle import assert_same, check

FLOATS_AND_INTS = [None, torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32]


def same(factory, *args, **kwargs):
    """The tpu factory gives CPU's tensor, or raises CPU's error."""
    try:
        expected = factory(*args, **kwargs)
    except Exception as error:
        with pytest.raises(type(error)) as raised:
            factory(*args, device="tpu", **kwargs)
        assert str(raised.value) == str(error)
        return
    actual = factory(*args, device="tpu", **kwargs)
    assert_same(actual, expected)


@pytest.mark.parametrize("dtype", FLOATS_AND_INTS)
@pytest.mark.parametrize("args", [(5,), (2, 9), (10, 0, -3), (0.0, 1.0, 0.1), (-1.5, 5.5, 1.7), (0, 0), (3, 1)],
                         ids=str)
def test_arange(args, dtype, request):
    if args == (0.0, 1.0, 0.1) and dtype == torch.int32:
        # PyTorch's own meta kernel disagrees with its CPU kernel here (meta raises, CPU returns
        # zeros); the executor runs the meta kernel first.
        request.applymarker(pytest.mark.xfail(reason="meta kernel raises 'step must be nonzero'", strict=True))
    same(torch.arange, *args, dtype=dtype)


def test_arange_length_rule_and_precision():
    # float steps whose count is off by one if computed in float32
    same(torch.arange, 0, 1, 1 / 49)
    same(torch.arange, -0.3, 0.9, 0.3)
    same(torch.arange, 1, 2.5, 0.5, dtype=torch.float16)
    same(torch.arange, 2 ** 40, 2 ** 40 + 3)


def test_arange_out_and_errors():
    for out in (torch.empty(0), torch.empty(7, dtype=torch.float64)):
        check(lambda o: torch.arange(1, 4, 0.5, out=o), out)
    check(lambda o: torch.arange(-2, 9, 3, out=o), torch.empty(0, dtype=torch.int32))
    same(torch.arange, 0, 3, 0)
    same(torch.arange, 0, 3, -1)
    same(torch.arange, 0, float("inf"))


@pytest.mark.xfail(reason="an out= call hides the dtype from the lowering: with float arguments and an "
                          "integer out, CPU truncates start/step first", strict=True)
def test_arange_float_args_into_integer_out():
    check(lambda o: torch.arange(0.5, 5.5, 1.5, out=o), torch.empty(0, dtype=torch.int32))


@pytest.mark.parametrize("dtype", FLOATS_AND_INTS + [torch.complex64])
@pytest.mark.parametrize("args", [(0, 1, 5), (-2, 10, 4), (0.3, 7.9, 11), (5, -3, 9), (3, 10, 1), (1, 2, 0)],
                         ids=str)
def test_linspace(args, dtype):
    same(torch.linspace, *args, dtype=dtype)


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("args", [(0, 3, 4), (-1, 2, 7), (2, 2, 1), (0, 1, 0)], ids=str)
def test_logspace(args, dtype):
    same(torch.logspace, *args, dtype=dtype)
    same(torch.logspace, *args, base=2.0, dtype=dtype)


def test_logspace_fractional_endpoints():
    same(torch.logspace, -1.5, 2.5, 7)
    same(torch.logspace, -1.5, 2.5, 7, dtype=torch.int64)


@pytest.mark.xfail(reason="bfloat16 logspace with fractional endpoints: CPU's rounding sequence is not "
                          "reproduced (differs by a few bf16 ulps)", strict=True)
def test_logspace_bfloat16_fractional_endpoints():
    same(torch.logspace, 0.3, 7.9, 11, dtype=torch.bfloat16)


def test_linspace_tensor_endpoints_and_out():
    check(lambda s, e: torch.linspace(s, e, 6), torch.tensor(1.0), torch.tensor(4.0))
    check(lambda o: torch.linspace(0, 1, 5, out=o), torch.empty(0))
    check(lambda o: torch.logspace(0, 2, 3, out=o), torch.empty(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [None, torch.int64, torch.bool, torch.bfloat16, torch.complex64])
def test_eye(dtype):
    same(torch.eye, 3, dtype=dtype)
    same(torch.eye, 2, 4, dtype=dtype)
    same(torch.eye, 0, 3, dtype=dtype)
    check(lambda o: torch.eye(3, 2, out=o), torch.empty(0, dtype=torch.int32))


@pytest.mark.parametrize("fill", [3, 2.5, True, 1 + 2j, -7], ids=str)
def test_full_infers_dtype(fill):
    same(torch.full, (2, 3), fill)
    same(torch.full, (0, 2), fill)
    same(torch.full, (), fill)


def test_full_with_dtype_and_likes():
    same(torch.full, (3,), 2.7, dtype=torch.int64)
    same(torch.full, (3,), 2 ** 40, dtype=torch.int64)
    same(torch.full, (3,), 1, dtype=torch.bool)
    check(lambda a: (torch.full_like(a, 4), torch.zeros_like(a), torch.ones_like(a, dtype=torch.int32),
                     a.new_full((2,), 1.5), a.new_zeros(3, 1), a.new_ones(0)), torch.empty(2, 3))


@pytest.mark.parametrize("dtype", [None, torch.int64, torch.bool, torch.float16])
def test_zeros_ones_scalar_tensor(dtype):
    same(torch.zeros, 2, 3, dtype=dtype)
    same(torch.ones, (4,), dtype=dtype)
    same(torch.zeros, (0, 2), dtype=dtype)
    same(torch.scalar_tensor, 3, dtype=dtype)
    same(torch.ones, (), dtype=dtype)


def test_efficientzerotensor():
    same(torch.ops.aten._efficientzerotensor, [2, 3])


@pytest.mark.parametrize("row,col,offset", [(3, 3, 0), (4, 3, 1), (3, 5, -2), (0, 3, 0), (3, 3, 10), (3, 3, -10)])
def test_tril_triu_indices(row, col, offset):
    same(torch.tril_indices, row, col, offset)
    same(torch.triu_indices, row, col, offset)
    same(torch.tril_indices, row, col, offset, dtype=torch.int32)


@pytest.mark.parametrize("make", [
    torch.zeros_like, lambda a: torch.ones_like(a, dtype=torch.int64), lambda a: torch.full_like(a, 2.5),
    lambda a: torch.full_like(a.t(), 7, dtype=torch.int32), lambda a: torch.zeros_like(a.t()),
    lambda a: torch.ones_like(a[:, ::2]), lambda a: a.new_zeros((2, 5)), lambda a: a.new_ones((3,), dtype=torch.int32),
    lambda a: a.new_full((2, 2), 1.5), lambda a: a.int().new_full((2,), 7),
], ids=lambda f: "")
def test_like_and_new_factories_keep_dtype_and_layout(make):
    check(make, torch.randn(3, 4), check_stride=True)
