"""Every setting torchtpu reads from the environment, read once, at import.

One rule names them: ``TORCHTPU_<NAME>``.  The three eager-mode switches also
answer to the names Google's TorchTPU gives them (``TPU_LAUNCH_BLOCKING``,
``TPU_DEFER_AND_FUSE``, ``TPU_MAX_FUSED_OPS``), so programs written for it run
unchanged; where both are set, the ``TORCHTPU_`` name wins.  One parser reads
flags: a flag is on unless it is unset, empty, ``0``, ``false``, ``no`` or
``off`` (in any case).

Changing ``os.environ`` after import changes nothing: change a setting with
``torchtpu.config.update(name=value)``, or for a block with
``with torchtpu.config.override(name=value):``.  ``TORCHTPU_PROFILE=path``
names a JSON file of settings (``{"settings": {"defer_and_fuse": true}}``, as
``torchtpu tune search`` writes it) that is read at import too; a variable set
in the environment wins over the profile's value.  ``docs/configuration.md``
holds the table of every setting, generated from ``Config``'s fields (a test checks
it is current).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

_OFF = ("", "0", "false", "no", "off")


def parse_flag(text: str) -> bool:
    return text.strip().lower() not in _OFF


def _parse_path(text: str) -> str | None:
    return text or None


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _parse_index(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a non-negative integer, got {text!r}")
    return value


def _parse_precision(text: str) -> str | None:
    value = text.strip().lower()
    if value and value not in ("highest", "high", "default"):
        raise ValueError(f"expected highest, high or default, got {text!r}")
    return value or None


def _setting(default, parse, doc, aliases=()):
    return dataclasses.field(default=default, metadata={"parse": parse, "doc": doc, "aliases": aliases})


@dataclasses.dataclass
class Config:
    """The settings; each field's metadata says how its environment variable is read."""

    launch_blocking: bool = _setting(
        False, parse_flag, "Debug eager mode at import: each op waits for its result (wins over fused).",
        aliases=("TPU_LAUNCH_BLOCKING",))
    defer_and_fuse: bool = _setting(
        False, parse_flag, "Fused eager mode at import: ops join a pending graph that runs as one program.",
        aliases=("TPU_DEFER_AND_FUSE",))
    max_fused_ops: int = _setting(
        500, _parse_positive_int, "The size of a pending fused graph at which it runs.",
        aliases=("TPU_MAX_FUSED_OPS",))
    cpu_fallback: bool = _setting(
        False, parse_flag, "Run ops that have no lowering on the host (slow; warned once per op, counted).")
    host_runs_before_compile: int = _setting(
        2, _parse_index, "Times a small integer op meeting a new shape runs on the host before its program compiles "
        "(strict eager mode; 0: compile at once).")
    log_recompiles: bool = _setting(
        False, parse_flag, "Log every compile of a graph after its first, with what changed.")
    matmul_precision: str | None = _setting(
        None, _parse_precision, "The float32 matmul precision of programs: `highest` (float32, CPU's results), `high` "
        "(three bfloat16 passes on TPU) or `default` (one); unset: `torch.set_float32_matmul_precision`'s "
        "(`high`: high, `medium`: default). `torch.tpu.precision(...)` wins inside its block.")
    cache_dir: str | None = _setting(
        None, _parse_path, "Keep compiled programs in this directory (XLA's persistent cache), across processes.")
    dump_dir: str | None = _setting(None, _parse_path, "Write the StableHLO of every compiled graph here.")
    flash_attention: bool = _setting(
        False, parse_flag, "Use the Pallas flash-attention kernel off TPU too (in Pallas' interpreter; for testing).")
    program_cache_size: int = _setting(
        8192, _parse_positive_int, "How many compiled programs each cache keeps before it evicts its oldest.")
    chip: int = _setting(
        0, _parse_index, "This process's chip: its tensors live on `tpu:<chip>` (one process per chip).",
        aliases=("LOCAL_RANK",))
    local_chips: int = _setting(
        1, _parse_positive_int, "How many chips this host drives, one process each (`torch.tpu.device_count()`).",
        aliases=("LOCAL_WORLD_SIZE",))
    share_host_cores: bool = _setting(
        True, parse_flag, "On XLA's CPU backend with several processes per host (`LOCAL_WORLD_SIZE` > 1), pin each "
        "to its own share of the cores, as one chip each (off: leave the CPU affinity alone).")
    reuse_host_memory: bool = _setting(
        True, parse_flag, "On XLA's CPU backend, keep freed large buffers in the process for the next program run "
        "(glibc malloc: one arena, 1 GiB mmap and trim thresholds) instead of mapping fresh, page-faulting memory on "
        "every run (off: malloc's defaults).")
    native: bool = _setting(
        True, parse_flag, "Use the C++ extension (device guard, tensor factory) if it was built; off: `tpu:0` only.")
    vllm: bool = _setting(
        True, parse_flag, "Activate the vLLM platform plugin where vLLM is installed (off: vLLM picks its own platform).")
    sglang: bool = _setting(
        True, parse_flag, "Activate the SGLang platform plugin where SGLang is installed (off: SGLang picks its own).")
    vllm_pallas_attention: bool = _setting(
        False, parse_flag, "Run vLLM's attention through JAX's ragged paged-attention Pallas kernel off TPU too "
        "(in Pallas' TPU interpreter; slow, for testing).")
    sglang_pallas_attention: bool = _setting(
        False, parse_flag, "Run SGLang's attention through JAX's ragged paged-attention Pallas kernel off TPU too "
        "(in Pallas' TPU interpreter; slow, for testing).")
    profile: str | None = _setting(
        None, _parse_path, "A JSON file of settings, `{\"settings\": {\"defer_and_fuse\": true}}` (as `torchtpu tune "
        "search` writes it), read at import; a variable set in the environment wins over the profile.")


def env_name(field: dataclasses.Field) -> str:
    return "TORCHTPU_" + field.name.upper()


SETTINGS = dataclasses.fields(Config)
_NAMES = {f.name for f in SETTINGS}


def from_environ(environ=os.environ) -> Config:
    """The settings the environment gives, then those of its profile (``TORCHTPU_PROFILE``), defaults for the rest."""
    values = _values_from_environ(environ)
    if values.get("profile"):
        values = {**load_profile(values["profile"]), **values}
    return Config(**values)


def _values_from_environ(environ) -> dict:
    values = {}
    for setting in SETTINGS:
        for env in (env_name(setting), *setting.metadata["aliases"]):
            if env in environ:
                try:
                    values[setting.name] = setting.metadata["parse"](environ[env])
                except ValueError as error:
                    raise ValueError(f"torchtpu: {env}={environ[env]!r}: {error}") from None
                break
    return values


def load_profile(path: str) -> dict:
    """The settings a profile file holds, checked, by setting name: ``{"settings": {name: value}}``.

    A value is either JSON of the setting's type (``true``, ``200``, ``null``
    for a path) or the text its environment variable would hold (``"1"``).
    """
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"torchtpu: TORCHTPU_PROFILE={path!r}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise ValueError(f'torchtpu: TORCHTPU_PROFILE={path!r}: expected an object {{"settings": {{...}}}}')
    return {name: _profile_value(path, name, value) for name, value in data["settings"].items()}


def _profile_value(path: str, name: str, value):
    fields = {f.name: f for f in SETTINGS}
    if name not in fields or name == "profile":
        raise ValueError(f"torchtpu: TORCHTPU_PROFILE={path!r}: {name!r} is not a setting a profile can hold; "
                         f"settings: {sorted(_NAMES - {'profile'})}")
    setting = fields[name]
    if value is None and setting.default is None:
        return None
    if not isinstance(value, str) and type(value) is not type(setting.default):  # bool is not taken for int
        expected = "text" if setting.default is None else type(setting.default).__name__
        raise ValueError(f"torchtpu: TORCHTPU_PROFILE={path!r}: {name}={value!r}: expected {expected}")
    try:
        return setting.metadata["parse"](value if isinstance(value, str) else to_text(value))
    except ValueError as error:
        raise ValueError(f"torchtpu: TORCHTPU_PROFILE={path!r}: {name}={value!r}: {error}") from None


def to_text(value) -> str:
    """A setting's value as its environment variable holds it (the inverse of its parser)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return "" if value is None else str(value)


def environment_for_child(settings: dict, remove=()) -> dict:
    """This process's environment with ``settings`` (by setting name) set and the variables in ``remove`` taken out:
    the environment for a subprocess (``torchtpu tune search`` runs each trial in one)."""
    environ = {name: value for name, value in os.environ.items() if name not in remove}
    for name, value in settings.items():
        if name not in _NAMES:
            raise AttributeError(f"torchtpu.config has no setting {name!r}; settings: {sorted(_NAMES)}")
        environ["TORCHTPU_" + name.upper()] = to_text(value)
    return environ


current = from_environ()


def update(**changes) -> None:
    """Change settings of the running process: ``update(cpu_fallback=True)``."""
    unknown = set(changes) - _NAMES
    if unknown:
        raise AttributeError(f"torchtpu.config has no setting {sorted(unknown)}; settings: {sorted(_NAMES)}")
    for name, value in changes.items():
        setattr(current, name, value)


@contextlib.contextmanager
def override(**changes):
    """Change settings inside a block; the old values come back on exit."""
    previous = {name: getattr(current, name) for name in changes}
    update(**changes)
    try:
        yield current
    finally:
        update(**previous)


def set_for_child_processes(name: str, value: str) -> None:
    """Set an environment variable that processes started from now on inherit (an engine's workers)."""
    os.environ[name] = value


def markdown_table() -> str:
    """The table of settings in docs/configuration.md."""
    rows = ["| variable | also read as | default | what it does |", "|---|---|---|---|"]
    for s in SETTINGS:
        aliases = ", ".join(f"`{a}`" for a in s.metadata["aliases"])
        rows.append(f"| `{env_name(s)}` | {aliases} | `{s.default}` | {s.metadata['doc']} |")
    return "\n".join(rows)
