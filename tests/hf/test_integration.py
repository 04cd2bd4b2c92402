"""Hugging Face entry points on tpu: from_pretrained, save_pretrained, pipeline, Trainer.

Everything is built in memory or written to pytest's tmp_path; nothing is
downloaded.
"""

from __future__ import annotations

import pytest
import safetensors.torch
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from .architectures import BY_NAME
from .harness import build_inputs, build_model, cpu_and_tpu_models, logits, on

WORDS = "the a cat dog sat ran on under mat log and then slept barked".split()


def tiny_tokenizer():
    """A word-level tokenizer built in memory: specials first, then WORDS."""
    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_from_pretrained_device_map_tpu(tmp_path, dtype):
    arch = BY_NAME["llama"]
    cpu_model = build_model(arch)
    cpu_model.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu", dtype=dtype)
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    assert {p.dtype for p in model.parameters()} == {dtype}
    inputs = build_inputs(arch)
    expected = logits(cpu_model.to(dtype), inputs)
    actual = logits(model, on("tpu", inputs))
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}
    torch.testing.assert_close(actual.cpu(), expected, **tolerance)


def test_save_pretrained_from_tpu_keeps_tied_weights(tmp_path):
    model = build_model(BY_NAME["gpt2"]).to("tpu")
    assert model.lm_head.weight is model.transformer.wte.weight  # tied by transformers, kept by .to()
    model.save_pretrained(tmp_path)
    saved = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in saved  # the tied copy is not written twice
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    for name, param in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], param.cpu(), rtol=0, atol=0, msg=name)


def test_text_generation_pipeline_on_tpu():
    tokenizer = tiny_tokenizer()
    arch = BY_NAME["gpt2"]
    config = transformers.AutoConfig.for_model(arch.model_type, **{**arch.config, "vocab_size": len(tokenizer)})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    prompt = "the cat sat on the mat"
    settings = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, return_tensors=True)
    on_cpu = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    expected = on_cpu(prompt, **settings)[0]["generated_token_ids"]
    on_tpu = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="tpu")
    assert on_tpu.device.type == "tpu" and next(model.parameters()).device.type == "tpu"
    actual = on_tpu(prompt, **settings)[0]["generated_token_ids"]
    assert list(actual) == list(expected)
    assert len(actual) == len(tokenizer(prompt)["input_ids"]) + 8


class RepeatedBatches(torch.utils.data.Dataset):
    """A few fixed token sequences, repeated: a causal LM can learn them quickly."""

    def __init__(self, length=64, seq=8, distinct=4):
        g = torch.Generator().manual_seed(0)
        self.sequences = torch.randint(3, 128, (distinct, seq), generator=g)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        ids = self.sequences[i % len(self.sequences)]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def train_with(tmp_path, monkeypatch, **overrides):
    """16 Trainer steps of tiny llama on tpu; returns the logged losses."""
    # Trainer takes a device it has no branch for from ACCELERATE_TORCH_DEVICE
    # (the fallback in TrainingArguments._setup_devices).
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "tpu")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=False,
        max_steps=16,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_pin_memory=False,
        **overrides,
    )
    assert args.device.type == "tpu"
    model = build_model(BY_NAME["llama"]).train()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RepeatedBatches())
    trainer.train()
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_trains_on_tpu(tmp_path, monkeypatch):
    losses = train_with(tmp_path, monkeypatch, optim="adamw_torch")  # foreach AdamW
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses


def test_trainer_default_fused_adamw_on_tpu(tmp_path, monkeypatch):
    losses = train_with(tmp_path, monkeypatch)  # optim="adamw_torch_fused": aten::_fused_adamw_
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_layers_compile_nothing_new_when_the_routing_changes(name):
    """transformers' default experts path (``grouped_mm``) on tpu is one grouped product per
    projection over all the routed tokens, whatever each expert receives (torch._grouped_mm's
    own fallback, a product per expert in the shape of its count, compiled new programs at
    every step). Losses and gradients stay CPU's."""
    arch = BY_NAME[name]
    cpu_model, tpu_model = cpu_and_tpu_models(arch)
    assert tpu_model.config._experts_implementation == "grouped_mm"

    def step(model, inputs):
        model.zero_grad()
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        return loss.detach(), next(p for n, p in model.named_parameters() if "experts" in n).grad

    for seed in range(1, 4):  # small integer ops (the routing counts) compile at their third meeting with a shape
        step(tpu_model, on("tpu", build_inputs(arch, seed=seed)))
    before = sum(torch.tpu.compile_stats().values())
    inputs = build_inputs(arch, seed=7)
    loss, grad = step(tpu_model, on("tpu", inputs))
    assert sum(torch.tpu.compile_stats().values()) == before
    expected_loss, expected_grad = step(cpu_model, inputs)
    torch.testing.assert_close(loss.cpu(), expected_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu(), expected_grad, rtol=1e-4, atol=1e-5)
