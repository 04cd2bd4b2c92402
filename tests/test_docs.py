"""Every ```python block in README.md and docs/*.md runs as written.

A block is skipped only when the line before its fence (blank lines aside)
is an explicit ``<!-- no-test: reason -->`` comment, and the reason is
required.  Blocks run in this process, each in a fresh namespace, so that
the suite does not pay for a new interpreter per example.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_TEST = re.compile(r"<!--\s*no-test\b(?P<reason>.*?)-->")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


def code_blocks(path: pathlib.Path):
    """(language, first line number, code, no-test reason or None) for each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or not match.group("lang"):
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = NO_TEST.search(lines[previous]) if previous >= 0 else None
        reason = marker.group("reason").strip(" :-") if marker else None
        yield match.group("lang"), start + 1, "\n".join(body) + "\n", reason


def _python_blocks():
    for path in DOC_FILES:
        for lang, line, code, reason in code_blocks(path):
            if lang == "python":
                yield pytest.param(path, line, code, reason, id=f"{path.relative_to(ROOT)}:{line}")


PYTHON_BLOCKS = list(_python_blocks())


def test_docs_have_examples():
    assert len(PYTHON_BLOCKS) >= 10
    assert (ROOT / "docs" / "index.md").exists() and (ROOT / "docs" / "ops.md").exists()


@pytest.mark.parametrize("path,line,code,reason", PYTHON_BLOCKS)
def test_python_block_runs(path, line, code, reason):
    if reason is not None:
        assert reason, f"{path.name}:{line}: a no-test marker must say why"
        pytest.skip(f"marked no-test: {reason}")
    environment = dict(os.environ)
    namespace = {"__name__": "__doc_example__"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), namespace)
    finally:  # an example may set TORCHTPU_* variables: keep them out of other tests
        os.environ.clear()
        os.environ.update(environment)


def test_readme_opens_with_the_two_commands():
    blocks = [b for b in code_blocks(ROOT / "README.md")]
    first = blocks[0][2].split()
    assert first == ["./scripts/demo.sh"], first
    second = blocks[1][2].split()
    assert second == ["./scripts/test.sh"], second


def test_relative_links_point_at_files():
    link = re.compile(r"\]\((?!https?:|#|mailto:)(?P<target>[^)#\s]+)")
    for path in DOC_FILES:
        for match in link.finditer(path.read_text(encoding="utf-8")):
            target = (path.parent / match.group("target")).resolve()
            assert target.exists(), f"{path.name}: broken link {match.group('target')}"
