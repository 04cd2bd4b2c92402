"""torchtpu tune plan: model sizes, memory accounting, the communication formulas, the search and the CLI.

Pure arithmetic and a small search: no device work, no processes (bench/tune_comm.py measures the
communication model against real collectives).  No timing assertions.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import pathlib

import pytest

from torchtpu.tools import cli
from torchtpu.tools.tune import chips, plan, plan_comm, plan_cost, plan_launch, plan_model, plan_search

TINY = plan_model.BUILTIN["tiny"]  # layers 4, hidden 256, heads 8 (head_dim 32), kv 4, MLP 768, vocab 4096, tied


def test_tiny_parameter_count_by_hand():
    attention = 2 * 256 * 256 + 2 * 256 * 128 + 2 * 256  # q and o, k and v, two norms
    mlp = 3 * 256 * 768
    embedding = 4096 * 256 + 256  # tied: one matrix, plus the final norm
    assert TINY.params() == 4 * (attention + mlp) + embedding == TINY.active_params()


def test_qwen3_235b_has_235b_parameters_22b_active():
    qwen = plan_model.load("qwen3-235b-a22b")
    assert round(qwen.params() / 1e9) == 235
    assert round(qwen.active_params() / 1e9) == 22


def test_memory_accounting_matches_hand_computation():
    work = plan_cost.Workload(TINY, chips.chip("v5e"), chips=2, global_batch=2, seq=128)
    memory = plan_cost.memory(work, plan_cost.Layout(fsdp=2, micro_batch=1, ac="none"))
    shard = TINY.params() / 2
    assert memory["params"] == shard * 4 and memory["grads"] == shard * 4 and memory["optimizer"] == shard * 8
    assert memory["gathered"] == (2 * 2 + 4) * TINY.params() / 4  # two bf16 layers and one fp32 gradient
    per_token_layer = (2 * 256 + 256 + 2 * 128 + 2 * 256) + (256 + 3 * 768)  # attention + MLP tensors kept
    logits = 128 * 4096 * 10
    assert memory["activations"] == 4 * 128 * per_token_layer * 2 + logits


def test_checkpointing_and_tensor_parallelism_shrink_activations():
    work = plan_cost.Workload(TINY, chips.chip("v5e"), chips=2, global_batch=2, seq=128)
    acts = {ac: plan_cost.activation_bytes(work, plan_cost.Layout(fsdp=2, ac=ac)) for ac in plan_cost.AC_MODES}
    assert acts["full"] < acts["selective"] < acts["none"]
    assert plan_cost.activation_bytes(work, plan_cost.Layout(tp=2, ac="none")) == pytest.approx(acts["none"] / 2)


def test_ring_formulas():
    assert plan_comm.bytes_moved("all_reduce", 4, 100.0) == 150.0  # 2(n-1)/n S
    assert plan_comm.bytes_moved("all_gather", 4, 100.0) == 75.0  # (n-1)/n S
    assert plan_comm.bytes_moved("reduce_scatter", 4, 100.0) == 75.0
    assert plan_comm.bytes_moved("all_to_all", 1, 100.0) == 0.0
    host = chips.calibrated_host(latency=1e-3, bandwidth=1e9, cores=4)  # latency per call, none per ring step
    assert plan_comm.flat_time("all_reduce", 1e9, 4, host) == pytest.approx(1e-3 + 1.5)  # alpha + 2(n-1)/n S/B
    assert plan_comm.flat_time("all_gather", 1e9, 4, host) == pytest.approx(1e-3 + 0.75)
    crowded = chips.calibrated_host(latency=1e-3, bandwidth=1e9, cores=2)  # 4 processes queue on 2 cores
    assert plan_comm.flat_time("all_gather", 1e9, 4, crowded) == pytest.approx(2e-3 + 0.75)
    v5p = chips.chip("v5p")  # a TPU: latency per ring step, a ring over 8 chips along one of 3 torus dimensions
    expected = 7 * v5p.ici_latency + 7 / 8 * 1e9 / (v5p.ici_bandwidth / 3)
    assert plan_comm.ici_time("all_gather", 1e9, (8,), v5p) == pytest.approx(expected)


def test_torus_mapping_and_dcn():
    assert plan_comm.torus_shape(8192, 3) == (16, 16, 32)
    assert plan_comm.span(1, 16, 64, (4, 4, 4)).ici_extents == (4, 4)  # spans two dimensions
    assert plan_comm.span(4, 4, 64, (4, 4, 4)).ici_extents == (4,)
    crossing = plan_comm.span(8, 4, 16, (4, 4))  # 2 of the 4 inside the 16-chip slice, then 2 slices
    assert crossing.ici_extents == (2,) and crossing.dcn_size == 2
    v7x = chips.chip("v7x")
    one_dim = plan_comm.ici_time("all_gather", 1e9, (16,), v7x)
    three_dims = plan_comm.ici_time("all_gather", 1e9, (4, 2, 2), v7x)
    assert three_dims < one_dim  # more dimensions, more links
    ici, dcn = plan_comm.collective_time("all_reduce", 1e9, crossing, v7x)
    assert dcn == pytest.approx(2 * v7x.dcn_latency + 1e9 / 2 / v7x.dcn_bandwidth)  # on the 1/2 left after ICI


def test_a_plan_that_does_not_fit_is_rejected_with_the_reason():
    work = plan_cost.Workload(plan_model.load("qwen3-235b-a22b"), chips.chip("v5e"), 8, 8, 4096)
    estimate = plan_cost.estimate(work, plan_cost.Layout(fsdp=8, ep=8, ac="full"))
    assert not estimate.fits
    assert estimate.rejected.startswith("out of memory") and "GiB" in estimate.rejected
    result = plan.plan("qwen3-235b-a22b", "v5e:8", batch=8, seq=4096)
    assert result.best is None and result.rejected["out of memory"] > 0


def test_structural_problems_are_named():
    work = plan_cost.Workload(TINY, chips.chip("v5e"), 16, 16, 128)
    assert "8 heads do not split over tp=16" in plan_cost.estimate(work, plan_cost.Layout(tp=16)).rejected
    work = plan_cost.Workload(TINY, chips.chip("v5e"), 8, 8, 128)
    assert "axes multiply" in plan_cost.estimate(work, plan_cost.Layout(fsdp=4)).rejected
    assert "dense model" in plan_cost.estimate(work, plan_cost.Layout(fsdp=8, ep=2)).rejected


def test_ranking_prefers_higher_mfu():
    layout = plan_cost.Layout()
    low = plan_cost.Estimate(layout, {"a": 1.0}, 10.0, mfu=0.2)
    high = plan_cost.Estimate(layout, {"a": 5.0}, 10.0, mfu=0.4)
    broken = plan_cost.Estimate(layout, {}, 10.0, mfu=0.9, rejected="out of memory")
    assert plan_search.rank([low, broken, high]) == [high, low]
    result = plan_search.search(plan_cost.Workload(TINY, chips.chip("v5e"), 8, 16, 512))
    mfus = [e.mfu for e in result.ranked]
    assert mfus and mfus == sorted(mfus, reverse=True)
    assert 0 < result.best.mfu <= 1


def test_more_chips_more_throughput_in_the_scaling_curve():
    work = plan_cost.Workload(plan_model.load("llama3-8b"), chips.chip("v5p"), 16, 16, 4096)
    rows = plan_search.scaling_curve(work)
    assert [r["chips"] for r in rows] == [1, 2, 4, 8, 16]
    fitted = [r for r in rows if r["plan"]]
    assert fitted[-1]["tokens_per_s"] > fitted[0]["tokens_per_s"]
    assert all(0 < r["efficiency"] <= 1.5 for r in fitted)


def test_cli_prints_a_table_and_writes_the_png(tmp_path, capsys):
    png = tmp_path / "scaling.png"
    code = cli.main(["tune", "plan", "--model", "tiny", "--chips", "v5e:8", "--batch", "16", "--seq", "512",
                     "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "MFU" in out and "tokens/s" in out and "--parallelism.data_parallel_shard_degree" in out
    assert "scaling" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_json_parses(tmp_path, capsys):
    code = cli.main(["tune", "plan", "--model", "tiny", "--chips", "v5e:4", "--batch", "8", "--seq", "256",
                     "--json", "--plot", str(tmp_path / "p.png")])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["plans"][0]["mfu"] > 0 and document["launch"]["torchtitan_flags"]
    assert [row["chips"] for row in document["scaling"]] == [1, 2, 4]


def test_bad_chip_spec_is_a_clear_error(capsys):
    assert cli.main(["tune", "plan", "--model", "tiny", "--chips", "v9:8", "--no-scaling"]) == 2
    assert "unknown TPU generation 'v9'" in capsys.readouterr().err
    assert cli.main(["tune", "plan", "--model", "tiny", "--chips", "v5e", "--no-scaling"]) == 2
    assert "GENERATION:COUNT" in capsys.readouterr().err


def test_model_config_missing_fields_is_a_clear_error(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}))
    assert cli.main(["tune", "plan", "--model", str(config), "--chips", "v5e:4", "--no-scaling"]) == 2
    err = capsys.readouterr().err
    assert "lacks" in err and "hidden_size" in err and "intermediate_size" in err


def test_hf_config_from_the_local_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "models--acme--moe-mini" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 1000}))
    (tmp_path / "models--acme--moe-mini" / "refs").mkdir()
    (tmp_path / "models--acme--moe-mini" / "refs" / "main").write_text("abc123")  # as the hub client leaves it
    hub_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    spec = plan_model.load("acme/moe-mini")
    assert (spec.experts, spec.active_experts, spec.moe_intermediate, spec.head_dim) == (8, 2, 32, 16)
    with pytest.raises(plan_model.ModelConfigError, match="never downloads"):
        plan_model.load("acme/not-cached")


def _titan_fields() -> dict[str, set[str]]:
    """TorchTitan's JobConfig sections and their fields, read from its source without importing it."""
    spec = importlib.util.find_spec("torchtitan")
    source = pathlib.Path(spec.origin).parent / "config" / "job_config.py"
    tree = ast.parse(source.read_text())
    classes = {node.name: {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
               for node in tree.body if isinstance(node, ast.ClassDef)}
    job = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "JobConfig")
    return {s.target.id: classes.get(getattr(s.annotation, "id", ""), set())
            for s in job.body if isinstance(s, ast.AnnAssign)}


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
def test_launch_flags_exist_in_torchtitan():
    work = plan_cost.Workload(plan_model.load("qwen3-30b-a3b"), chips.chip("v5p"), 64, 256, 4096)
    layout = plan_cost.Layout(dp=2, fsdp=4, cp=2, tp=2, pp=2, ep=4, micro_batch=1, ac="selective")
    fields = _titan_fields()
    for flag in plan_launch.titan_flags(work, layout):
        section, _, field = flag.split()[0].removeprefix("--").partition(".")
        assert field in fields[section], flag
    launch = plan_launch.settings(work, layout)
    assert "--nproc_per_node=4" in launch["torchrun"] and "--model.name qwen3" in launch["torchrun"]


def test_every_chip_cites_its_page():
    for entry in chips.CHIPS.values():
        assert entry.source.startswith("https://cloud.google.com/tpu/docs/")
        assert dataclasses.asdict(entry)["ici_bandwidth"] > 0


def test_data_parallelism_across_slices_goes_over_dcn():
    work = plan_cost.Workload(plan_model.load("llama3-8b"), chips.chip("v5e"), 512, 512, 2048, slice_chips=256)
    estimate = plan_cost.estimate(work, plan_cost.Layout(dp=2, fsdp=256, ac="full"))
    assert estimate.fits, estimate.rejected
    by_axis = {c.axis: c for c in estimate.collectives}
    assert by_axis["dp"].dcn_s > 0 and by_axis["fsdp"].dcn_s == 0  # fsdp stays inside a slice
    assert "across slices" in plan_cost.estimate(work, plan_cost.Layout(cp=16, tp=32)).rejected


def test_pipeline_bubble_follows_1f1b():
    work = plan_cost.Workload(TINY, chips.chip("v5e"), 4, 16, 256)
    estimate = plan_cost.estimate(work, plan_cost.Layout(fsdp=2, pp=2, micro_batch=2))  # 8 / 2 = 4 micro-batches
    assert estimate.fits
    busy = estimate.compute_s + estimate.exposed_comm_s
    assert estimate.bubble_s == pytest.approx(busy * (2 - 1) / 4)
    assert any(c.axis == "pp" for c in estimate.collectives)


def test_the_host_pseudo_chip_plans_too():
    result = plan.plan("tiny", "host:2", batch=2, seq=128)
    assert result.best is not None and result.work.chip.name == "host"
