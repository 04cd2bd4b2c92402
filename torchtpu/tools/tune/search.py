"""``torchtpu tune search script.py``: try settings in subprocesses, measure each, keep the best as a profile.

The loop starts from the script as given (the *default*), tries the fixes
that ``torchtpu tune analyze`` proposed (its ``Finding.fix``), then walks the
candidate space one dimension at a time (eager mode, fused graph size, the
user's ``--setting`` and ``--vary`` grids), each move applied on top of the
best configuration so far.  Every trial is a fresh ``python script.py`` with
the settings in its environment, bounded in time; a trial that crashes or runs
out of time is recorded as such and the loop goes on.  At the end the default
and the best run again, taking turns, and a speed-up is claimed only when
every run of the best beat every run of the default.

Trial protocol: the script reports each step's time on a line
``torchtpu-step-seconds: <float>``; ``steps(n)`` does that for a loop.  A
script that reports nothing is measured by its wall time less the start-up
time of ``python -c "import torchtpu"``, and the report says so.

Only the standard library is imported at the top: ``torchtpu tune --help``
must stay cheap, and ``steps`` must not import torch into a script that has
not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

STEP_MARK = "torchtpu-step-seconds:"
DEFAULT_SPACE = (  # (setting, values, only when these settings hold): the dimensions tried unless told otherwise
    ("launch_blocking", (False,), {}),  # only moves anything when the environment turned debug mode on
    ("defer_and_fuse", (False, True), {}),
    ("max_fused_ops", (100, 2000), {"defer_and_fuse": True}),
)
STARTUP_CODE = "import torchtpu"


# ---- inside the script being tuned ----------------------------------------------------------------


def report_step(seconds: float) -> None:
    """Tell ``torchtpu tune search`` one step's time (stderr, unbuffered, so a killed trial keeps its lines)."""
    print(f"{STEP_MARK} {seconds:.9f}", file=sys.stderr, flush=True)


def steps(n: int):
    """``for step in steps(n):`` runs n steps and reports the time of each, waiting for the device at its end."""
    wait_for_device = _device_wait()
    for index in range(n):
        start = time.perf_counter()
        yield index
        wait_for_device()
        report_step(time.perf_counter() - start)


def _device_wait():
    if "torchtpu" not in sys.modules:  # the script does not use the device: nothing to wait for
        return lambda: None
    import torch

    return torch.tpu.synchronize


# ---- candidates and trials ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration: torchtpu settings (by name) and script arguments (``--name=value``)."""

    settings: tuple = ()  # sorted (name, value) pairs
    args: tuple = ()

    @staticmethod
    def of(settings: dict, args: dict) -> Candidate:
        return Candidate(tuple(sorted(settings.items())), tuple(sorted(args.items())))

    def with_changes(self, settings: dict = None, args: dict = None) -> Candidate:
        return Candidate.of({**dict(self.settings), **(settings or {})}, {**dict(self.args), **(args or {})})

    def argv(self) -> list:
        """The script arguments: ``--NAME=VALUE``; a bare flag (``--vary NAME``) is ``--NAME`` when on, absent when off."""
        return [f"--{name}" if value is True else f"--{name}={value}"
                for name, value in self.args if value is not False]

    def label(self) -> str:
        parts = [f"{name}={_text(value)}" for name, value in self.settings] + self.argv()
        return " ".join(parts) or "(as given)"


def _text(value) -> str:
    return {True: "1", False: "0"}.get(value, str(value)) if isinstance(value, bool) else str(value)


@dataclasses.dataclass
class Trial:
    """One run of the script and what it measured."""

    index: int
    candidate: Candidate
    role: str  # default, finding, space, confirm-default, confirm-best
    reason: str  # why this candidate was tried
    status: str = "pending"  # ok, crashed, timeout, incomparable (measured another way than the default)
    step_s: float | None = None  # the measure compared: median step time, or wall time less start-up
    measured_by: str = ""  # "step lines" or "wall time less start-up"
    wall_s: float = 0.0
    steps_reported: int = 0
    detail: str = ""  # the exit status, or the tail of the log of a failure
    log: str = ""
    profile: str = ""  # set: the settings came from this profile file (TORCHTPU_PROFILE), not from variables

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["candidate"] = {"settings": dict(self.candidate.settings), "args": dict(self.candidate.args),
                             "label": self.candidate.label()}
        return data


@dataclasses.dataclass
class Dimension:
    """Values to try for one setting or script argument, only where ``when`` holds of the candidate's settings."""

    name: str
    values: tuple
    is_setting: bool
    when: dict = dataclasses.field(default_factory=dict)

    def applies(self, candidate: Candidate, baseline: dict) -> bool:
        settings = {**baseline, **dict(candidate.settings)}
        return all(settings.get(name) == value for name, value in self.when.items())

    def current(self, candidate: Candidate, baseline: dict):
        own = dict(candidate.settings if self.is_setting else candidate.args)
        return own[self.name] if self.name in own else baseline.get(self.name)

    def move(self, candidate: Candidate, value) -> Candidate:
        return candidate.with_changes(**({"settings": {self.name: value}} if self.is_setting else
                                         {"args": {self.name: value}}))


# ---- proposals from a diagnosis -----------------------------------------------------------------


@dataclasses.dataclass
class Proposal:
    settings: dict
    args: dict
    reason: str


def proposals_from_findings(findings, script_args=()) -> tuple:
    """The fixes the findings suggest, costliest first, and notes on fixes that cannot be tried.

    A finding is a ``diagnose.Finding`` or its JSON.  A key of its ``fix`` is a
    torchtpu setting (by name or as ``TORCHTPU_NAME``), or a script argument the
    user declared with ``--vary``; anything else is left out, with a note.
    """
    names = _setting_names()
    ranked = sorted(findings, key=lambda f: -_get(f, "estimated_cost_s", 0.0) * _get(f, "count", 1))
    proposals, notes, seen = [], [], set()
    for finding in ranked:
        settings, args = {}, {}
        for key, value in (_get(finding, "fix", None) or {}).items():
            name = key[len("TORCHTPU_"):].lower() if key.startswith("TORCHTPU_") else key
            if name in names:
                settings[name] = parse_setting(name, value) if isinstance(value, str) else value
            elif name in script_args:
                args[name] = value
            else:
                notes.append(f"{_get(finding, 'kind', '?')}: {key!r} is not a torchtpu setting; "
                             f"try it with --vary {key}=...")
        key = (tuple(sorted(settings.items())), tuple(sorted(args.items())))
        if (settings or args) and key not in seen:
            seen.add(key)
            where = f"{_get(finding, 'file', '?')}:{_get(finding, 'line', '?')}"
            proposals.append(Proposal(settings, args, f"{_get(finding, 'kind', '?')} at {where}"))
    return proposals, notes


def _get(finding, name, default):
    return finding.get(name, default) if isinstance(finding, dict) else getattr(finding, name, default)


def _setting_names() -> set:
    from torchtpu import config

    return {s.name for s in config.SETTINGS} - {"profile"}


def parse_setting(name: str, text: str):
    """A setting's value from text, read as its environment variable would be."""
    from torchtpu import config

    fields = {s.name: s for s in config.SETTINGS}
    if name not in fields or name == "profile":
        raise ValueError(f"{name!r} is not a torchtpu setting; settings: {sorted(_setting_names())}")
    return fields[name].metadata["parse"](text)


def default_space() -> list:
    return [Dimension(name, values, True, dict(when)) for name, values, when in DEFAULT_SPACE]


def grid_dimensions(settings_grid: dict, args_grid: dict) -> list:
    """Dimensions from ``--setting name=a,b`` (values as text) and ``--vary name=a,b``."""
    dims = [Dimension(name, tuple(parse_setting(name, v) for v in values), True)
            for name, values in settings_grid.items()]
    return dims + [Dimension(name, tuple(values), False) for name, values in args_grid.items()]


# ---- running one trial --------------------------------------------------------------------------


@dataclasses.dataclass
class Runner:
    """Runs the script in a subprocess per trial, each in its own process group, logs under ``log_dir``."""

    script: str
    script_args: list
    log_dir: pathlib.Path
    timeout_s: float
    startup_s: float | None = None  # measured on first need

    def run(self, trial: Trial, timeout_s: float) -> Trial:
        trial.log = str(self.log_dir / f"trial-{trial.index:03d}.log")
        command = [sys.executable, self.script, *self.script_args, *trial.candidate.argv()]
        with open(trial.log, "w", encoding="utf-8") as log:
            start = time.perf_counter()
            environment = (_profile_environment(trial.profile, trial.candidate) if trial.profile else
                           _child_environment(dict(trial.candidate.settings)))
            code = _run_bounded(command, environment, log, timeout_s)
            trial.wall_s = time.perf_counter() - start
        text = pathlib.Path(trial.log).read_text(encoding="utf-8", errors="replace")
        times = step_times(text)
        trial.steps_reported = len(times)
        if code is None:
            trial.status, trial.detail = "timeout", f"killed after {timeout_s:.0f} s"
        elif code != 0:
            trial.status, trial.detail = "crashed", f"exit status {code}: {_tail(text)}"
        else:
            trial.status = "ok"
            self._measure(trial, times)
        return trial

    def _measure(self, trial: Trial, times: list) -> None:
        if times:
            trial.step_s, trial.measured_by = steady_step_time(times), "step lines"
            return
        if self.startup_s is None:
            self.startup_s = measure_startup()
        trial.step_s = max(trial.wall_s - self.startup_s, 1e-3)
        trial.measured_by = "wall time less start-up"


def _child_environment(settings: dict) -> dict:
    from torchtpu import config

    # A trial measures exactly the settings it names: no profile of the caller's leaks into it.
    return config.environment_for_child(settings, remove=("TORCHTPU_PROFILE",))


def _profile_environment(profile: str, candidate: Candidate) -> dict:
    """An environment that takes the candidate's settings from its profile file, as a user of the profile would."""
    from torchtpu import config

    fields = {s.name: s for s in config.SETTINGS}
    variables = [variable for name, _ in candidate.settings
                 for variable in (config.env_name(fields[name]), *fields[name].metadata["aliases"])]
    environment = config.environment_for_child({}, remove=variables)  # a variable would win over the profile
    environment["TORCHTPU_PROFILE"] = profile
    return environment


def _run_bounded(command: list, environment: dict, log, timeout_s: float, stdout=None):
    """The exit status, or None when the time ran out (then the whole process group is killed).
    Output goes to ``log``, or standard output alone to ``stdout`` when given."""
    process = subprocess.Popen(command, env=environment, stdout=stdout or log,
                               stderr=log if stdout else subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:  # also after a normal exit: a worker it left behind must not load the next trial's measure
        _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: nothing left to stop
        pass
    process.wait()


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:])[-600:]


def step_times(text: str) -> list:
    """The step times a log reports, in order."""
    times = []
    for line in text.splitlines():
        _, mark, rest = line.partition(STEP_MARK)
        if mark:
            try:
                times.append(float(rest.split()[0]))
            except (ValueError, IndexError):
                continue
    return times


def steady_step_time(times: list) -> float:
    """The median step time, leaving out the first step (its compiles) when there are three or more."""
    return statistics.median(times[1:] if len(times) >= 3 else times)


def measure_startup(runs: int = 2) -> float:
    """Seconds for ``python -c "import torchtpu"``: what a trial's wall time includes before any step."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        try:
            subprocess.run([sys.executable, "-c", STARTUP_CODE], env=_child_environment({}), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        except (subprocess.SubprocessError, OSError):  # the trial itself ran: take nothing off rather than stop
            return 0.0
        best = min(best, time.perf_counter() - start)
    return best


# ---- the loop ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    trials: list
    default: Trial
    best: Trial
    default_runs: list  # the step times of every run of the default configuration
    best_runs: list
    speedup: float | None  # median default / median best, only where confirmed
    confirmed: bool
    notes: list
    startup_s: float | None = None  # what "wall time less start-up" took off
    profile_path: str = ""
    report_path: str = ""


def search(script: str, script_args=(), *, findings=(), space=None, vary=None, max_trials: int = 12,
           timeout_s: float = 300.0, repeats: int = 2, min_gain: float = 0.03, out: str = "tune-search",
           progress: bool = True) -> Result:
    """Search settings for ``script`` and write ``profile.json`` and a report under ``out``.

    ``space``: the dimensions to walk (``default_space()`` when None, plus
    ``grid_dimensions(...)``); ``vary``: script arguments with their values,
    the first value being the default's (``{"batch": ["8", "16"]}``).
    """
    out_dir = pathlib.Path(out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    repeats = max(repeats, 1)  # a speed-up rests on two runs of each side at the least
    vary = dict(vary or {})
    dims = list(default_space() if space is None else space) + grid_dimensions({}, vary)
    proposals, notes = proposals_from_findings(findings, script_args=vary)
    runner = Runner(script, list(script_args), out_dir / "logs", timeout_s)
    loop = _Loop(runner, _baseline_settings(), max_trials, min_gain, progress,
                 planned=len(proposals) + sum(len(d.values) for d in dims) + 1 + 2 * repeats)
    start = Candidate.of({}, {name: values[0] for name, values in vary.items()})
    default = loop.trial(start, "default", "the script as given")
    if loop.best is None:
        notes.append(f"the default run {default.status}: {default.detail}; nothing to compare against")
        loop.bar.close()
        return _finish(Result(loop.trials, default, default, [], [], None, False, notes), out_dir)
    for proposal in proposals:
        loop.consider(loop.best.candidate.with_changes(proposal.settings, proposal.args), "finding", proposal.reason)
    for dim in dims:
        loop.walk(dim)
    result = _confirm(loop, default, repeats, notes)
    loop.bar.close()
    result.startup_s = runner.startup_s
    return _finish(result, out_dir)


def _baseline_settings() -> dict:
    """The settings a trial that names none runs with (those of this environment, less any profile)."""
    from torchtpu import config

    values = dataclasses.asdict(config.from_environ(_child_environment({})))
    values.pop("profile", None)
    return values


class _Loop:
    """The trials so far, the best among them, and the progress line."""

    def __init__(self, runner: Runner, baseline: dict, max_trials: int, min_gain: float, progress: bool,
                 planned: int):
        self.runner, self.baseline, self.max_trials, self.min_gain = runner, baseline, max_trials, min_gain
        self.bar = ProgressBar(planned, enabled=progress)
        self.trials, self.tried, self.best = [], set(), None

    def trial(self, candidate: Candidate, role: str, reason: str, profile: str = "") -> Trial:
        self.tried.add(self._key(candidate))
        trial = Trial(len(self.trials), candidate, role, reason, profile=profile)
        self.runner.run(trial, self._time_bound())
        self._check_comparable(trial)
        self.trials.append(trial)
        if role in ("default", "finding", "space") and self._leads(trial):
            self.best = trial
        self.bar.update(len(self.trials), self.best or trial, trial, self.trials[0])
        return trial

    def _check_comparable(self, trial: Trial) -> None:
        """A trial measured another way than the default (step lines against wall time) cannot be compared."""
        default = self.trials[0] if self.trials else None
        if default and default.status == "ok" and trial.status == "ok" and trial.measured_by != default.measured_by:
            trial.status = "incomparable"
            trial.detail = f"measured by {trial.measured_by}, the default by {default.measured_by}"

    def _leads(self, trial: Trial) -> bool:
        """Better than the best so far by the minimum gain (noise must not pick the winner)."""
        if trial.status != "ok":
            return False
        return self.best is None or trial.step_s < self.best.step_s * (1 - self.min_gain)

    def _key(self, candidate: Candidate):
        # Naming a setting at its baseline value is the same configuration as leaving it out.
        settings = {k: v for k, v in candidate.settings if self.baseline.get(k) != v}
        return tuple(sorted(settings.items())), candidate.args

    def _time_bound(self) -> float:
        """The user's bound, and once the default has run, no more than a few times its wall time."""
        if not self.trials or self.trials[0].status != "ok":
            return self.runner.timeout_s
        return min(self.runner.timeout_s, 5 * self.trials[0].wall_s + 30)

    def consider(self, candidate: Candidate, role: str, reason: str) -> None:
        searched = sum(t.role not in ("confirm-default", "confirm-best") for t in self.trials)
        if self._key(candidate) in self.tried or searched >= self.max_trials:
            return
        self.trial(candidate, role, reason)

    def walk(self, dim: Dimension) -> None:
        """Each value on top of the best so far, and on the default too: an option can lose on top
        of the leader and win alone (torch.compile against fused eager mode, say)."""
        for value in dim.values:
            default = self.trials[0]
            bases = [self.best.candidate] + ([default.candidate] if self.best is not default else [])
            for base in bases:
                if dim.applies(base, self.baseline) and value != dim.current(base, self.baseline):
                    self.consider(dim.move(base, value), "space", f"{dim.name}={_text(value)}")


def _confirm(loop: _Loop, default: Trial, repeats: int, notes: list) -> Result:
    """Run the default and the best again, taking turns; claim a speed-up only if every best run beat every default."""
    best = loop.best
    if best is default:
        notes.append("no candidate beat the default by the minimum gain: the profile keeps the default")
        return Result(loop.trials, default, best, [default.step_s], [], None, False, notes)
    # The best runs again as its profile: what is confirmed is what a user of the profile gets.
    profile = write_profile_file(best.candidate, loop.runner.log_dir.parent / "candidate-profile.json")
    for _ in range(repeats):
        loop.trial(default.candidate, "confirm-default", f"measured again: trial {default.index}")
        loop.trial(best.candidate, "confirm-best", f"trial {best.index} measured again, from its profile",
                   profile=str(profile))
    default_runs = _runs(loop.trials, default)
    best_runs = _runs(loop.trials, best)
    failed = [t for t in loop.trials if t.role.startswith("confirm") and t.status != "ok"]
    confirmed = not failed and max(best_runs) < min(default_runs)
    speedup = statistics.median(default_runs) / statistics.median(best_runs) if confirmed else None
    if not confirmed:
        notes.append("the best candidate did not beat the default in every repeated run: no speed-up is claimed "
                     "and the profile keeps the default")
    return Result(loop.trials, default, best, default_runs, best_runs, speedup, confirmed, notes)


def _runs(trials: list, of: Trial) -> list:
    return [t.step_s for t in trials if t.candidate == of.candidate and t.status == "ok"]


# ---- progress -----------------------------------------------------------------------------------


class ProgressBar:
    """One line on stderr: a bar, the trials run, the best so far, the last trial's outcome."""

    def __init__(self, planned: int, enabled: bool = True, width: int = 20):
        self.planned, self.enabled, self.width = max(planned, 1), enabled, width
        self.live = enabled and sys.stderr.isatty()  # redraw in place on a terminal, a line per trial elsewhere

    def update(self, done: int, best: Trial, last: Trial, default: Trial) -> None:
        if not self.enabled:
            return
        self.planned = max(self.planned, done)
        line = render_progress(done, self.planned, best, last, default, self.width)
        sys.stderr.write(f"\r\x1b[2K{line}" if self.live else f"{line}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.live:
            sys.stderr.write("\n")


def render_progress(done: int, planned: int, best: Trial, last: Trial, default: Trial, width: int = 20) -> str:
    filled = round(width * done / planned)
    bar = "#" * filled + "-" * (width - filled)
    best_text = "best: none yet"
    if best.status == "ok":
        ratio = f", {default.step_s / best.step_s:.2f}x first default run" if default.status == "ok" else ""
        best_text = f"best {best.step_s * 1e3:.2f} ms ({best.candidate.label()}{ratio})"
    last_text = f"{last.step_s * 1e3:.2f} ms" if last.status == "ok" else last.status
    return f"[{bar}] {done}/~{planned} trials  {best_text}  last #{last.index}: {last_text}"


# ---- the profile and the report -----------------------------------------------------------------


def _finish(result: Result, out_dir: pathlib.Path) -> Result:
    result.profile_path = str(write_profile(result, out_dir / "profile.json"))
    result.report_path = str(write_report(result, out_dir))
    return result


def profile_of(result: Result) -> dict:
    """The profile file's contents: the settings to load (``TORCHTPU_PROFILE``), and how they were measured."""
    chosen = result.best if result.confirmed else result.default
    return {
        "settings": dict(chosen.candidate.settings),
        "script_args": chosen.candidate.argv(),  # script-level knobs: not loaded by torchtpu, pass them yourself
        "speedup": result.speedup,
        "measured": {"default_step_s": result.default_runs, "best_step_s": result.best_runs,
                     "measured_by": result.default.measured_by, "confirmed": result.confirmed},
        "written_by": "torchtpu tune search",
    }


def write_profile(result: Result, path: pathlib.Path) -> pathlib.Path:
    path.write_text(json.dumps(profile_of(result), indent=2) + "\n")
    return path


def write_profile_file(candidate: Candidate, path: pathlib.Path) -> pathlib.Path:
    """A profile of one candidate's settings alone, for the confirmation runs."""
    path.write_text(json.dumps({"settings": dict(candidate.settings)}, indent=2) + "\n")
    return path


def write_report(result: Result, out_dir: pathlib.Path) -> pathlib.Path:
    data = {"trials": [t.to_json() for t in result.trials], "default": result.default.index,
            "best": result.best.index, "default_runs": result.default_runs, "best_runs": result.best_runs,
            "speedup": result.speedup, "confirmed": result.confirmed, "notes": result.notes,
            "startup_s": result.startup_s}
    (out_dir / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    plot = plot_trials(result, out_dir / "trials.png")
    path = out_dir / "report.md"
    path.write_text(report_markdown(result, plot.name if plot else None))
    return path


def report_markdown(result: Result, plot_name: str | None) -> str:
    lines = ["# torchtpu tune search", ""]
    lines += _verdict(result) + [""]
    if plot_name:
        lines += [f"![trials]({plot_name})", ""]
    lines += ["| # | role | configuration | status | measure (ms) | measured by | why tried |",
              "|---|---|---|---|---|---|---|"]
    for t in result.trials:
        measure = f"{t.step_s * 1e3:.3f}" if t.step_s is not None else ""
        status = t.status if t.status == "ok" else f"{t.status}: {t.detail}".replace("|", "/")
        lines.append(f"| {t.index} | {t.role} | `{t.candidate.label()}` | {status} | {measure} | {t.measured_by} | "
                     f"{t.reason} |")
    lines += [""] + [f"- {note}" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def _verdict(result: Result) -> list:
    ms = ", ".join
    if result.confirmed:
        return [f"**{result.speedup:.2f}x** faster than the default (median of each; every run of the best beat every "
                f"run of the default): `{result.best.candidate.label()}`.", "",
                f"- default runs (ms): {ms(f'{s * 1e3:.3f}' for s in result.default_runs)}",
                f"- best runs (ms): {ms(f'{s * 1e3:.3f}' for s in result.best_runs)}",
                f"- measured by: {result.default.measured_by}"]
    if result.default.status != "ok":
        return [f"The default run {result.default.status}: no search ({result.default.detail})."]
    return ["No speed-up claimed: the profile keeps the default.", "",
            f"- default runs (ms): {ms(f'{s * 1e3:.3f}' for s in result.default_runs)}",
            f"- best candidate's runs (ms): {ms(f'{s * 1e3:.3f}' for s in result.best_runs) or 'none'}"
            + (f" (`{result.best.candidate.label()}`)" if result.best is not result.default else "")]


def plot_trials(result: Result, path: pathlib.Path):
    """A PNG of each trial's measure, failures marked at the top, the default's first run as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [t for t in result.trials if t.status == "ok"]
    failed = [t for t in result.trials if t.status != "ok"]
    figure, axes = plt.subplots(figsize=(8, 4))
    top = max((t.step_s for t in ok), default=1.0) * 1e3 * 1.1
    for role, colour in (("default", "tab:gray"), ("finding", "tab:purple"), ("space", "tab:blue"),
                         ("confirm-default", "silver"), ("confirm-best", "tab:green")):
        chosen = [t for t in ok if t.role == role]
        if not chosen:
            continue
        axes.scatter([t.index for t in chosen], [t.step_s * 1e3 for t in chosen], color=colour, label=role)
    if failed:
        axes.scatter([t.index for t in failed], [top] * len(failed), marker="x", color="tab:red",
                     label="crashed / timed out")
    if result.default.status == "ok":
        axes.axhline(result.default.step_s * 1e3, color="tab:gray", linestyle="--", linewidth=1)
    if result.confirmed:
        axes.scatter([result.best.index], [result.best.step_s * 1e3], marker="*", s=200, color="gold",
                     edgecolor="black", label="best", zorder=3)
    axes.set_xlabel("trial")
    axes.set_ylabel("step time (ms)" if result.default.measured_by == "step lines" else "time (ms)")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# ---- the command ---------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    import argparse

    parser.usage = "%(prog)s [options] script.py [script arguments]"
    parser.add_argument("--vary", action="append", default=[], metavar="NAME=A,B",
                        help="a script argument to try (passed as --NAME=A); the first value is the default's; "
                        "a bare NAME is a flag, tried off (absent) and on (--NAME)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=A,B",
                        help="a torchtpu setting to try, by name (max_fused_ops=100,1000)")
    parser.add_argument("--findings", metavar="JSON",
                        help="findings of `torchtpu tune analyze --json` to start from (default: analyze the script first)")
    parser.add_argument("--no-analyze", action="store_true", help="do not analyze the script before the trials")
    parser.add_argument("--no-default-space", action="store_true",
                        help="try only --setting, --vary and the findings, not the eager modes and fused graph sizes")
    parser.add_argument("--trials", type=int, default=12, help="at most this many trials before the repeats")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a trial may run before it is killed")
    parser.add_argument("--repeats", type=int, default=2, help="extra runs each of the default and the best")
    parser.add_argument("--min-gain", type=float, default=0.03, help="a candidate must be this much faster to lead")
    parser.add_argument("--out", default="tune-search", help="directory for profile.json, report.md/.json, trials.png")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("script", help="the Python script to tune (options of the search go before it)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its own arguments, passed to every trial")


def parse_grid(items: list, flags: bool = False) -> dict:
    """``["batch=8,16"]`` -> ``{"batch": ["8", "16"]}``; with ``flags``, a bare ``"compile"`` is a
    flag tried off (absent, the default's) and on: ``{"compile": [False, True]}``."""
    grid = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().lstrip("-")
        if flags and not sep and name:
            grid[name] = [False, True]
            continue
        if not sep or not name or not values:
            raise SystemExit(f"torchtpu tune search: expected NAME=A,B{' or NAME' if flags else ''}, got {item!r}")
        grid[name] = [v.strip() for v in values.split(",") if v.strip()]
    return grid


def run(args) -> int:
    try:
        dims = ([] if args.no_default_space else default_space()) + grid_dimensions(parse_grid(args.setting), {})
    except ValueError as error:
        raise SystemExit(f"torchtpu tune search: {error}") from None
    if args.findings:
        findings = _load_findings(args.findings)
    elif args.no_analyze:
        findings = []
    else:
        findings = diagnose_in_subprocess(args.script, args.script_args, pathlib.Path(args.out), args.timeout)
    vary = parse_grid(args.vary, flags=True)
    result = search(args.script, args.script_args, findings=findings, space=dims, vary=vary, max_trials=args.trials, timeout_s=args.timeout, repeats=args.repeats, min_gain=args.min_gain,
                    out=args.out, progress=not args.quiet)
    print(_verdict(result)[0])
    print(f"profile: {result.profile_path}  (TORCHTPU_PROFILE={result.profile_path})")
    print(f"report: {result.report_path}")
    return 0 if result.default.status == "ok" else 1


def diagnose_in_subprocess(script: str, script_args, out_dir: pathlib.Path, timeout_s: float) -> list:
    """``torchtpu tune analyze --json`` of the script, in a time-bounded subprocess: its findings,
    or none (with a line on stderr) when it fails, so that the search still runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    findings_path, log_path = out_dir / "findings.json", out_dir / "analyze.log"
    command = [sys.executable, "-m", "torchtpu", "tune", "analyze", "--json", script, *script_args]
    with open(findings_path, "w") as stdout, open(log_path, "w") as log:
        status = _run_bounded(command, _child_environment({}), log, timeout_s, stdout=stdout)
    if status != 0:
        print(f"torchtpu tune search: analyzing the script {'timed out' if status is None else 'failed'} "
              f"(see {log_path}); searching without its findings", file=sys.stderr)
        return []
    return _load_findings(str(findings_path))


def _load_findings(path: str) -> list:
    data = json.loads(pathlib.Path(path).read_text())
    return data["findings"] if isinstance(data, dict) else data
