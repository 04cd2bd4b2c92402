"""PyTorch's parallel stack unchanged on tpu: FSDP2, DTensor, tensor parallel, a 2-D mesh, DCP.

Each test launches worker_parallel.py (see it for the checks); every rank
compares with one CPU process training the same model on the whole batch.
"""

from __future__ import annotations

import re

from . import launcher

WORKER = "tests/distributed/worker_parallel.py"


def _all_passed(results, at_least: int) -> None:
    for r in results:
        match = re.search(r"\] (\d+) passed, 0 failed", r.stdout)
        assert match and int(match.group(1)) >= at_least, launcher.report([r])


def test_fsdp2_dtensor_tensor_parallel_and_checkpoints_on_two_processes(tmp_path):
    results = launcher.run_ok([WORKER, str(tmp_path / "ckpt")], nprocs=2, timeout=300)
    _all_passed(results, at_least=30)


def test_fsdp_times_tensor_parallel_on_a_two_by_two_mesh():
    results = launcher.run_ok([WORKER, "unused"], nprocs=4, timeout=300)
    _all_passed(results, at_least=6)


def test_a_killed_job_resumes_from_its_checkpoint_with_the_same_losses(tmp_path):
    directory = str(tmp_path / "ckpt")
    killed = launcher.launch([WORKER, directory, "save-then-die"], nprocs=2, timeout=300)
    assert [r.returncode for r in killed] == [-9, -9], launcher.report(killed)
    assert all("saved" in r.stdout for r in killed)
    resumed = launcher.run_ok([WORKER, directory, "resume"], nprocs=2, timeout=300)
    _all_passed(resumed, at_least=6)


def test_the_fsdp2_example_trains_shards_and_saves(tmp_path):
    results = launcher.run_ok(["docs/examples/fsdp2_train.py", str(tmp_path / "ckpt")], nprocs=2, timeout=240)
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", results[0].stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 5, results[0].stdout
    for r in results:
        assert f"rank {r.rank} holds 16 of 32 values on tpu:{r.rank}" in r.stdout, r.stdout
    assert (tmp_path / "ckpt" / ".metadata").exists()
