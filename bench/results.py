"""docs/benchmarks.md is shared: each benchmark script owns one section and rewrites only that."""

from __future__ import annotations

import pathlib
import re

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nEach section below is written by the script under `bench/` that it names; "
          "`bench/README.md` says how to run them.\n")


def write_section(script: str, text: str) -> None:
    """Put ``text`` in ``script``'s section of docs/benchmarks.md, leaving the others as they are."""
    start, end = f"<!-- written by bench/{script} -->", f"<!-- end of bench/{script} -->"
    block = f"{start}\n{text.strip()}\n{end}"
    current = RESULTS.read_text() if RESULTS.exists() else HEADER
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    updated = pattern.sub(lambda _: block, current) if pattern.search(current) else f"{current.rstrip()}\n\n{block}\n"
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(updated)


def how_measured(command: str, started: float, device: str, versions: str, notes=()) -> str:
    """The closing "How this was measured" part of a section: command, notes, date, machine, versions, time."""
    import datetime
    import os
    import platform
    import time

    return "\n".join([
        "### How this was measured", "",
        f"- Command: `{command}`",
        *(f"- {note}" for note in notes),
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_model()}, {os.cpu_count()} cores; device: {device}",
        f"- Versions: {versions}",
        f"- Total time: {time.time() - started:.0f} s",
    ])


def cpu_model() -> str:
    """The host CPU's model and its widest vector units (bf16 and large matmuls on CPU, XLA's and
    PyTorch's, run several times faster with AVX-512 or AMX than with AVX2 alone)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "CPU unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    units = [name for name, flag in (("AMX", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16"), ("AVX-512", "avx512f"),
                                     ("AVX2", "avx2")) if flag in flags]
    return f"{model} ({', '.join(units) or 'no AVX2'})"


def sweep(sizes, configs, measure, table) -> list:
    """``measure(config, nprocs)`` for every world size and configuration, the table printed as it
    grows; a configuration that fails is reported on stderr, not hidden, and the sweep goes on."""
    import sys

    rows = []
    for nprocs in sizes:
        for config in configs:
            try:
                rows.append(measure(config, nprocs))
            except Exception as error:  # noqa: BLE001
                print(f"FAILED {config} n={nprocs}: {str(error)[-2000:]}", file=sys.stderr)
            print(table(rows), flush=True)
    return rows

