"""The c10d backend "tpu" across processes.

Each test starts a few worker processes (``launcher.py``, as torchrun would)
that run many checks against CPU math and report every failure; the test
fails with every rank's output.  A process costs seconds to start (torch,
jax, torchtpu), so each worker batches its checks.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

import torchtpu.distributed
from torchtpu.distributed import collectives

from . import launcher

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(launcher.REPO, "docs", "examples", "ddp_train.py")


def _passed(result: launcher.RankResult) -> int:
    match = re.search(r"\] (\d+) passed, 0 failed", result.stdout)
    assert match, f"rank {result.rank} printed no clean summary:\n{launcher.report([result])}"
    return int(match.group(1))


def test_the_backend_is_registered_at_import_and_registering_again_is_harmless():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu"
    assert "tpu" in dist.Backend.backend_list
    torchtpu.distributed.register()
    assert dist.Backend.backend_list.count("tpu") == 1


def test_a_one_process_world_runs_in_this_process():
    """World size 1 needs no jax.distributed, so it works even after tpu tensors exist."""
    torch.ones(1, device="tpu").cpu()  # JAX's backend is running now
    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(4.0, device="tpu")
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out = torch.zeros(4, device="tpu")
        dist.all_gather_into_tensor(out, t)
        dist.broadcast(t, src=0)
        assert torch.equal(out.cpu(), torch.arange(4.0)) and torch.equal(t.cpu(), torch.arange(4.0))
    finally:
        dist.destroy_process_group()


def test_a_world_of_several_processes_must_start_before_jax_does():
    """This process's JAX backend is running (other tests made tpu tensors): JAX's
    multi-process runtime can no longer start, and the creator says what to do."""
    torch.ones(1, device="tpu").cpu()
    with pytest.raises(RuntimeError, match="must come before this process creates tpu tensors"):
        dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=2)
    assert not dist.is_initialized()


@pytest.mark.parametrize("op,dtype,message", [
    ("avg", "int64", "AVG needs a floating-point"),
    ("premul_sum", "int32", "PREMUL_SUM needs a floating-point"),
    ("band", "float32", "BAND needs an integer or bool"),
    ("max", "complex64", "undefined for complex"),
])
def test_reduce_ops_a_dtype_does_not_allow_are_refused_before_tracing(op, dtype, message):
    with pytest.raises(RuntimeError, match=message):
        collectives.check_reduce_op("all_reduce", op, dtype)


def test_every_collective_and_reduce_op_on_two_ranks():
    """Every collective, reduce op and dtype; views; async work and futures; CPU tensors
    through gloo; functional collectives; subgroups; point to point; DDP against one
    CPU process."""
    results = launcher.run_ok([os.path.join(HERE, "worker_collectives.py")], nprocs=2, timeout=300)
    assert all(_passed(r) >= 149 for r in results), launcher.report(results)


def test_four_ranks_and_the_overlapping_groups_of_a_2d_device_mesh():
    results = launcher.run_ok([os.path.join(HERE, "worker_four.py")], nprocs=4, timeout=300)
    assert all(_passed(r) >= 29 for r in results), launcher.report(results)


def test_faults_fail_clearly_mismatch_reinit_and_a_dead_rank():
    """A shape mismatch names the collective; destroy + init again works; a rank that
    exits makes the survivor raise, at once for a known program and within the group's
    timeout (10 s) for a new one."""
    results = launcher.run_ok([os.path.join(HERE, "worker_faults.py")], nprocs=2, timeout=180)
    assert _passed(results[0]) == 11 and _passed(results[1]) == 7, launcher.report(results)
    assert "dead peer: new collective failed after" in results[0].stdout


@pytest.mark.parametrize("env", [{}, {"TORCHTPU_DEFER_AND_FUSE": "1"}, {"TORCHTPU_NATIVE": "0"}],
                         ids=["strict", "fused", "without-the-cpp-extension"])
def test_the_ddp_example_trains_and_keeps_replicas_identical(env):
    results = launcher.run_ok([EXAMPLE], nprocs=2, timeout=240, env=env)
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", results[0].stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 10, results[0].stdout
    assert "replicas identical: True" in results[0].stdout


def test_a_hung_rank_ends_the_job_through_the_watchdog_within_the_timeout():
    """Rank 1 stops before a collective it has run before (no store check then); rank 0's
    call would block in XLA for ever.  The watchdog ends rank 0, naming the collective."""
    results = launcher.launch([os.path.join(HERE, "worker_hang.py"), "8"], nprocs=2, timeout=120)
    survivor = results[0]
    assert survivor.returncode == 6, launcher.report(results)
    assert "torchtpu watchdog: all_reduce on process group" in survivor.stderr
    assert "the group's timeout is 8 s" in survivor.stderr
    assert "UNEXPECTED" not in survivor.stdout
    assert not any(r.killed for r in results), launcher.report(results)  # nobody needed the launcher's kill
