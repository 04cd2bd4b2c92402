"""Errors are part of the product: where CPU raises, tpu raises the same
exception with a similar message, and the failed op leaves every tensor as it was."""

import re
import warnings

import pytest
import torch

import torchtpu  # noqa: F401


def _ones(*shape, device):
    return torch.ones(*shape, device=device)


def _raised(fn, device):
    """The exception ``fn(device)`` raises, or None."""
    try:
        fn(device)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def assert_raises_like_cpu(fn, match):
    expected = _raised(fn, "cpu")
    actual = _raised(fn, "tpu")
    assert expected is not None, "CPU accepted the call"
    assert actual is not None, f"tpu did not raise; CPU raises {type(expected).__name__}: {expected}"
    assert type(actual) is type(expected), f"tpu raised {actual!r}, CPU raises {expected!r}"
    assert match in str(expected) and match in str(actual)


# ---- in-place ops never resize self -----------------------------------------------

BROADCAST_INPLACE = {
    "add_": lambda s, o: s.add_(o),
    "atan2_": lambda s, o: s.atan2_(o),
    "copysign_": lambda s, o: s.copysign_(o),
    "eq_": lambda s, o: s.eq_(o),
    "fmod_": lambda s, o: s.fmod_(o),
    "clamp_min_": lambda s, o: s.clamp_min_(o),
    "clamp_max_": lambda s, o: s.clamp_max_(o),
    "div_floor": lambda s, o: s.div_(o, rounding_mode="floor"),
    "div_trunc": lambda s, o: s.div_(o, rounding_mode="trunc"),
    "floor_divide_": lambda s, o: s.floor_divide_(o),
    "hypot_": lambda s, o: s.hypot_(o),
}


@pytest.mark.parametrize("name", sorted(BROADCAST_INPLACE))
def test_inplace_broadcast_bigger_than_self_raises(name):
    op = BROADCAST_INPLACE[name]
    assert_raises_like_cpu(lambda d: op(_ones(5, 1, device=d), _ones(5, 5, device=d)),
                           "doesn't match the broadcast shape")


@pytest.mark.parametrize("name", ["atan2_", "clamp_min_", "div_floor"])
def test_failed_inplace_leaves_self_unchanged(name):
    self = torch.arange(5.0, device="tpu").reshape(5, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no resize warning on the way
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            BROADCAST_INPLACE[name](self, _ones(5, 5, device="tpu"))
    assert self.shape == (5, 1)
    torch.testing.assert_close(self.cpu(), torch.arange(5.0).reshape(5, 1))


def test_addr_on_zero_dim_self_raises():
    def addr_(d):
        return torch.tensor(1.0, device=d).addr_(_ones(3, device=d), _ones(3, device=d))

    assert type(_raised(addr_, "tpu")) is type(_raised(addr_, "cpu")) is RuntimeError


def test_inplace_broadcasting_within_self_still_works():
    for device in ("cpu", "tpu"):
        self = _ones(5, 5, device=device)
        self.atan2_(_ones(5, 1, device=device)).floor_divide_(_ones(1, 5, device=device))
    torch.testing.assert_close(self.cpu(), torch.ones(5, 5).atan2_(torch.ones(5, 1)).floor_divide_(torch.ones(1, 5)))


def test_floor_divide_inplace_matches_cpu():
    for dtype in (torch.float32, torch.int64):
        a, b = torch.tensor([5, -7, 9], dtype=dtype), torch.tensor([2, 2, -4], dtype=dtype)
        actual = a.to("tpu").floor_divide_(b.to("tpu"))
        torch.testing.assert_close(actual.cpu(), a.clone().floor_divide_(b))


def test_addbmm_inplace_resizes_self_as_cpu_does():
    """CPU computes addbmm_ as addbmm.out with self as out: self takes the result's shape."""
    b1, b2 = torch.randn(2, 5, 3), torch.randn(2, 3, 10)
    expected = torch.tensor([2.0]).addbmm_(b1, b2, beta=3)
    actual = torch.tensor([2.0], device="tpu").addbmm_(b1.to("tpu"), b2.to("tpu"), beta=3)
    assert actual.shape == expected.shape == (5, 10)
    torch.testing.assert_close(actual.cpu(), expected)


# ---- out= tensors ---------------------------------------------------------------------


def test_out_of_the_wrong_shape_is_resized_with_cpus_warning():
    for device in ("cpu", "tpu"):
        out = _ones(3, device=device)
        with pytest.warns(UserWarning, match="was resized"):
            torch.add(_ones(5, device=device), _ones(5, device=device), out=out)
        assert out.shape == (5,)
        torch.testing.assert_close(out.cpu(), torch.full((5,), 2.0))


def test_out_repeating_an_element_raises():
    def gather(d):
        x = torch.arange(6.0, device=d)
        return torch.gather(x, 0, torch.tensor([2, 1, 0], device=d), out=torch.zeros(1, device=d).expand(3))

    assert_raises_like_cpu(gather, "more than one element of the written-to tensor")


def test_out_partly_overlapping_an_input_raises():
    def shifted_add(d):
        x = torch.arange(6.0, device=d)
        return torch.add(x[1:], 1, out=x[:5])

    def take(d):
        x = torch.arange(6.0, device=d)
        return torch.take(x, torch.tensor([2, 1, 0], device=d), out=x[1:4])

    assert_raises_like_cpu(shifted_add, "some elements of the input tensor and the written-to tensor")
    assert_raises_like_cpu(take, "some elements of the input tensor and the written-to tensor")


def test_out_that_is_an_input_of_an_elementwise_op_works():
    x = torch.arange(6.0, device="tpu")
    torch.add(x, 1, out=x)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) + 1)


# ---- random ops check their parameters on every call -------------------------------

BAD_PARAMETERS = {
    "exponential_": (lambda t, v: t.exponential_(v), 1.0, 0.0, "exponential_ expects lambda > 0.0"),
    "cauchy_": (lambda t, v: t.cauchy_(0.0, v), 1.0, -1.0, "cauchy_ expects sigma > 0.0"),
    "geometric_": (lambda t, v: t.geometric_(v), 0.5, -1.0, "geometric_ expects p to be in (0, 1)"),
    "log_normal_": (lambda t, v: t.log_normal_(0.0, v), 1.0, -1.0, "log_normal_ expects std > 0.0"),
    "uniform_": (lambda t, v: t.uniform_(v, 1.0), 0.0, 3.0, "uniform_ expects to return a [from, to) range"),
}


@pytest.mark.parametrize("name", sorted(BAD_PARAMETERS))
def test_random_op_rejects_bad_parameter_after_a_good_call(name):
    """The program compiled by the good call must not skip the check for the bad value."""
    op, good, bad, match = BAD_PARAMETERS[name]
    self = torch.zeros(10, device="tpu")
    op(self, good)
    before = self.cpu()
    assert_raises_like_cpu(lambda d: op(torch.zeros(10, device=d), bad), match)
    with pytest.raises(RuntimeError, match=re.escape(match)):
        op(self, bad)
    torch.testing.assert_close(self.cpu(), before)


def test_uniform_message_matches_cpu():
    def uniform(d):
        return torch.zeros(4, device=d).uniform_(3, -1)

    assert str(_raised(uniform, "tpu")) == str(_raised(uniform, "cpu"))


# ---- grouped products ----------------------------------------------------------------------


def _grouped(a_shape, b_shape, offs=(3, 8), dtype=torch.float32, offs_dtype=torch.int32, **kwargs):
    def call(device):
        a, b = torch.ones(a_shape, dtype=dtype, device=device), torch.ones(b_shape, dtype=dtype, device=device)
        ends = None if offs is None else torch.tensor(offs, dtype=offs_dtype, device=device)
        return torch._grouped_mm(a, b, offs=ends, **kwargs)
    return call


@pytest.mark.parametrize("call, match", [
    (_grouped((8, 4), (2, 4, 8), dtype=torch.float64), "Float32, BFloat16 or Float16"),
    (_grouped((8, 4), (2, 4, 8), offs_dtype=torch.int64), "Offsets have to be int32"),
    (_grouped((8, 4), (2, 4, 8), offs=None), "Have to provide offsets"),
    (_grouped((2, 8, 4), (2, 4, 8)), "no offset if both matrices are 3d"),
    (_grouped((8, 4), (3, 4, 8)), "matrix batch sizes have to match"),
    (_grouped((8, 4), (2, 8, 8)), "contraction dimension of mat_a and mat_b must match"),
    (_grouped((8,), (2, 4, 8)), "mat_a has to be 2 or 3d"),
    (_grouped((8, 4), (2, 4, 8), bias=None, out_dtype=torch.bfloat16), "output dtype must match"),
], ids=["dtype", "offs dtype", "no offs", "offs for 3d", "groups", "contraction", "1d", "out dtype"])
def test_grouped_product_errors_like_cpu(call, match):
    assert_raises_like_cpu(call, match)
