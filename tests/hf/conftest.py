"""CI leaves the matrix's slow cells out; ``-m`` or TORCHTPU_HF_ALL=1 runs them.

The cells are deselected, not skipped, and ``python -m tests.hf.report`` runs
every cell.
"""

from __future__ import annotations

import os


def run_everything(config) -> bool:
    return bool(config.option.markexpr) or os.environ.get("TORCHTPU_HF_ALL") == "1"


def pytest_collection_modifyitems(config, items):
    if run_everything(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow") and "tests/hf/" in item.nodeid]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]
