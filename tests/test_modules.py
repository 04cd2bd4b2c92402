"""Module.to("tpu") keeps Parameter identity, so tied weights stay tied, as on CUDA."""

import torch
import torch.nn as nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_tied_weights_stay_tied():
    model = Tied()
    weight = model.embed.weight
    cpu_value = weight.detach().clone()
    model.to("tpu")
    assert model.head.weight is model.embed.weight
    assert model.embed.weight is weight, "the Parameter object survives, as with .to('cuda')"
    assert model.embed.weight.device.type == "tpu"
    assert len(list(model.parameters())) == 1
    torch.testing.assert_close(model.embed.weight.detach().cpu(), cpu_value)


def test_module_tpu_method_and_back_to_cpu():
    model = Tied().tpu()
    assert model.head.weight.device.type == "tpu"
    model.to("cpu")
    assert model.head.weight is model.embed.weight and model.head.weight.device.type == "cpu"


def test_to_dtype_and_other_devices_are_untouched():
    before = torch.__future__.get_swap_module_params_on_conversion()
    model = nn.Linear(2, 2).to(torch.float64)
    assert model.weight.dtype == torch.float64
    model.to("tpu", torch.float32)
    assert model.weight.dtype == torch.float32 and model.weight.device.type == "tpu"
    assert torch.__future__.get_swap_module_params_on_conversion() == before


def test_gradients_flow_through_tied_parameter():
    model = Tied().to("tpu")
    idx = torch.tensor([[1, 2, 3]], device="tpu")
    model.head(model.embed(idx)).sum().backward()
    assert model.embed.weight.grad is not None
    assert model.embed.weight.grad.device.type == "tpu"


def test_parameters_held_by_a_graph_still_move(recwarn):
    model = nn.Conv2d(2, 2, 3)
    out = model(torch.randn(1, 2, 4, 4))  # the graph holds the weight, so it cannot be swapped
    model.to("tpu")
    assert model.weight.device.type == "tpu"
    assert any("could not keep Parameter identity" in str(w.message) for w in recwarn)
    del out
