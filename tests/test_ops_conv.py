"""Convolution, pooling and upsampling against CPU: forward values, indices and gradients."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_same, check, check_grad, to_device


torch.manual_seed(0)
X = torch.randn(2, 4, 9, 9)


@pytest.mark.parametrize("kwargs,wshape", [
    (dict(), (6, 4, 3, 3)),
    (dict(stride=2, padding=(1, 2), dilation=(2, 1), groups=2), (6, 2, 3, 3)),
    (dict(padding="same"), (6, 4, 4, 4)),
])
def test_conv2d(kwargs, wshape):
    check_grad(lambda x, w, b: F.conv2d(x, w, b, **kwargs), X, torch.randn(wshape), torch.randn(wshape[0]))


def test_conv1d_conv3d():
    check_grad(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), torch.randn(2, 3, 10), torch.randn(5, 3, 3),
               torch.randn(5))
    check_grad(lambda x, w, b: F.conv3d(x, w, b, padding=1, stride=(1, 2, 1)), torch.randn(1, 2, 5, 6, 5),
               torch.randn(3, 2, 3, 3, 3), torch.randn(3))


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(stride=2, padding=1, output_padding=1, groups=2, dilation=2),
    dict(stride=3, padding=4),  # padding beyond the kernel reach: negative pads
])
def test_conv_transpose2d(kwargs):
    check_grad(lambda x, w, b: F.conv_transpose2d(x, w, b, **kwargs), X, torch.randn(4, 3, 3, 3), torch.randn(
        3 * kwargs.get("groups", 1)))


def test_conv_transpose1d_3d():
    check_grad(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=2), torch.randn(2, 3, 7),
               torch.randn(3, 2, 4), torch.randn(2))
    check_grad(lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2), torch.randn(1, 2, 3, 4, 3),
               torch.randn(2, 3, 2, 2, 2), torch.randn(3))


def test_conv2d_module_bfloat16():
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 8, 8)
    expected = conv.bfloat16()(x.bfloat16())
    actual = conv.to("tpu")(x.bfloat16().to("tpu"))
    assert_same(actual, expected, atol=5e-2, rtol=5e-2)


def test_conv2d_module_weight_grads():
    torch.manual_seed(2)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    tconv = nn.Conv2d(4, 6, 3, stride=2, padding=1).to("tpu")
    tconv.load_state_dict(conv.state_dict())
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    tx = x.detach().to("tpu").requires_grad_()
    (conv(x) ** 3).sum().backward()
    (tconv(tx) ** 3).sum().backward()
    assert_same(tconv.weight.grad, conv.weight.grad, atol=1e-3, rtol=1e-4)
    assert_same(tconv.bias.grad, conv.bias.grad, atol=1e-3, rtol=1e-4)
    assert_same(tx.grad, x.grad, atol=1e-4, rtol=1e-4)


def test_conv_without_bias_or_input_grad():
    conv = nn.Conv2d(4, 6, 3, bias=False)
    tconv = nn.Conv2d(4, 6, 3, bias=False).to("tpu")
    tconv.load_state_dict(conv.state_dict())
    # no bias and an input without grad: convolution_backward's output_mask drops two outputs
    conv(X).sum().backward()
    tconv(X.to("tpu")).sum().backward()
    assert_same(tconv.weight.grad, conv.weight.grad, atol=1e-3, rtol=1e-4)


# ---- max pooling -------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 0), ceil_mode=True, dilation=(1, 2)),
])
def test_max_pool2d(kwargs):
    check(lambda x: F.max_pool2d(x, return_indices=True, **kwargs), X)
    check_grad(lambda x: F.max_pool2d(x, **kwargs), X)


def test_max_pool2d_ties_and_unbatched():
    # Ties pick the first maximum in window scan order, as CPU does.
    check(lambda x: F.max_pool2d(x, 2, 2, return_indices=True), torch.tensor([[[1., 1., 2., 2.], [1., 1., 2., 2.]]]))
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), torch.randint(0, 4, (3, 7, 7)))
    check(lambda x: F.max_pool2d(x, 3, 1, 1, return_indices=True), torch.tensor([[[1., float("nan"), 0.], [0., 2., 1.]]]))


def test_max_pool_module_and_1d_3d():
    check_grad(nn.MaxPool2d(3, 2, 1), X)
    check_grad(lambda x: F.max_pool1d(x, 3, 2, 1), torch.randn(2, 3, 10))
    check(lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), torch.randn(2, 3, 10))
    check(lambda x: F.max_pool3d(x, 2, 2, 1, return_indices=True), torch.randn(1, 2, 5, 5, 5))
    check_grad(lambda x: F.max_pool3d(x, 3, 2, 1, ceil_mode=True), torch.randn(1, 2, 5, 6, 5))


def test_max_pool2d_bfloat16():
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), X.bfloat16())


# ---- average pooling --------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, divisor_override=5),
    dict(kernel_size=(2, 3), stride=(3, 1), padding=(1, 1)),
])
def test_avg_pool2d(kwargs):
    check_grad(lambda x: F.avg_pool2d(x, **kwargs), X)


def test_avg_pool_module_1d_3d_bf16():
    check_grad(nn.AvgPool2d(3, 2, 1, count_include_pad=False), X)
    check_grad(lambda x: F.avg_pool1d(x, 3, 2, 1), torch.randn(2, 3, 10))
    check_grad(lambda x: F.avg_pool3d(x, 2, 2, 1, ceil_mode=True), torch.randn(1, 2, 5, 5, 5))
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), X.bfloat16(), atol=2e-2, rtol=2e-2)


# ---- adaptive pooling -------------------------------------------------------------------


@pytest.mark.parametrize("size", [(4, 5), 1])
def test_adaptive_pool2d(size):
    check_grad(lambda x: F.adaptive_avg_pool2d(x, size), X)
    check(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), X)
    check_grad(lambda x: F.adaptive_max_pool2d(x, size), X)


def test_adaptive_pool3d():
    x = torch.randn(1, 2, 5, 5, 5)
    check_grad(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), x)
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True), x)


# ---- upsampling ------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(scale_factor=2),
    dict(size=(5, 13), mode="nearest-exact"),
    dict(scale_factor=1.7, mode="bilinear"),
    dict(size=(5, 13), mode="bilinear", align_corners=True),
])
def test_upsample2d(kwargs):
    check_grad(lambda x: F.interpolate(x, **kwargs), X)


def test_upsample_1d_3d():
    check_grad(lambda x: F.interpolate(x, size=13, mode="linear"), torch.randn(2, 3, 10))
    check_grad(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), torch.randn(2, 3, 10))
    check_grad(lambda x: F.interpolate(x, size=(3, 7, 4), mode="trilinear"), torch.randn(1, 2, 5, 5, 5))


@pytest.mark.parametrize("shape, kernel, output_size", [
    ((2, 3, 9, 11), (2, 3), (4, 5)),
    ((3, 7, 7), (3, 3), (3, 3)),  # no batch dim
    ((1, 1, 5, 5), (2, 2), (1, 2)),  # a single output row takes the last window
    ((2, 2, 6, 7, 8), (2, 2, 3), (3, 4, 3)),
])
def test_fractional_max_pool_windows_indices_and_gradient(shape, kernel, output_size):
    """With the random samples given, the windows are CPU's exactly: values, indices, gradient."""
    n = len(kernel)
    samples = torch.rand(shape[0] if len(shape) == n + 2 else 1, shape[-n - 1], n, generator=torch.Generator().manual_seed(0))
    pool = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d

    def values_and_indices(x, samples):
        return pool(x, kernel, output_size=output_size, return_indices=True, _random_samples=samples)

    check(values_and_indices, torch.randn(shape), samples)
    check_grad(lambda x: pool(x, kernel, output_size=output_size, _random_samples=samples.to(x.device)),
               torch.randn(shape), atol=0, rtol=0)
