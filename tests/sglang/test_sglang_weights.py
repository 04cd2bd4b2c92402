"""SGLang's linear layers re-stored [in, out] on XLA:CPU (torchtpu/integrations/sglang/weights.py) compute what CPU does."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang", reason="SGLang is not installed: ./scripts/setup_engines.sh installs it")

from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod  # noqa: E402

from torchtpu.integrations.sglang.weights import store_linear_weights_in_out  # noqa: E402


def linear_layer(weight, bias):
    """The parts of SGLang's LinearBase that the re-store touches: a weight, a bias, a quant method."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.bias = torch.nn.Parameter(bias, requires_grad=False)
    layer.quant_method = UnquantizedLinearMethod()
    return layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_restored_linear_layer_computes_what_cpu_does(dtype):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(24, 40).to(dtype), torch.randn(24).to(dtype), torch.randn(5, 40).to(dtype)
    layer = linear_layer(weight, bias).to("tpu")
    restored = store_linear_weights_in_out(layer)
    assert restored == (1 if dtype == torch.bfloat16 else 0)  # XLA:CPU's float32 dot is fast in either layout
    assert torch.equal(layer.weight.cpu(), weight)  # the same values under the old name
    expected = F.linear(x.float(), weight.float(), bias.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    out = layer.quant_method.apply(layer, x.to("tpu"), layer.bias)
    torch.testing.assert_close(out.float().cpu(), expected, atol=tol, rtol=tol)
    into = torch.empty(5, 24, dtype=dtype, device="tpu")
    assert layer.quant_method.apply_into(layer, x.to("tpu"), into, layer.bias) is into
    torch.testing.assert_close(into.float().cpu(), expected, atol=tol, rtol=tol)
