"""torch.compile(backend="tpu") of graphs with functional collectives: one XLA program per graph.

The multi-process checks run ``worker_compile.py`` once per world size (a
module fixture: starting JAX's runtime in each process is most of the cost)
and judge each scenario from its named checks.  The mesh planning is checked
here, in-process, on rank lists alone.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

import torchtpu  # noqa: F401
from torchtpu.distributed import compiled
from torchtpu.graph import fx

from .launcher import launch, report

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_compile.py")


@pytest.fixture(scope="module")
def two_ranks():
    return launch([WORKER], 2, timeout=180)


@pytest.fixture(scope="module")
def four_ranks():
    return launch([WORKER, "mesh2d"], 4, timeout=180)


def _judge(results, scenario: str) -> None:
    """Every rank finished ``scenario`` with no failed check."""
    failed = [r.rank for r in results if f"DONE {scenario} " not in r.stdout
              or re.search(rf"FAIL {re.escape(scenario)}\b", r.stdout)]
    if failed:
        raise AssertionError(f"scenario {scenario!r} failed on rank(s) {failed}:\n" + report(results))


def test_all_reduce_compiles_into_one_graph(two_ranks):
    """funcol.all_reduce(x * 2) and ops around it: one compiled graph, no fallback, no eager
    collective; equal to the closed-form CPU value; reused on the second call; fused mode too."""
    _judge(two_ranks, "all_reduce")


def test_gathers_scatters_and_coalesced_forms(two_ranks):
    """all_gather_tensor, reduce_scatter_tensor, all_to_all_single, broadcast and the
    _coalesced forms inside one graph; unequal all_to_all splits fall back, counted."""
    _judge(two_ranks, "gather_scatter")


def test_two_dim_device_mesh_on_two_ranks(two_ranks):
    """A collective per dim of (2, 1) and (1, 2) DeviceMeshes in one graph (a size-1 axis)."""
    _judge(two_ranks, "mesh2d")


def test_tensor_parallel_mlp(two_ranks):
    """ColwiseParallel/RowwiseParallel MLP: compiled forward and 2 training steps equal CPU."""
    _judge(two_ranks, "tp")
    timing = [line for line in two_ranks[0].stdout.splitlines() if line.startswith("TIMING tp")]
    print(*timing, sep="\n")


def test_ranks_whose_graphs_differ_in_operands_run_one_program(two_ranks):
    """A vocabulary-parallel embedding whose index range and scale are each rank's own numbers:
    one compiled graph, equal to CPU; graphs that differ in their ops raise on every rank."""
    _judge(two_ranks, "rank_numbers")


def test_fsdp2_training_steps(two_ranks):
    """fully_shard MLP under torch.compile: 2 SGD steps equal the CPU reference.  On torch
    2.13 FSDP2's hooks are dynamo-disabled, so its collectives run eagerly between the
    compiled graphs; the graphs hold the compute."""
    _judge(two_ranks, "fsdp")
    timing = [line for line in two_ranks[0].stdout.splitlines() if line.startswith("TIMING fsdp")]
    print(*timing, sep="\n")


def test_two_by_two_device_mesh(four_ranks):
    """4 processes, a 2x2 DeviceMesh: all_reduce down the columns and all_gather/reduce_scatter
    along the rows, in one graph: one program over two mesh axes."""
    _judge(four_ranks, "mesh2d")


# ---- in-process: the mesh a graph's groups make, the extension point, fsdp.copy_ ----------------


def test_groups_of_a_two_by_two_mesh_make_two_axes():
    rows, cols = ((0, 1), (2, 3)), ((0, 2), (1, 3))
    for rank in range(4):
        row, col = rows[rank // 2], cols[rank % 2]
        mesh = compiled.GraphMesh(tuple(sorted({row, col})), rank)
        assert mesh.ranks == (0, 1, 2, 3)
        assert [(name, n) for name, _, n in mesh.axes] == [("stride2", 2), ("stride1", 2)]
        assert mesh.axes_of[row] == ("stride1",) and mesh.axes_of[col] == ("stride2",)


def test_a_graph_on_one_row_spans_only_that_row():
    """TP groups alone: each row is its own mesh (its own program)."""
    assert compiled.GraphMesh(((2, 3),), 3).ranks == (2, 3)
    mesh = compiled.GraphMesh(((0, 4),), 4)  # dim 0 of a 2x4 mesh
    assert mesh.ranks == (0, 4) and mesh.axes_of[(0, 4)] == ("stride4",)


def test_one_group_is_a_mesh_of_its_own_ranks():
    """new_group([1, 2]) (no DeviceMesh dim): the mesh is the group."""
    for rank in (1, 2):
        mesh = compiled.GraphMesh(((1, 2),), rank)
        assert mesh.ranks == (1, 2) and mesh.axes_of[(1, 2)] == ("stride1",)
    assert compiled.GraphMesh(((1, 3, 5),), 5).ranks == (1, 3, 5)


def test_a_flattened_group_spans_the_axes_it_covers():
    world, tp = (0, 1, 2, 3), (0, 1)
    mesh = compiled.GraphMesh((world, tp), 0)
    assert mesh.axes_of[world] == ("stride2", "stride1") and mesh.axes_of[tp] == ("stride1",)
    mesh = compiled.GraphMesh(((0,), (0, 1)), 0)
    assert mesh.axes_of[(0,)] == ("one",) and mesh.size == 2


@pytest.mark.parametrize("groups, rank", [(((0, 2, 1),), 0), (((0, 1, 3),), 0), (((0, 1), (0, 3)), 0)])
def test_groups_that_are_no_mesh_axes_fall_back(groups, rank):
    with pytest.raises(fx.UnsupportedGraph):
        compiled.GraphMesh(groups, rank)


def test_the_handler_is_registered_by_the_package():
    compiled.register()
    assert compiled.registered()


def test_import_torchtpu_registers_the_handler(two_ranks):
    assert "handler registered by import torchtpu: True" in two_ranks[0].stdout, two_ranks[0].stdout[:500]


def test_wait_tensor_alone_is_a_local_graph():
    """A graph whose only functional-collective op is wait_tensor needs no mesh."""
    compiled.register()

    def fn(x):
        return torch.ops._c10d_functional.wait_tensor(x * 3) + 1

    before = sum(torch.tpu.metrics()["graph_fallbacks"].values())
    x = torch.arange(4.0)
    out = torch.compile(fn, backend="tpu")(x.to("tpu"))
    assert torch.equal(out.cpu(), x * 3 + 1)
    assert sum(torch.tpu.metrics()["graph_fallbacks"].values()) == before


def test_fsdp_copy_into_an_input_is_lowered():
    """torch.ops.fsdp.copy_ (FSDP2's copy into the unsharded parameter) writes its graph input."""
    import torch.distributed.fsdp  # noqa: F401  (defines torch.ops.fsdp.copy_)

    def fn(dst, src):
        torch.ops.fsdp.copy_(dst, src * 2)
        return dst + 1

    before = sum(torch.tpu.metrics()["graph_fallbacks"].values())
    dst, src = torch.zeros(3, device="tpu"), torch.arange(3.0, device="tpu")
    out = torch.compile(fn, backend="tpu")(dst, src)
    assert torch.equal(dst.cpu(), torch.tensor([0.0, 2.0, 4.0]))
    assert torch.equal(out.cpu(), torch.tensor([1.0, 3.0, 5.0]))
    assert sum(torch.tpu.metrics()["graph_fallbacks"].values()) == before
