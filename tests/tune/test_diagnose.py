"""`torchtpu tune analyze`: each planted problem is found, at its line, with a fix; clean code has none."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.tools.tune import chips, diagnose

HERE = __file__


def _line_of(fn, marker: str) -> int:
    """The line of ``fn``'s source holding ``marker`` (a planted problem)."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def _found(report, kind, line=None):
    return [f for f in report.findings if f.kind == kind and f.file == HERE and (line is None or f.line == line)]


def test_findings_carry_the_json_fields_the_issue_names():
    x = torch.ones(8, 8, device="tpu")
    report = diagnose.analyze(lambda t: (t * 2).sum().item(), x, steps=2)
    for item in report.to_json():
        assert {"kind", "file", "line", "message", "estimated_cost_s"} <= set(item)
        assert item["kind"] in diagnose.KINDS
    assert json.loads(json.dumps(report.to_json()))


def test_host_sync_in_the_step_is_found_at_its_line():
    def step(x):
        y = (x * 2).sum()
        return y.item()  # planted: host sync

    report = diagnose.analyze(step, torch.ones(8, 8, device="tpu"), steps=3)
    found = _found(report, "host_sync", _line_of(step, "planted: host sync"))
    assert len(found) == 1 and found[0].count == 1 and "item" in found[0].message
    assert found[0].estimated_cost_s > 0


def test_eager_ops_outside_a_compiled_graph_are_found_with_the_fused_mode_fix():
    def step(x):
        return torch.relu(x @ x)  # planted: eager ops

    report = diagnose.analyze(step, torch.ones(8, 8, device="tpu"), steps=3)
    found = _found(report, "eager_op", _line_of(step, "planted: eager ops"))
    assert len(found) == 1 and found[0].count == 2  # mm and relu, per step
    assert found[0].fix == {"defer_and_fuse": True}


def test_fused_mode_ops_are_not_eager_findings():
    def step(x):
        return torch.relu(x @ x)  # fused: recorded into a graph

    with torch.tpu.eager_mode("fused"):
        report = diagnose.analyze(step, torch.ones(8, 8, device="tpu"), steps=2)
    assert not _found(report, "eager_op")


def test_graph_break_is_found_at_its_line():
    def fn(x):
        y = x * 2
        print("", end="")  # planted: graph break
        return y + 1

    compiled = torch.compile(fn, backend="tpu")
    report = diagnose.analyze(compiled, torch.ones(4, device="tpu"), steps=2)
    found = _found(report, "graph_break", _line_of(fn, "planted: graph break"))
    assert len(found) == 1 and "print" in found[0].message


def test_recompiles_are_found_with_their_reason():
    compiled = torch.compile(lambda x: (x * 3).sum(), backend="tpu", dynamic=False)
    sizes = iter([3, 4, 5, 6])
    report = diagnose.analyze(lambda: compiled(torch.ones(next(sizes), device="tpu")), steps=4)
    found = [f for f in report.findings if f.kind == "recompile"]
    assert sum(f.count for f in found) == 3  # Dynamo's, counted once (not again as torchtpu's)
    assert any("size mismatch" in f.message for f in found)
    assert not any(f.measured for f in found)  # every step after the first recompiled: no clean step to compare


def test_an_unmeasured_dynamo_recompile_costs_its_trace_as_well_as_its_compile(monkeypatch):
    """Every step recompiles: each is estimated as the run's mean XLA compile plus Dynamo's mean trace."""
    traces = []
    monkeypatch.setattr(diagnose, "_dynamo_traces", lambda: list(traces))
    analyzer = diagnose.Analyzer(chips.chip("v5e"))
    with diagnose.instrumented(analyzer):
        traces += [0.5, 0.25]  # Dynamo traced two frames during the run
    analyzer.compile_seconds = [0.1, 0.3]
    for step in (1, 2):
        analyzer.step = step
        analyzer._add("recompile", ("train.py", 7), "f recompiled: size mismatch", diagnose.DYNAMO_RETRACE)
    analyzer._add("recompile", ("train.py", 9), "torchtpu: g compiled again")  # a known graph, new shapes
    found = {f.line: f for f in diagnose._recompile_findings(analyzer, steps=2, step_seconds=[1.0, 1.0, 1.0])}
    assert found[7].estimated_cost_s == pytest.approx(2 * (0.2 + 0.375) / 2) and not found[7].measured
    assert found[9].estimated_cost_s == pytest.approx(0.2 / 2)


def test_a_recompile_among_clean_steps_is_costed_by_the_time_its_step_took():
    compiled = torch.compile(lambda x: (x * 3).sum(), backend="tpu", dynamic=False)
    sizes = iter([3, 3, 3, 4, 3, 3])  # step 3 compiles a program for a new shape
    report = diagnose.analyze(lambda: compiled(torch.ones(next(sizes), device="tpu")), steps=6)
    found = [f for f in report.findings if f.kind == "recompile"]
    assert len(found) == 1 and found[0].count == 1 and found[0].measured
    clean = [t for k, t in enumerate(report.step_seconds) if k not in (0, 3)]
    extra = report.step_seconds[3] - statistics.median(clean)
    assert found[0].estimated_cost_s == pytest.approx(max(extra, 0.0) / 6)


_lib = torch.library.Library("torchtpu_tune_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")


def test_cpu_fallback_is_found(monkeypatch):
    monkeypatch.setattr(torchtpu.config.current, "cpu_fallback", True)

    def step(x):
        return torch.ops.torchtpu_tune_test.twice(x)  # planted: cpu fallback

    with pytest.warns(UserWarning):
        report = diagnose.analyze(step, torch.ones(4, device="tpu"), steps=2)
    found = _found(report, "cpu_fallback", _line_of(step, "planted: cpu fallback"))
    assert len(found) == 1 and "twice" in found[0].message


@pytest.mark.parametrize("chip_name, tile", [("v5e", 128), ("v6e", 256)])
def test_misaligned_matmul_dims_are_found_against_the_chips_tile(chip_name, tile):
    w_bad = torch.randn(300, 100, dtype=torch.bfloat16, device="tpu")
    w_good = torch.randn(512, 256, dtype=torch.bfloat16, device="tpu")

    def step(x, y):
        F.linear(x, w_bad)  # planted: misaligned
        F.linear(y, w_good)

    x = torch.randn(16, 100, dtype=torch.bfloat16, device="tpu")
    y = torch.randn(16, 256, dtype=torch.bfloat16, device="tpu")
    report = diagnose.analyze(step, x, y, steps=2, chip=chip_name)
    found = _found(report, "misaligned_dim")
    assert [f.line for f in found] == [_line_of(step, "planted: misaligned")]
    assert f"k=100 -> {tile}" in found[0].message and f"n=300 -> {-(-300 // tile) * tile}" in found[0].message
    assert found[0].estimated_cost_s > 0
    assert not _found(report, "float32_matmul")  # bfloat16 products


def test_float32_matmul_in_a_compiled_graph_is_found_at_the_model_line():
    w = torch.randn(256, 256, device="tpu")

    def fn(x):
        return (x @ w).sum()  # planted: float32 matmul

    compiled = torch.compile(fn, backend="tpu")
    report = diagnose.analyze(compiled, torch.randn(128, 256, device="tpu"), steps=2)
    found = _found(report, "float32_matmul", _line_of(fn, "planted: float32 matmul"))
    assert len(found) == 1 and "autocast" in found[0].message and found[0].estimated_cost_s > 0
    assert found[0].fix == {"matmul_precision": "default"}  # a setting: `tune search` can try it
    with torch.tpu.precision("default"):  # one bfloat16 pass: nothing to gain
        report = diagnose.analyze(compiled, torch.randn(128, 256, device="tpu"), steps=1)
    assert not _found(report, "float32_matmul")


def test_padding_waste_above_the_limit_is_found():
    def step(x):
        torch.tpu.pad_to_bucket(x, 0)  # planted: 33 -> 64

    report = diagnose.analyze(step, torch.ones(33, 4, device="tpu"), steps=2)
    found = _found(report, "padding_waste", _line_of(step, "planted: 33 -> 64"))
    assert len(found) == 1 and "48%" in found[0].message
    report = diagnose.analyze(step, torch.ones(60, 4, device="tpu"), steps=2)
    assert not _found(report, "padding_waste")


def test_memory_beyond_the_chip_is_found(monkeypatch):
    small = chips.Chip("tiny", 1e12, 1e12, 0.0, 2**20, 1e11, 1e10, "2d-torus", 1e9, 4, 128, "a test chip")
    monkeypatch.setitem(chips.CHIPS, "tiny", small)
    keep = [torch.ones(1 << 20, device="tpu")]  # 4 MiB on a 1 MiB chip
    report = diagnose.analyze(lambda: keep[0] + 1, steps=1, chip="tiny")
    memory = [f for f in report.findings if f.kind == "memory"]
    assert len(memory) == 1 and "does not fit" in memory[0].message


def test_clean_compiled_bf16_step_has_no_compute_findings():
    w = torch.randn(256, 512, dtype=torch.bfloat16, device="tpu")
    compiled = torch.compile(lambda x: (x @ w).float().sum(), backend="tpu")
    report = diagnose.analyze(compiled, torch.randn(256, 256, dtype=torch.bfloat16, device="tpu"), steps=3)
    assert {f.kind for f in report.findings} <= {"eager_op"}  # the input's creation is outside the step
    assert not _found(report, "eager_op")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        diagnose.analyze(lambda: None, chip="v9")
    with pytest.raises(ValueError, match="steps must be at least 1"):
        diagnose.analyze(lambda: None, steps=0)


def test_the_command_prints_json_findings_of_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torchtpu
        assert sys.argv[1:] == ["--lr", "0.1"], sys.argv  # the script's own arguments reach it
        model = torch.nn.Linear(100, 300).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            loss = model(torch.randn(8, 100, device="tpu")).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            print("loss", loss.item())
    """))
    result = subprocess.run([sys.executable, "-m", "torchtpu", "tune", "analyze", "--steps", "3", "--json",
                             str(script), "--lr", "0.1"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    findings = json.loads(result.stdout)
    kinds = {(f["kind"], f["line"]) for f in findings if f["file"] == str(script)}
    assert ("host_sync", 11) in kinds and ("eager_op", 7) in kinds and ("misaligned_dim", 7) in kinds
    assert "loss" in result.stderr  # the script's own output, out of the JSON's way
    missing = subprocess.run([sys.executable, "-m", "torchtpu", "tune", "analyze", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no such file" in missing.stderr
