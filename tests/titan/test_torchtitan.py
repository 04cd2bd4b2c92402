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

import re
import shutil

import pytest
from distributed import launcher
from titan.assets import write_assets

pytest.importorskip("torchtitan", reason="the TorchTitan extra is not installed (pip install -e '.[titan]')")

REFERENCE = "tests/titan/cpu_reference.py"
ON_CPU = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # torchtpu not loaded: TorchTitan's device lookup finds none
STEPS = 3
# A hang guard, not a speed limit: a run takes 1-2.5 min alone, and CI's other worker can double that.
TIMEOUT = 600


def flags(tokenizer: str, data: str, dump, flavor: str = "debugmodel", model: str = "llama3") -> list[str]:
    return ["--model.name", model, "--model.flavor", flavor, "--model.hf_assets_path", tokenizer,
            "--training.dataset", "c4_test", "--training.dataset_path", data, "--training.local_batch_size", "2",
            "--training.seq_len", "64", "--metrics.log_freq", "1", "--job.dump_folder", str(dump)]


def run(entry: list[str], nprocs: int, argv: list[str], env: dict | None = None) -> list[float]:
    """One TorchTitan run on ``nprocs`` processes; rank 0's loss at each step."""
    results = launcher.launch([*entry, *argv], nprocs, timeout=TIMEOUT, env=env)
    assert all(r.returncode == 0 for r in results), launcher.report(results)
    log = re.sub(r"\x1b\[[0-9;]*m", "", results[0].stdout + results[0].stderr)
    assert "runs op by op in eager mode instead" not in log, "a compiled graph fell back to eager"
    return [float(loss) for loss in re.findall(r"step:\s*\d+\s+loss:\s*([0-9.]+)", log)]


def write_seed_checkpoint(tokenizer: str, data: str, folder, model: str) -> str:
    """A step-0 checkpoint of ``model``'s debug flavor, initialised on the CPU: its path."""
    run([REFERENCE], 1, [*flags(tokenizer, data, folder, model=model), "--checkpoint.enable",
                         "--checkpoint.create_seed_checkpoint", "--training.steps", "1",
                         "--parallelism.data_parallel_shard_degree", "1"], env=ON_CPU)
    return str(folder / "checkpoint" / "step-0")


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """The assets and a step-0 checkpoint of the llama3 debug model."""
    folder = tmp_path_factory.mktemp("titan")
    tokenizer, data = write_assets(folder)
    return tokenizer, data, write_seed_checkpoint(tokenizer, data, folder / "seed", "llama3")


@pytest.fixture(scope="module")
def cpu_losses(seed, tmp_path_factory):
    """The CPU/gloo run's losses for a parameter dtype (each run once per module)."""
    tokenizer, data, checkpoint = seed
    runs = {}

    def losses(dtype: str, nprocs: int = 2, parallelism: tuple[str, ...] = ()) -> list[float]:
        key = (dtype, nprocs, parallelism)
        if key not in runs:
            dump = tmp_path_factory.mktemp("cpu")
            runs[key] = run([REFERENCE], nprocs, [*flags(tokenizer, data, dump), *same_run(dtype, checkpoint),
                                                  *parallelism], env=ON_CPU)
        return runs[key]

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


TENSOR_PARALLEL = ("--parallelism.tensor_parallel_degree", "2")


def test_tensor_parallel_on_two_processes_gives_the_losses_of_cpu_gloo(seed, cpu_losses, tmp_path):
    tokenizer, data, checkpoint = seed
    tpu = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path), *same_run("float32", checkpoint),
                                              *TENSOR_PARALLEL])
    assert tpu == pytest.approx(cpu_losses("float32", 2, TENSOR_PARALLEL), rel=1e-4)


@pytest.mark.slow
def test_fsdp_by_tensor_parallel_on_four_processes_gives_the_losses_of_cpu_gloo(seed, cpu_losses, tmp_path):
    """A 2-D mesh: FSDP over 2 rows, tensor parallel within each (4 processes: a minute here; ``-m slow``)."""
    tokenizer, data, checkpoint = seed
    two_d = (*TENSOR_PARALLEL, "--parallelism.data_parallel_shard_degree", "2")
    tpu = run(["-m", "torchtitan.train"], 4, [*flags(tokenizer, data, tmp_path), *same_run("float32", checkpoint),
                                              *two_d])
    assert tpu == pytest.approx(cpu_losses("float32", 4, two_d), rel=1e-4)


def test_a_run_killed_after_its_checkpoint_resumes_with_the_losses_of_an_uninterrupted_one(seed, tmp_path):
    """Checkpoints every 2 steps (DCP). A second run of the job is SIGKILLed, every rank at once, as
    soon as its step-2 checkpoint is complete; started again in the same folder, it resumes there:
    steps 3 and 4 (weights, optimizer, scheduler and data position restored) equal the uninterrupted
    run's."""
    tokenizer, data, checkpoint = seed
    four_steps = [*same_run("float32", checkpoint), "--training.steps", "4", "--checkpoint.interval", "2"]
    whole = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path / "whole"), *four_steps])
    assert len(whole) == 4
    job = ["-m", "torchtitan.train", *flags(tokenizer, data, tmp_path / "killed"), *four_steps]
    saved = tmp_path / "killed" / "checkpoint"
    crashed = launcher.launch(job, 2, timeout=TIMEOUT, kill_when=(saved / "step-2" / ".metadata").exists)
    assert all(r.killed for r in crashed), "the run ended before it could be killed:\n" + launcher.report(crashed)
    assert sorted(p.name for p in saved.iterdir()) == ["step-2"]
    resumed = run(job[:2], 2, job[2:])
    assert resumed == whole[2:]


def test_flex_attention_with_document_masks_gives_the_losses_of_pytorchs_own_implementation(seed, tmp_path):
    """The debugmodel_flex_attn flavor (flex attention, block-causal over the packed documents), whose
    attention TorchTitan compiles: lowered into the program by torchtpu, against PyTorch's own
    composite implementation of the op, run op by op on tpu with Dynamo off (the CPU has no flex
    attention backward to compare with)."""
    tokenizer, data, checkpoint = seed
    flex = "debugmodel_flex_attn"
    lowered = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path / "lowered", flex),
                                                  *same_run("float32", checkpoint)])
    composite = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path / "composite", flex),
                                                    *same_run("float32", checkpoint)],
                    env={"TORCHDYNAMO_DISABLE": "1"})
    assert len(lowered) == STEPS
    assert lowered == pytest.approx(composite, rel=1e-4)


@pytest.fixture(scope="module")
def deepseek(seed, tmp_path_factory):
    """A step-0 checkpoint of the deepseek_v3 debug model and the CPU/gloo FSDP run's losses from it."""
    tokenizer, data, _ = seed
    folder = tmp_path_factory.mktemp("deepseek")
    argv = same_run("float32", write_seed_checkpoint(tokenizer, data, folder / "seed", "deepseek_v3"))
    cpu = run([REFERENCE], 2, [*flags(tokenizer, data, folder / "cpu", model="deepseek_v3"), *argv], env=ON_CPU)
    assert len(cpu) == STEPS
    return argv, cpu


@pytest.mark.parametrize("parallelism", [(), ("--parallelism.expert_parallel_degree", "2")],
                         ids=["fsdp", "expert-parallel"])
def test_the_deepseek_v3_mixture_of_experts_gives_the_losses_of_cpu_gloo(seed, deepseek, tmp_path, parallelism):
    """TorchTitan's deepseek_v3 debug model (8 routed experts, top-3, 2 shared; multi-head latent
    attention) on 2 processes under FSDP2, and with its experts split over them (expert parallelism:
    tokens travel to their experts' rank by all_to_all)."""
    tokenizer, data, _ = seed
    argv, cpu = deepseek
    tpu = run(["-m", "torchtitan.train"], 2, [*flags(tokenizer, data, tmp_path, model="deepseek_v3"), *argv,
                                              *parallelism])
    assert tpu == pytest.approx(cpu, rel=1e-4)
