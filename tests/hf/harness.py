"""Build each architecture tiny and random, run it on cpu and on tpu, compare.

CPU PyTorch is the oracle.  Every check builds its model on CPU from the
config with a fixed seed, copies it to tpu, and runs the same call on both.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import transformers

import torchtpu  # noqa: F401

from .architectures import VOCAB, Arch

BATCH, SEQ, TARGET_SEQ, NEW_TOKENS = 2, 8, 6, 32
FORWARD_RTOL, FORWARD_ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
BF16_ERROR_RATIO, BF16_RELATIVE_ATOL = 2.0, 1e-2  # see check_bf16

transformers.logging.set_verbosity_error()


def token_ids(g, *shape):
    return torch.randint(3, VOCAB, shape, generator=g)  # ids 0-2 are pad/bos/eos


def text_inputs(g, config):
    ids = token_ids(g, BATCH, SEQ)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def image_inputs(g, config):
    size = config.image_size
    return {"pixel_values": torch.randn(BATCH, config.num_channels, size, size, generator=g)}


def speech_inputs(g, config):
    frames = 2 * config.max_source_positions  # the encoder's conv stride is 2
    return {"input_features": torch.randn(BATCH, config.num_mel_bins, frames, generator=g)}


def same_labels(g, config, inputs):
    return inputs["input_ids"].clone()


def target_labels(g, config, inputs):
    return token_ids(g, BATCH, TARGET_SEQ)


def class_labels(g, config, inputs):
    return torch.randint(0, config.num_labels, (BATCH,), generator=g)


@dataclass(frozen=True)
class Task:
    auto_class: Callable
    make_inputs: Callable  # (generator, config) -> model inputs
    make_labels: Callable  # (generator, config, inputs) -> labels


TASKS = {
    "causal-lm": Task(transformers.AutoModelForCausalLM, text_inputs, same_labels),
    "masked-lm": Task(transformers.AutoModelForMaskedLM, text_inputs, same_labels),
    "seq2seq-lm": Task(transformers.AutoModelForSeq2SeqLM, text_inputs, target_labels),
    "image-classification": Task(transformers.AutoModelForImageClassification, image_inputs, class_labels),
    "speech-seq2seq": Task(transformers.AutoModelForSpeechSeq2Seq, speech_inputs, target_labels),
}


def build_config(arch: Arch):
    return transformers.AutoConfig.for_model(arch.model_type, **arch.config)


def build_model(arch: Arch, seed: int = 0):
    """The CPU model, random weights from a fixed seed, in eval mode (no dropout)."""
    torch.manual_seed(seed)
    return TASKS[arch.task].auto_class.from_config(build_config(arch)).eval()


def build_inputs(arch: Arch, *, labels: bool = False, seed: int = 1) -> dict:
    task, config, g = TASKS[arch.task], build_config(arch), torch.Generator().manual_seed(seed)
    inputs = task.make_inputs(g, config)
    if labels:
        inputs["labels"] = task.make_labels(g, config, inputs)
    return inputs


def on(device, inputs: dict) -> dict:
    return {k: v.to(device) for k, v in inputs.items()}


def cpu_and_tpu_models(arch: Arch, dtype=torch.float32):
    cpu_model = build_model(arch).to(dtype)
    return cpu_model, copy.deepcopy(cpu_model).to("tpu")


def check_forward(arch: Arch):
    cpu_model, tpu_model = cpu_and_tpu_models(arch)
    inputs = build_inputs(arch, labels=arch.task not in ("causal-lm", "masked-lm"))
    expected, actual = logits(cpu_model, inputs), logits(tpu_model, on("tpu", inputs))
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, rtol=FORWARD_RTOL, atol=FORWARD_ATOL)


def check_backward(arch: Arch):
    cpu_model, tpu_model = cpu_and_tpu_models(arch)
    inputs = build_inputs(arch, labels=True)
    expected = cpu_model(**inputs).loss
    actual = tpu_model(**on("tpu", inputs)).loss
    expected.backward()
    actual.backward()
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=GRAD_RTOL, atol=GRAD_ATOL)
    tpu_params = dict(tpu_model.named_parameters())
    for name, cpu_param in cpu_model.named_parameters():
        tpu_grad = tpu_params[name].grad
        if cpu_param.grad is None:
            assert tpu_grad is None, f"{name}: tpu has a gradient, cpu has none"
            continue
        assert tpu_grad is not None, f"{name}: no gradient on tpu"
        torch.testing.assert_close(tpu_grad.cpu(), cpu_param.grad, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


def greedy_generate(model, inputs: dict, cache_implementation):
    return model.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,  # no early stop at eos: always 32 new tokens
        do_sample=False,
        cache_implementation=cache_implementation,
    )


def check_generate(arch: Arch, cache_implementation=None):
    """Greedy decoding gives CPU's tokens exactly (dynamic cache, or "static")."""
    cpu_model, tpu_model = cpu_and_tpu_models(arch)
    inputs = build_inputs(arch)
    expected = greedy_generate(cpu_model, inputs, cache_implementation)
    actual = greedy_generate(tpu_model, on("tpu", inputs), cache_implementation)
    assert expected.shape[-1] >= NEW_TOKENS
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def check_bf16(arch: Arch):
    """bfloat16 on tpu is as close to the float32 logits as CPU's bfloat16 is.

    Both bf16 runs are judged against CPU's float32 logits: tpu's largest error
    may be at most twice CPU's own bf16 error, or 1% of the logits' scale,
    whichever is larger.  (A fixed elementwise tolerance would flag a routing
    flip in a bf16 mixture of experts, which CPU makes too.)
    """
    inputs = build_inputs(arch, labels=arch.task not in ("causal-lm", "masked-lm"))
    reference = logits(build_model(arch), inputs)
    cpu_model, tpu_model = cpu_and_tpu_models(arch, torch.bfloat16)
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    cpu_bf16 = logits(cpu_model, inputs)
    tpu_bf16 = logits(tpu_model, on("tpu", inputs))
    assert tpu_bf16.dtype == torch.bfloat16 and tpu_bf16.device.type == "tpu"
    cpu_error = (cpu_bf16.float() - reference).abs().max().item()
    allowed = max(BF16_ERROR_RATIO * cpu_error, BF16_RELATIVE_ATOL * reference.abs().max().item())
    torch.testing.assert_close(tpu_bf16.cpu().float(), reference, rtol=0, atol=allowed)


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


CHECKS = {
    "forward": check_forward,
    "backward": check_backward,
    "generate-dynamic": lambda arch: check_generate(arch, None),
    "generate-static": lambda arch: check_generate(arch, "static"),
    "bf16": check_bf16,
}
