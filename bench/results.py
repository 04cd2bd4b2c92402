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
