"""peft LoRA fine-tuning on tpu, judged against the same run on CPU.

A tiny random Llama (tests/hf/architectures.py) is wrapped with a LoRA config,
trained a few AdamW steps on CPU and on tpu from the same weights, and the
two runs are compared: the losses, which parameters received gradients, the
LoRA weights after training, and the merged model (``merge_and_unload``).
"""

from __future__ import annotations

import copy

import pytest

peft = pytest.importorskip("peft")

import torch  # noqa: E402

from .architectures import BY_NAME  # noqa: E402
from .harness import build_inputs, build_model, logits, on  # noqa: E402

ARCH = BY_NAME["llama"]
STEPS = 6
RTOL, ATOL = 1e-4, 1e-5


def lora_model():
    """The CPU base model wrapped with LoRA adapters on the attention and MLP projections."""
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "up_proj"],
        lora_dropout=0.0,
        init_lora_weights="gaussian",  # B starts at zero either way: the wrapped model starts as the base
    )
    base = build_model(ARCH).train()
    torch.manual_seed(2)  # the adapters' own initialization
    return peft.get_peft_model(base, config)


def fine_tune(device):
    """``STEPS`` AdamW steps on one fixed batch; returns the model, the losses and the gradients of step 1."""
    model = lora_model().to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    inputs = on(device, build_inputs(ARCH, labels=True))
    losses, first_grads = [], None
    for _ in range(STEPS):
        loss = model(**inputs).loss
        loss.backward()
        if first_grads is None:
            first_grads = {n: None if p.grad is None else p.grad.cpu() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses, first_grads


@pytest.fixture(scope="module")
def runs():
    return fine_tune("cpu"), fine_tune("tpu")


def test_lora_loss_falls_and_matches_cpu(runs):
    (_, cpu_losses, _), (model, tpu_losses, _) = runs
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    assert tpu_losses[-1] < tpu_losses[0], tpu_losses
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=RTOL, atol=ATOL)


def test_only_lora_parameters_get_gradients(runs):
    (cpu_model, _, cpu_grads), (tpu_model, _, tpu_grads) = runs
    lora = {n for n, p in tpu_model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora), sorted(lora)
    assert lora == {n for n, p in cpu_model.named_parameters() if p.requires_grad}
    for name, grad in tpu_grads.items():
        if name in lora:
            assert grad is not None, f"{name}: a LoRA weight got no gradient on tpu"
            torch.testing.assert_close(grad, cpu_grads[name], rtol=RTOL, atol=ATOL, msg=name)
        else:
            assert grad is None, f"{name}: a frozen base weight got a gradient on tpu"


def test_lora_weights_match_cpu_and_base_weights_stay(runs):
    (cpu_model, _, _), (tpu_model, _, _) = runs
    untouched = lora_model()
    cpu_state, start = cpu_model.state_dict(), untouched.state_dict()
    for name, value in tpu_model.state_dict().items():
        torch.testing.assert_close(value.cpu(), cpu_state[name], rtol=RTOL, atol=ATOL, msg=name)
        if "lora_" not in name:
            torch.testing.assert_close(value.cpu(), start[name], rtol=0, atol=0, msg=name)
    for name in start:
        if "lora_B" in name:  # LoRA's B starts at zero and has moved
            assert tpu_model.state_dict()[name].abs().sum().item() > 0, name


def test_merge_and_unload_on_tpu(runs):
    (cpu_model, _, _), (tpu_model, _, _) = runs
    cpu_model, tpu_model = copy.deepcopy(cpu_model).eval(), copy.deepcopy(tpu_model).eval()  # merging is in place
    inputs = build_inputs(ARCH)
    with_adapters = logits(tpu_model, on("tpu", inputs)).cpu()
    merged = tpu_model.merge_and_unload()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert {p.device.type for p in merged.parameters()} == {"tpu"}
    merged_logits = logits(merged, on("tpu", inputs)).cpu()
    torch.testing.assert_close(merged_logits, with_adapters, rtol=RTOL, atol=ATOL)
    expected = logits(cpu_model.merge_and_unload(), inputs)
    torch.testing.assert_close(merged_logits, expected, rtol=RTOL, atol=ATOL)


def test_adapter_save_and_load_from_tpu(tmp_path):
    model = lora_model().to("tpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)  # nonzero, so the adapter changes the logits
    model.save_pretrained(tmp_path)
    reloaded = peft.PeftModel.from_pretrained(build_model(ARCH), tmp_path).to("tpu")
    inputs = on("tpu", build_inputs(ARCH))
    model.eval()
    torch.testing.assert_close(logits(reloaded, inputs).cpu(), logits(model, inputs).cpu(), rtol=0, atol=0)
