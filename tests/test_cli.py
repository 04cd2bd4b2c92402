"""The ``torchtpu`` command line: ``info`` and a tiny ``demo``, each in a fresh interpreter."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import torch

from torchtpu.tools import cli, demo

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONSOLE_SCRIPT = pathlib.Path(sys.executable).parent / "torchtpu"
TINY_DEMO = ["--steps", "3", "--log-every", "1", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
             "--block-size", "16", "--batch-size", "1", "--sample-chars", "24"]
# batch 1, like generation: sampling reuses the programs training compiled


def _run(command, timeout=300):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _torchtpu_command():
    """The installed console script where there is one, else ``python -m torchtpu``."""
    return [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "torchtpu"]


def test_info_reports_platform_memory_and_versions():
    out = _run(_torchtpu_command() + ["info"])
    assert re.search(r"^platform:\s+\w+", out, re.M), out
    assert re.search(r"^device:\s+tpu:0 \(.*\), 1 on this host", out, re.M), out
    assert re.search(r"^extension:\s+built$", out, re.M), out
    assert re.search(r"^chips:\s+\d+", out, re.M), out
    assert re.search(r"^memory:\s+[\d.]+ GiB total, [\d.]+ GiB free", out, re.M), out
    assert f"torch:     {torch.__version__}" in out
    for package in ("torchtpu", "jax", "jaxlib"):
        assert re.search(rf"^{package}:\s+\d+\.\d+", out, re.M), out


def _check_demo_output(out, device):
    losses = re.findall(r"^step\s+(\d+)/3 \| loss (\d+\.\d+) \| .* tokens/s", out, re.M)
    assert [int(step) for step, _ in losses] == [1, 2, 3], out
    assert all(0 < float(loss) < 10 for _, loss in losses), out
    assert f"on device '{device}'" in out
    sample = out.split("---- sample ----\n", 1)[1].split("\n----------------", 1)[0]
    assert len(sample) == 24, repr(sample)


def test_tiny_demo_trains_and_samples_on_tpu():
    _check_demo_output(_run([sys.executable, "-m", "torchtpu", "demo"] + TINY_DEMO), "tpu")


def test_tiny_compiled_demo_compiles_the_step(capsys):
    """--compile: Dynamo traces the demo's own code (torchtpu's runtime is skipped, not the demo)."""
    torch._dynamo.reset()
    before = torch.tpu.metrics()
    assert cli.main(["demo", "--compile"] + TINY_DEMO) == 0
    _check_demo_output(capsys.readouterr().out, "tpu")
    after = torch.tpu.metrics()
    assert after["compile_cache"]["misses"] > before["compile_cache"]["misses"]
    assert after["graph_fallbacks"] == before["graph_fallbacks"], "a demo graph ran op by op"


def test_tiny_demo_on_cpu_in_process(capsys):
    """The same command line with --device cpu, run in this process (PyTorch is already loaded)."""
    assert cli.main(["demo", "--device", "cpu"] + TINY_DEMO) == 0
    _check_demo_output(capsys.readouterr().out, "cpu")


def test_demo_flags_reach_the_configs():
    args = cli._parser().parse_args(["demo", "--steps", "7", "--device", "cpu", "--seed", "3"])
    assert (args.steps, args.device, args.seed) == (7, "cpu", 3)
    defaults = cli._parser().parse_args(["demo"])
    assert defaults.device == "tpu" and defaults.steps == demo.TrainConfig().steps


# ---- the demo's pieces, in process ---------------------------------------------------------


def test_tokenizer_round_trip_covers_the_corpus():
    text = demo.load_corpus()
    assert 50_000 <= len(text.encode()) <= 150_000
    tokenizer = demo.CharTokenizer(text)
    assert tokenizer.decode(tokenizer.encode(text[:500]).tolist()) == text[:500]
    assert "\n" in tokenizer.index  # generation starts from a window of newlines


def test_learning_rate_warms_up_then_decays():
    cfg = demo.TrainConfig(steps=100, lr=1e-3)
    rates = [demo._learning_rate(step, cfg) for step in range(1, 101)]
    peak = rates.index(max(rates))
    assert 0 < peak < 20 and max(rates) == pytest.approx(1e-3)
    assert rates[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1:]))


def test_gpt_on_tpu_matches_cpu():
    cfg = demo.ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
    torch.manual_seed(0)
    model = demo.GPT(cfg)
    idx = torch.randint(0, 11, (2, 8))
    expected_logits, expected_loss = model(idx, idx)
    model.to("tpu")
    model.tie_weights()
    assert model.head.weight is model.token_embedding.weight
    logits, loss = model(idx.to("tpu"), idx.to("tpu"))
    torch.testing.assert_close(logits.cpu(), expected_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.cpu(), expected_loss, rtol=1e-4, atol=1e-5)
