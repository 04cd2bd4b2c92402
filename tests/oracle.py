"""CPU PyTorch is the oracle: run the same program on cpu and on tpu, compare."""

from __future__ import annotations

import torch

import torchtpu  # noqa: F401


def to_device(value, device):
    if isinstance(value, torch.Tensor):
        moved = value.detach().to(device, copy=True)
        return moved.requires_grad_(value.requires_grad) if value.is_floating_point() or value.is_complex() else moved
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def assert_same(actual, expected, *, atol=None, rtol=None, check_stride=False):
    """tpu results equal cpu results: same structure, dtype, shape, values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"result is on {actual.device}, not tpu"
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        if check_stride:
            assert actual.stride() == expected.stride(), f"stride {actual.stride()} != {expected.stride()}"
        torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol=atol, rtol=rtol, check_stride=check_stride)
    else:
        assert actual == expected or (actual != actual and expected != expected), f"{actual!r} != {expected!r}"


def check(fn, *args, atol=None, rtol=None, check_stride=False, **kwargs):
    """Run ``fn`` on cpu inputs and on tpu copies of them; assert the results match."""
    tpu_args, tpu_kwargs = to_device(args, "tpu"), to_device(kwargs, "tpu")
    expected = fn(*to_device(args, "cpu"), **to_device(kwargs, "cpu"))
    actual = fn(*tpu_args, **tpu_kwargs)
    assert_same(actual, expected, atol=atol, rtol=rtol, check_stride=check_stride)
    return actual, expected


def check_grad(fn, *args, atol=1e-4, rtol=1e-4, grad_args=None):
    """fn's output and the gradients of the chosen float arguments match CPU."""
    grad_args = range(len(args)) if grad_args is None else grad_args
    cpu = [a.detach().clone().requires_grad_(i in grad_args and a.is_floating_point()) for i, a in enumerate(args)]
    tpu = [to_device(a, "tpu") for a in cpu]
    expected, actual = fn(*cpu), fn(*tpu)
    assert_same(actual, expected, atol=atol, rtol=rtol)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    actual.backward(grad.to("tpu"))
    for c, t in zip(cpu, tpu):
        if c.requires_grad:
            assert_same(t.grad, c.grad, atol=atol, rtol=rtol)
