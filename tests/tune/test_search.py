"""``torchtpu tune search``: the trial protocol, the loop's bookkeeping, the profile, and one planted problem.

Most trials here run tiny standard-library scripts that read the settings the
search gives them and report a step time they choose, so the loop's decisions
are checked without timing anything.  One test runs a torchtpu program with a
planted 0.2 s cost that only fused mode removes, and checks that the search
picked fused mode and that torchtpu loads the profile it wrote: the assertion
is about what was picked, not about a ratio of times.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import textwrap
import time

import pytest
import torch

from torchtpu import config
from torchtpu.eager import modes
from torchtpu.tools import cli
from torchtpu.tools.tune import search
from torchtpu.tools.tune.diagnose import Finding

PROGRAMS = pathlib.Path(__file__).parent / "programs"


# A script's view of its settings without importing torchtpu: its variable, else its profile's value.
PRELUDE = """import json, os, sys, time
def setting(name):
    if "TORCHTPU_" + name.upper() in os.environ:
        return os.environ["TORCHTPU_" + name.upper()]
    profile = json.load(open(os.environ["TORCHTPU_PROFILE"])) if os.environ.get("TORCHTPU_PROFILE") else {}
    value = profile.get("settings", {}).get(name)
    return None if value is None else {True: "1", False: "0"}.get(value, str(value))
"""


def _script(tmp_path, body: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return str(path)


# Reports 100 ms a step, 10 ms in fused mode.
FUSED_IS_FASTER = """
fused = setting("defer_and_fuse") == "1"
for _ in range(3):
    print("torchtpu-step-seconds:", 0.01 if fused else 0.1, file=sys.stderr)
"""


def _search(tmp_path, script, **kwargs):
    kwargs.setdefault("progress", False)
    kwargs.setdefault("timeout_s", 30)
    return search.search(script, out=str(tmp_path / "out"), **kwargs)


# ---- the protocol ----------------------------------------------------------------------------------


def test_steps_reports_each_step_and_the_log_reads_back():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        seen = list(search.steps(3))
    assert seen == [0, 1, 2]
    times = search.step_times("noise\n" + stderr.getvalue() + "torchtpu-step-seconds: nonsense\n")
    assert len(times) == 3 and all(t >= 0 for t in times)


def test_the_steady_step_time_leaves_out_the_first_step_once_there_are_three():
    assert search.steady_step_time([5.0, 1.0, 3.0]) == 2.0
    assert search.steady_step_time([5.0, 1.0]) == 3.0


# ---- the loop ------------------------------------------------------------------------------------


def test_search_finds_the_faster_setting_and_confirms_it_before_claiming(tmp_path):
    result = _search(tmp_path, _script(tmp_path, FUSED_IS_FASTER), max_trials=2, repeats=2)
    assert dict(result.best.candidate.settings) == {"defer_and_fuse": True}
    assert result.confirmed and result.speedup == pytest.approx(10.0)
    assert len(result.default_runs) == 3 and len(result.best_runs) == 3  # measured again, taking turns
    roles = [t.role for t in result.trials]
    assert roles == ["default", "space", "confirm-default", "confirm-best", "confirm-default", "confirm-best"]
    profile = json.loads(pathlib.Path(result.profile_path).read_text())
    assert profile["settings"] == {"defer_and_fuse": True} and profile["speedup"] == pytest.approx(10.0)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "10.00x" in report and "step lines" in report
    assert (tmp_path / "out" / "trials.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["confirmed"] is True


def test_a_lead_that_does_not_hold_up_is_not_claimed(tmp_path):
    """Fast only on its first run: the repeats catch it, no speed-up is reported and the profile keeps the default."""
    marker = tmp_path / "ran-fused-once"
    script = _script(tmp_path, f"""
    fast = setting("defer_and_fuse") == "1" and not os.path.exists({str(marker)!r})
    if fast:
        open({str(marker)!r}, "w").close()
    print("torchtpu-step-seconds:", 0.01 if fast else 0.1, file=sys.stderr)
    """)
    result = _search(tmp_path, script, max_trials=2, repeats=2)
    assert result.best.candidate.settings == (("defer_and_fuse", True),)
    assert not result.confirmed and result.speedup is None
    profile = json.loads(pathlib.Path(result.profile_path).read_text())
    assert profile["settings"] == {} and profile["speedup"] is None
    assert "No speed-up claimed" in (tmp_path / "out" / "report.md").read_text()


def test_a_crash_and_a_timeout_are_recorded_and_the_search_goes_on(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = _script(tmp_path, f"""
    size = setting("max_fused_ops")
    if size == "100":
        raise SystemExit("planted crash")
    if size == "2000":  # hang, with a child of its own that must die too
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(120)
    print("torchtpu-step-seconds:", 0.1 if size is None else 0.01, file=sys.stderr)
    """)
    space = [search.Dimension("max_fused_ops", (100, 2000, 7), True)]
    started = time.monotonic()
    result = _search(tmp_path, script, space=space, timeout_s=3, repeats=1)
    assert time.monotonic() - started < 60
    statuses = {dict(t.candidate.settings).get("max_fused_ops"): t.status for t in result.trials if t.role == "space"}
    assert statuses == {100: "crashed", 2000: "timeout", 7: "ok"}
    assert "planted crash" in next(t.detail for t in result.trials if t.status == "crashed")
    assert dict(result.best.candidate.settings) == {"max_fused_ops": 7} and result.confirmed
    grandchild = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed with its process group
        for _ in range(50):
            os.kill(grandchild, 0)
            time.sleep(0.1)


def test_a_worker_left_behind_by_a_trial_is_stopped(tmp_path):
    pid_file = tmp_path / "worker.pid"
    script = _script(tmp_path, f"""
    import subprocess
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open({str(pid_file)!r}, "w").write(str(worker.pid))
    print("torchtpu-step-seconds: 0.1", file=sys.stderr)
    """)
    result = _search(tmp_path, script, space=[])
    assert [t.status for t in result.trials] == ["ok"]
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(int(pid_file.read_text()), 0)
            time.sleep(0.1)


def test_a_default_that_crashes_stops_the_search_with_a_report(tmp_path):
    result = _search(tmp_path, _script(tmp_path, "raise SystemExit(3)\n"))
    assert [t.status for t in result.trials] == ["crashed"] and result.speedup is None
    assert "no search" in (tmp_path / "out" / "report.md").read_text()


def test_script_arguments_from_a_grid_and_their_default(tmp_path):
    script = _script(tmp_path, """
    batch = int(sys.argv[-1].removeprefix("--batch="))
    print("torchtpu-step-seconds:", 1.0 / batch, file=sys.stderr)
    """)
    result = _search(tmp_path, script, space=[], vary={"batch": ["1", "4"]}, repeats=1)
    assert result.default.candidate.argv() == ["--batch=1"]  # the first value is the default's
    assert result.best.candidate.argv() == ["--batch=4"] and result.confirmed
    assert json.loads(pathlib.Path(result.profile_path).read_text())["script_args"] == ["--batch=4"]


def test_a_bare_flag_is_tried_absent_and_present(tmp_path):
    assert search.parse_grid(["compile", "batch=1,4"], flags=True) == {"compile": [False, True], "batch": ["1", "4"]}
    with pytest.raises(SystemExit, match="NAME=A,B"):
        search.parse_grid(["max_fused_ops"])  # a setting needs its values
    script = _script(tmp_path, """
    print("torchtpu-step-seconds:", 0.05 if "--compile" in sys.argv else 0.1, file=sys.stderr)
    """)
    result = _search(tmp_path, script, space=[], vary={"compile": [False, True]}, repeats=1)
    assert result.default.candidate.argv() == [] and result.best.candidate.argv() == ["--compile"]
    assert result.confirmed


def test_an_option_that_loses_on_top_of_the_leader_is_tried_alone(tmp_path):
    """Fused mode leads (90 ms); compile on top of it is slower (120 ms), compile alone the fastest (50 ms)."""
    script = _script(tmp_path, """
    fused, compiled = setting("defer_and_fuse") == "1", "--compile=1" in sys.argv
    seconds = {(False, False): 0.1, (True, False): 0.09, (True, True): 0.12, (False, True): 0.05}[(fused, compiled)]
    print("torchtpu-step-seconds:", seconds, file=sys.stderr)
    """)
    space = [search.Dimension("defer_and_fuse", (True,), True)]
    result = _search(tmp_path, script, space=space, vary={"compile": ["0", "1"]}, repeats=1)
    assert result.best.candidate.argv() == ["--compile=1"] and not dict(result.best.candidate.settings)
    assert result.confirmed


def test_findings_fixes_go_first_and_keys_that_are_no_setting_are_noted(tmp_path):
    findings = [
        Finding("eager_op", "train.py", 3, "many small ops", 0.001, count=1, fix={"TORCHTPU_DEFER_AND_FUSE": "1"}),
        Finding("recompile", "train.py", 9, "shapes vary", 0.5, count=2, fix={"buckets": "8,16"}),
        Finding("graph_break", "train.py", 5, "graph too small", 0.01, fix={"max_fused_ops": 2000}),
    ]
    proposals, notes = search.proposals_from_findings(findings)
    assert [p.settings for p in proposals] == [{"max_fused_ops": 2000}, {"defer_and_fuse": True}]
    assert any("buckets" in note for note in notes)
    result = _search(tmp_path, _script(tmp_path, FUSED_IS_FASTER), findings=[f.to_json() for f in findings],
                     space=[], repeats=1)
    assert [t.role for t in result.trials][:3] == ["default", "finding", "finding"]
    assert dict(result.best.candidate.settings) == {"defer_and_fuse": True}


def test_without_step_lines_the_wall_time_less_start_up_is_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "STARTUP_CODE", "pass")  # the scripts here do not import torchtpu
    script = _script(tmp_path, 'time.sleep(0.05 if setting("defer_and_fuse") == "1" else 1.0)\n')
    result = _search(tmp_path, script, space=[search.Dimension("defer_and_fuse", (True,), True)], repeats=1)
    assert result.default.measured_by == "wall time less start-up" and result.startup_s > 0
    assert dict(result.best.candidate.settings) == {"defer_and_fuse": True}
    assert "wall time less start-up" in (tmp_path / "out" / "report.md").read_text()


def test_the_progress_line_shows_the_best_so_far():
    default = search.Trial(0, search.Candidate(), "default", "", status="ok", step_s=0.1)
    best = search.Trial(1, search.Candidate.of({"defer_and_fuse": True}, {}), "space", "", status="ok", step_s=0.05)
    failed = search.Trial(2, search.Candidate(), "space", "", status="timeout")
    line = search.render_progress(3, 6, best, failed, default, width=10)
    assert line.startswith("[#####-----] 3/~6") and "defer_and_fuse=1" in line and "2.00x" in line
    assert line.endswith("last #2: timeout")


def test_the_command_passes_what_follows_the_script_to_it(tmp_path):
    script = _script(tmp_path, """
    assert sys.argv[1:3] == ["--steps", "3"], sys.argv
    print("torchtpu-step-seconds: 0.1", file=sys.stderr)
    """)
    code = cli.main(["tune", "search", "--quiet", "--no-default-space", "--no-analyze", "--out", str(tmp_path / "o"),
                     script, "--steps", "3"])
    assert code == 0
    assert [t["status"] for t in json.loads((tmp_path / "o" / "report.json").read_text())["trials"]] == ["ok"]


# ---- the profile ---------------------------------------------------------------------------------


def test_a_profile_sets_settings_and_the_environment_wins(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"settings": {"defer_and_fuse": True, "max_fused_ops": "64", "cache_dir": None}}))
    settings = config.from_environ({"TORCHTPU_PROFILE": str(path)})
    assert settings.defer_and_fuse is True and settings.max_fused_ops == 64 and settings.profile == str(path)
    assert config.from_environ({"TORCHTPU_PROFILE": str(path), "TPU_MAX_FUSED_OPS": "5"}).max_fused_ops == 5
    assert config.from_environ({"TORCHTPU_PROFILE": ""}) == config.Config()


@pytest.mark.parametrize("content,message", [
    ({"settings": {"max_fused_ops": True}}, "expected int"),
    ({"settings": {"max_fused_op": 3}}, "not a setting"),
    ({"settings": {"profile": "other.json"}}, "not a setting"),
    ({"max_fused_ops": 3}, "expected an object"),
    ({"settings": {"max_fused_ops": 0}}, "positive integer"),
])
def test_a_bad_profile_names_the_file(tmp_path, content, message):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message) as error:
        config.from_environ({"TORCHTPU_PROFILE": str(path)})
    assert "TORCHTPU_PROFILE" in str(error.value)
    with pytest.raises(ValueError, match="TORCHTPU_PROFILE"):
        config.from_environ({"TORCHTPU_PROFILE": str(tmp_path / "missing.json")})


def test_a_child_environment_carries_settings_and_drops_what_it_is_told():
    environment = config.environment_for_child({"defer_and_fuse": True, "cache_dir": None},
                                               remove=("TORCHTPU_PROFILE",))
    assert environment["TORCHTPU_DEFER_AND_FUSE"] == "1" and environment["TORCHTPU_CACHE_DIR"] == ""
    assert "TORCHTPU_PROFILE" not in environment
    assert config.from_environ(environment).defer_and_fuse is True
    with pytest.raises(AttributeError):
        config.environment_for_child({"no_such_setting": 1})


# ---- a planted problem in a torchtpu program -----------------------------------------------------


def test_search_removes_a_planted_cost_and_torchtpu_loads_the_profile(tmp_path):
    """0.2 s a step unless fused: the search must pick fused mode, and the best's repeats, which load its profile
    at import (TORCHTPU_PROFILE), must run without the planted cost."""
    space = [search.Dimension("defer_and_fuse", (True,), True)]
    result = _search(tmp_path, str(PROGRAMS / "slow_unless_fused.py"), space=space, repeats=1, timeout_s=90)
    assert [t.status for t in result.trials] == ["ok"] * 4, [t.detail for t in result.trials]
    assert dict(result.best.candidate.settings) == {"defer_and_fuse": True} and result.confirmed
    from_profile = [t for t in result.trials if t.role == "confirm-best"]
    assert from_profile and all(t.profile and t.step_s < 0.2 for t in from_profile)  # the planted sleep, gone
    assert min(result.default_runs) >= 0.2
    settings = config.from_environ({"TORCHTPU_PROFILE": result.profile_path})
    assert modes.mode_from_config(settings) == torch.tpu.EagerMode.DEFER_AND_FUSE


def test_the_command_analyzes_the_script_first_and_tries_its_fixes(tmp_path, capsys):
    """No search space but the diagnosis: the eager ops `tune analyze` finds carry the fused-mode fix,
    which removes the planted cost."""
    out = tmp_path / "out"
    code = cli.main(["tune", "search", "--quiet", "--no-default-space", "--repeats", "1", "--timeout", "120",
                     "--out", str(out), str(PROGRAMS / "slow_unless_fused.py")])
    assert code == 0
    findings = json.loads((out / "findings.json").read_text())
    assert any(f["kind"] == "eager_op" and f["fix"] == {"defer_and_fuse": True} for f in findings)
    report = json.loads((out / "report.json").read_text())
    assert [t["role"] for t in report["trials"]][:2] == ["default", "finding"]
    assert json.loads((out / "profile.json").read_text())["settings"]["defer_and_fuse"] is True


def test_a_trial_measured_another_way_than_the_default_is_not_compared(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "STARTUP_CODE", "pass")
    script = _script(tmp_path, """
    if setting("defer_and_fuse") != "1":  # only the default reports its steps
        print("torchtpu-step-seconds: 0.5", file=sys.stderr)
    """)
    result = _search(tmp_path, script, space=[search.Dimension("defer_and_fuse", (True,), True)])
    assert [t.status for t in result.trials] == ["ok", "incomparable"]
    assert result.best is result.default and result.speedup is None
