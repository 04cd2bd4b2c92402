"""The architecture matrix: one test per (architecture, cell).

Each cell passes or is xfail with the reason recorded in
tests/hf/architectures.py.  Cells listed as slow there are deselected in CI
(tests/hf/conftest.py) and run by ``python -m tests.hf.report``.
"""

from __future__ import annotations

import pytest

from .architectures import ARCHITECTURES
from .harness import CHECKS


def matrix_params():
    for arch in ARCHITECTURES:
        for cell in arch.cells:
            marks = []
            if cell in arch.xfail:
                marks.append(pytest.mark.xfail(reason=arch.xfail[cell], strict=True))
            if cell in arch.slow:
                marks.append(pytest.mark.slow)
            yield pytest.param(arch, cell, id=f"{arch.name}-{cell}", marks=marks)


@pytest.mark.parametrize("arch, cell", list(matrix_params()))
def test_cell(arch, cell):
    CHECKS[cell](arch)
