"""Turn sweep results into coverage figures, docs/op_coverage.md and expected_failures.py."""

from __future__ import annotations

import collections
import importlib
import pathlib
import pprint

import torch

from conformance import expected_failures, harness

EXPECTED_PATH = pathlib.Path(expected_failures.__file__)
KIND_COLUMNS = ("forward", "grad", "inplace", "out", "errors")


def _checks(op, settings):
    kinds = settings.get("kinds", ",".join(harness.KINDS)).split(",")
    dtypes = set(settings.get("dtypes", ",".join(harness.DTYPES)).split(","))
    return [(kind, dtype) for kind, dtype in harness.checks_for(op, kinds) if dtype in dtypes]


def summarize(sweep) -> dict:
    """Every check of every swept entry with its status: pass, xfail, fail or xpass."""
    importlib.reload(expected_failures)
    expected = expected_failures.EXPECTED_FAILURES
    records = {(r["op"], r["kind"], r["dtype"]): r for r in sweep["results"]}
    crashed = {r["op"]: r["reason"] for r in sweep["results"] if r["kind"] == "*"}
    swept = {r["op"] for r in sweep["results"]}
    rows = []
    for name, op in harness.ops_by_name().items():
        if name not in swept:
            continue
        checks = []
        for kind, dtype in _checks(op, sweep.get("settings", {})):
            record = records.get((name, kind, dtype)) or {
                "op": name, "kind": kind, "dtype": dtype, "total": 1, "passed": 0, "fallback_only": 0,
                "reason": crashed.get(name, "not run"), "random": False,
            }
            record = dict(record)
            ok = record["passed"] == record["total"]
            key = (name, kind, dtype)
            record["status"] = {(True, False): "pass", (True, True): "xpass",
                                (False, True): "xfail", (False, False): "fail"}[ok, key in expected]
            record["expected_reason"] = expected.get(key, "")
            checks.append(record)
        rows.append({"op": name, "checks": checks})
    return {"rows": rows, "figures": _figures(rows), **_problems(rows)}


def _problems(rows):
    checks = [c for row in rows for c in row["checks"]]
    return {
        "unexpected_failures": [c for c in checks if c["status"] == "fail"],
        "unexpected_passes": [c for c in checks if c["status"] == "xpass"],
        "expected_failures": [c for c in checks if c["status"] == "xfail"],
        "fallback_only": sum(c["fallback_only"] for c in checks),
    }


def _entry_rate(rows, kind, dtype):
    checks = [c for row in rows for c in row["checks"] if c["kind"] == kind and c["dtype"] == dtype]
    return sum(c["passed"] == c["total"] for c in checks), len(checks)


def _sample_rate(rows, kind, dtype):
    checks = [c for row in rows for c in row["checks"] if c["kind"] == kind and c["dtype"] == dtype]
    return sum(c["passed"] for c in checks), sum(c["total"] for c in checks)


def _figures(rows):
    return {
        "forward float32 (entries)": _entry_rate(rows, "forward", "float32"),
        "gradients float32 (entries)": _entry_rate(rows, "grad", "float32"),
        "forward bfloat16 (samples)": _sample_rate(rows, "forward", "bfloat16"),
        "forward float32 (samples)": _sample_rate(rows, "forward", "float32"),
        "gradients float32 (samples)": _sample_rate(rows, "grad", "float32"),
        "in-place (entries)": _rate_any_dtype(rows, "inplace"),
        "out= (entries)": _rate_any_dtype(rows, "out"),
        "error inputs (entries)": _entry_rate(rows, "errors", "float32"),
        "all checks": _all_checks(rows),
    }


def _rate_any_dtype(rows, kind):
    checks = [c for row in rows for c in row["checks"] if c["kind"] == kind]
    return sum(c["passed"] == c["total"] for c in checks), len(checks)


def _all_checks(rows):
    checks = [c for row in rows for c in row["checks"]]
    return sum(c["passed"] == c["total"] for c in checks), len(checks)


def _percent(pair):
    passed, total = pair
    return f"{100 * passed / total:.1f}% ({passed}/{total})" if total else "n/a"


def console_summary(summary) -> str:
    lines = [f"  {name:30s} {_percent(pair)}" for name, pair in summary["figures"].items()]
    lines.append(f"  expected failures (xfail):     {len(summary['expected_failures'])} checks")
    lines.append(f"  pass only with CPU fallback:   {summary['fallback_only']} samples (not counted as coverage)")
    lines.append(f"  unexpected passes (stale xfail): {len(summary['unexpected_passes'])}")
    lines.append(f"  unexpected failures:           {len(summary['unexpected_failures'])}")
    for c in summary["unexpected_failures"][:20]:
        lines.append(f"    FAIL {c['op']} {c['kind']} {c['dtype']}: {c['reason']}")
    return "coverage:\n" + "\n".join(lines)


# ---------------------------------------------------------------------------
# docs/op_coverage.md


def _cell(checks, kind):
    mine = [c for c in checks if c["kind"] == kind]
    if not mine:
        return "—"
    passed = sum(c["status"] in ("pass", "xpass") for c in mine)
    mark = "✓" if passed == len(mine) else ("xfail" if all(c["status"] != "fail" for c in mine) else "FAIL")
    if kind == "forward":
        return f"{mark} {passed}/{len(mine)}"
    return mark


def _reasons(checks):
    by_reason = collections.defaultdict(list)
    for c in checks:
        if c["status"] in ("fail", "xfail"):
            by_reason[c["expected_reason"] or c["reason"]].append(f"{c['kind']} {c['dtype']}")
    parts = [f"{', '.join(where)}: {reason}" for reason, where in by_reason.items()]
    return "; ".join(parts).replace("|", "\\|").replace("\n", " ")


def _status(checks):
    statuses = {c["status"] for c in checks}
    if "fail" in statuses:
        return "FAIL"
    if "xfail" in statuses:
        return "xfail"
    return "pass"


def write_markdown(sweep, summary, path) -> None:
    settings = sweep.get("settings", {})
    f = summary["figures"]
    lines = [
        "# Op coverage",
        "",
        "Generated by `./scripts/op_conformance.sh` (tests/conformance/sweep.py); do not edit by hand.",
        "Every sample input of PyTorch's OpInfo database (`op_db`) runs on `tpu` and on CPU, and the",
        "results are compared with `torch.testing.assert_close`'s per-dtype tolerances (widened where the",
        "OpInfo entry carries a `toleranceOverride`). The CPU fallback is off: it never counts as coverage.",
        "",
        f"torch {torch.__version__}; {len(summary['rows'])} OpInfo entries swept in {sweep.get('seconds', '?')} s; "
        f"samples per check: {'first ' + str(settings['max_samples']) if settings.get('max_samples') else 'all'}; "
        f"dtypes: {settings.get('dtypes', 'all')}; kinds: {settings.get('kinds', 'all')}.",
        "",
        "## Coverage",
        "",
        "| figure | target | result |",
        "|---|---|---|",
        f"| forward float32: entries whose every sample matches CPU | ≥ 90% | {_percent(f['forward float32 (entries)'])} |",
        f"| gradients (float32): entries whose every gradient matches | ≥ 80% | {_percent(f['gradients float32 (entries)'])} |",
        f"| forward bfloat16: samples that match | ≥ 85% | {_percent(f['forward bfloat16 (samples)'])} |",
        f"| forward float32: samples | | {_percent(f['forward float32 (samples)'])} |",
        f"| gradients float32: samples | | {_percent(f['gradients float32 (samples)'])} |",
        f"| in-place variants: entries | | {_percent(f['in-place (entries)'])} |",
        f"| `out=` variants: entries | | {_percent(f['out= (entries)'])} |",
        f"| error inputs raise CPU's exception type: entries | | {_percent(f['error inputs (entries)'])} |",
        f"| all checks (entry × kind × dtype) | | {_percent(f['all checks'])} |",
        "",
        f"- Expected failures (xfail, listed in `tests/conformance/expected_failures.py`): "
        f"{len(summary['expected_failures'])} checks.",
        f"- Unexpected failures: {len(summary['unexpected_failures'])}; "
        f"stale expected failures (now pass): {len(summary['unexpected_passes'])}.",
        f"- Samples that pass only with `TORCHTPU_CPU_FALLBACK=1`: {summary['fallback_only']} "
        "(counted separately, never as coverage).",
        "",
        "## Ops run through `torch._decomp`",
        "",
        "These ATen ops have no lowering of their own; the sweep ran them through PyTorch's",
        "decomposition (`torchtpu/ops/decompositions.py`):",
        "",
        ", ".join(f"`{name}`" for name in sweep.get("decomposed", [])) or "(none)",
        "",
        "## Per entry",
        "",
        "`forward` counts the swept dtypes CPU supports (see above); `grad` is float32; `inplace` and `out=`",
        "run float32 (or the first supported dtype).",
        "Random ops are compared by shape, dtype and statistics only (marked *random*).",
        "",
        "| op | forward | grad | inplace | out= | errors | status | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        checks = row["checks"]
        random = " *random*" if any(c["random"] for c in checks) else ""
        cells = [_cell(checks, kind) for kind in KIND_COLUMNS]
        lines.append(f"| `{row['op']}`{random} | {' | '.join(cells)} | {_status(checks)} | {_reasons(checks)} |")
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------
# expected_failures.py


def write_expected_failures(summary) -> None:
    """Every failing check of this sweep becomes an expected failure; hand-written reasons are kept."""
    entries = dict(expected_failures.EXPECTED_FAILURES)
    swept = {(c["op"], c["kind"], c["dtype"]) for row in summary["rows"] for c in row["checks"]}
    entries = {k: v for k, v in entries.items() if k not in swept}
    for row in summary["rows"]:
        for c in row["checks"]:
            if c["status"] in ("fail", "xfail"):
                entries[(c["op"], c["kind"], c["dtype"])] = c["expected_reason"] or c["reason"]
    body = pprint.pformat(dict(sorted(entries.items())), width=120, sort_dicts=False)
    EXPECTED_PATH.write_text(HEADER + "EXPECTED_FAILURES = " + body + "\n")


HEADER = '''"""Known conformance failures: (OpInfo entry, check kind, dtype) -> reason.

The CI slice (test_op_conformance.py) marks these xfail(strict=True); the full
sweep reports them as expected-to-fail.  `./scripts/op_conformance.sh
--update-expected` rewrites this file from a sweep, keeping the reasons
written here by hand and dropping entries that now pass.
"""

'''
