"""The package's shape, checked: layers, import cycles, private fields, the public surface, settings.

These read torchtpu's source with ``ast``: a rule broken anywhere fails here
with the file and line, before a reader has to find it.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu import config
from torchtpu.runtime import caches, metrics

ROOT = pathlib.Path(torchtpu.__file__).resolve().parent
DOCS = ROOT.parent / "docs"

# Bottom to top.  A module may import from its own layer and the layers below it.
LAYERS = ["config", "runtime", "core", "ops", "graph", "eager", "compile", "dispatch", "distributed", "api",
          "integrations", "tools"]
# Layers that own state and may read private fields of the modules in their own layer.
STATE_OWNERS = {"runtime", "core"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "torchtpu"


SOURCES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The torchtpu modules an ``ImportFrom`` names (a package's submodules included)."""
    if node.level:
        package = module.split(".") if SOURCES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if not base.startswith("torchtpu"):
        return []
    names = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in SOURCES]
    return names or [base]


def _imports(module: str, top_level_only: bool):
    """(imported torchtpu module, line) for every import in ``module``."""
    tree = ast.parse(SOURCES[module].read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            for name in _resolve(module, node):
                yield name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("torchtpu"):
                    yield alias.name, node.lineno


def test_every_module_belongs_to_a_layer():
    layers = {_layer(m) for m in SOURCES} - {"torchtpu", "__main__"}
    assert layers <= set(LAYERS), f"modules outside the layers: {sorted(layers - set(LAYERS))}"


def test_dependencies_point_down_only():
    violations = []
    for module in SOURCES:
        layer = _layer(module)
        if layer in ("torchtpu", "__main__"):
            continue  # the package itself wires the layers together
        rank = LAYERS.index(layer)
        for imported, line in _imports(module, top_level_only=False):
            target = _layer(imported)
            if target == "torchtpu" and layer == "tools":
                continue  # user-level programs import the package, as users do
            if target == "torchtpu" or LAYERS.index(target) > rank:
                violations.append(f"{SOURCES[module].relative_to(ROOT.parent)}:{line}: {layer} imports {imported}")
    assert not violations, "imports that point up:\n" + "\n".join(violations)


def test_no_import_cycles():
    graph = {m: {i for i, _ in _imports(m, top_level_only=True) if i in SOURCES and i != m} for m in SOURCES}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert cycles == [], f"import cycles: {cycles}"


def _private_attributes(module: str) -> set[str]:
    """Private names a module defines on its own objects: ``self._x = ``, ``__slots__`` and module globals."""
    tree = ast.parse(SOURCES[module].read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
            names.add(node.attr)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and str(e.value).startswith("_")}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            names.add(node.name)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("_")}
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_no_module_reads_another_modules_private_fields():
    """Outside runtime/ and core/, a module reads only its own private names: another
    module's state goes through that module's functions."""
    owners = {}
    for module in SOURCES:
        for name in _private_attributes(module):
            owners.setdefault(name, set()).add(module)
    violations = []
    for module, path in SOURCES.items():
        if _layer(module) in STATE_OWNERS:
            continue
        own = _private_attributes(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in owners and node.attr not in own:
                violations.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: .{node.attr} "
                                  f"(private to {', '.join(sorted(owners[node.attr]))})")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("torchtpu")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        violations.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: imports {alias.name}")
    assert not violations, "private fields read across modules:\n" + "\n".join(violations)


# ---- the public surface ---------------------------------------------------------------------

PUBLIC_SNAPSHOT = """
DeviceProperties Event EagerMode NonFiniteError Precision Stream bucket_size compile_cache_stats compile_stats
current_device current_stream debug_checks default_stream device device_count eager_mode empty_cache
fallback_stats fused_stats get_amp_supported_dtype get_device_name get_device_properties get_eager_mode
get_max_fused_ops get_precision get_rng_state get_rng_state_all graph_break_stats host_sync_stats initial_seed
is_available is_initialized manual_seed manual_seed_all max_memory_allocated max_memory_reserved mem_get_info
memory_allocated memory_reserved memory_stats metrics pad_to_bucket pallas precision reset_metrics
reset_peak_memory_stats seed seed_all set_device set_eager_mode set_max_fused_ops set_rng_state
set_rng_state_all set_stream stream StreamContext synchronize
""".split()


def test_torch_tpu_is_exactly_the_public_table():
    public = sorted(n for n in vars(torch.tpu) if not n.startswith("_"))
    assert public == sorted(PUBLIC_SNAPSHOT), (
        "torch.tpu changed: update torchtpu/api/public_api.py and this snapshot together.\n"
        f"added: {sorted(set(public) - set(PUBLIC_SNAPSHOT))}, removed: {sorted(set(PUBLIC_SNAPSHOT) - set(public))}")
    private = sorted(n for n in vars(torch.tpu) if n.startswith("_") and not n.startswith("__"))
    assert private == ["_is_in_bad_fork", "_lazy_init"]  # what PyTorch calls on a device module


def test_torch_tpu_mirrors_torch_cuda_where_names_match():
    """Every public torch.tpu function that torch.cuda also has is callable the same way (no device argument)."""
    for name in ("current_device", "device_count", "is_available", "synchronize", "memory_allocated",
                 "max_memory_allocated", "memory_reserved", "empty_cache", "initial_seed", "get_rng_state"):
        assert hasattr(torch.cuda, name)
        getattr(torch.tpu, name)()


# ---- settings ----------------------------------------------------------------------------------


def test_settings_read_flags_one_way_and_prefer_the_torchtpu_name():
    for off in ("", "0", "false", "False", "no", "OFF"):
        assert config.from_environ({"TORCHTPU_CPU_FALLBACK": off}).cpu_fallback is False
    for on in ("1", "true", "yes", "on"):
        assert config.from_environ({"TORCHTPU_CPU_FALLBACK": on}).cpu_fallback is True
    settings = config.from_environ({"TPU_MAX_FUSED_OPS": "7", "TORCHTPU_MAX_FUSED_OPS": "9"})
    assert settings.max_fused_ops == 9
    assert config.from_environ({"TPU_DEFER_AND_FUSE": "1"}).defer_and_fuse is True
    assert config.from_environ({}) == config.Config()


def test_bad_settings_raise_naming_the_variable():
    with pytest.raises(ValueError, match="TORCHTPU_MAX_FUSED_OPS"):
        config.from_environ({"TORCHTPU_MAX_FUSED_OPS": "many"})
    with pytest.raises(ValueError, match="TPU_MAX_FUSED_OPS"):
        config.from_environ({"TPU_MAX_FUSED_OPS": "0"})
    with pytest.raises(AttributeError, match="no setting"):
        config.update(cpu_fallbak=True)


def test_override_restores_settings_also_on_error():
    before = config.current.cpu_fallback
    with pytest.raises(RuntimeError):
        with config.override(cpu_fallback=not before):
            assert config.current.cpu_fallback is (not before)
            raise RuntimeError("inside")
    assert config.current.cpu_fallback is before


def test_every_setting_is_in_the_documented_table():
    assert config.markdown_table() in (DOCS / "configuration.md").read_text(), (
        "docs/configuration.md is stale: paste torchtpu.config.markdown_table() into it")


def test_only_the_settings_read_the_environment():
    """No module but config.py reads TORCHTPU_* or TPU_* variables."""
    readers = []
    for module, path in SOURCES.items():
        text = path.read_text()
        if module != "torchtpu.config" and ("os.environ" in text or "os.getenv" in text):
            readers.append(module)
    assert readers == []


# ---- bounded caches -----------------------------------------------------------------------------


def test_a_bounded_cache_evicts_its_oldest_entry_and_counts_it():
    cache = caches.BoundedCache("test cache", maxsize=2)
    before = metrics.cache_evictions["test cache"]
    for k in range(5):
        cache[k] = k
    assert list(cache) == [3, 4]
    assert metrics.cache_evictions["test cache"] - before == 3
    assert torch.tpu.metrics()["cache_evictions"]["test cache"] == metrics.cache_evictions["test cache"]


def test_eager_program_cache_is_bounded_and_results_stay_right():
    from torchtpu.eager import executor

    before = torch.tpu.metrics()["cache_evictions"].get("eager programs", 0)
    with config.override(program_cache_size=3):
        for n in range(1, 8):
            x = torch.arange(float(n))
            assert torch.equal((x.to("tpu") * 3 + 1).cpu(), x * 3 + 1)
        assert len(executor.PROGRAMS) <= 3
    assert torch.tpu.metrics()["cache_evictions"]["eager programs"] > before


# ---- metrics ------------------------------------------------------------------------------------


def test_metrics_counts_what_happened_and_the_old_functions_are_views_of_it():
    before = torch.tpu.metrics()
    x = torch.ones(3, device="tpu") * 2
    x.sum().item()
    after = torch.tpu.metrics()
    assert after["host_syncs"]["item"] == before["host_syncs"].get("item", 0) + 1
    assert after["totals"]["host_syncs"] == before["totals"]["host_syncs"] + 1
    assert torch.tpu.host_sync_stats() == after["host_syncs"]
    assert torch.tpu.compile_stats() == after["compiles"]
    assert torch.tpu.compile_cache_stats() == after["compile_cache"]
    assert set(after["totals"]) == {"programs_compiled", "cache_hits", "host_syncs", "cpu_fallbacks", "host_runs",
                                    "graph_breaks", "donated_buffers", "cache_evictions"}


# ---- import -----------------------------------------------------------------------------------


def test_import_registers_and_does_nothing_else():
    """``import torchtpu`` imports no engine, no Dynamo and opens no device."""
    code = ("import sys, torch, torchtpu; from jax._src import xla_bridge; "
            "heavy = [m for m in ('vllm', 'sglang', 'torchtitan', 'transformers', 'torch._dynamo', "
            "'torchtpu.integrations', 'torchtpu.tools') if m in sys.modules]; "
            "print(heavy, len(xla_bridge._backends))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[] 0"


def test_dynamo_skips_every_runtime_file():
    """Dynamo must not trace our executors (a backward after a graph break runs eager ops):
    every torchtpu file is on its skip list but the user-level ones."""
    from torch._dynamo import trace_rules

    from torchtpu.compile import dynamo

    traceable = tuple(str(ROOT / name.replace(".", "/")) for name in dynamo.TRACEABLE)
    # Packages holding a traceable module are skipped module by module; their __init__ is not.
    holders = {"torchtpu." + ".".join(name.split(".")[:i]) for name in dynamo.TRACEABLE
               for i in range(1, name.count(".") + 1)}
    for module, path in SOURCES.items():
        if str(path.with_suffix("")).startswith(traceable) or module in {"torchtpu", "torchtpu.__main__", *holders}:
            continue
        assert trace_rules.check_file(str(path)).skipped, module
