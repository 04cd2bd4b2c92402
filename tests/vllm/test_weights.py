"""Linear weights re-stored [in, out] on XLA:CPU (torchtpu/integrations/vllm/weights.py) keep every value."""

import pytest
import torch
import torch.nn.functional as F
from vllm.model_executor.layers.linear import UnquantizedLinearMethod

from torchtpu.integrations.vllm.weights import store_linear_weights_in_out


class Linear(torch.nn.Module):
    """The parts of vLLM's LinearBase that the re-store touches: a weight, a bias, a quant method."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False)
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return self.quant_method.apply(self, x, self.bias)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_restored_linear_layer_computes_what_cpu_does(dtype):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(24, 40).to(dtype), torch.randn(24).to(dtype), torch.randn(5, 40).to(dtype)
    model = torch.nn.Sequential(Linear(weight, bias)).to("tpu")
    restored = store_linear_weights_in_out(model)
    layer = model[0]
    if dtype == torch.float32:  # XLA:CPU's float32 dot is fast in either layout
        assert restored == 0 and not hasattr(layer, "weight_in_out")
    else:
        assert restored == 1
        assert layer.weight_in_out.shape == (40, 24) and layer.weight_in_out.is_contiguous()
        assert layer.weight.untyped_storage().data_ptr() == layer.weight_in_out.untyped_storage().data_ptr()
    assert torch.equal(layer.weight.cpu(), weight)  # the same values under the old name
    expected = F.linear(x.float(), weight.float(), bias.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(model(x.to("tpu")).float().cpu(), expected, atol=tol, rtol=tol)
    # Dynamo counts compiles per code object (nn.Sequential.forward) across the whole worker: start afresh,
    # so that the tests this worker ran before cannot push it past its recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to("tpu")).float().cpu(), expected, atol=tol, rtol=tol)


def test_a_weight_two_modules_share_is_left_as_it_is():
    weight = torch.randn(6, 4, dtype=torch.bfloat16)
    first, second = Linear(weight, torch.zeros(6, dtype=torch.bfloat16)), Linear(weight, torch.zeros(6, dtype=torch.bfloat16))
    second.weight = first.weight  # tied
    model = torch.nn.Sequential(first, second).to("tpu")
    assert store_linear_weights_in_out(model) == 0
    assert model[0].weight.is_contiguous()
