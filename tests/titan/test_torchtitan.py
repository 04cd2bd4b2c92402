"""TorchTitan 0.2.2 trains on tpu through its own entry point, unchanged.

``python -m torchtitan.train`` (what torchrun runs) picks the ``tpu`` device by
itself (``torch.tpu.is_available()``) and the ``tpu`` process-group backend.
The oracle is the same command on the CPU with gloo (``cpu_reference.py``),
both starting from one seed checkpoint written on the CPU, so that the
weights, the data and the steps are the same: the losses must agree at
every step. The tests write their own word-level tokenizer and text dataset
in the layouts TorchTitan reads (the wheel ships neither).
"""

from __future__ import annotations

import json
import random
import re

import pytest
from distributed import launcher

pytest.importorskip("torchtitan", reason="the TorchTitan extra is not installed (pip install -e '.[titan]')")

REFERENCE = "tests/titan/cpu_reference.py"
ON_CPU = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # torchtpu not loaded: TorchTitan's device lookup finds none
STEPS = 3
TIMEOUT = 300
WORDS = [f"w{i}" for i in range(2000)]


def write_assets(folder) -> tuple[str, str]:
    """A word-level tokenizer (``--model.hf_assets_path``) and a c4-style JSON-lines dataset."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer_dir, data_dir = folder / "tokenizer", folder / "data"
    data_dir.mkdir(parents=True)
    vocab = {word: i for i, word in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                         eos_token="<eos>", unk_token="<unk>").save_pretrained(tokenizer_dir)
    rng = random.Random(0)
    with open(data_dir / "data.json", "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randrange(20, 200)))}) + "\n")
    return str(tokenizer_dir), str(data_dir)


def flags(tokenizer: str, data: str, dump) -> list[str]:
    return ["--model.name", "llama3", "--model.flavor", "debugmodel", "--model.hf_assets_path", tokenizer,
            "--training.dataset", "c4_test", "--training.dataset_path", data, "--training.local_batch_size", "2",
            "--training.seq_len", "64", "--metrics.log_freq", "1", "--job.dump_folder", str(dump)]


def run(entry: list[str], nprocs: int, argv: list[str], env: dict | None = None) -> list[float]:
    """One TorchTitan run on ``nprocs`` processes; rank 0's loss at each step."""
    results = launcher.launch([*entry, *argv], nprocs, timeout=TIMEOUT, env=env)
    assert all(r.returncode == 0 for r in results), launcher.report(results)
    log = re.sub(r"\x1b\[[0-9;]*m", "", results[0].stdout + results[0].stderr)
    return [float(loss) for loss in re.findall(r"step:\s*\d+\s+loss:\s*([0-9.]+)", log)]


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """The assets and a step-0 checkpoint of the debug model, initialised on the CPU."""
    folder = tmp_path_factory.mktemp("titan")
    tokenizer, data = write_assets(folder)
    run([REFERENCE], 1, [*flags(tokenizer, data, folder / "seed"), "--checkpoint.enable",
                         "--checkpoint.create_seed_checkpoint", "--training.steps", "1",
                         "--parallelism.data_parallel_shard_degree", "1"], env=ON_CPU)
    return tokenizer, data, str(folder / "seed" / "checkpoint" / "step-0")


@pytest.fixture(scope="module")
def cpu_losses(seed, tmp_path_factory):
    """The CPU/gloo run's losses for a parameter dtype (each run once per module)."""
    tokenizer, data, checkpoint = seed
    runs = {}

    def losses(dtype: str) -> list[float]:
        if dtype not in runs:
            dump = tmp_path_factory.mktemp(f"cpu_{dtype}")
            runs[dtype] = run([REFERENCE], 2, [*flags(tokenizer, data, dump), *same_run(dtype, checkpoint)],
                              env=ON_CPU)
        return runs[dtype]

    return losses


def same_run(dtype: str, checkpoint: str) -> list[str]:
    return ["--training.steps", str(STEPS), "--training.mixed_precision_param", dtype, "--checkpoint.enable",
            "--checkpoint.initial_load_path", checkpoint]


@pytest.mark.parametrize("dtype, compiled, rel", [
    ("float32", False, 1e-4),
    ("float32", True, 1e-4),  # --compile.enable: torch.compile's default backend, which runs tpu graphs on ours
    ("bfloat16", False, 1e-3),  # FSDP2 mixed precision: bfloat16 compute, float32 master weights
], ids=["float32", "float32-compiled", "bfloat16"])
def test_llama3_under_fsdp_on_two_processes_gives_the_losses_of_cpu_gloo(seed, cpu_losses, tmp_path, dtype,
                                                                         compiled, rel):
    tokenizer, data, checkpoint = seed
    tpu = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path), *same_run(dtype, checkpoint),
                                              *(["--compile.enable"] if compiled else [])])
    cpu = cpu_losses(dtype)
    assert len(cpu) == STEPS
    assert tpu == pytest.approx(cpu, rel=rel)
